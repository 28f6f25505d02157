"""Evaluating a policy on whole episodes: the shared part of every algorithm's ``evaluator`` role.

An algorithm's evaluator state is an :class:`EpisodeRunner` holding its envs and its policy network;
its ``evaluate`` fragment loads the published weights and calls :meth:`EpisodeRunner.run` with an
action function: the deterministic one (argmax, the Gaussian's mean, ...), or with
:attr:`EpisodeRunner.deterministic` off the stochastic one :meth:`EpisodeRunner.pick` chooses (a sample of
the policy; a value-based policy's epsilon-greedy action, as Stable-Baselines3's ``predict`` gives).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch


@dataclass
class EpisodeRunner:
    envs: Any
    """A vector env from ``RoleContext.make_envs`` (autoreset in the same step)."""
    net: torch.nn.Module
    seed: int
    episodes: int
    calls: int = 0
    last_returns: list[float] = field(default_factory=list)
    """The returns of the last call's episodes, in the order they ended (``dagrl eval`` lists them)."""
    last_lengths: list[int] = field(default_factory=list)
    capture: bool = False
    """``run`` keeps the action function it is given in :attr:`captured` and plays nothing (``dagrl export``)."""
    captured: Callable[[torch.Tensor], torch.Tensor] | None = None
    deterministic: bool = True
    """Act by the deterministic action function; off: by the stochastic one (``dagrl eval --stochastic``)."""
    epsilon: float = 0.0
    """A value-based policy's chance of a uniform random action when not :attr:`deterministic` (the run's
    final epsilon)."""
    gen: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    """What stochastic actions are drawn from (seeded from :attr:`seed` by :meth:`run`)."""

    def pick(self, greedy: Callable[..., Any], sample: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """``greedy`` when :attr:`deterministic`, else ``sample`` (``None``: ``greedy`` epsilon-greedily)."""
        if self.deterministic:
            return greedy
        return sample if sample is not None else self.epsilon_greedy(greedy)

    def epsilon_greedy(self, greedy: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """``greedy``'s actions, each replaced with chance :attr:`epsilon` by a uniform one (``Discrete``)."""
        n = int(self.envs.single_action_space.n)

        def act(x: torch.Tensor) -> torch.Tensor:
            action = greedy(x)
            explore = torch.rand(action.shape, generator=self.gen) < self.epsilon
            return torch.where(explore, torch.randint(0, n, action.shape, generator=self.gen), action)

        return act

    def run(
        self, act: Callable[[torch.Tensor], torch.Tensor], ended: Callable[[np.ndarray], None] | None = None
    ) -> dict[str, float]:
        """``episodes`` whole episodes from fresh resets (new seeds each call); their mean and spread.

        ``ended``, for a policy that carries a state between steps (a recurrent one): called after
        every step with the mask of envs whose episode ended, whose next observation starts a new one."""
        if self.capture:
            self.captured = act
            return {}
        envs = self.envs
        self.calls += 1
        self.gen.manual_seed(self.seed + 10_000 * self.calls)
        obs, _ = envs.reset(seed=[self.seed + 10_000 * self.calls + i for i in range(envs.num_envs)])
        space = envs.single_action_space
        running, steps = np.zeros(envs.num_envs), np.zeros(envs.num_envs, np.int64)
        returns: list[float] = []
        lengths: list[int] = []
        with torch.no_grad():
            while len(returns) < self.episodes:
                action = act(torch.as_tensor(obs, dtype=torch.float32)).numpy()
                if isinstance(space, gym.spaces.Box):
                    action = np.clip(action, space.low, space.high)
                obs, reward, terminated, truncated, _ = envs.step(action)
                running += reward
                steps += 1
                done = terminated | truncated
                returns.extend(running[done].tolist())
                lengths.extend(steps[done].tolist())
                running[done] = 0.0
                steps[done] = 0
                if ended is not None:
                    ended(done)
        self.last_returns, self.last_lengths = returns[: self.episodes], lengths[: self.episodes]
        out = np.asarray(self.last_returns)
        return {"eval/return_mean": float(out.mean()), "eval/return_std": float(out.std())}
