"""Metrics rows as TensorBoard scalars (``tensorboard: true`` in a graph): ``tensorboard --logdir runs``.

Each row of ``metrics.jsonl`` becomes one scalar per numeric key at the row's ``env_steps`` (the x
axis CleanRL and Stable-Baselines3 use), written by torch's ``SummaryWriter`` under
``<run>/tensorboard/``; ``metrics.jsonl`` stays the record. Rows that go back in env steps (a
learner rolled back to its checkpoint, a resumed run) start a new event file that purges what the
earlier ones logged from that step on, so TensorBoard shows each step once, as ``metrics.jsonl``
does.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

__all__ = ["TensorBoardLog", "available"]

AXES = ("iteration", "env_steps")
"""Keys of a row that place it rather than measure something."""


def available() -> bool:
    """Whether the ``tensorboard`` package (which torch's writer needs) is installed."""
    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardLog:
    """A metrics-row listener writing scalars to ``directory``; ``resumed_at``: env steps of the
    checkpoint a resumed run starts from (anything logged after it is purged)."""

    def __init__(self, directory: str | Path, resumed_at: int | None = None):
        self.directory = Path(directory)
        self.last = -1 if resumed_at is None else resumed_at
        self.writer = self._open(None if resumed_at is None else resumed_at + 1)

    def _open(self, purge_step: int | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.directory), purge_step=purge_step, flush_secs=10)

    def on_row(self, row: dict[str, Any], _result: Any = None) -> None:
        step = int(row["env_steps"])
        if step <= self.last:  # redone after a rollback: the steps from here on are replaced
            self.writer.close()
            self.writer = self._open(step)
        self.last = step
        for key, value in row.items():
            if key in AXES or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()
