"""A small PettingZoo parallel env whose agents join late and leave early, with two groups of
different spaces: what the multi-agent adapter and algorithms must handle beyond MPE."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

RUNNERS = ("runner_0", "runner_1")
SCOUT = "scout_0"


class Relay(ParallelEnv):
    """``runner_0`` and ``scout_0`` start; ``runner_1`` joins after step 2; ``runner_0`` terminates at
    step 3; every agent left is truncated at step ``length``. A runner earns 1 for action 1, the scout 1
    for action 2. Runners see ``[t, index, 1]``, the scout ``[t, 7]``; the state is ``[t, agents in play]``."""

    metadata = {"name": "relay_v0"}

    def __init__(self, length: int = 5):
        self.length = length
        self.possible_agents = [*RUNNERS, SCOUT]
        self.state_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.t = 0
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (2,) if agent == SCOUT else (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3 if agent == SCOUT else 2)

    def _obs(self, agent: str) -> np.ndarray:
        if agent == SCOUT:
            return np.array([self.t, 7], np.float32)
        return np.array([self.t, RUNNERS.index(agent), 1], np.float32)

    def state(self) -> np.ndarray:
        return np.array([self.t, len(self.agents)], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = ["runner_0", SCOUT]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        rewards = {a: float(actions[a] == (2 if a == SCOUT else 1)) for a in self.agents}
        terminated = {a: a == "runner_0" and self.t == 3 for a in self.agents}
        truncated = {a: self.t >= self.length for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminated[a] or truncated[a])]
        if self.t == 2 and self.t < self.length:
            self.agents.insert(1, "runner_1")
            obs["runner_1"] = self._obs("runner_1")
        return obs, rewards, terminated, truncated, infos
