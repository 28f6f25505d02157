"""Recording vector-env steps as replay rows, with the true last observation of finished episodes,
as one-step or n-step transitions."""

from __future__ import annotations

from typing import Any

import numpy as np

from dagrl.envs.episodes import EpisodeTracker
from dagrl.replay.nstep import NStep
from dagrl.replay.role import Transitions

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


class Recorder:
    """Steps a same-step-autoreset vector env and keeps what an off-policy sampler returns.

    ``next_obs`` of a step that ended an episode is ``info["final_obs"]`` (the env already shows the
    next episode's first observation); episode returns and lengths run across calls.

    With ``n_step > 1`` each row folds up to ``n_step`` steps of one env (:class:`NStep`) and has a
    ``discount`` field, ``gamma ** steps folded``; a row leaves once its ``n_step`` steps are taken or
    its episode ends, so a call returns rows for the steps it took, some of them begun in the call
    before, and rows still open when a sampler is replaced are lost with it. ``env_steps`` counts the
    env steps taken either way.

    Examples
    --------
    >>> from dagrl.core.context import RoleContext
    >>> envs = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", num_envs=2).make_envs()
    >>> rec, (obs, _) = Recorder(2), envs.reset(seed=0)
    >>> for _ in range(3):
    ...     obs = rec.step(envs, obs, envs.action_space.sample())
    >>> rec.take(envs).env_steps
    6
    """

    def __init__(self, num_envs: int, n_step: int = 1, gamma: float = 0.99):
        self.episodes = EpisodeTracker(num_envs)
        self.nstep = NStep(n_step, gamma, num_envs) if n_step > 1 else None
        self.fields = (*FIELDS, "discount") if self.nstep is not None else FIELDS
        self._reset_batch()

    def _reset_batch(self) -> None:
        self.rows: dict[str, list] = {k: [] for k in self.fields}
        self.env_steps = 0

    def step(self, envs: Any, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Take one step of every env; return the observations to act on next."""
        new_obs, reward, terminated, truncated, info = envs.step(action)
        done = terminated | truncated
        next_obs = new_obs.copy()
        for i in np.flatnonzero(done):
            next_obs[i] = info["final_obs"][i]
        step = (obs, action, reward, next_obs, terminated, truncated)
        rows = dict(zip(FIELDS, step, strict=True)) if self.nstep is None else self.nstep.push(*step)
        for k in self.fields:
            self.rows[k].append(rows[k])
        self.env_steps += len(reward)
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
        if self.nstep is not None:
            data["discount"] = np.concatenate(self.rows["discount"])
        out = Transitions(data, self.episodes.take(), self.env_steps)
        self._reset_batch()
        return out
