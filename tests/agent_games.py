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


class Lottery(ParallelEnv):
    """A cooperative game where only the global state explains the return. Each step every agent sees a
    cue naming the action that scores; the team's reward is the share of agents that took it, plus a
    jackpot drawn once per episode (mean 0, std ``spread``) that no agent sees, only the state. A critic
    that reads the state (MAPPO's) can take the jackpot out of the advantages; one that reads only the
    agent's observation (IPPO's) cannot, and its advantages drown in it. Best return ``length``, random
    ``length / 2``."""

    metadata = {"name": "lottery_v0"}

    def __init__(self, agents: int = 2, length: int = 10, spread: float = 2.0):
        self.possible_agents = [f"player_{i}" for i in range(agents)]
        self.length, self.spread = length, spread
        self.state_space = spaces.Box(-np.inf, np.inf, (2 + agents,), np.float32)
        self.rng = np.random.default_rng()
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def _observe(self) -> dict:
        return {
            a: np.array([c == 0, c == 1, self.t / self.length], np.float32)
            for a, c in zip(self.agents, self.cues, strict=True)
        }

    def state(self) -> np.ndarray:
        return np.array([self.jackpot, self.t / self.length, *self.cues], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        self.jackpot = float(self.rng.normal(0.0, self.spread))
        self.cues = self.rng.integers(0, 2, len(self.agents))
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        scored = np.mean([actions[a] == c for a, c in zip(self.agents, self.cues, strict=True)])
        reward = float(scored) + self.jackpot
        self.cues = self.rng.integers(0, 2, len(self.agents))
        over = self.t >= self.length
        obs = self._observe()
        done = {a: over for a in self.agents}
        rewards = {a: reward for a in self.agents}
        infos = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, {a: False for a in done}, done, infos


class Recall(Lottery):
    """A game only a policy with memory plays well. Every agent sees a cue of its own (one of two) at the
    start of the episode, and then no more; each step it scores 1 for the action the cue named. A policy
    without memory scores the first step and guesses the rest: ``1 + (length - 1) / 2`` at best; one
    that remembers the cue scores ``length``. (Lottery without its jackpot, its cues kept and hidden.)"""

    metadata = {"name": "recall_v0"}

    def __init__(self, agents: int = 2, length: int = 4):
        super().__init__(agents, length, spread=0.0)

    def _observe(self) -> dict:
        shown = self.t == 0
        return {
            a: np.array([shown and c == 0, shown and c == 1, self.t / self.length], np.float32)
            for a, c in zip(self.agents, self.cues, strict=True)
        }

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        rewards = {a: float(actions[a] == c) for a, c in zip(self.agents, self.cues, strict=True)}
        obs, over = self._observe(), self.t >= self.length
        done = {a: over for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, {a: False for a in done}, done, {a: {} for a in done}
