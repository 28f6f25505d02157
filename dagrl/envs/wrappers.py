"""Gymnasium wrappers a graph names under ``env.wrappers``, put around every env dagrl makes.

.. code-block:: yaml

    env:
      id: CartPole-v1
      wrappers:
        - gymnasium.wrappers.TimeLimit: {max_episode_steps: 200}
        - gymnasium.wrappers.ClipReward: {min_reward: -1, max_reward: 1}
        - mypackage.wrappers:StickyActions          # no arguments

An entry is a wrapper's import path (``package.module.Name`` or ``package.module:Name``), alone or as
the one key of a mapping to its keyword arguments (rl-baselines3-zoo's ``env_wrapper`` shape). They
wrap the env in the order given, each around the one before, right after ``gymnasium.make`` and
before :func:`dagrl.envs.vector.vector_observations` makes the observations what the networks take, in
every process that makes the env: samplers (each env of a vector env, ``async`` subprocesses
included), evaluators, ``dagrl eval``, the graph check and ``dagrl tune``'s probes. The graph check
imports and applies them, so a bad path or argument is named before anything starts; like an env
id's module, a wrapper's module must be importable on every worker.

YAML has no tuple: a list among a wrapper's arguments reaches it as a tuple
(``gymnasium.wrappers.ResizeObservation: {shape: [64, 64]}``).

Rewards and episode ends the wrappers change are what the algorithm learns from and what the
metrics count (``charts/episode_return`` of a ``ClipReward`` run is a clipped return). EnvPool steps
its envs in C++ and takes no Python wrapper: a graph with both is refused.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

__all__ = ["Wrapper", "as_functions", "entry", "parse", "resolve", "wrap"]

Wrapper = tuple[str, dict[str, Any]]
"""A wrapper's import path and its keyword arguments."""


def parse(entries: Sequence[Any]) -> list[Wrapper]:
    """The ``(path, kwargs)`` of each ``env.wrappers`` entry (module docstring).

    >>> parse(["gymnasium.wrappers.ClipReward", {"gymnasium.wrappers.TimeLimit": {"max_episode_steps": 9}}])
    [('gymnasium.wrappers.ClipReward', {}), ('gymnasium.wrappers.TimeLimit', {'max_episode_steps': 9})]

    Raises ``ValueError`` starting ``[i]`` for entry ``i`` of another shape.
    """
    out: list[Wrapper] = []
    for i, given in enumerate(entries):
        try:
            out.append(entry(given))
        except ValueError as err:
            raise ValueError(f"[{i}]: {err}") from None
    return out


def entry(given: Any) -> Wrapper:
    """The ``(path, kwargs)`` of one ``env.wrappers`` entry; ``ValueError`` saying what is wrong with it."""
    if isinstance(given, dict) and len(given) == 1:
        ((path, kwargs),) = given.items()
        kwargs = {} if kwargs is None else kwargs
    else:
        path, kwargs = given, {}
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"expected an import path, or a mapping of one to its arguments, got {given!r}")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"{path}: expected a mapping of keyword arguments, got {kwargs!r}")
    return path, dict(kwargs)


def resolve(path: str) -> Callable[..., gym.Env]:
    """The wrapper class (or function) ``path`` names: ``package.module:Name`` or ``package.module.Name``.

    >>> resolve("gymnasium.wrappers:TimeLimit").__name__
    'TimeLimit'

    Raises ``ValueError`` saying what could not be imported or found.
    """
    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module or not name:
        raise ValueError(f"{path!r} is not an import path (package.module.Name or package.module:Name)")
    try:
        target: Any = importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"cannot import {module!r} for {path!r} ({err})") from None
    for part in name.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{module!r} has no {name!r}") from None
    if not callable(target):
        raise ValueError(f"{path!r} is a {type(target).__name__}, not a wrapper")
    return target


def wrap(env: gym.Env, wrappers: Sequence[Wrapper]) -> gym.Env:
    """``env`` inside each of ``wrappers``, the first innermost.

    >>> env = wrap(gym.make("CartPole-v1"), [("gymnasium.wrappers.TimeLimit", {"max_episode_steps": 5})])
    >>> _ = env.reset(seed=0)
    >>> [env.step(0)[3] for _ in range(5)]  # truncated
    [False, False, False, False, True]

    Raises ``ValueError`` naming the wrapper when one cannot be built or does not return an env.
    """
    for path, kwargs in wrappers:
        make = resolve(path)
        try:
            wrapped = make(env, **{k: _tuples(v) for k, v in kwargs.items()})
        except (TypeError, ValueError, AssertionError, gym.error.Error) as err:
            raise ValueError(f"{path}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {err}") from None
        if not isinstance(wrapped, gym.Env):
            raise ValueError(f"{path} returned a {type(wrapped).__name__}, not a gymnasium env")
        env = wrapped
    return env


def _tuples(value: Any) -> Any:
    """``value`` with its lists as tuples, nested ones too: YAML has no tuple, and wrappers such as
    ``ResizeObservation(shape=(64, 64))`` take only one."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def as_functions(given: Sequence[Wrapper]) -> list[Callable[[gym.Env], gym.Env]]:
    """``given`` as one function ``env -> env`` (picklable, for ``async`` vector envs' subprocesses)."""
    return [functools.partial(wrap, wrappers=list(given))] if given else []
