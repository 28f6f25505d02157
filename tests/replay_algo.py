"""A small algorithm for testing the replay role: samplers act randomly, a replay role stores,
a learner samples and counts. Written like any algorithm: no dask, fragments only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dagrl import Manifest, fragment, iteration, role
from dagrl.replay import ReplayStore, Sample, Schema


@dataclass
class Config:
    steps: int = 25
    """Env steps per env per collect."""
    batch_size: int = 64
    capacity: int = 100_000
    memory_budget: int = 200_000
    """Small, so that most rows spill to disk."""


@dataclass
class SamplerState:
    envs: object
    obs: np.ndarray
    index: int
    steps: int


@dataclass
class LearnerState:
    seen: int = 0
    batch_size: int = 64


@role("sampler", many=True)
def sampler(ctx, cfg: Config) -> SamplerState:
    envs = ctx.make_envs()
    obs, _ = envs.reset(seed=ctx.seed)
    envs.action_space.seed(ctx.seed)
    return SamplerState(envs, obs, ctx.index, cfg.steps)


@role("replay", many=True)
def replay(ctx, cfg: Config) -> ReplayStore:
    schema = Schema.transitions(ctx.observation_space, ctx.action_space, source=("int64", ()))
    return ReplayStore(schema, cfg.capacity, cfg.memory_budget, ctx.path, chunk_rows=64, seed=ctx.seed)


@role("learner")
def learner(ctx, cfg: Config) -> LearnerState:
    return LearnerState(batch_size=cfg.batch_size)


@fragment(role="sampler")
def collect(state: SamplerState) -> dict[str, np.ndarray]:
    out = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    for _ in range(state.steps):
        action = state.envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = state.envs.step(action)
        for k, v in zip(out, (state.obs, action, reward, next_obs, terminated, truncated), strict=True):
            out[k].append(v)
        state.obs = next_obs
    batch = {k: np.concatenate(v) for k, v in out.items()}
    batch["reward"] = batch["reward"].astype(np.float32)
    batch["action"] = batch["action"].astype(state.envs.single_action_space.dtype)
    batch["source"] = np.full(len(batch["reward"]), state.index)
    return batch


@fragment(role="replay")
def add(store: ReplayStore, batches: list[dict[str, np.ndarray]]) -> int:
    for b in batches:
        store.add(b)
    return len(store)


@fragment(role="replay")
def sample(store: ReplayStore, stored: int) -> Sample:
    return store.sample(min(64, stored))


@fragment(role="learner")
def update(state: LearnerState, samples: list[Sample]) -> dict[str, float]:
    state.seen += sum(len(s) for s in samples)
    return {"learner/seen": float(state.seen), "learner/shards": float(len(samples))}


@iteration
def train_iteration():
    return update(sample(add(collect())))


ALGORITHM = Manifest(config=Config, roles=[sampler, replay, learner], iteration=train_iteration)
