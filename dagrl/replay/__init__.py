"""Replay storage: a hot ring in RAM that spills whole chunks to zarr; uniform and prioritized sampling."""

from __future__ import annotations

from dagrl.replay.nstep import NStep
from dagrl.replay.role import ReplayState, Transitions, replay_state
from dagrl.replay.schema import Field, ReplayError, Schema
from dagrl.replay.store import ReplayStore, Sample
from dagrl.replay.synthetic import random_sample

__all__ = [
    "Field",
    "NStep",
    "ReplayError",
    "ReplayState",
    "ReplayStore",
    "Sample",
    "Schema",
    "Transitions",
    "random_sample",
    "replay_state",
]
