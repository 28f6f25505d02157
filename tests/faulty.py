"""Things that fail on purpose, for the supervision tests: envs that raise, an algorithm whose
learner turns NaN or whose sampler hangs, with rows that can be checked for integrity.

One-shot faults use a marker file (``DAGRL_FAULT_DIR``) so they fire once across processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from dagrl import Manifest, fragment, iteration, role
from dagrl.replay import ReplayStore, Schema


def once(name: str) -> bool:
    """True the first time ``name`` is asked for in this test (any process), False after."""
    marker = Path(os.environ["DAGRL_FAULT_DIR"]) / name
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class StepFailsOnce(CartPoleEnv):
    """CartPole whose ``step`` raises once (in the whole test) after 300 steps of one env."""

    steps = 0

    def step(self, action):
        StepFailsOnce.steps += 1
        if StepFailsOnce.steps > 300 and once("step-failed"):
            raise ValueError("the pole fell off the cart")
        return super().step(action)


class StartFailsOnce(StepFailsOnce):
    """:class:`StepFailsOnce` whose first env made after that failure raises in ``reset``: the sampler's
    first replacement fails to start, the second starts."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.made_after_failure = (Path(os.environ["DAGRL_FAULT_DIR"]) / "step-failed").exists()

    def reset(self, **kwargs):
        if self.made_after_failure and once("start-failed"):
            raise RuntimeError("licence server busy")
        return super().reset(**kwargs)


class CrashLoop(CartPoleEnv):
    """CartPole that breaks for good in a process after 200 steps: ``step`` and then every ``reset`` raise."""

    steps = 0

    def reset(self, **kwargs):
        if CrashLoop.steps > 200:
            raise RuntimeError("simulator licence expired")
        return super().reset(**kwargs)

    def step(self, action):
        CrashLoop.steps += 1
        if CrashLoop.steps > 200:
            raise RuntimeError("simulator licence expired")
        return super().step(action)


class KillsItsWorkerOnce(CartPoleEnv):
    """CartPole whose first construction in a Dask worker (in the whole test) SIGKILLs that worker: a
    worker lost while the roles start (preempted, out of memory), before its sampler's actor exists."""

    def __init__(self, **kwargs):
        from distributed import get_worker

        try:
            get_worker()
        except ValueError:  # the driver's probe of the env: not a worker
            pass
        else:
            if once("worker-killed-while-starting"):
                os.kill(os.getpid(), signal.SIGKILL)
        super().__init__(**kwargs)


class NanAfter(CartPoleEnv):
    """CartPole whose observations turn NaN after 100 steps of one env (a simulator gone unstable)."""

    steps = 0

    def step(self, action):
        NanAfter.steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if NanAfter.steps > 100:
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


class RaisesAfter(CartPoleEnv):
    """CartPole whose ``step`` raises for good after 100 steps of one env."""

    steps = 0

    def step(self, action):
        RaisesAfter.steps += 1
        if RaisesAfter.steps > 100:
            raise RuntimeError("the physics engine lost its licence")
        return super().step(action)


gym.register("NanAfter-v0", entry_point=NanAfter, max_episode_steps=500)
gym.register("RaisesAfter-v0", entry_point=RaisesAfter, max_episode_steps=500)
gym.register("KillsItsWorkerOnce-v0", entry_point=KillsItsWorkerOnce, max_episode_steps=500)
gym.register("StepFailsOnce-v0", entry_point=StepFailsOnce, max_episode_steps=500)
gym.register("CrashLoop-v0", entry_point=CrashLoop, max_episode_steps=500)
gym.register("StartFailsOnce-v0", entry_point=StartFailsOnce, max_episode_steps=500)


# -- an algorithm with checkable rows ---------------------------------------------------------------


@dataclass
class Config:
    rows: int = 64
    """Rows per collect."""
    capacity: int = 200_000
    memory_budget: int = 40_000
    """Small: most rows spill to the zarr store."""
    nan_after: int = 0
    """Learner weights become NaN after this many updates (0: never)."""
    hang_at: int = 0
    """A sampler's collect hangs once at this collect (0: never)."""
    publish_fails_at: int = 0
    """The learner's ``publish`` raises once at this call (0: never)."""
    killed_at_checkpoint: int = 0
    """The learner's worker is SIGKILLed once, at the learner's N-th ``state_dict`` (a checkpoint; 0: never)."""
    killed_at_close: bool = False
    """Sampler 0's worker is SIGKILLed once, while the run closes that sampler."""


