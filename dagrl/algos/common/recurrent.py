"""The recurrent actor-critic that PPO-LSTM and IMPALA-LSTM share, and the LSTM core R2D2 builds on.

An LSTM between the encoder and the heads: samplers keep each env's LSTM state across rollouts,
zeroed where an episode starts; a rollout carries the state its envs began it with and where episodes
started, so a learner unrolls the LSTM from there over whole env sequences (:class:`Sequences`).
Under ``central-inference`` the ``inference`` role keeps no state: each request carries its envs' LSTM
state beside the observations, and the answer the state after the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.actor_critic import (
    ACTION_SPACES,
    ActorCritic,
    Metrics,
    Weights,
    check_norm_obs,
    evaluator_of,
    inference_of,
    learner_of,
    norm_shape,
    publish,
)
from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.algos.common.rollouts import Rollout, Steps
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, role
from dagrl.core.schema import at_least, widths_fit
from dagrl.envs.episodes import EpisodeTracker
from dagrl.nn.encoders import CNN, encoder
from dagrl.nn.networks import RunningNorm, Widths, obs_array, obs_tensor
from dagrl.spaces.mixed import MixedBox

__all__ = [  # what a recurrent actor-critic algorithm takes as it is (ppo_lstm.py, impala_lstm.py)
    "ACTION_SPACES", "collect", "eval_iteration", "evaluate", "evaluator", "inference", "learner", "publish",
    "sampler",
]  # fmt: skip


@dataclass
class Recurrent:
    """The LSTM's hyperparameter, mixed into a recurrent algorithm's ``Config`` ahead of the base it
    extends (``class Config(Recurrent, ActorCriticConfig)``), whose checks run first."""

    lstm: int = 128
    """Width of the LSTM's state (its hidden and its cell vectors each)."""
    burn_in: int = 0
    """R2D2's burn-in: each rollout also carries the last ``burn_in`` steps of the one before it, and the
    learner unrolls them without gradients from the state stored there, so each sequence starts from
    the state the learner's own weights reach rather than the one the sampler's (older, under
    ``async``) weights left. 0: the stored state as it is. At most ``num_steps``."""

    def __post_init__(self) -> None:
        super().__post_init__()  # the base's checks
        at_least(self, 1, "lstm")
        widths_fit(self, "lstm")
        at_least(self, 0, "burn_in")
        if self.burn_in > self.num_steps:
            raise ValueError(f"burn_in {self.burn_in} > num_steps {self.num_steps}: it comes from the rollout before")


State = tuple[torch.Tensor, torch.Tensor]
"""The LSTM's hidden and cell vectors, ``[1, N, lstm]`` each."""


