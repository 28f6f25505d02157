"""REINFORCE on discrete actions, as fragments: the algorithm of the tutorial (docs/tutorial.md)."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl import Episodes, EpisodeTracker, Manifest, RoleContext, fragment, iteration, role

ACTION_SPACES = (gym.spaces.Discrete,)


@dataclass
class Config:  # the graph's hyperparameters
    steps: int = 64  # env steps per env per rollout
    gamma: float = 0.99
    lr: float = 1e-2


def policy(ctx: RoleContext) -> nn.Module:
    n_obs, n_act = int(np.prod(ctx.observation_space.shape)), int(ctx.action_space.n)
    return nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, n_act))


@dataclass
class Sampler:  # a sampler's state: its envs and its copy of the policy
    cfg: Config
    envs: gym.vector.VectorEnv
    net: nn.Module
    obs: np.ndarray
    tracker: EpisodeTracker


@dataclass
class Learner:  # the learner's state; state_dict is what a checkpoint holds
    net: nn.Module
    optimizer: torch.optim.Optimizer

    def state_dict(self) -> dict:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.net.load_state_dict(sd["net"])
        self.optimizer.load_state_dict(sd["optimizer"])


@dataclass
class Rollout:  # what a sampler sends; dagrl counts env_steps and the finished episodes
    obs: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    episodes: Episodes
    env_steps: int


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> Sampler:
    envs, obs, _ = ctx.start_envs()
    return Sampler(cfg, envs, policy(ctx), obs, EpisodeTracker(envs.num_envs))


@role("learner")
def learner(ctx: RoleContext, cfg: Config) -> Learner:
    torch.manual_seed(ctx.seed)
    net = policy(ctx)
    return Learner(net, torch.optim.Adam(net.parameters(), lr=cfg.lr))


@fragment(role="learner")
def publish(state: Learner) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in state.net.state_dict().items()}


@fragment(role="sampler")
def collect(state: Sampler, weights: dict[str, np.ndarray]) -> Rollout:
    cfg, n = state.cfg, state.envs.num_envs
    state.net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    obs, actions, rewards, dones = [], [], [], []
    for _ in range(cfg.steps):
        with torch.no_grad():
            logits = state.net(torch.as_tensor(state.obs, dtype=torch.float32))
        action = torch.distributions.Categorical(logits=logits).sample().numpy()
        obs.append(state.obs)
        actions.append(action)
        state.obs, reward, terminated, truncated, _ = state.envs.step(action)
        rewards.append(reward)
        dones.append(terminated | truncated)
        state.tracker.step(reward, terminated | truncated)
    returns, ret = np.zeros((cfg.steps, n), np.float32), np.zeros(n, np.float32)
    for t in reversed(range(cfg.steps)):  # discounted returns to go, cut where an episode ends
        ret = returns[t] = rewards[t] + cfg.gamma * ret * (1 - dones[t])
    flat = np.concatenate(obs), np.concatenate(actions), returns.reshape(-1)
    return Rollout(*flat, state.tracker.take(), cfg.steps * n)


@fragment(role="learner")
def update(state: Learner, rollouts: list[Rollout]) -> dict[str, float]:
    obs, actions, returns = (torch.as_tensor(np.concatenate([getattr(r, k) for r in rollouts])) for k in
                             ("obs", "actions", "returns"))  # fmt: skip
    advantage = (returns - returns.mean()) / (returns.std() + 1e-8)  # a baseline, and one scale
    log_prob = torch.distributions.Categorical(logits=state.net(obs.float())).log_prob(actions)
    loss = -(log_prob * advantage).mean()
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.step()
    return {"losses/policy": loss.item()}


@iteration
def train_iteration():
    return update(collect(publish()))


ALGORITHM = Manifest(config=Config, roles=[sampler, learner], iteration=train_iteration, action_spaces=ACTION_SPACES)