def value_of(source: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Each row's payload follows from its (source, seq), so a reader can tell a damaged row."""
    base = (source * 1_000_003 + seq).astype(np.float64)
    return np.stack([np.sin(base), np.cos(base), base % 97, base % 89], axis=1).astype(np.float32)


SCHEMA = Schema({"source": ("int64", ()), "seq": ("int64", ()), "value": ("float32", (4,))})


@dataclass
class SamplerState:
    index: int
    rows: int
    hang_at: int
    killed_at_close: bool = False
    seq: int = 0
    collects: int = 0

    def close(self) -> None:
        """Leave a ``closed-sampler-<index>`` marker: the test sees when the host closed the state."""
        with contextlib.suppress(OSError, KeyError):
            (Path(os.environ["DAGRL_FAULT_DIR"]) / f"closed-sampler-{self.index}").touch()
        if self.killed_at_close and self.index == 0 and once("worker-killed-while-closing"):
            os.kill(os.getpid(), signal.SIGKILL)


def hang(limit_s: float = 3600.0) -> None:
    """Block as a hung env would, until the test leaves a ``release-hung`` marker (or ``limit_s``)."""
    release = Path(os.environ["DAGRL_FAULT_DIR"]) / "release-hung"
    end = time.monotonic() + limit_s
    while not release.exists() and time.monotonic() < end:
        time.sleep(0.05)


@dataclass
class Rows:
    data: dict
    env_steps: int


class LearnerState:
    def __init__(self, nan_after: int, publish_fails_at: int = 0, killed_at_checkpoint: int = 0):
        self.w = torch.zeros(4)
        self.updates = 0
        self.nan_after = nan_after
        self.publish_fails_at = publish_fails_at
        self.publishes = 0
        self.killed_at_checkpoint = killed_at_checkpoint
        self.checkpoints = 0

    def state_dict(self):
        self.checkpoints += 1
        if self.checkpoints == self.killed_at_checkpoint and once("worker-killed-at-checkpoint"):
            os.kill(os.getpid(), signal.SIGKILL)  # the learner's worker, while the checkpoint is taken
        return {"w": self.w.clone(), "updates": self.updates}

    def load_state_dict(self, sd):
        self.w, self.updates = sd["w"].clone(), sd["updates"]


@role("sampler", many=True)
def sampler(ctx, cfg: Config) -> SamplerState:
    return SamplerState(ctx.index, cfg.rows, cfg.hang_at, cfg.killed_at_close)


@role("replay", many=True)
def replay(ctx, cfg: Config) -> ReplayStore:
    return ReplayStore(SCHEMA, cfg.capacity, cfg.memory_budget, ctx.path, chunk_rows=64, seed=ctx.seed)


@role("learner")
def learner(ctx, cfg: Config) -> LearnerState:
    return LearnerState(cfg.nan_after, cfg.publish_fails_at, cfg.killed_at_checkpoint)


@fragment(role="learner")
def publish(state: LearnerState) -> np.ndarray:
    state.publishes += 1
    if state.publishes == state.publish_fails_at and once("publish-failed"):
        raise RuntimeError("publish failed on purpose")
    return state.w.numpy().copy()


@fragment(role="sampler")
def collect(state: SamplerState, weights: np.ndarray) -> Rows:
    state.collects += 1
    if state.hang_at and state.collects == state.hang_at and once("hung"):
        hang()
    seq = np.arange(state.seq, state.seq + state.rows)
    state.seq += state.rows
    source = np.full(state.rows, state.index)
    return Rows({"source": source, "seq": seq, "value": value_of(source, seq)}, state.rows)


@fragment(role="replay")
def add(store: ReplayStore, items: list[Rows]) -> int:
    for item in items:
        store.add(item.data)
    return len(store)


@fragment(role="replay")
def sample(store: ReplayStore, stored: int):
    return store.sample(min(32, len(store))) if len(store) else None


@fragment(role="learner")
def update(state: LearnerState, samples: list) -> dict[str, float]:
    state.updates += 1
    state.w += 0.01
    if state.nan_after and state.updates >= state.nan_after:
        state.w[1] = float("nan")
    rows = [s for s in samples if s is not None]
    return {"learner/updates": float(state.updates), "learner/rows": float(sum(len(s) for s in rows))}


@iteration
def train_iteration():
    w = publish()
    return update(sample(add(collect(w))))


ALGORITHM = Manifest(config=Config, roles=[sampler, replay, learner], iteration=train_iteration)