class LSTMCore(nn.Module):
    """An observation encoder (:func:`~dagrl.nn.encoders.encoder`: ``cnn`` for images) and an LSTM over
    its features, unrolled over env sequences whose state is zeroed where an episode starts; the
    recurrent trunk of :class:`RecurrentActorCritic` and of R2D2's Q-network (``dagrl.algos.r2d2``).
    ``obs_norm``: running observation statistics applied before the encoder, or ``None``."""

    def __init__(
        self, obs_space: gym.Space, hidden: Widths, lstm: int, obs_norm: RunningNorm | None = None, cnn: CNN = "nature"
    ):
        super().__init__()
        self.mixed = isinstance(obs_space, MixedBox)
        self.obs_norm = obs_norm
        self.trunk, width = encoder(obs_space, hidden, cnn)
        self.core = nn.LSTM(width, lstm)
        for name, param in self.core.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.width = lstm

    def initial(self, n: int, device: torch.device | str = "cpu") -> State:
        """The state of ``n`` envs at their first step: zeros."""
        zeros = torch.zeros(1, n, self.width, device=device)
        return zeros, zeros.clone()

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_norm is None:
            return self.trunk(obs)
        return self.trunk(obs, self.obs_norm) if self.mixed else self.trunk(self.obs_norm(obs))

    def unroll(self, obs: torch.Tensor, state: State, starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        """The LSTM's outputs ``[T, N, lstm]`` for observations ``[T, N, ...]`` from ``state``, zeroed
        before each step whose ``starts`` (``[T, N]``) is 1 (an episode's first observation); and the
        state after the last step."""
        T, N = starts.shape
        x = self.features(obs.reshape(T * N, *obs.shape[2:])).reshape(T, N, -1)
        h, c = state
        # one LSTM call per stretch of steps in which no env starts an episode (then the state is zeroed)
        cuts = [0, *(torch.nonzero(starts[1:].any(1)).flatten() + 1).tolist(), T]
        outs = []
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            keep = (1.0 - starts[a]).view(1, N, 1)
            out, (h, c) = self.core(x[a:b], (h * keep, c * keep))
            outs.append(out)
        return torch.cat(outs), (h, c)

    def step(self, obs: torch.Tensor, state: State, starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        """One step of ``N`` envs: the LSTM's output ``[N, lstm]`` and the state after it (what
        :meth:`unroll` computes for one step, without its data-dependent stretches: ``torch.export``
        takes it)."""
        keep = (1.0 - starts).view(1, -1, 1)
        out, state = self.core(self.features(obs).unsqueeze(0), (state[0] * keep, state[1] * keep))
        return out[0], state


class RecurrentActorCritic(LSTMCore):
    """:class:`LSTMCore` and PPO's actor and critic over the LSTM's output (:attr:`heads`, which also hold
    ``norm_reward``'s statistic); ``norm_obs``'s statistics are kept before the encoder."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, cfg: Any):
        if cfg.norm_obs:
            check_norm_obs(obs_space)
        norm = RunningNorm(norm_shape(obs_space)) if cfg.norm_obs else None
        super().__init__(obs_space, cfg.hidden, cfg.lstm, norm, cfg.cnn)
        out_space = gym.spaces.Box(-np.inf, np.inf, (cfg.lstm,), np.float32)
        activation, log_std = getattr(cfg, "activation", "tanh"), getattr(cfg, "log_std_init", 0.0)
        self.heads = ActorCritic(
            out_space, act_space, cfg.hidden, norm_reward=cfg.norm_reward, activation=activation, log_std_init=log_std
        )

    def scaled_rewards(self, rewards: np.ndarray) -> np.ndarray:
        """Rewards in the units the critic learns (:meth:`ActorCritic.scaled_rewards`)."""
        return self.heads.scaled_rewards(rewards)

    def fold_statistics(self, obs: torch.Tensor, disc_returns: list, reduce) -> None:
        """As :meth:`ActorCritic.fold_statistics`: observations here, discounted returns in the heads."""
        if self.obs_norm is not None:
            self.obs_norm.update(self.trunk.values(obs) if self.mixed else obs, reduce)
        self.heads.fold_statistics(obs, disc_returns, reduce)


class Acting:
    """Picks actions for a batch of observations from their envs' LSTM states ``h``, ``c`` (``[N, lstm]``
    each) and ``starts`` (1 where an observation is an episode's first): ``(actions, log-probs, h, c)``,
    the state after the step. A sampler acts with its own; under ``central-inference`` the ``inference``
    role acts for all samplers with one, batched, the states travelling with the observations."""

    def __init__(self, agent: RecurrentActorCritic, gen: torch.Generator, device: str = "cpu"):
        self.agent, self.gen, self.device = agent, gen, device

    def __call__(self, obs: np.ndarray, h: np.ndarray, c: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
        dev = self.device
        state = (torch.as_tensor(h, device=dev).unsqueeze(0), torch.as_tensor(c, device=dev).unsqueeze(0))
        with torch.no_grad():
            out, (h, c) = self.agent.step(obs_tensor(obs).to(dev), state, torch.as_tensor(starts, device=dev))
            action, logp = self.agent.heads.sample(out, self.gen)
        return tuple(t.cpu().numpy() for t in (action, logp, h[0], c[0]))

    def load(self, weights: Weights) -> None:
        self.agent.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})


@dataclass
class RecurrentRollout(Rollout):
    """A :class:`~dagrl.algos.common.rollouts.Rollout` and what the learner needs to unroll the LSTM over it."""

    starts: np.ndarray | None = None  # [T, N], 1 where obs[t] is an episode's first observation
    state: tuple[np.ndarray, np.ndarray] | None = None  # the LSTM state [N, lstm] x 2 before obs[0]
    last_start: np.ndarray | None = None  # [N], 1 where last_obs starts an episode
    prefix: Prefix | None = None  # burn-in (Recurrent.burn_in): the steps before obs[0]


@dataclass
class Prefix:
    """The ``B`` steps of an env sequence before a rollout's first (its sampler's previous rollout's
    last), for the learner's burn-in; zeros before a sampler's first rollout, which starts episodes."""

    obs: np.ndarray  # [B, N, *obs_shape]
    starts: np.ndarray  # [B, N]
    state: tuple[np.ndarray, np.ndarray]  # the LSTM state [N, lstm] x 2 before obs[0]


@dataclass
class SamplerState:
    cfg: Any
    envs: gym.vector.VectorEnv
    agent: RecurrentActorCritic
    acting: Acting
    """Picks the actions: the sampler's own ``agent``, or the ``inference`` role (``central-inference``)."""
    obs: np.ndarray
    lstm: tuple[np.ndarray, np.ndarray]
    """Each env's LSTM state after its last step, ``[N, lstm]`` x 2."""
    starts: np.ndarray
    """Per env, 1 where :attr:`obs` is an episode's first observation."""
    episodes: EpisodeTracker
    disc_return: np.ndarray
    prefix: Prefix | None = None
    """What the next rollout carries for burn-in (``burn_in`` > 0)."""


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Any) -> SamplerState:
    envs, obs, _ = ctx.start_envs()
    with ctx.seeded():
        agent = RecurrentActorCritic(envs.single_observation_space, envs.single_action_space, cfg)
    n = envs.num_envs
    acting = ctx.acting(Acting(agent, torch.Generator().manual_seed(ctx.seed)))
    lstm = tuple(s[0].numpy() for s in agent.initial(n))
    starts = np.ones(n, np.float32)  # every env at an episode's first observation
    prefix = None
    if cfg.burn_in:
        b, ob = cfg.burn_in, obs_array(obs)
        prefix = Prefix(np.zeros((b, *ob.shape), ob.dtype), np.zeros((b, n), np.float32), lstm)
    return SamplerState(cfg, envs, agent, acting, obs, lstm, starts, EpisodeTracker(n), np.zeros(n), prefix)


