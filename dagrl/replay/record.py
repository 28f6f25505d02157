"""Recording vector-env steps as replay rows, with the true last observation of finished episodes."""

from __future__ import annotations

from typing import Any

import numpy as np

from dagrl.episodes import EpisodeTracker
from dagrl.replay.role import Transitions

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


class Recorder:
    """Steps a same-step-autoreset vector env and keeps what an off-policy sampler returns.

    ``next_obs`` of a step that ended an episode is ``info["final_obs"]`` (the env already shows the
    next episode's first observation); episode returns and lengths run across calls.

    Examples
    --------
    >>> from dagrl.context import RoleContext
    >>> envs = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", num_envs=2).make_envs()
    >>> rec, (obs, _) = Recorder(2), envs.reset(seed=0)
    >>> for _ in range(3):
    ...     obs = rec.step(envs, obs, envs.action_space.sample())
    >>> rec.take(envs).env_steps
    6
    """

    def __init__(self, num_envs: int):
        self.episodes = EpisodeTracker(num_envs)
        self._reset_batch()

    def _reset_batch(self) -> None:
        self.rows: dict[str, list] = {k: [] for k in FIELDS}

    def step(self, envs: Any, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Take one step of every env; return the observations to act on next."""
        new_obs, reward, terminated, truncated, info = envs.step(action)
        done = terminated | truncated
        next_obs = new_obs.copy()
        for i in np.flatnonzero(done):
            next_obs[i] = info["final_obs"][i]
        for k, v in zip(FIELDS, (obs, action, reward, next_obs, terminated, truncated), strict=True):
            self.rows[k].append(v)
        self.episodes.step(reward, done)
        return new_obs

    def take(self, envs: Any) -> Transitions:
        """The rows and finished episodes recorded since the last call, typed as the replay schema."""
        obs_dtype, act_dtype = envs.single_observation_space.dtype, envs.single_action_space.dtype
        data = {
            "obs": np.concatenate(self.rows["obs"]).astype(obs_dtype),
            "action": np.concatenate(self.rows["action"]).astype(act_dtype),
            "reward": np.concatenate(self.rows["reward"]).astype(np.float32),
            "next_obs": np.concatenate(self.rows["next_obs"]).astype(obs_dtype),
            "terminated": np.concatenate(self.rows["terminated"]),
            "truncated": np.concatenate(self.rows["truncated"]),
        }
        out = Transitions(data, self.episodes.take(), len(data["reward"]))
        self._reset_batch()
        return out
