"""Rollouts of an on-policy sampler: what one holds, generalised advantage estimation, and
:class:`Steps`, the toolkit a sampler collects with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from dagrl.envs.episodes import Episodes
from dagrl.nn.networks import obs_array


@dataclass
class Rollout:
    """``num_steps`` steps of ``N`` envs, collected with the weights of one learner version."""

    obs: np.ndarray  # [T, N, *obs_shape]
    actions: np.ndarray  # [T, N, *act_shape]
    logprobs: np.ndarray  # [T, N], behaviour policy
    rewards: np.ndarray  # [T, N], raw; truncated episodes bootstrapped with the behaviour critic
    dones: np.ndarray  # [T, N], the episode ended at this step
    last_obs: np.ndarray  # [N, *obs_shape]
    episodes: Episodes
    env_steps: int
    disc_returns: np.ndarray | None = None  # [T, N], running discounted returns (``norm_reward`` only)


def gae(
    rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last_value: np.ndarray, gamma: float, lam: float
) -> np.ndarray:
    """Generalised advantage estimates for ``[T, N]`` arrays; ``dones[t]`` cuts the bootstrap after t."""
    adv = np.zeros_like(values)
    running = np.zeros_like(last_value)
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * live - values[t]
        running = delta + gamma * lam * live * running
        adv[t] = running
    return adv


R = TypeVar("R", bound="Rollout")


class Steps:
    """The ``[T, N]`` buffers a PPO-style sampler fills over one rollout, and the bookkeeping of each env
    step: episode statistics, the running discounted return (``norm_reward``), and the bootstrap of an
    episode a time limit cut. The sampler picks the actions; :meth:`take` steps the envs with them."""

    def __init__(self, state: Any, box: bool, norm_reward: bool) -> None:
        cfg, envs = state.cfg, state.envs
        T, N = cfg.num_steps, envs.num_envs
        self.gamma, self.box, self.space = cfg.gamma, box, envs.single_action_space
        self.obs = np.zeros((T, N, *state.obs.shape[1:]), obs_array(state.obs).dtype)  # images stay uint8
        self.actions = np.zeros((T, N, *self.space.shape), self.space.dtype)
        self.logprobs = np.zeros((T, N), np.float32)
        self.rewards = np.zeros((T, N), np.float32)
        self.dones = np.zeros((T, N), np.float32)
        self.disc_returns = np.zeros((T, N), np.float32) if norm_reward else None

    def take(
        self,
        t: int,
        state: Any,
        actions: np.ndarray,
        logprobs: np.ndarray,
        tail_value: Callable[[np.ndarray, np.ndarray], np.ndarray],
    ) -> np.ndarray:
        """Step the envs from ``state.obs`` with ``actions`` and record step ``t``; returns where an episode
        ended. ``tail_value(rows, final_obs)`` values, in raw reward units, the last observations of the
        envs ``rows`` whose episode a time limit cut (not ended): their reward gets its discounted tail."""
        obs = state.obs
        state.obs, *stepped = state.envs.step(self.env_actions(actions))
        return self.record(t, slice(None), state, obs, (actions, logprobs), (state.obs, *stepped), tail_value)

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The actions as the envs take them: clipped to a ``Box`` action space's bounds."""
        return np.clip(actions, self.space.low, self.space.high) if self.box else actions

    def record(
        self,
        t: int,
        rows: slice,
        state: Any,
        obs: np.ndarray,
        picked: tuple[np.ndarray, np.ndarray],
        stepped: tuple,
        tail_value: Callable[[np.ndarray, np.ndarray], np.ndarray],
    ) -> np.ndarray:
        """Record step ``t`` of the envs ``rows``: from observations ``obs`` with ``picked`` (actions,
        log-probs), which gave ``stepped`` (the vector env's step for those envs); returns where an
        episode ended (of ``rows``). A double-buffered sampler records each group of its envs in turn
        (:func:`dagrl.envs.double_buffer.step_in_groups`); ``tail_value`` as in :meth:`take`, its
        ``rows`` the envs' own indices."""
        (actions, logprobs), (_, reward, terminated, truncated, info) = picked, stepped
        self.obs[t, rows], self.actions[t, rows], self.logprobs[t, rows] = obs, actions, logprobs
        rewards, done = self.rewards[t, rows], terminated | truncated
        rewards[:] = reward
        self.dones[t, rows] = done
        state.episodes.step(reward, done, rows)
        disc_return = state.disc_return[rows]  # a view: updated in place
        if self.disc_returns is not None:
            disc_return *= self.gamma
            disc_return += reward
            self.disc_returns[t, rows] = disc_return
        cut = truncated & ~terminated
        if cut.any():
            local = np.flatnonzero(cut)
            final = np.stack([info["final_obs"][i] for i in local])
            rewards[cut] += self.gamma * tail_value(np.arange(len(state.disc_return))[rows][local], final)
        disc_return[done] = 0.0
        return done

    def rollout(self, sampler: Any, kind: type[R], **extra: object) -> R:
        """The rollout of the steps taken, ``extra`` fields added (a subclass's)."""
        T, N = self.rewards.shape
        return kind(
            self.obs, self.actions, self.logprobs, self.rewards, self.dones, obs_array(sampler.obs),
            sampler.episodes.take(), T * N, self.disc_returns, **extra,
        )  # fmt: skip