learner = learner_of(RecurrentActorCritic)
inference = inference_of(RecurrentActorCritic, Acting)
evaluator = evaluator_of(RecurrentActorCritic)


@fragment(role="sampler")
def collect(state: SamplerState, weights: Weights) -> RecurrentRollout:
    """Step every env ``num_steps`` times with the given weights, each env's LSTM state carried on."""
    agent, heads = state.agent, state.agent.heads
    agent.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    steps = Steps(state, box=heads.box, norm_reward=heads.return_norm is not None)
    starts = np.zeros_like(steps.dones)
    first = tuple(s.copy() for s in state.lstm)

    def tail_value(rows: np.ndarray, final: np.ndarray) -> np.ndarray:  # from the state the episode reached
        h, c = (torch.from_numpy(s[rows]).unsqueeze(0) for s in state.lstm)
        out, _ = agent.step(obs_tensor(final), (h, c), torch.zeros(len(rows)))
        return heads.value(out).numpy() * heads.reward_scale()

    T, B = state.cfg.num_steps, state.cfg.burn_in
    with torch.no_grad():
        for t in range(T):
            if t == T - B:
                before_tail = tuple(s.copy() for s in state.lstm)  # the next rollout's burn-in starts here
            starts[t] = state.starts
            act, logp, *after = state.acting(state.obs, *state.lstm, state.starts)
            state.lstm = tuple(after)
            state.starts = steps.take(t, state, act, logp, tail_value).astype(np.float32)
    prefix = state.prefix
    if B:
        state.prefix = Prefix(steps.obs[T - B :].copy(), starts[T - B :].copy(), before_tail)
    return steps.rollout(
        state, RecurrentRollout, starts=starts, state=first, last_start=state.starts.copy(), prefix=prefix
    )


