"""What the driver counts of a sampler's output (env steps, finished episodes), made on the output's worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagrl.core.context import Episodes
from dagrl.runtime.shm import unwrap


@dataclass
class Report:
    """What the driver counts of a sampler output: env steps and the episodes that finished."""

    env_steps: int = 0
    episodes: Episodes = field(default_factory=Episodes)
    counted: bool = False
    """Whether the output carried ``env_steps``/``episodes`` at all (other outputs need no report)."""


def report(value: Any) -> Report:
    """The :class:`Report` of a fragment output (a task on the output's worker: only this travels)."""
    value = unwrap(value)
    steps = getattr(value, "env_steps", None)
    episodes = getattr(value, "episodes", None)
    counted = isinstance(steps, int | np.integer) or isinstance(episodes, Episodes)
    return Report(
        int(steps) if isinstance(steps, int | np.integer) else 0,
        episodes if isinstance(episodes, Episodes) else Episodes(),
        counted,
    )


def report_message(value: Any) -> dict[str, Any]:
    """:func:`report` of ``value`` as plain lists and numbers (a Dask event carries msgpack only)."""
    r = report(value)
    ep = r.episodes
    return {
        "env_steps": r.env_steps,
        "counted": r.counted,
        "returns": ep.returns.tolist(),
        "lengths": ep.lengths.tolist(),
        "in_window": None if ep.in_window is None else ep.in_window.tolist(),
    }


def report_from_message(msg: dict[str, Any]) -> Report:
    mask = msg["in_window"]
    episodes = Episodes(
        np.asarray(msg["returns"], np.float64),
        np.asarray(msg["lengths"], np.int64),
        None if mask is None else np.asarray(mask, bool),
    )
    return Report(int(msg["env_steps"]), episodes, bool(msg["counted"]))
