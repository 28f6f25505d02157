"""What MAPPO and IPPO share: PPO for the agents of a PettingZoo game (:mod:`dagrl.envs.agents`).

A game's observation has a row per agent: its own observation, its one-hot index and the global
state (:class:`~dagrl.envs.agents.AgentsBox`). Agents of one group act with one policy network,
which reads the agent's own observation (and its index, when the group has several agents, so that
they may still act differently); ``share_parameters: false`` gives every agent a network of its own.
Each group has a critic: a *central* one (MAPPO) reads the whole row, global state included, which
only training needs; a *local* one (IPPO) reads what the policy reads. Acting never needs the state.

The update is PPO's clipped loss over every agent-step of the rollouts, minus the steps of agents
that were not in the game (left early, not yet joined). Advantages are per agent, from that agent's
own reward and values; an agent's episode ends where it left the game.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.actor_critic import (
    LearnerState,
    Metrics,
    Weights,
    end_update,
    evaluator_of,
    learner_of,
    publish,
    start_update,
)
from dagrl.algos.common.epochs import clipped_loss, proximal, train_epochs
from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.algos.common.hyperparameters import ClippedPPO
from dagrl.algos.common.rollouts import gae
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, iteration, role
from dagrl.core.schema import at_least
from dagrl.envs.agents import AgentsBox, agent_step
from dagrl.envs.episodes import Episodes, EpisodeTracker
from dagrl.nn.networks import RunningNorm

__all__ = [  # what a multi-agent algorithm module is made of (mappo.py, ippo.py: a star import)
    "ACTION_SPACES", "MULTI_AGENT", "Config", "collect", "eval_iteration", "evaluate", "evaluator", "learner",
    "publish", "sampler", "train_iteration", "update",
]  # fmt: skip

ACTION_SPACES = (gym.spaces.MultiDiscrete, gym.spaces.Box)
"""A game's joint action: one ``Discrete`` choice per agent, or a ``Box`` row per agent."""

MULTI_AGENT = True
"""An algorithm module that re-exports this trains the agents of a PettingZoo game (``env.api: pettingzoo``)."""


