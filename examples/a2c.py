"""Advantage actor-critic (A2C), as fragments: the smallest whole algorithm to copy when writing one.

A file like this is all an algorithm is: hyperparameters, networks, role states, fragments and one
iteration, in plain torch and numpy. It never imports Dask; ``examples/a2c-cartpole.yaml`` names it
(``algorithm: examples.a2c``) and chooses how it is distributed, and ``--set policy=single`` runs the
same file in one process. For what the built-in algorithms add (minibatch epochs, image encoders,
observation statistics, central inference), read ``dagrl/algos/ppo.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl import Episodes, EpisodeTracker, Manifest, RoleContext, evaluation, fragment, iteration, role
from dagrl.algos.common.evaluation import EpisodeRunner

ACTION_SPACES = (gym.spaces.Discrete,)
"""A graph whose env acts otherwise is refused before anything starts."""

Weights = dict[str, np.ndarray]


@dataclass
class Config:
    num_steps: int = 16
    """Env steps per env per rollout."""
    gamma: float = 0.99
    """Discount factor."""
    lr: float = 1e-3
    """Adam learning rate."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    hidden: int = 64
    """Units of each of the two hidden layers."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), acting greedily."""


class ActorCritic(nn.Module):
    """A policy and a value MLP over vector observations."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: int):
        super().__init__()
        n = int(np.prod(obs_space.shape))

        def mlp(n_out: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Flatten(),
                nn.Linear(n, hidden),
                nn.Tanh(),
                nn.Linear(hidden, hidden),
                nn.Tanh(),
                nn.Linear(hidden, n_out),
            )

        self.actor, self.critic = mlp(int(act_space.n)), mlp(1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs).argmax(-1)


@dataclass
class Rollout:
    """``num_steps`` steps of ``N`` envs. ``env_steps`` and ``episodes`` are what dagrl counts."""

    obs: np.ndarray  # [T, N, *obs_shape]
    actions: np.ndarray  # [T, N]
    rewards: np.ndarray  # [T, N]; an episode cut by a time limit has its tail's value added
    dones: np.ndarray  # [T, N]
    last_obs: np.ndarray  # [N, *obs_shape]
    episodes: Episodes
    env_steps: int


@dataclass
class SamplerState:
    cfg: Config
    envs: gym.vector.VectorEnv
    net: ActorCritic
    obs: np.ndarray
    episodes: EpisodeTracker
    gen: torch.Generator


@dataclass
class LearnerState:
    cfg: Config
    net: ActorCritic
    optimizer: torch.optim.Optimizer
    ctx: RoleContext
    """Averages gradients over data-parallel learner replicas (``policy: dp-learners``); else a no-op."""

    def state_dict(self) -> dict:  # what a checkpoint holds, and a rollback or resume restores
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.net.load_state_dict(sd["net"])
        self.optimizer.load_state_dict(sd["optimizer"])


@role("sampler", many=True)  # replicated by the graph's roles.sampler.replicas; a lost one is replaced
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs, obs, _ = ctx.start_envs()
    net = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden)
    return SamplerState(cfg, envs, net, obs, EpisodeTracker(envs.num_envs), torch.Generator().manual_seed(ctx.seed))


@role("learner")  # one; a lost one rolls the run back to its last checkpoint
def learner(ctx: RoleContext, cfg: Config) -> LearnerState:
    with ctx.seeded():  # initial weights from the role's seed
        net = ActorCritic(ctx.observation_space, ctx.action_space, cfg.hidden).to(ctx.device)
    return LearnerState(cfg, net, torch.optim.Adam(net.parameters(), lr=cfg.lr), ctx)


@role("evaluator", recover="replace")  # started only when the graph's evaluate.every asks for it
def evaluator(ctx: RoleContext, cfg: Config) -> EpisodeRunner:
    envs = ctx.make_envs()
    return EpisodeRunner(
        envs,
        ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden),
        ctx.seed,
        cfg.eval_episodes,
    )


@fragment(role="learner")
def publish(state: LearnerState) -> Weights:
    """The learner's weights as CPU numpy arrays: what crosses to the samplers."""
    return {k: v.detach().cpu().numpy().copy() for k, v in state.net.state_dict().items()}


@fragment(role="sampler")
def collect(state: SamplerState, weights: Weights) -> Rollout:
    """Step every env ``num_steps`` times, sampling actions from the given weights."""
    cfg, envs, net = state.cfg, state.envs, state.net
    net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    T, N = cfg.num_steps, envs.num_envs
    obs = np.zeros((T, N, *state.obs.shape[1:]), np.float32)
    actions, rewards, dones = np.zeros((T, N), np.int64), np.zeros((T, N), np.float32), np.zeros((T, N), np.float32)
    with torch.no_grad():
        for t in range(T):
            obs[t] = state.obs
            probs = net.dist(torch.as_tensor(state.obs, dtype=torch.float32)).probs
            actions[t] = torch.multinomial(probs, 1, generator=state.gen).squeeze(1).numpy()
            state.obs, reward, terminated, truncated, info = envs.step(actions[t])
            rewards[t], dones[t] = reward, terminated | truncated
            state.episodes.step(reward, terminated | truncated)
            for i in np.flatnonzero(truncated & ~terminated):  # cut by a time limit: bootstrap its tail
                final = torch.as_tensor(info["final_obs"][i], dtype=torch.float32)[None]
                rewards[t, i] += cfg.gamma * float(net.value(final))
    return Rollout(obs, actions, rewards, dones, state.obs.astype(np.float32), state.episodes.take(), T * N)


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[Rollout]) -> dict[str, float]:
    """One gradient step on every sampler's rollout: n-step returns bootstrapped from the critic."""
    cfg, net = state.cfg, state.net
    device = next(net.parameters()).device
    obs, actions, returns = [], [], []
    for r in rollouts:
        with torch.no_grad():
            ret = net.value(torch.as_tensor(r.last_obs, device=device)).cpu().numpy()
        out = np.zeros_like(r.rewards)
        for t in reversed(range(len(r.rewards))):
            ret = r.rewards[t] + cfg.gamma * ret * (1.0 - r.dones[t])
            out[t] = ret
        obs.append(r.obs.reshape(-1, *r.obs.shape[2:]))
        actions.append(r.actions.reshape(-1))
        returns.append(out.reshape(-1))
    obs, actions, returns = (torch.as_tensor(np.concatenate(x), device=device) for x in (obs, actions, returns))
    dist, value = net.dist(obs), net.value(obs)
    advantage = (returns - value).detach()
    pg_loss = -(dist.log_prob(actions) * advantage).mean()
    v_loss, entropy = ((returns - value) ** 2).mean(), dist.entropy().mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
    state.optimizer.zero_grad()
    loss.backward()
    state.ctx.average_gradients(net.parameters())  # replicas under dp-learners step alike
    nn.utils.clip_grad_norm_(net.parameters(), 0.5)
    state.optimizer.step()
    return {
        "losses/policy": pg_loss.item(),
        "losses/value": v_loss.item(),
        "losses/entropy": entropy.item(),
        "perf/frames": float(len(returns)),  # samples learnt from: the update frame rate on the RL page
    }


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Weights) -> dict[str, float]:
    """``eval_episodes`` whole episodes acting greedily."""
    state.net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    return state.run(state.net.greedy)


@evaluation
def eval_iteration():
    return evaluate(publish())


@iteration
def train_iteration():
    return update(collect(publish()))


ALGORITHM = Manifest(  # what dagrl runs of this module
    config=Config,
    roles=[sampler, learner, evaluator],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
)
