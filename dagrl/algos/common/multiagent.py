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
from dagrl.algos.common.agent_networks import AgentsActorCritic, RecurrentGreedy, Rows
from dagrl.algos.common.epochs import clipped_loss, proximal, train_epochs
from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.algos.common.hyperparameters import ClippedPPO
from dagrl.algos.common.rollouts import gae
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, iteration, role
from dagrl.core.schema import at_least, widths_fit
from dagrl.envs.agents import AgentsBox, agent_step
from dagrl.envs.episodes import Episodes, EpisodeTracker

__all__ = [  # what a multi-agent algorithm module is made of (mappo.py, ippo.py)
    "ACTION_SPACES", "Config", "collect", "eval_iteration", "evaluate", "evaluator", "learner",
    "publish", "sampler", "train_iteration", "update",
]  # fmt: skip

ACTION_SPACES = (gym.spaces.MultiDiscrete, gym.spaces.Box)
"""A game's joint action: one ``Discrete`` choice per agent, or a ``Box`` row per agent."""


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
    ``relu``); over 3.5-4M, ``input`` and ``none`` end level (-13.0 and -12.7, seed 1). IPPO's default is
    ``none`` (:class:`dagrl.algos.ippo.Config`)."""
    critic: Literal["central", "local"] = "central"
    """``central``: each critic reads the global state too (MAPPO); ``local``: only what the agent sees (IPPO)."""
    team_reward: bool = False
    """Every agent learns from the sum of the step's rewards of all agents in its game, as MAPPO's copy of
    MPE shares its reward (``shared_reward``); the returns logged stay each agent's own. Off by default: on
    simple_spread (whose logged return the shared reward is an affine function of) it learned slower, -13.8
    against -11.8 over 0.5-1M env steps (``mappo-spread-single``, seed 1): each agent's reward then also
    carries the others' collisions, a noisier signal of what its own actions did."""
    gru: int = 0
    """Width of a GRU in each policy, between its hidden layers and its output (MAPPO's recurrent policy,
    rMAPPO); its state is kept per game and agent and zeroed where a game starts, and the learner unrolls
    it over each agent's ``num_steps`` steps from the state the rollout began with. 0: feed-forward
    policies. Critics stay feed-forward. For games whose observations hide what an agent needs; on
    simple_spread, which hides nothing that matters, ``gru: 64`` learned slower (-15.7 and -15.2 against
    -11.8 and -12.3 over 0.5-1M env steps, ``mappo-spread-single``, seeds 1 and 2), and with each agent
    seeing only its nearest landmark and agent too (-14.0 against -12.6, seed 1)."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), every agent acting greedily."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "eval_episodes")
        at_least(self, 0, "gru")
        if self.gru:
            widths_fit(self, "gru")

    def check_spaces(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Refuse, before any cluster starts, an env that is not a multi-agent game."""
        if not isinstance(obs_space, AgentsBox):
            raise ValueError("a multi-agent algorithm needs a PettingZoo env: set env.api: pettingzoo")


