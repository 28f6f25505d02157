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


def in_env(info: dict[str, Any]) -> float | None:
    """The share of a role instance's fragment time spent inside its envs' ``step`` (a heartbeat's or
    an ``info()``'s ``env_s`` over its ``busy_s`` summed); ``None`` for roles without envs.

    >>> in_env({"env_s": 1.5, "busy_s": {"collect": 2.0}}), in_env({"env_s": 0.0, "busy_s": {"update": 3.0}})
    (0.75, None)
    """
    env_s, busy = info.get("env_s") or 0.0, sum((info.get("busy_s") or {}).values())
    return min(1.0, env_s / busy) if env_s > 0 and busy > 0 else None


def busy_share(summed: dict[str, Any], wall_s: float) -> float:
    """How much of a run's ``wall_s`` a role's instances were busy in their fragments, their mean
    (``summed``: :func:`role_time`'s).

    >>> busy_share({"instances": 2, "env_s": 0.0, "busy_s": {"collect": 3.0, "publish": 1.0}}, wall_s=4.0)
    0.5
    """
    n = summed["instances"]
    return sum(summed["busy_s"].values()) / n / wall_s if n and wall_s > 0 else 0.0


def bounding(busy: dict[str, float], at: float = 0.9) -> str | None:
    """The one role busy at least ``at`` of a run (its instances' mean share of the run's wall time, by
    role: ``busy``) while every other was not: the role the others waited on, which bounds the run's
    throughput. ``None`` when no role or more than one was that busy.

    >>> bounding({"sampler": 0.41, "learner": 0.97}), bounding({"sampler": 0.95, "learner": 0.93})
    ('learner', None)
    """
    busiest = [role for role, share in busy.items() if share >= at]
    return busiest[0] if len(busiest) == 1 else None


def role_time(actors: list[dict[str, Any]], role: str) -> dict[str, Any]:
    """``env_s`` and ``busy_s`` (by fragment) of every instance of ``role`` in ``actors`` (``policy.actors()``,
    ``actors.json``) summed, as one instance's would be: :func:`in_env` takes it.

    >>> role_time([{"role": "sampler", "env_s": 1.0, "busy_s": {"collect": 2.0}}] * 2, "sampler")
    {'instances': 2, 'env_s': 2.0, 'busy_s': {'collect': 4.0}}
    """
    mine = [a for a in actors if a["role"] == role]
    busy: dict[str, float] = {}
    for a in mine:
        for fragment, s in a["busy_s"].items():
            busy[fragment] = busy.get(fragment, 0.0) + s
    return {"instances": len(mine), "env_s": sum(a["env_s"] for a in mine), "busy_s": busy}
