"""A stand-in algorithm for ``dagrl bench transport``: samplers emit Atari-shaped rollouts, the learner counts bytes.

``collect`` returns 8 envs x 128 steps of 4x84x84 uint8 observations (~29 MB) by copying a buffer
made once, so the benchmark measures moving rollouts, not simulating Atari.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dagrl.core.context import Episodes, RoleContext
from dagrl.core.fragment import Manifest, fragment, iteration, role

SHAPE = (128, 8, 4, 84, 84)


@dataclass
class Config:
    pass


@dataclass
class Rollout:
    obs: np.ndarray
    env_steps: int
    episodes: Episodes


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> np.ndarray:
    return np.random.default_rng(ctx.seed).integers(0, 255, SHAPE, dtype=np.uint8)


@role("learner")
def learner(ctx: RoleContext, cfg: Config) -> dict:
    return {"bytes": 0}


@fragment(role="learner")
def publish(state: dict) -> int:
    return state["bytes"]


@fragment(role="sampler")
def collect(state: np.ndarray, version: int) -> Rollout:
    return Rollout(state.copy(), SHAPE[0] * SHAPE[1], Episodes())


@fragment(role="learner")
def update(state: dict, rollouts: list[Rollout]) -> dict[str, float]:
    n = sum(int(r.obs.nbytes) for r in rollouts)
    state["bytes"] += n
    return {"perf/bytes": float(n)}


@iteration
def train_iteration():
    return update(collect(publish()))


ALGORITHM = Manifest(config=Config, roles=[sampler, learner], iteration=train_iteration)