@dataclass
class Config(ClippedPPO):
    """MAPPO's and IPPO's hyperparameters: :class:`~dagrl.algos.common.hyperparameters.ClippedPPO`'s,
    with the MAPPO paper's MPE settings as defaults (25 env steps per game per rollout, ``gamma`` 0.99,
    ``gae_lambda`` 0.95, ``lr`` 7e-4, 10 epochs, entropy 0.01, gradient norm 10), and these.
    ``minibatch_size`` counts agent-steps."""

    num_steps: int = 25
    gamma: float = 0.99
    gae_lambda: float = 0.95
    lr: float = 7e-4
    update_epochs: int = 10
    minibatch_size: int = 1024
    ent_coef: float = 0.01
    max_grad_norm: float = 10.0
    share_parameters: bool = True
    """Agents of one group (``env.groups``) share one policy and one critic; ``false``: a network per agent."""
    norm_value: bool = False
    """Learn each group's values standardised by the running mean and std of its returns, as MAPPO's
    value normalisation; the statistics are buffers of the network (published, checkpointed). Off by
    default: on simple_spread with these defaults it learned slower (mean return -22.2 against -20.3
    after 200k env steps, one seed each, lr 3e-4; -22.1 against -20.2 at 120k with lr 7e-4 and 32
    envs per sampler)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """The hidden layers' nonlinearity, in the policies and the critics. MAPPO's own code uses ``relu``; on
    simple_spread it learned slower here (-18.0 against -17.1 over 0.5-1M env steps, seed 1)."""
    layer_norm: Literal["none", "input", "all"] = "input"
    """LayerNorms in the policies and the critics: ``input``, over each network's input (MAPPO's own
    code's feature normalisation); ``all``, also after each hidden layer's activation (its MLP's
    layout). On simple_spread with 16 games per update, mean training return over 0.5-1M env steps:
    ``input`` -15.4 and -15.3 (seeds 1, 2), ``none`` -17.1 and -17.7, ``all`` -15.8 (seed 1; -16.9 with
    ``relu``); over 3.5-4M, ``input`` and ``none`` end level (-13.0 and -12.7, seed 1)."""
    critic: Literal["central", "local"] = "central"
    """``central``: each critic reads the global state too (MAPPO); ``local``: only what the agent sees (IPPO)."""
    team_reward: bool = False
    """Every agent learns from the sum of the step's rewards of all agents in its game, as MAPPO's copy of
    MPE shares its reward (``shared_reward``); the returns logged stay each agent's own. Off by default: on
    simple_spread (whose logged return the shared reward is an affine function of) it learned slower, -13.8
    against -11.8 over 0.5-1M env steps (``mappo-spread-single``, seed 1): each agent's reward then also
    carries the others' collisions, a noisier signal of what its own actions did."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), every agent acting greedily."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "eval_episodes")

    def check_spaces(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Refuse, before any cluster starts, an env that is not a multi-agent game."""
        if not isinstance(obs_space, AgentsBox):
            raise ValueError("a multi-agent algorithm needs a PettingZoo env: set env.api: pettingzoo")


def _mlp(n_in: int, hidden: int, n_out: int, gain: float, activation: str, layer_norm: str) -> nn.Sequential:
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    linears = [nn.Linear(n_in, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, n_out)]
    for layer, g in zip(linears, (np.sqrt(2), np.sqrt(2), gain), strict=True):
        nn.init.orthogonal_(layer.weight, g)
        nn.init.zeros_(layer.bias)
    layers: list[nn.Module] = [nn.LayerNorm(n_in)] if layer_norm != "none" else []
    for linear in linears[:2]:
        layers += [linear, act(), *([nn.LayerNorm(hidden)] if layer_norm == "all" else [])]
    return nn.Sequential(*layers, linears[2])


class Rows:
    """The action distribution of a batch of agent rows of several groups: log-probs and entropies per
    row, each group's from its own head (the ``dist`` :func:`~dagrl.algos.common.epochs.clipped_loss` takes)."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.distributions.Distribution]], n: int):
        self.parts, self.n = parts, n

    def _gather(self, values: list[torch.Tensor]) -> torch.Tensor:
        out = values[0].new_zeros(self.n)
        for (rows, _), v in zip(self.parts, values, strict=True):
            out = out.index_put((rows,), v)
        return out

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self._gather([dist.log_prob(actions[rows]) for rows, dist in self.parts])

    def entropy(self) -> torch.Tensor:
        return self._gather([dist.entropy() for _, dist in self.parts])


class AgentsActorCritic(nn.Module):
    """A policy and a critic per group (module docstring), over rows ``[local | one-hot | state]``.

    Methods take the rows ``[M, W]`` and, per row, the agent's index ``[M]``."""

    def __init__(
        self,
        obs_space: AgentsBox,
        act_space: gym.Space,
        hidden: int,
        share: bool,
        critic: str,
        norm_value: bool = False,
        activation: str = "tanh",
        layer_norm: str = "input",
    ):
        super().__init__()
        A, L = obs_space.n_agents, obs_space.local
        groups = obs_space.groups if share else {name: (i,) for i, name in enumerate(obs_space.agents)}
        self.names = list(groups)
        self.box = isinstance(act_space, gym.spaces.Box)
        self.L, self.A = L, A
        self.register_buffer("group", torch.zeros(A, dtype=torch.long), persistent=False)
        self.sizes, self.onehot, self.n_act = [], [], []
        actors, critics, log_stds = [], [], []
        for g, members in enumerate(groups.values()):
            self.group[list(members)] = g
            size = obs_space.local_sizes[members[0]]
            onehot = len(members) > 1  # agents sharing a network are told apart by their index
            n_in = size + (A if onehot else 0)
            n_act = int(act_space.shape[1]) if self.box else int(act_space.nvec[members[0]])
            self.sizes.append(size)
            self.onehot.append(onehot)
            self.n_act.append(n_act)
            actors.append(_mlp(n_in, hidden, n_act, 0.01, activation, layer_norm))
            critic_in = size + A + obs_space.state_size if critic == "central" else n_in
            critics.append(_mlp(critic_in, hidden, 1, 1.0, activation, layer_norm))
            log_stds.append(nn.Parameter(torch.zeros(n_act)) if self.box else None)
        self.actors, self.critics = nn.ModuleList(actors), nn.ModuleList(critics)
        self.group_of = self.group.tolist()  # the same as plain ints: what export may branch on
        self.log_stds = nn.ParameterList([p for p in log_stds if p is not None])
        self.central = critic == "central"
        self.value_norms = nn.ModuleList([RunningNorm(()) for _ in groups]) if norm_value else None

    def _own(self, g: int, x: torch.Tensor) -> torch.Tensor:
        """What group ``g``'s policy reads of its rows: the agent's own observation (and its index)."""
        own = x[:, : self.sizes[g]]
        return torch.cat([own, x[:, self.L : self.L + self.A]], -1) if self.onehot[g] else own

    def _critic_in(self, g: int, x: torch.Tensor) -> torch.Tensor:
        if self.central:
            return torch.cat([x[:, : self.sizes[g]], x[:, self.L :]], -1)
        return self._own(g, x)

    def _groups(self, agent: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        of = self.group[agent]
        if len(self.names) == 1:
            return [(0, torch.arange(len(agent), device=agent.device))]
        return [(g, rows) for g in range(len(self.names)) if len(rows := torch.nonzero(of == g).squeeze(-1))]

    def _dist(self, g: int, out: torch.Tensor) -> torch.distributions.Distribution:
        if not self.box:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        normal = torch.distributions.Normal(out, self.log_stds[g].exp(), validate_args=False)
        return torch.distributions.Independent(normal, 1, validate_args=False)

    def _values(self, x: torch.Tensor, agent: torch.Tensor, raw: bool) -> torch.Tensor:
        out = x.new_zeros(len(x))
        for g, rows in self._groups(agent):
            v = self.critics[g](self._critic_in(g, x[rows])).squeeze(-1)
            if not raw and self.value_norms is not None:
                norm = self.value_norms[g]
                v = v * torch.sqrt(norm.var + norm.eps).to(v.dtype) + norm.mean.to(v.dtype)
            out = out.index_put((rows,), v)
        return out

    def value(self, x: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """Values in reward units."""
        return self._values(x, agent, raw=False)

    def dist_value(self, x: torch.Tensor, agent: torch.Tensor) -> tuple[Rows, torch.Tensor]:
        """The action distribution and the value in the units the critic learns (:meth:`learned_units`)."""
        parts = []
        for g, rows in self._groups(agent):
            parts.append((rows, self._dist(g, self.actors[g](self._own(g, x[rows])))))
        return Rows(parts, len(x)), self._values(x, agent, raw=True)

    @torch.no_grad()
    def learned_units(self, returns: torch.Tensor, agent: torch.Tensor, reduce: Any = None) -> torch.Tensor:
        """``returns`` in the units the critic learns: under ``norm_value``, each group's folded into its
        running statistics (``reduce``: over data-parallel replicas) and standardised by them."""
        if self.value_norms is None:
            return returns
        out = returns.clone()
        of = self.group[agent]
        for g, norm in enumerate(self.value_norms):
            rows = of == g
            norm.update(returns[rows], reduce)
            out[rows] = (returns[rows] - norm.mean.to(returns.dtype)) / torch.sqrt(norm.var + norm.eps).to(
                returns.dtype
            )
        return out

    def act(
        self, x: torch.Tensor, agent: torch.Tensor, gen: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions (sampled from ``gen``; ``None``: the most likely) and their log-probs, per row."""
        shape = (len(x), self.n_act[0]) if self.box else (len(x),)
        actions = x.new_zeros(shape) if self.box else torch.zeros(shape, dtype=torch.long, device=x.device)
        logps = x.new_zeros(len(x))
        for g, rows in self._groups(agent):
            out = self.actors[g](self._own(g, x[rows]))
            dist = self._dist(g, out)
            if gen is None:
                a = out if self.box else out.argmax(-1)
            elif self.box:
                a = out + self.log_stds[g].exp() * torch.randn(out.shape, generator=gen, device=out.device)
            else:
                a = torch.multinomial(torch.softmax(out, -1), 1, generator=gen).squeeze(-1)
            actions = actions.index_put((rows,), a)
            logps = logps.index_put((rows,), dist.log_prob(a))
        return actions, logps

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Every agent's most likely action (a ``Box``'s mean), for observations ``[N, A, W]``
        (evaluation, export): one pass per agent, so no shape depends on the data."""
        actions = []
        for a in range(self.A):
            g = self.group_of[a]
            out = self.actors[g](self._own(g, obs[:, a]))
            actions.append(out if self.box else out.argmax(-1))
        return torch.stack(actions, 1)

    def members(self, group: str) -> list[int]:
        """The agents (their indices in a game's rows) of the group named ``group``."""
        g = self.names.index(group)
        return [a for a in range(self.A) if self.group_of[a] == g]

    def group_greedy(self, obs: torch.Tensor, group: str) -> torch.Tensor:
        """The most likely actions of one group's agents, for their rows ``[N, k, W]`` in the game's
        order (what ``dagrl export --group`` exports: the policy one kind of agent deploys with)."""
        g = self.names.index(group)
        out = [self.actors[g](self._own(g, obs[:, j])) for j in range(len(self.members(group)))]
        return torch.stack(out if self.box else [o.argmax(-1) for o in out], 1)

    def agent_index(self, n_games: int, device: Any = "cpu") -> torch.Tensor:
        """The agent of each row of ``n_games`` games' rows, flattened game-major."""
        return torch.arange(self.A, device=device).repeat(n_games)


def agents_network(obs_space: AgentsBox, act_space: gym.Space, cfg: Config) -> AgentsActorCritic:
    return AgentsActorCritic(
        obs_space, act_space, cfg.hidden, cfg.share_parameters, cfg.critic, cfg.norm_value, cfg.activation,
        cfg.layer_norm,
    )  # fmt: skip


@dataclass
class AgentsRollout:
    """``num_steps`` steps of ``N`` games of ``A`` agents, collected with one learner version."""

    obs: np.ndarray  # [T, N, A, W]
    actions: np.ndarray  # [T, N, A, *act]
    logprobs: np.ndarray  # [T, N, A]
    rewards: np.ndarray  # [T, N, A], each agent's own; cut by a time limit: bootstrapped
    dones: np.ndarray  # [T, N, A], the agent's episode ended with this step
    active: np.ndarray  # [T, N, A], the agent was in the game and acted
    last_obs: np.ndarray  # [N, A, W]
    episodes: Episodes
    """The games' episodes: an episode's return is the mean over agents of their returns."""
    env_steps: int
    agent_returns: dict[str, np.ndarray] = field(default_factory=dict)
    """Per agent, the returns of its episodes that ended in this rollout."""


@dataclass
class SamplerState:
    cfg: Config
    envs: gym.vector.VectorEnv
    agent: AgentsActorCritic
    gen: torch.Generator
    obs: np.ndarray
    active: np.ndarray
    episodes: EpisodeTracker
    agent_return: np.ndarray
    """Per game and agent, its reward so far this episode."""


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs, obs, info = ctx.start_envs()
    with ctx.seeded():
        agent = agents_network(envs.single_observation_space, envs.single_action_space, cfg)
    n = envs.num_envs
    active = np.array(info["agents"]["active"], bool)
    tracker = EpisodeTracker(n)
    return SamplerState(
        cfg, envs, agent, torch.Generator().manual_seed(ctx.seed), obs, active, tracker, np.zeros(active.shape)
    )


learner, evaluator = learner_of(agents_network), evaluator_of(agents_network)


def _load(net: nn.Module, weights: Weights) -> None:
    net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})


@fragment(role="sampler")
def collect(state: SamplerState, weights: Weights) -> AgentsRollout:
    """Step every game ``num_steps`` times, every agent acting with its group's policy."""
    net, cfg, envs = state.agent, state.cfg, state.envs
    _load(net, weights)
    T, (N, A, W) = cfg.num_steps, state.obs.shape
    space = envs.single_action_space
    obs = np.zeros((T, N, A, W), np.float32)
    actions = np.zeros((T, N, A, *space.shape[1:]), np.float32 if net.box else np.int64)
    logprobs, rewards, dones, active = (np.zeros((T, N, A), np.float32) for _ in range(4))
    names = envs.single_observation_space.agents
    returns: dict[str, list[float]] = {name: [] for name in names}
    index = net.agent_index(N)
    with torch.no_grad():
        for t in range(T):
            obs[t], active[t] = state.obs, state.active
            a, logp = net.act(torch.as_tensor(state.obs).reshape(N * A, W), index, state.gen)
            actions[t], logprobs[t] = a.reshape(actions.shape[1:]).numpy(), logp.reshape(N, A).numpy()
            sent = np.clip(actions[t], space.low, space.high) if net.box else actions[t]
            state.obs, team, terminated, truncated, info = envs.step(sent)
            done = terminated | truncated
            step = agent_step(info, done)
            rewards[t], dones[t] = step["reward"], step["ended"]
            if cfg.team_reward:
                rewards[t] = (step["reward"] * state.active).sum(1, keepdims=True) * state.active
            state.episodes.step(team, done)
            state.agent_return += step["reward"] * state.active
            if step["cut"].any():  # a time limit ended them: the reward gets the value of where they were
                games, agents = np.nonzero(step["cut"])
                final = np.stack([info["final_obs"][i] if done[i] else state.obs[i] for i in games])[
                    np.arange(len(games)), agents
                ]
                tail = net.value(torch.as_tensor(final), torch.as_tensor(agents)).numpy()
                rewards[t, games, agents] += cfg.gamma * tail
            for i, j in zip(*np.nonzero(step["ended"]), strict=True):
                returns[names[j]].append(float(state.agent_return[i, j]))
                state.agent_return[i, j] = 0.0
            state.active = np.array(step["active"], bool)
    agent_returns = {name: np.asarray(r) for name, r in returns.items()}
    return AgentsRollout(
        obs, actions, logprobs, rewards, dones, active, state.obs.copy(), state.episodes.take(), T * N, agent_returns
    )


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[AgentsRollout]) -> Metrics:
    """Clipped-PPO epochs over the agent-steps of agents in the game; advantages per agent."""
    cfg, net, dev = state.cfg, state.agent, state.device
    rows, agent_of, actions, logprobs, advantages, returns = [], [], [], [], [], []
    with torch.no_grad():
        for r in rollouts:
            T, N, A, W = r.obs.shape
            x = torch.as_tensor(r.obs, device=dev).reshape(T * N * A, W)
            agent = net.agent_index(T * N, dev)
            values = net.value(x, agent).reshape(T, N * A).cpu().numpy()
            last = net.value(torch.as_tensor(r.last_obs, device=dev).reshape(N * A, W), net.agent_index(N, dev))
            adv = gae(
                r.rewards.reshape(T, N * A),
                values,
                r.dones.reshape(T, N * A),
                last.cpu().numpy(),
                cfg.gamma,
                cfg.gae_lambda,
            )
            keep = torch.as_tensor(r.active.reshape(-1) > 0, device=dev)
            rows.append(x[keep])
            agent_of.append(agent[keep])
            actions.append(torch.as_tensor(r.actions, device=dev).reshape(T * N * A, *r.actions.shape[3:])[keep])
            logprobs.append(torch.as_tensor(r.logprobs, device=dev).reshape(-1)[keep])
            advantages.append(torch.as_tensor(adv, device=dev).reshape(-1)[keep])
            returns.append(torch.as_tensor(adv + values, device=dev).reshape(-1)[keep])
    b_x, b_agent, b_act = torch.cat(rows), torch.cat(agent_of), torch.cat(actions)
    b_logp, b_adv, b_ret = torch.cat(logprobs), torch.cat(advantages), torch.cat(returns)
    b_ret = net.learned_units(b_ret, b_agent, state.ctx.sum_over_replicas)
    batch = len(b_x)
    mb = min(cfg.minibatch_size, batch)
    prox, stale = proximal(cfg, batch, mb, lambda s: net.dist_value(b_x[s], b_agent[s])[0].log_prob(b_act[s]), b_logp)

    def loss_of(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dist, value = net.dist_value(b_x[idx], b_agent[idx])
        p = None if prox is None else prox[idx]
        return clipped_loss(cfg, dist, value, b_act[idx], b_logp[idx], b_adv[idx], b_ret[idx], p)

    lr = start_update(state)
    metrics, steps = train_epochs(state, batch, mb, loss_of)
    metrics.update(stale)
    end_update(state, metrics, lr, sum(r.env_steps for r in rollouts))
    metrics["perf/frames"] = float(steps * mb)
    metrics.update(agent_metrics(rollouts, net))
    return metrics


def agent_metrics(rollouts: list[AgentsRollout], net: AgentsActorCritic) -> Metrics:
    """The mean return of each agent's and each group's episodes that ended in ``rollouts``:
    ``agents/<agent>/episode_return`` and ``groups/<group>/episode_return``."""
    out: Metrics = {}
    by_group: dict[str, list[np.ndarray]] = {}
    for i, name in enumerate(rollouts[0].agent_returns if rollouts else ()):
        got = np.concatenate([r.agent_returns[name] for r in rollouts])
        if len(got):
            out[f"agents/{name}/episode_return"] = float(got.mean())
            by_group.setdefault(net.names[net.group_of[i]], []).append(got)
    for group, parts in by_group.items():
        out[f"groups/{group}/episode_return"] = float(np.concatenate(parts).mean())
    return out


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Weights) -> Metrics:
    """``eval_episodes`` whole games, every agent acting greedily; the return is the agents' mean."""
    _load(state.net, weights)
    return state.run(state.net.greedy)


@iteration
def train_iteration():
    weights = publish()
    rollouts = collect(weights)
    return update(rollouts)


@evaluation
def eval_iteration():
    return evaluate(publish())
