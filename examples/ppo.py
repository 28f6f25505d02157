"""PPO (clipped) in one file, on dagrl's public API: CleanRL's ``ppo.py``, cut into fragments.

Read top to bottom: the hyperparameters, the network, what each role keeps, the three fragments
(``publish`` the weights, ``collect`` a rollout, ``update`` on the rollouts) and the iteration that wires
them. Nothing here knows how it runs: ``examples/ppo-cartpole.yaml`` runs it under ``async``, and
``--set policy=single`` (one process) or ``--set policy=sync`` (lockstep on a cluster) changes no line.

Under ``async`` a rollout may come from weights a few updates old. The ratio is taken against the
log-probs the sampler acted with, and advantages are computed on the learner with its current critic,
so a stale rollout is corrected as APPO corrects it.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl import Episodes, EpisodeTracker, Manifest, RoleContext, fragment, iteration, role

# ---------------------------------------------------------------------------------------------------
# Hyperparameters: a graph's `hyperparameters` set them (rl-zoo's CartPole values by default)
# ---------------------------------------------------------------------------------------------------


@dataclass
class Config:
    num_steps: int = 32  # env steps per env per rollout
    gamma: float = 0.98
    gae_lambda: float = 0.8
    lr: float = 1e-3
    update_epochs: int = 20
    minibatch_size: int = 256
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64


# ---------------------------------------------------------------------------------------------------
# The network: a policy head and a value head on separate MLPs, orthogonal init (as CleanRL's)
# ---------------------------------------------------------------------------------------------------


def layer(n_in: int, n_out: int, std: float = np.sqrt(2)) -> nn.Linear:
    out = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(out.weight, std)
    nn.init.zeros_(out.bias)
    return out


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int, hidden: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer(n_obs, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(), layer(hidden, 1, 1.0)
        )
        self.actor = nn.Sequential(
            layer(n_obs, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(), layer(hidden, n_actions, 0.01)
        )

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(obs))


def agent(ctx: RoleContext, cfg: Config) -> Agent:
    torch.manual_seed(ctx.seed)
    return Agent(int(np.prod(ctx.observation_space.shape)), int(ctx.action_space.n), cfg.hidden)


# ---------------------------------------------------------------------------------------------------
# What each role keeps: a sampler its envs and a copy of the agent, the learner the agent and Adam
# ---------------------------------------------------------------------------------------------------


@dataclass
class SamplerState:
    cfg: Config
    envs: gym.vector.VectorEnv
    agent: Agent
    obs: np.ndarray
    tracker: EpisodeTracker
    gen: torch.Generator  # its own random stream: the same actions in one process or on a cluster


@dataclass
class LearnerState:
    cfg: Config
    agent: Agent
    optimizer: torch.optim.Optimizer
    gen: torch.Generator  # minibatch order

    def state_dict(self) -> dict:  # what a checkpoint holds and a rollback restores
        return {"agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict(), "gen": self.gen.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.agent.load_state_dict(sd["agent"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.gen.set_state(sd["gen"])


@dataclass
class Rollout:  # a sampler's output; dagrl counts its env_steps and finished episodes
    obs: np.ndarray  # (T, N, obs)
    actions: np.ndarray  # (T, N)
    logprobs: np.ndarray  # (T, N): the behaviour policy's
    rewards: np.ndarray  # (T, N)
    dones: np.ndarray  # (T, N): the episode ended at this step
    last_obs: np.ndarray  # (N, obs): to bootstrap from
    episodes: Episodes
    env_steps: int


@role("sampler", many=True)  # the graph says how many; a lost one is replaced
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs, obs, _ = ctx.start_envs()
    gen = torch.Generator().manual_seed(ctx.seed)
    return SamplerState(cfg, envs, agent(ctx, cfg), obs, EpisodeTracker(envs.num_envs), gen)


@role("learner")  # one; a lost one rolls the run back to its last checkpoint
def learner(ctx: RoleContext, cfg: Config) -> LearnerState:
    net = agent(ctx, cfg)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, eps=1e-5)
    return LearnerState(cfg, net, optimizer, torch.Generator().manual_seed(ctx.seed))


# ---------------------------------------------------------------------------------------------------
# Fragments
# ---------------------------------------------------------------------------------------------------


@fragment(role="learner")
def publish(state: LearnerState) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in state.agent.state_dict().items()}


@fragment(role="sampler")
def collect(state: SamplerState, weights: dict[str, np.ndarray]) -> Rollout:
    cfg, n = state.cfg, state.envs.num_envs
    state.agent.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    obs, actions, logprobs, rewards, dones = [], [], [], [], []
    for _ in range(cfg.num_steps):
        with torch.no_grad():
            dist = state.agent.dist(torch.as_tensor(state.obs, dtype=torch.float32))
            action = torch.multinomial(dist.probs, 1, generator=state.gen).squeeze(1)
        obs.append(state.obs)
        actions.append(action.numpy())
        logprobs.append(dist.log_prob(action).numpy())
        state.obs, reward, terminated, truncated, _ = state.envs.step(action.numpy())
        rewards.append(reward.astype(np.float32))
        dones.append(terminated | truncated)
        state.tracker.step(reward, terminated | truncated)
    stacked = (np.stack(x) for x in (obs, actions, logprobs, rewards, dones))
    return Rollout(*stacked, state.obs.copy(), state.tracker.take(), cfg.num_steps * n)


def gae(rewards, values, dones, last_value, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates, cut where an episode ended (``dones[t]``: after step t)."""
    advantages, running = np.zeros_like(rewards), np.zeros_like(last_value)
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * alive - values[t]
        running = advantages[t] = delta + gamma * lam * alive * running
    return advantages


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[Rollout]) -> dict[str, float]:
    cfg, net = state.cfg, state.agent
    obs, actions, logprobs, advantages, returns = [], [], [], [], []
    with torch.no_grad():  # advantages from the current critic, whichever weights collected them
        for r in rollouts:
            o = torch.as_tensor(r.obs, dtype=torch.float32)
            values = net.value(o).numpy()
            last = net.value(torch.as_tensor(r.last_obs, dtype=torch.float32)).numpy()
            adv = gae(r.rewards, values, r.dones, last, cfg.gamma, cfg.gae_lambda)
            obs.append(o.flatten(0, 1))
            actions.append(torch.as_tensor(r.actions).flatten())
            logprobs.append(torch.as_tensor(r.logprobs).flatten())
            advantages.append(torch.as_tensor(adv).flatten())
            returns.append(torch.as_tensor(adv + values).flatten())
    b_obs, b_act, b_logp = torch.cat(obs), torch.cat(actions), torch.cat(logprobs)
    b_adv, b_ret = torch.cat(advantages), torch.cat(returns)
    batch = len(b_obs)
    mb = min(cfg.minibatch_size, batch)
    for _ in range(cfg.update_epochs):
        order = torch.randperm(batch, generator=state.gen)
        for start in range(0, batch - mb + 1, mb):
            idx = order[start : start + mb]
            dist = net.dist(b_obs[idx])
            ratio = (dist.log_prob(b_act[idx]) - b_logp[idx]).exp()
            adv = b_adv[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
            v_loss = 0.5 * ((net.value(b_obs[idx]) - b_ret[idx]) ** 2).mean()
            entropy = dist.entropy().mean()
            loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
            state.optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), cfg.max_grad_norm)
            state.optimizer.step()
    return {"losses/policy": pg_loss.item(), "losses/value": v_loss.item(), "losses/entropy": entropy.item()}


# ---------------------------------------------------------------------------------------------------
# One training iteration, and what dagrl runs of this file
# ---------------------------------------------------------------------------------------------------


@iteration
def train_iteration():
    return update(collect(publish()))


ALGORITHM = Manifest(
    config=Config, roles=[sampler, learner], iteration=train_iteration, action_spaces=(gym.spaces.Discrete,)
)
