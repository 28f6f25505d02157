"""Snapshots of role states that have no ``state_dict`` of their own: samplers and evaluators.

Under the lockstep policies (``single``, ``sync``) every draw a run makes happens in an iteration the
driver waits for, so a checkpoint taken between iterations can hold everything that decides the run's
future: the learners' own ``state_dict`` (weights, optimizers, generators), the replay store's sampler,
and, made here, each sampler's whole state: its envs (their simulator states and generators, the
vector env's autoreset flags), its last observations, its generators, its episode counters. A resume
that loads all of it trains on exactly as the run would have, bit for bit.

A snapshot is the state dataclass's fields as they are (torch saves the networks, generators and
arrays), with the vector env replaced by its attributes but the functions it was made from; it is
loaded into the role's freshly built state, whose envs take the saved attributes. An env that cannot
be pickled (a simulator holding a socket, a renderer, envs stepped in subprocesses) gives no snapshot:
the resume says in one line that the role's envs start fresh.

A checkpoint holding snapshots names the classes of the roles' states; :func:`allowed_globals` is
what of them ``torch.load(weights_only=True)`` may rebuild (see :mod:`dagrl.runtime.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import io
import logging
from typing import Any

log = logging.getLogger("dagrl")

LOCKSTEP = ("single", "sync")
"""The policies whose checkpoints hold sampler snapshots (streaming ones resume as a continuation)."""
KEY = "__dagrl_snapshot__"
ENVS = "__dagrl_envs__"
CONFIG_FIELDS = ("cfg", "config")
"""State fields holding the algorithm's hyperparameters: not restored, the run's own graph says them."""
SKIP_VECTOR = ("env_fns",)
"""Vector env attributes not saved: the functions that made its envs (local lambdas)."""


def snapshot(state: Any, where: str) -> dict[str, Any] | None:
    """``state``'s fields as a checkpoint holds them, or ``None`` (said once) where they cannot be saved."""
    import torch

    if not dataclasses.is_dataclass(state):
        return None
    from dagrl.core.context import NamedEnvErrors

    fields = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, NamedEnvErrors):
            inner = value._envs
            value = {ENVS: {k: v for k, v in vars(inner).items() if k not in SKIP_VECTOR}, "steps": value.steps}
        fields[f.name] = value
    out = {KEY: type(state).__qualname__, "fields": fields}
    try:
        torch.save(out, io.BytesIO())  # what the checkpoint will do with it, tried now
    except Exception as err:  # an env holding a lock, a socket, a subprocess
        log.info("%s: its state cannot be saved (%s): a resume starts its envs fresh", where, _first_line(err))
        return None
    return out


def restore(state: Any, snap: dict[str, Any], where: str) -> None:
    """Load snapshot ``snap`` into the freshly built ``state`` (the same role of the same graph)."""
    from dagrl.core.context import NamedEnvErrors

    if snap.get(KEY) != type(state).__qualname__:
        raise ValueError(f"{where}: snapshot of a {snap.get(KEY)}, not of a {type(state).__qualname__}")
    for name, value in snap["fields"].items():
        if name in CONFIG_FIELDS:
            continue  # the graph's, as this run resolved it (a resume may change hyperparameters)
        current = getattr(state, name)
        if isinstance(current, NamedEnvErrors) and isinstance(value, dict) and ENVS in value:
            inner = current._envs
            saved = value[ENVS]
            if set(saved) != {k for k in vars(inner) if k not in SKIP_VECTOR}:
                raise ValueError(f"{where}: the saved envs are not of the kind this run makes")
            for env in getattr(inner, "envs", []):
                env.close()
            vars(inner).update(saved)
            current.steps = value["steps"]
            continue
        setattr(state, name, value)


def env_modules() -> set[str]:
    """The modules of the envs registered with gymnasium that this process has imported: a user's own
    env classes, which its run imports and runs anyway. Read from the registry, never from the file."""
    import sys

    import gymnasium as gym

    out = set()
    for spec in gym.registry.values():
        entry = spec.entry_point
        module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
        if module and module in sys.modules:
            out.add(module)
    return out


TRUSTED = tuple(f"dagrl.{m}." for m in ("algos", "core", "envs", "nn", "replay")) + ("gymnasium.", "torch.nn.")
"""Packages whose classes a snapshot may name (imported to find them: their code is dagrl's and its
dependencies')."""


def allowed_globals(path: str | None = None, modules: set[str] | None = None) -> list[Any]:
    """What a snapshot may name: numpy's generators and their constructors, two collections, torch's
    generator and device, and the classes, among the globals checkpoint ``path`` names, of
    :data:`TRUSTED` packages and of ``modules`` (default :func:`env_modules`: env code this process has
    imported already). Only classes and numpy's constructors: no function of the file's choosing runs."""
    import collections
    import importlib
    import sys

    import numpy as np
    import torch
    from numpy.random import _pickle, bit_generator

    out: list[Any] = [collections.OrderedDict, collections.deque, torch.Generator, torch.device]
    out += [np.random.Generator, np.random.PCG64, np.random.SeedSequence, np.random.MT19937]
    out += [v for k, v in vars(_pickle).items() if k.startswith("__") and k.endswith("_ctor")]
    out += [v for k, v in vars(bit_generator).items() if k.startswith("__pyx_unpickle")]  # SeedSequence's
    if path is None:
        return out
    modules = env_modules() if modules is None else modules
    for name in torch.serialization.get_unsafe_globals_in_checkpoint(path):
        module, _, attr = name.rpartition(".")
        if f"{module}.".startswith(TRUSTED):
            try:
                found = getattr(importlib.import_module(module), attr, None)
            except ImportError:
                continue
        elif module in modules and module in sys.modules:
            found = getattr(sys.modules[module], attr, None)
        else:
            continue
        if isinstance(found, type):
            out.append(found)
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