@dataclass
class Sequences:
    """The env sequences of a batch of rollouts, side by side (``[T, N, ...]``), as the learner unrolls them."""

    obs: torch.Tensor
    starts: torch.Tensor
    state: State
    """The LSTM state before each sequence's first step, ``[1, N, lstm]`` x 2."""
    last_obs: torch.Tensor
    last_start: torch.Tensor

    @classmethod
    def of(
        cls, rollouts: list[RecurrentRollout], device: torch.device, agent: RecurrentActorCritic | None = None
    ) -> Sequences:
        """The rollouts' sequences; where they carry a burn-in :class:`Prefix` and ``agent`` is given, each
        sequence's first state is the one ``agent`` reaches over the prefix (no gradients)."""

        def cat(values: list[np.ndarray], axis: int = 1) -> torch.Tensor:
            return torch.as_tensor(np.concatenate(values, axis), device=device)

        state = tuple(cat([r.state[i] for r in rollouts], 0).unsqueeze(0) for i in range(2))
        if agent is not None and rollouts[0].prefix is not None:
            prefixes = [r.prefix for r in rollouts]
            before = tuple(cat([p.state[i] for p in prefixes], 0).unsqueeze(0) for i in range(2))
            with torch.no_grad():
                _, state = agent.unroll(cat([p.obs for p in prefixes]), before, cat([p.starts for p in prefixes]))
        return cls(
            cat([r.obs for r in rollouts]), cat([r.starts for r in rollouts]), state,
            cat([r.last_obs for r in rollouts], 0), cat([r.last_start for r in rollouts], 0),
        )  # fmt: skip

    def values(self, agent: RecurrentActorCritic) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The LSTM's outputs ``[T * N, lstm]`` over every step, the values ``[T, N]``, and the values of
        the observations after the last steps ``[N]``, from the state the sequences end in."""
        T, N = self.starts.shape
        out, after = agent.unroll(self.obs, self.state, self.starts)
        flat = out.reshape(T * N, -1)
        last_out, _ = agent.step(self.last_obs, after, self.last_start)
        return flat, agent.heads.value(flat).reshape(T, N), agent.heads.value(last_out)


class Greedy:
    """The most likely action of each env, its LSTM state carried from step to step and zeroed where an
    episode ended (:meth:`ended`, called by :meth:`EpisodeRunner.run`).

    :meth:`step` is the same policy as a function of the observations and the state, ``[N, lstm]``
    each of hidden and cell, for ``dagrl export`` (:attr:`recurrent`)."""

    recurrent = True
    """Acts on its state as well as the observation: ``dagrl export`` exports :meth:`step`."""

    def __init__(self, agent: RecurrentActorCritic, n: int, pick: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.agent, self.state, self.starts = agent, agent.initial(n), torch.ones(n)
        self.pick = agent.heads.greedy if pick is None else pick
        """The action from the LSTM's output: the heads' ``greedy``, or a stochastic one."""

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        out, self.state = self.agent.step(obs, self.state, self.starts)
        self.starts = torch.zeros_like(self.starts)
        return self.pick(out)

    def ended(self, done: np.ndarray) -> None:
        self.starts = torch.as_tensor(done, dtype=torch.float32)

    def initial_state(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The state at an episode's first step: zeros, ``[n, lstm]`` each."""
        return tuple(s[0] for s in self.agent.initial(n))

    def step(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Actions and the state after them, from observations ``[N, ...]`` and the state before."""
        out, (h, c) = self.agent.step(obs, (h.unsqueeze(0), c.unsqueeze(0)), obs.new_zeros(obs.shape[0]))
        return self.pick(out), h[0], c[0]


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Weights) -> Metrics:
    """``eval_episodes`` whole episodes acting greedily, the LSTM state carried within each."""
    state.net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    heads = state.net.heads
    sample = (lambda out: heads.sample(out, state.gen)[0]) if hasattr(heads, "sample") else None  # else epsilon
    act = Greedy(state.net, state.envs.num_envs, state.pick(heads.greedy, sample))
    return state.run(act, act.ended)


@evaluation
def eval_iteration():
    return evaluate(publish())
