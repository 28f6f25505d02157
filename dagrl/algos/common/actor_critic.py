"""The actor-critic that PPO, PPO-LSTM and IMPALA share: their common hyperparameters
(:class:`Config`), the network, its acting state for central inference, the learner's state, and the
learner fragment that publishes its weights."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.distributions import ActionDist, Categorical, MultiCategorical, action_heads
from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.algos.common.hyperparameters import ClippedPPO
from dagrl.algos.common.rollouts import Rollout, Steps
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, role
from dagrl.core.schema import at_least
from dagrl.envs.double_buffer import double_buffering, step_in_groups
from dagrl.envs.episodes import EpisodeTracker
from dagrl.nn.encoders import CNN, encoder
from dagrl.nn.networks import ACTIVATIONS, RunningNorm, Widths, hidden_layers, obs_tensor
from dagrl.nn.optim import adam, load_state
from dagrl.spaces.images import is_image
from dagrl.spaces.mixed import MixedBox

__all__ = [  # what an actor-critic algorithm module takes as it is (ppo.py, impala.py)
    "ACTION_SPACES", "collect", "eval_iteration", "evaluate", "evaluator", "inference", "learner", "publish",
    "sampler",
]  # fmt: skip

ACTION_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Box)
"""One categorical head, one per entry (``MultiDiscrete``, ``MultiBinary``), or a diagonal Gaussian."""


@dataclass
class Config(ClippedPPO):
    """PPO's and IMPALA's hyperparameters: :class:`~dagrl.algos.common.hyperparameters.ClippedPPO`'s,
    and these."""

    cnn: CNN = "nature"
    """Encoder of image observations: ``nature`` or ``impala`` (:data:`dagrl.nn.encoders.CNNS`)."""
    norm_obs: bool = False
    """Standardise vector observations by a running mean/std (MuJoCo), clipped to +-10; for a ``Dict``
    holding images, its other entries (the CNN scales the images). The statistics are buffers of the
    network: the learner folds in each batch after its update, samplers and evaluators receive them
    with the weights, the checkpoint keeps them."""
    norm_reward: bool = False
    """Divide rewards by the running std of the discounted return (as gymnasium's ``NormalizeReward``),
    clipped to +-10; the statistic is kept like ``norm_obs``'s."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), acting greedily."""
    activation: Literal["tanh", "relu"] = "tanh"
    """The hidden layers' nonlinearity (SB3's ``activation_fn``; the rl-zoo's MuJoCo PPO uses ``relu``)."""
    log_std_init: float = 0.0
    """A Gaussian policy's log standard deviation at the start (SB3's ``log_std_init``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "eval_episodes")

    def check_spaces(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Refuse, before any cluster starts, what the env's spaces rule out."""
        if self.norm_obs:
            check_norm_obs(obs_space)
        action_heads(act_space)  # a MultiDiscrete space it cannot act in


def _layer(n_in: int, n_out: int, gain: float = np.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def check_norm_obs(obs_space: gym.Space) -> None:
    if is_image(obs_space):
        raise ValueError("norm_obs: true is for vector observations; the CNN scales uint8 images itself")
    if isinstance(obs_space, MixedBox) and not obs_space.values:
        raise ValueError(f"norm_obs: true: {obs_space} holds only images, which the CNN scales itself")


def norm_shape(obs_space: gym.Space) -> tuple[int, ...]:
    """What ``norm_obs`` standardises: the observation, or a ``Dict``'s entries that are not images."""
    if isinstance(obs_space, MixedBox):
        return (sum(p.size for p in obs_space.values),)
    return tuple(obs_space.shape)


class ActorCritic(nn.Module):
    """Separate tanh MLPs for the policy and the value over vector observations; over images
    (``uint8`` ``[C, H, W]``) one shared Nature CNN with a linear head each. Categorical or
    diagonal-Gaussian actions. Optionally running statistics of observations (``obs_norm``) and of
    discounted returns (``return_norm``), kept as buffers so they travel with the weights."""

    def __init__(
        self,
        obs_space: gym.Space,
        act_space: gym.Space,
        hidden: Widths,
        norm_obs: bool = False,
        norm_reward: bool = False,
        cnn: CNN = "nature",
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ):
        super().__init__()
        if norm_obs:
            check_norm_obs(obs_space)
        self.mixed = isinstance(obs_space, MixedBox)  # norm_obs: the Dict's entries that are not images
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        self.heads = action_heads(act_space)  # MultiDiscrete / MultiBinary: the choices per entry
        self.box = not self.discrete and self.heads is None
        if self.discrete:
            n_act = int(act_space.n)
        elif self.heads is not None:  # the logits of every head
            n_act = sum(self.heads)
        else:  # the Gaussian's means
            n_act = int(np.prod(act_space.shape))
        self.obs_norm = RunningNorm(norm_shape(obs_space)) if norm_obs else None
        self.return_norm = RunningNorm(()) if norm_reward else None
        self.trunk, width = encoder(obs_space, hidden, cnn)
        if is_image(obs_space):
            self.critic, self.actor = _layer(width, 1, 1.0), _layer(width, n_act, 0.01)
        else:
            act = ACTIVATIONS[activation]
            layers, last = hidden_layers(width, hidden, act, _layer)
            self.critic = nn.Sequential(*layers, _layer(last, 1, 1.0))
            layers, last = hidden_layers(width, hidden, act, _layer)
            self.actor = nn.Sequential(*layers, _layer(last, n_act, 0.01))
        self.log_std = nn.Parameter(torch.full((n_act,), float(log_std_init))) if self.box else None

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_norm is None:
            return self.trunk(obs)
        return self.trunk(obs, self.obs_norm) if self.mixed else self.trunk(self.obs_norm(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The most likely action (evaluation)."""
        out = self.actor(self.features(obs))
        if self.heads is not None:
            return torch.stack([h.argmax(-1) for h in out.split(self.heads, -1)], -1)
        return out.argmax(-1) if self.discrete else out

    def dist_value(self, obs: torch.Tensor) -> tuple[ActionDist, torch.Tensor]:
        """The action distribution and the value, through the trunk once."""
        features = self.features(obs)
        return self._dist(self.actor(features)), self.critic(features).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> ActionDist:
        return self._dist(self.actor(self.features(obs)))

    def reward_scale(self) -> float:
        """What rewards are divided by: the running std of discounted returns, or 1."""
        return 1.0 if self.return_norm is None else self.return_norm.std()

    def scaled_rewards(self, rewards: np.ndarray) -> np.ndarray:
        """Rewards in the units the critic learns (``norm_reward``: divided by the scale, clipped to +-10)."""
        if self.return_norm is None:
            return rewards
        return np.clip(rewards / self.reward_scale(), -10.0, 10.0).astype(np.float32)

    def fold_statistics(self, obs: torch.Tensor, disc_returns: list, reduce) -> None:
        """Fold a batch's observations and discounted returns into the running statistics (after an update)."""
        if self.obs_norm is not None:
            self.obs_norm.update(self.trunk.values(obs) if self.mixed else obs, reduce)
        if self.return_norm is not None:
            self.return_norm.update(torch.as_tensor(np.concatenate([d.ravel() for d in disc_returns])), reduce)

    def _dist(self, out: torch.Tensor) -> ActionDist:
        if self.discrete:
            return Categorical(out)
        if self.heads is not None:
            return MultiCategorical(out, self.heads)
        normal = torch.distributions.Normal(out, self.log_std.exp(), validate_args=False)
        return torch.distributions.Independent(normal, 1, validate_args=False)

    def sample(self, obs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Action and its log-prob, drawn from ``gen`` so each role's randomness is its own.

        Called once per env step by every sampler, so it skips building a ``torch.distributions``
        object (a sampler's `collect` took 13-19 % less at 4 CartPole envs) and computes what
        :meth:`dist` would, with the same operations: the log-probs match the learner's bit for bit."""
        out = self.actor(self.features(obs))
        if self.discrete:
            logits = torch.log_softmax(out, -1)  # as the learner's Categorical normalises them
            action = torch.multinomial(logits.exp(), 1, generator=gen)
            return action.squeeze(-1), logits.gather(-1, action).squeeze(-1)
        if self.heads is not None:
            dist = MultiCategorical(out, self.heads)
            action = dist.sample(gen)
            return action, dist.log_prob(action)
        log_std = self.log_std.expand_as(out)
        scale = log_std.exp()
        action = out + scale * torch.randn(out.shape, generator=gen, device=out.device)
        # Normal.log_prob, summed over the action's dimensions as Independent(..., 1) does
        logp = -((action - out) ** 2) / (2 * scale**2) - scale.log() - math.log(math.sqrt(2 * math.pi))
        return action, logp.sum(-1)


class Acting:
    """Picks actions for a batch of observations: ``(actions, log-probs)`` drawn from the policy.

    A sampler acts with its own (under ``central-inference``, the ``inference`` role acts for all
    samplers with one of these, batched)."""

    def __init__(self, agent: ActorCritic, gen: torch.Generator, device: str = "cpu"):
        self.agent, self.gen, self.device = agent, gen, device

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            action, logp = self.agent.sample(obs_tensor(obs).to(self.device), self.gen)
        return action.cpu().numpy(), logp.cpu().numpy()

    def load(self, weights: Weights) -> None:
        self.agent.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})


Weights = dict[str, np.ndarray]


Metrics = dict[str, float]


AgentOf = Callable[[gym.Space, gym.Space], nn.Module]
"""Makes a policy network for an observation space and an action space."""


@dataclass
class LearnerState:
    cfg: Config
    agent: ActorCritic
    optimizer: torch.optim.Optimizer
    gen: torch.Generator
    device: torch.device
    ctx: RoleContext
    """Averages gradients over data-parallel learner replicas (``dp-learners``); else a no-op."""
    updates: int = 0
    trained_steps: int = 0
    """Env steps of the batches trained on, over all data-parallel replicas (``anneal_lr``'s clock)."""

    def state_dict(self) -> dict:
        return {
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "gen": self.gen.get_state(),
            "updates": self.updates,
            "trained_steps": self.trained_steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.agent.load_state_dict(sd["agent"])
        load_state(self.optimizer, sd["optimizer"])
        self.gen.set_state(sd["gen"])
        self.updates = sd["updates"]
        self.trained_steps = sd.get("trained_steps", 0)  # checkpoints written before anneal_lr


def seeded_agent(ctx: RoleContext, agent_of: AgentOf) -> nn.Module:
    """``agent_of`` for the run's observation and action spaces, initialised from the role's seed (the
    global torch RNG left as it was), on the role's device."""
    with ctx.seeded():
        return agent_of(ctx.observation_space, ctx.action_space).to(ctx.device)


def new_learner(ctx: RoleContext, cfg: Config, agent_of: AgentOf) -> LearnerState:
    """A learner of the network ``agent_of`` makes, with PPO's Adam; what ``learner`` builds."""
    agent = seeded_agent(ctx, agent_of)
    optimizer = adam(agent.parameters(), cfg.lr, ctx.device, eps=1e-5)
    return LearnerState(cfg, agent, optimizer, torch.Generator().manual_seed(ctx.seed), torch.device(ctx.device), ctx)


@fragment(role="learner")
def publish(state: LearnerState) -> Weights:
    """The learner's current weights, as CPU numpy arrays."""
    return {k: v.detach().cpu().numpy().copy() for k, v in state.agent.state_dict().items()}


def start_update(state: LearnerState) -> float | None:
    """Under ``anneal_lr``, set the optimizer's rate for this update and return it; else ``None``."""
    if not state.cfg.anneal_lr:
        return None
    lr = annealed_lr(state.cfg, state.trained_steps, state.ctx.env_steps_budget)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    return lr


def end_update(state: LearnerState, metrics: Metrics, lr: float | None, env_steps: int) -> None:
    """Count the update and, under ``anneal_lr``, the env steps trained on (over all replicas)."""
    state.updates += 1
    if lr is not None:
        state.trained_steps += int(state.ctx.sum_over_replicas(np.array([env_steps]))[0])
        metrics["losses/lr"] = lr


def annealed_lr(cfg: Config, trained_steps: int, budget: int | None) -> float:
    """The learning rate of the next batch under ``anneal_lr``: ``lr`` times the share of the run's
    env-step budget not yet trained on (0 past it).

    >>> annealed_lr(Config(lr=1e-3, anneal_lr=True), 250, 1000)
    0.00075
    >>> annealed_lr(Config(lr=1e-3, anneal_lr=True), 1200, 1000)
    0.0
    """
    if budget is None:
        raise ValueError("anneal_lr needs the run's stop.env_steps")
    return cfg.lr * max(0.0, 1.0 - trained_steps / budget)


@dataclass
class SamplerState:
    cfg: Config
    envs: gym.vector.VectorEnv
    agent: ActorCritic
    acting: Acting
    """Picks the actions: the sampler's own ``agent``, or the ``inference`` role (``central-inference``)."""
    obs: np.ndarray
    episodes: EpisodeTracker
    disc_return: np.ndarray
    """Per env, the discount-weighted sum of its rewards so far (what ``norm_reward`` scales by)."""


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs, obs, _ = ctx.start_envs()
    with ctx.seeded():
        agent = _agent(envs.single_observation_space, envs.single_action_space, cfg)
    acting = ctx.acting(Acting(agent, torch.Generator().manual_seed(ctx.seed)))
    n = envs.num_envs
    return SamplerState(cfg, envs, agent, acting, obs, EpisodeTracker(n), np.zeros(n))


def _agent(obs_space: gym.Space, act_space: gym.Space, cfg) -> ActorCritic:
    # IMPALA's Config shares these fields; getattr keeps other configs that reuse PPO's roles working
    norm_obs, norm_reward = getattr(cfg, "norm_obs", False), getattr(cfg, "norm_reward", False)
    return ActorCritic(
        obs_space, act_space, cfg.hidden, norm_obs, norm_reward, getattr(cfg, "cnn", "nature"),
        getattr(cfg, "activation", "tanh"), getattr(cfg, "log_std_init", 0.0),
    )  # fmt: skip


NetworkOf = Callable[[gym.Space, gym.Space, Any], nn.Module]
"""An actor-critic network (its class, or what makes it): ``network_of(obs_space, act_space, cfg)``."""


def learner_of(network_of: NetworkOf) -> Callable[[RoleContext, Any], LearnerState]:
    """The ``learner`` role of an actor-critic whose network ``network_of`` makes."""

    @role("learner")
    def learner(ctx: RoleContext, cfg: Any) -> LearnerState:
        return new_learner(ctx, cfg, lambda obs_space, act_space: network_of(obs_space, act_space, cfg))

    return learner


def inference_of(network_of: NetworkOf, acting: type = Acting) -> Callable[[RoleContext, Any], Any]:
    """The ``inference`` role, which acts for every sampler at once under ``central-inference`` (started
    by no other policy), of an actor-critic whose network ``network_of`` makes; ``acting`` picks the
    actions (a recurrent network's carries its state)."""

    @role("inference", recover="replace")
    def inference(ctx: RoleContext, cfg: Any) -> Any:
        agent = seeded_agent(ctx, lambda obs_space, act_space: network_of(obs_space, act_space, cfg))
        return acting(agent, torch.Generator(ctx.device).manual_seed(ctx.seed), ctx.device)

    return inference


def evaluator_of(network_of: NetworkOf) -> Callable[[RoleContext, Any], EpisodeRunner]:
    """The ``evaluator`` role (its envs and its own network) of an actor-critic whose network
    ``network_of`` makes."""

    @role("evaluator", recover="replace")
    def evaluator(ctx: RoleContext, cfg: Any) -> EpisodeRunner:
        envs = ctx.make_envs()
        agent = network_of(envs.single_observation_space, envs.single_action_space, cfg)
        return EpisodeRunner(envs, agent, ctx.seed, cfg.eval_episodes)

    return evaluator


learner, inference, evaluator = learner_of(_agent), inference_of(_agent), evaluator_of(_agent)


@fragment(role="sampler")
def collect(state: SamplerState, weights: Weights) -> Rollout:
    """Step every env ``num_steps`` times with the given weights (double-buffered where that pays:
    :mod:`dagrl.envs.double_buffer`)."""
    agent = state.agent
    agent.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    steps = Steps(state, box=agent.box, norm_reward=agent.return_norm is not None)

    def tail_value(rows: np.ndarray, final: np.ndarray) -> np.ndarray:
        return agent.value(obs_tensor(final)).numpy() * agent.reward_scale()

    with torch.no_grad(), double_buffering(state.envs, state.acting) as buffered:
        if buffered:
            state.obs = step_in_groups(
                state.envs, state.obs, state.cfg.num_steps, state.acting,
                lambda t, rows, obs, picked, stepped: steps.record(t, rows, state, obs, picked, stepped, tail_value),
                steps.env_actions,
            )  # fmt: skip
        else:
            for t in range(state.cfg.num_steps):
                steps.take(t, state, *state.acting(state.obs), tail_value)
    return steps.rollout(state, Rollout)


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Weights) -> Metrics:
    """``eval_episodes`` whole episodes acting greedily (the most likely action; or sampled, see
    :attr:`EpisodeRunner.deterministic`)."""
    state.net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    return state.run(state.pick(state.net.greedy, lambda obs: state.net.sample(obs, state.gen)[0]))


@evaluation
def eval_iteration():
    return evaluate(publish())
