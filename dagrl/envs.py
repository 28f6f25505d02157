"""Envs dagrl ships for benchmarks and examples.

``dagrl.envs:CostlyCartPole-v0`` is CartPole whose every step also costs ``step_ms`` milliseconds,
to stand for an expensive simulator: ``cost: sleep`` waits (a remote or GPU-bound simulator: the
core is free meanwhile), ``cost: busy`` spins (a CPU-bound one: the core is taken). Use it as
``env: {id: "dagrl.envs:CostlyCartPole-v0", kwargs: {step_ms: 1.0, cost: sleep}}``.

Examples
--------
>>> import gymnasium as gym
>>> env = gym.make("dagrl.envs:CostlyCartPole-v0", step_ms=0.5, cost="busy")
>>> _ = env.reset(seed=0)
>>> obs, reward, terminated, truncated, info = env.step(0)
>>> reward
1.0
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["CostlyCartPole"]

COSTS = ("sleep", "busy")


class CostlyCartPole(CartPoleEnv):
    """CartPole-v1 whose ``step`` takes at least ``step_ms`` ms more, spent as ``cost``."""

    def __init__(self, step_ms: float = 1.0, cost: str = "sleep", **kwargs: Any):
        if cost not in COSTS:
            raise ValueError(f"cost must be one of {', '.join(COSTS)}, got {cost!r}")
        if not step_ms >= 0:
            raise ValueError(f"step_ms must be >= 0, got {step_ms!r}")
        super().__init__(**kwargs)
        self.step_s, self.cost = step_ms / 1000.0, cost

    def step(self, action: Any) -> tuple:
        if self.cost == "sleep":
            time.sleep(self.step_s)
        else:
            deadline = time.perf_counter() + self.step_s
            while time.perf_counter() < deadline:
                pass
        return super().step(action)


if "CostlyCartPole-v0" not in gym.registry:
    gym.register("CostlyCartPole-v0", entry_point=CostlyCartPole, max_episode_steps=500, reward_threshold=475.0)
