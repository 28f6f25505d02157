"""Checkpoints: role states plus the driver's counters, written atomically, the newest few kept."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from dagrl.runtime.rundir import RunDir

FORMAT = 1

log = logging.getLogger("dagrl")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (truncated, corrupt, another format)."""


class CheckpointRefused(CheckpointError):
    """A file that asks to run code when it is read (a pickled global outside
    :func:`dagrl.runtime.snapshot.allowed_globals`):
    refused, never skipped for an older checkpoint, since someone other than dagrl wrote it."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); the previous ones are intact."""


def save_checkpoint(rundir: RunDir, iteration: int, payload: dict[str, Any], keep: int = 3) -> Path:
    """Write ``payload`` for ``iteration``; a crash or a full disk mid-write leaves the previous
    checkpoints intact and no partial file (:class:`CheckpointWriteError` names the file and the cause)."""
    path = rundir.checkpoint_path(iteration)
    tmp = path.with_suffix(".tmp")
    try:
        rundir.checkpoints.mkdir(parents=True, exist_ok=True)
        for stale in rundir.checkpoints.glob("*.tmp"):  # left by a writer killed mid-write
            stale.unlink(missing_ok=True)
        with tmp.open("wb") as f:
            torch.save({"format": FORMAT, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch reports a short write as RuntimeError
        tmp.unlink(missing_ok=True)
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
        raise CheckpointWriteError(f"{path}: cannot write checkpoint ({reason}); earlier checkpoints kept") from None
    for old in rundir.list_checkpoints()[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint file, or the newest intact one in a run directory.

    In a run directory, an unreadable newest checkpoint (a disk that filled up, a copy cut short) is
    skipped with a warning for the next older one; only when none can be read is it an error.
    ``data["path"]`` says which file was read.
    """
    path = Path(path)
    if not path.is_dir():
        return _read(path)
    found = RunDir(path).list_checkpoints()
    if not found:
        raise FileNotFoundError(f"{path}: no checkpoints in {path / 'checkpoints'}")
    problems = []
    for candidate in reversed(found):
        try:
            data = _read(candidate)
        except CheckpointRefused:
            raise
        except CheckpointError as err:
            problems.append(str(err))
            continue
        for problem in problems:
            log.warning("%s; using %s instead", problem, candidate.name)
        return data
    raise CheckpointError(f"{path}: no readable checkpoint ({'; '.join(problems)})")


def _read(path: Path) -> dict[str, Any]:
    """Read with ``torch.load(weights_only=True)``: a checkpoint is tensors, arrays and plain values, and
    a file that would run code on load (a crafted pickle) is refused, naming what it asked for."""
    import pickle

    try:
        from dagrl.runtime.snapshot import allowed_globals

        with torch.serialization.safe_globals(allowed_globals(str(path))):
            data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as err:
        asked = re.search(r"(?:GLOBAL|global) ([\w.]+)", str(err))
        if asked is None:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise CheckpointError(f"{path}: unreadable checkpoint ({reason})") from None
        raise CheckpointRefused(
            f"{path}: refused: loading it would call {asked.group(1)}, which no dagrl checkpoint holds "
            "(if you trust where the file came from, torch.load can read it with weights_only off)"
        ) from None
    except Exception as err:  # torch raises RuntimeError, EOFError, zipfile errors...
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: unreadable checkpoint ({reason})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(f"{path}: checkpoint format {found!r}, expected {FORMAT}")
    data["path"] = str(path)
    return data


def non_finite(tree: Any, prefix: str = "") -> list[str]:
    """Keys of every tensor or array in a nested state holding NaN or inf (``learner.actor.0.weight``)."""
    import numpy as np

    bad: list[str] = []
    if isinstance(tree, torch.Tensor):
        if tree.is_floating_point() and not bool(torch.isfinite(tree).all()):
            bad.append(prefix)
    elif isinstance(tree, np.ndarray):
        if np.issubdtype(tree.dtype, np.floating) and not np.isfinite(tree).all():
            bad.append(prefix)
    elif isinstance(tree, float):
        if tree != tree or tree in (float("inf"), float("-inf")):
            bad.append(prefix)
    elif isinstance(tree, dict):
        for k, v in tree.items():
            bad += non_finite(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            bad += non_finite(v, f"{prefix}.{i}" if prefix else str(i))
    return bad