def agents_network(obs_space: AgentsBox, act_space: gym.Space, cfg: Config) -> AgentsActorCritic:
    return AgentsActorCritic(
        obs_space, act_space, cfg.hidden, cfg.share_parameters, cfg.critic, cfg.norm_value, cfg.activation,
        cfg.layer_norm, cfg.gru,
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
    starts: np.ndarray | None = None  # [T, N], 1 where obs[t] is a game's first observation
    memory: np.ndarray | None = None  # [N, A, gru], the policies' GRU state before obs[0]


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
    memory: np.ndarray
    """Per game and agent, the policies' GRU state after its last step, ``[N, A, gru]``."""
    starts: np.ndarray
    """Per game, 1 where :attr:`obs` is an episode's first observation."""


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs, obs, info = ctx.start_envs()
    with ctx.seeded():
        agent = agents_network(envs.single_observation_space, envs.single_action_space, cfg)
    n = envs.num_envs
    active = np.array(info["agents"]["active"], bool)
    gen, memory = torch.Generator().manual_seed(ctx.seed), np.zeros((*active.shape, cfg.gru), np.float32)
    return SamplerState(
        cfg, envs, agent, gen, obs, active, EpisodeTracker(n), np.zeros(active.shape), memory, np.ones(n, np.float32)
    )


learner, evaluator = learner_of(agents_network), evaluator_of(agents_network)


def _load(net: AgentsActorCritic, weights: Weights) -> None:
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
    starts, first = np.zeros((T, N), np.float32), state.memory
    h = torch.as_tensor(state.memory).reshape(N * A, cfg.gru)
    with torch.no_grad():
        for t in range(T):
            obs[t], active[t], starts[t] = state.obs, state.active, state.starts
            h = h * torch.as_tensor(1.0 - state.starts).repeat_interleave(A).unsqueeze(-1)
            a, logp, h = net.act(torch.as_tensor(state.obs).reshape(N * A, W), index, state.gen, h)
            actions[t], logprobs[t] = a.reshape(actions.shape[1:]).numpy(), logp.reshape(N, A).numpy()
            sent = np.clip(actions[t], space.low, space.high) if net.box else actions[t]
            state.obs, team, terminated, truncated, info = envs.step(sent)
            done = terminated | truncated
            state.starts = done.astype(np.float32)
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
    state.memory = h.reshape(N, A, cfg.gru).numpy()
    return AgentsRollout(
        obs, actions, logprobs, rewards, dones, active, state.obs.copy(), state.episodes.take(), T * N, agent_returns,
        starts, first,
    )  # fmt: skip


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[AgentsRollout]) -> Metrics:
    """Clipped-PPO epochs over the agent-steps of agents in the game; advantages per agent. With ``gru``,
    a minibatch holds whole agent sequences, each policy unrolled from the state its rollout began with."""
    cfg, net, dev = state.cfg, state.agent, state.device
    seqs = [_sequences(r, net, cfg, dev) for r in rollouts]
    reduce = state.ctx.sum_over_replicas
    if net.gru:  # minibatches of whole sequences: [T, S] side by side
        b = {k: torch.cat([q[k] for q in seqs], 0 if k in ("agent", "memory") else 1) for k in seqs[0]}
        keep = b["active"]
        T, n = keep.shape
        b["returns"][keep] = net.learned_units(b["returns"][keep], b["agent"].expand_as(keep)[keep], reduce)
        mb = min(max(1, cfg.minibatch_size // T), n)

        def rows_of(idx: Any, kept: torch.Tensor | None = None) -> tuple[Rows, torch.Tensor, torch.Tensor]:
            kept = keep[:, idx] if kept is None else kept
            x, agent, starts, memory = b["obs"][:, idx], b["agent"][idx], b["starts"][:, idx], b["memory"][idx]
            return (*net.unroll(x, agent, starts, memory, kept), kept)

        def logprobs_of(idx: Any) -> torch.Tensor:  # [T, sequences idx]: every step's, in the game or not
            dist, _, _ = rows_of(idx, torch.ones_like(keep[:, idx]))
            return dist.log_prob(b["actions"][:, idx].reshape(-1, *b["actions"].shape[2:])).reshape(T, -1)

    else:  # minibatches of the agent-steps in the game, rollout after rollout
        b = {k: torch.cat([q[k][q["active"]] for q in seqs]) for k in seqs[0] if k not in ("agent", "memory")}
        b["agent"] = torch.cat([q["agent"].expand_as(q["active"])[q["active"]] for q in seqs])
        b["returns"] = net.learned_units(b["returns"], b["agent"], reduce)
        T, n = 1, len(b["obs"])
        mb = min(cfg.minibatch_size, n)

        def rows_of(idx: Any) -> tuple[Rows, torch.Tensor, None]:
            return (*net.dist_value(b["obs"][idx], b["agent"][idx]), None)

        def logprobs_of(idx: Any) -> torch.Tensor:
            return rows_of(idx)[0].log_prob(b["actions"][idx])

    prox, stale = proximal(cfg, n, mb, logprobs_of, b["logprobs"])

    def loss_of(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dist, value, kept = rows_of(idx)
        parts = [
            v[idx] if kept is None else v[:, idx][kept]
            for v in (b["actions"], b["logprobs"], b["advantages"], b["returns"])
        ]
        p = None if prox is None else prox[idx] if kept is None else prox[:, idx][kept]
        return clipped_loss(cfg, dist, value, *parts, p)

    lr = start_update(state)
    metrics, steps = train_epochs(state, n, mb, loss_of)
    metrics.update(stale)
    end_update(state, metrics, lr, sum(r.env_steps for r in rollouts))
    metrics["perf/frames"] = float(steps * mb * T)
    metrics.update(agent_metrics(rollouts, net))
    return metrics


def _sequences(r: AgentsRollout, net: AgentsActorCritic, cfg: Config, dev: Any) -> dict[str, torch.Tensor]:
    """A rollout as ``N x A`` agent sequences side by side (``[T, S, ...]``; ``agent`` and ``memory``
    per sequence), with advantages and returns per agent from the current critics."""
    T, N, A, W = r.obs.shape
    x = torch.as_tensor(r.obs, device=dev).reshape(T, N * A, W)
    agent = net.agent_index(N, dev)
    with torch.no_grad():
        values = net.value(x.reshape(T * N * A, W), agent.repeat(T)).reshape(T, N * A).cpu().numpy()
        last = net.value(torch.as_tensor(r.last_obs, device=dev).reshape(N * A, W), agent).cpu().numpy()
    adv = gae(r.rewards.reshape(T, N * A), values, r.dones.reshape(T, N * A), last, cfg.gamma, cfg.gae_lambda)
    return {
        "obs": x,
        "agent": agent,
        "actions": torch.as_tensor(r.actions, device=dev).reshape(T, N * A, *r.actions.shape[3:]),
        "logprobs": torch.as_tensor(r.logprobs, device=dev).reshape(T, N * A),
        "advantages": torch.as_tensor(adv, device=dev),
        "returns": torch.as_tensor(adv + values, device=dev),
        "active": torch.as_tensor(r.active.reshape(T, N * A) > 0, device=dev),
        "starts": torch.as_tensor(r.starts, device=dev).repeat_interleave(A, 1),
        "memory": torch.as_tensor(r.memory, device=dev).reshape(N * A, -1),
    }


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
    """``eval_episodes`` whole games, every agent acting greedily (GRU policies: their states carried
    through each game); the return is the agents' mean."""
    _load(state.net, weights)
    gen = None if state.deterministic else state.gen
    if not state.net.gru:
        return state.run(lambda obs: state.net.greedy(obs, None, gen))
    act = RecurrentGreedy(state.net, state.envs.num_envs, gen)
    return state.run(act, act.ended)


@iteration
def train_iteration():
    weights = publish()
    rollouts = collect(weights)
    return update(rollouts)


@evaluation
def eval_iteration():
    return evaluate(publish())
