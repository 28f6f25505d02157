"""Checkpoints: role states plus the driver's counters, written atomically, the newest few kept."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from dagrl.runtime.rundir import RunDir

FORMAT = 1


def save_checkpoint(rundir: RunDir, iteration: int, payload: dict[str, Any], keep: int = 3) -> Path:
    """Write ``payload`` for ``iteration``; a crash mid-write leaves the previous checkpoints intact."""
    rundir.checkpoints.mkdir(parents=True, exist_ok=True)
    path = rundir.checkpoint_path(iteration)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        torch.save({"format": FORMAT, **payload}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in rundir.list_checkpoints()[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint file, or the newest one in a run directory."""
    path = Path(path)
    if path.is_dir():
        found = RunDir(path).list_checkpoints()
        if not found:
            raise FileNotFoundError(f"{path}: no checkpoints in {path / 'checkpoints'}")
        path = found[-1]
    data = torch.load(path, map_location="cpu", weights_only=False)
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {data.get('format')!r}, expected {FORMAT}")
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
