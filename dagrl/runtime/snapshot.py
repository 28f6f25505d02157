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
the resume says in one line that the role's envs start fresh. So does an env class that sets
``dagrl_snapshot = False`` (its pickles do not come back whole: PettingZoo's games).

A checkpoint holding snapshots names the classes of the roles' states; :func:`allowed_globals` is
what of them ``torch.load(weights_only=True)`` may rebuild (see :mod:`dagrl.runtime.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import io
import logging
from typing import Any

log = logging.getLogger("dagrl")

KEY = "__dagrl_snapshot__"
ENVS = "__dagrl_envs__"
CONFIG_FIELDS = ("cfg", "config")
"""State fields holding the algorithm's hyperparameters: not restored, the run's own graph says them."""
SKIP_VECTOR = ("env_fns", "spec")
"""Vector env attributes not saved: the functions that made its envs (local lambdas) and its spec (which
names the wrapper functions; the fresh env has its own)."""


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
            refusing = [e for e in getattr(inner, "envs", []) if not getattr(e.unwrapped, "dagrl_snapshot", True)]
            if refusing:  # an env class that says its pickles are not whole
                log.info(
                    "%s: %s cannot be saved: a resume starts its envs fresh",
                    where,
                    type(refusing[0].unwrapped).__name__,
                )
                return None
            value = {ENVS: {k: v for k, v in vars(inner).items() if k not in SKIP_VECTOR}, "steps": value.steps}
        fields[f.name] = value
    out = {KEY: type(state).__qualname__, "fields": fields}
    buffer = io.BytesIO()
    try:
        torch.save(out, buffer)  # what the checkpoint will do with it, tried now
    except Exception as err:  # an env holding a lock, a socket, a subprocess
        log.info("%s: its state cannot be saved (%s): a resume starts its envs fresh", where, _first_line(err))
        return None
    refused = _refused_globals(buffer)
    if refused:  # a function or a class from elsewhere: a checkpoint loaded with weights_only refuses it
        said = "%s: its state names %s, which a checkpoint does not load: a resume starts its envs fresh"
        log.info(said, where, refused[0])
        return None
    return out


def _refused_globals(buffer: io.BytesIO) -> list[str]:
    """The globals in the saved ``buffer`` that :func:`dagrl.runtime.checkpoint.load_checkpoint` would refuse."""
    import torch

    allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals(buffer)}
    buffer.seek(0)
    return [name for name in torch.serialization.get_unsafe_globals_in_checkpoint(buffer) if name not in allowed]


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


TRUSTED = (
    *(f"dagrl.{m}." for m in ("algos", "core", "envs", "nn", "replay")),
    *(f"{p}." for p in ("gymnasium", "pettingzoo", "mpe2", "ale_py", "mujoco", "shimmy")),
    "torch.nn.",
)
"""Packages whose classes a snapshot may name (imported to find them: their code is dagrl's and that of
the env packages it runs)."""


def value_globals() -> list[Any]:
    """What any dagrl checkpoint may name besides torch's own tensors and plain Python values: numpy's
    arrays, scalars and dtypes (replay positions, normalisation statistics, generator states). Each only
    rebuilds a value; none runs code of the file's choosing."""
    import numpy as np

    core = np._core.multiarray
    dtypes = {type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGUSVMmO"}
    return [core._reconstruct, core.scalar, np.ndarray, np.dtype, *sorted(dtypes, key=str)]


def allowed_globals(path: str | io.BytesIO | None = None, modules: set[str] | None = None) -> list[Any]:
    """What a checkpoint may name: :func:`value_globals`; for snapshots, numpy's generators and their
    constructors, two collections, torch's generator and device, builtin containers, and the classes, among
    the globals checkpoint ``path`` names, of :data:`TRUSTED` packages and of ``modules`` (default
    :func:`env_modules`: env code this process has imported already). Only classes and numpy's
    constructors: no function of the file's choosing runs."""
    import collections
    import importlib
    import sys

    import numpy as np
    import torch
    from numpy.random import _pickle, bit_generator

    out: list[Any] = [*value_globals(), collections.OrderedDict, collections.deque, torch.Generator, torch.device]
    out += [bytes, bytearray, set, frozenset, complex, slice, range]  # builtins whose pickles call them
    out += [np.random.Generator, np.random.PCG64, np.random.SeedSequence, np.random.MT19937]
    out += [v for k, v in vars(_pickle).items() if k.startswith("__") and k.endswith("_ctor")]
    out += [v for k, v in vars(bit_generator).items() if k.startswith("__pyx_unpickle")]  # SeedSequence's
    if path is None:
        return out
    modules = env_modules() if modules is None else modules
    if isinstance(path, io.BytesIO):
        path.seek(0)
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
