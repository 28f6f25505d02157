"""The off-policy actor-critic that SAC and TD3 share: hyperparameters, the samplers and their
``collect`` loop, the replay role, the two learner roles' networks made alike, the fragments and the
iteration, and the evaluator. Each algorithm keeps its own policy network, its role states (what the
critic takes from the actor, one gradient step of each) and its losses.

Two learner roles, as Spreeze splits them: the ``critic`` role holds the twin Q networks and their
targets, the ``actor`` role the policy. They exchange weights once per update call:

* ``publish`` (actor): the policy's weights and what else the critic's targets need (:class:`Published`);
* ``collect`` (sampler): env steps with the policy's :meth:`explore` action;
* ``update_critic``: the critic's gradient steps on the sampled batches, with the actor's weights as
  published; it sends its Q weights and metrics on (:class:`CriticOut`);
* ``update_actor``: the actor's steps against that Q;
* ``evaluate`` (evaluator): whole episodes with the policy's ``greedy`` action.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, iteration, role
from dagrl.core.schema import Widths, at_least, unit_interval, widths_fit
from dagrl.nn.cuda_graphs import CapturedStep, set_capturable, step_means, wants_graphs
from dagrl.nn.encoders import CNN, Shift, check_share_encoder, check_shift, image_shift
from dagrl.nn.networks import TwinQ, Weights, as_tensors, minibatches, to_numpy
from dagrl.nn.optim import load_state
from dagrl.replay import ReplayState, Sample, Schema, Transitions, replay_state
from dagrl.replay.record import Recorder
from dagrl.replay.role import add, sample

__all__ = [
    "ACTION_SPACES", "add", "collect", "eval_iteration", "evaluate", "publish", "sample", "train_iteration",
    "update_actor", "update_critic",
]  # fmt: skip
"""What an algorithm module takes as it is (sac.py, td3.py); its roles it binds one by one
(:func:`sampler_of`)."""

ACTION_SPACES = (gym.spaces.Box,)
Metrics = dict[str, float]
PolicyOf = Callable[[gym.Space, gym.Space, int, CNN], nn.Module]
"""An algorithm's policy network class: ``Policy(obs_space, act_space, hidden, cnn)``."""


@dataclass
class Config:
    """What SAC's and TD3's hyperparameters have in common; each algorithm's ``Config`` adds its own."""

    steps: int = 16
    """Env steps per env per ``collect`` call."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Steps of reward each replay row folds before bootstrapping (as DQN's ``n_step``)."""
    tau: float = 0.005
    """Polyak factor of the target networks."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gradient_steps: int = 16
    """Critic steps per update call; the two roles exchange weights after each call."""
    buffer_size: int = 100_000
    """Replay capacity."""
    learning_starts: int = 1_000
    """Transitions stored before learning begins; samplers act uniformly at random until then."""
    hidden: Widths = 128
    """The hidden layers' widths of every network: one width for two layers of it, or each layer's in order
    (``[400, 300]``)."""
    cnn: CNN = "nature"
    """Encoder of image observations: ``nature`` or ``impala`` (:data:`dagrl.nn.encoders.CNNS`)."""
    cuda_graphs: bool = False
    """Replay each gradient step of a learner on a CUDA device from a CUDA graph (no effect on the CPU)."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), without exploration."""
    augment_shift: int = 0
    """Image observations only: in every gradient step, each batch image moved by up to this many
    pixels (DrQ's random shift, :func:`dagrl.nn.encoders.random_shift`; 4 for 84x84 in DrQ); 0: none."""
    share_encoder: bool = False
    """Image observations only: the actor reads the critic's encoder, its features detached (DrQ's and
    DrQ-v2's actor; Stable-Baselines3's ``share_features_extractor``), instead of training a CNN of its
    own: one CNN forward per actor step instead of three passes. The actor's trunk is then the
    critic's, copied at each exchange and sent with the policy."""

    def __post_init__(self) -> None:
        at_least(self, 1, "steps", "n_step", "batch_size", "gradient_steps", "buffer_size", "hidden", "eval_episodes")
        widths_fit(self, "hidden")
        at_least(self, 0, "learning_starts", "augment_shift")
        unit_interval(self, "gamma", "tau")

    def check_spaces(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Refuse, before any cluster starts, what the env's spaces rule out."""
        check_shift(self.augment_shift, obs_space)
        check_share_encoder(self.share_encoder, obs_space)


@dataclass
class Published:
    """What the actor publishes: the policy's weights, and the values the critic's targets read beside
    them (SAC's temperature ``alpha``)."""

    policy: Weights
    values: dict[str, float]


@dataclass
class CriticOut:
    """What the critic sends the actor after an update call: its Q weights and its metrics."""

    q: Weights
    metrics: Metrics


@dataclass
class SamplerState:
    cfg: Any
    envs: gym.vector.VectorEnv
    policy: nn.Module
    gen: torch.Generator
    """The policy's own draws (SAC's sampled actions)."""
    rng: np.random.Generator
    """Exploration noise drawn beside the policy (TD3's Gaussian noise)."""
    obs: np.ndarray
    recorder: Recorder
    random_steps: int
    steps_done: int = 0


def new_sampler(ctx: RoleContext, cfg: Config, policy_of: PolicyOf) -> SamplerState:
    """A sampler's envs, its copy of the policy, and how many of its steps act at random."""
    envs, obs, _ = ctx.start_envs()
    policy = policy_of(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.cnn)
    gen, rng = torch.Generator().manual_seed(ctx.seed), np.random.default_rng(ctx.seed)
    recorder = Recorder(envs.num_envs, cfg.n_step, cfg.gamma)
    done = ctx.per_replica(ctx.env_steps)  # a resumed run or a replacement acts as the run has got to
    return SamplerState(cfg, envs, policy, gen, rng, obs, recorder, ctx.per_replica(cfg.learning_starts), done)


def collect_steps(state: SamplerState, act: Callable[[torch.Tensor], np.ndarray]) -> Transitions:
    """``steps`` steps of every env: uniform random actions until ``learning_starts``, then ``act``'s
    (the algorithm's choice from the observations, under ``torch.no_grad``)."""
    envs = state.envs
    for _ in range(state.cfg.steps):
        if state.steps_done < state.random_steps:
            action = envs.action_space.sample()
        else:
            with torch.no_grad():
                action = act(torch.as_tensor(state.obs, dtype=torch.float32))
        state.obs = state.recorder.step(envs, state.obs, action)
        state.steps_done += envs.num_envs
    return state.recorder.take(envs)


def sampler_of(policy_of: PolicyOf) -> Callable[[RoleContext, Config], SamplerState]:
    """The ``sampler`` role of an algorithm whose policy network is ``policy_of``. An algorithm binds
    its roles in the order ``sampler``, ``replay``, ``critic``, ``actor``, ``evaluator``, which gives
    each its seed."""

    @role("sampler", many=True)
    def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
        return new_sampler(ctx, cfg, policy_of)

    return sampler


@role("replay", many=True)
def replay(ctx: RoleContext, cfg: Config) -> ReplayState:
    schema = Schema.transitions(ctx.observation_space, ctx.action_space, cfg.n_step)
    return replay_state(
        ctx, schema, capacity=cfg.buffer_size, batch_size=cfg.batch_size, batches=cfg.gradient_steps,
        learning_starts=cfg.learning_starts,
    )  # fmt: skip


def seeded(ctx: RoleContext, *makers: Callable[[], nn.Module]) -> list[nn.Module]:
    """The networks ``makers`` build, in order, from the role's seed, on the role's device (the
    process's own random state left as it was)."""
    with ctx.seeded():
        return [make().to(torch.device(ctx.device)) for make in makers]


def twin_q(ctx: RoleContext, cfg: Config) -> TwinQ:
    """The twin Q networks for the env's spaces (not yet on a device, not seeded)."""
    return TwinQ(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn)


def policy_maker(ctx: RoleContext, cfg: Config, policy_of: PolicyOf) -> Callable[[], nn.Module]:
    return lambda: policy_of(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn)


def target_of(q: TwinQ, ctx: RoleContext, cfg: Config) -> TwinQ:
    """A target copy of ``q``, on its device."""
    target = twin_q(ctx, cfg).to(torch.device(ctx.device))
    target.load_state_dict(q.state_dict())
    return target


def polyak(params: Any, targets: Any, tau: float) -> None:
    """Move each target tensor ``tau`` of the way toward its source (floating-point ones only)."""
    with torch.no_grad():
        for p, tp in zip(params, targets, strict=True):
            if tp.is_floating_point():
                tp.lerp_(p, tau)


def restored(cfg: Config, device: torch.device, optimizers: list[torch.optim.Optimizer], *steps: Any) -> None:
    """After a checkpoint's optimizer state is loaded: make it capturable again where CUDA graphs are
    on, and drop the captured steps (the optimizer's state tensors are new ones)."""
    for opt in optimizers:
        set_capturable(opt, wants_graphs(cfg.cuda_graphs, device))
    for step in steps:
        if isinstance(step, CapturedStep):
            step.reset()


def evaluator_of(policy_of: PolicyOf) -> Callable[[RoleContext, Config], EpisodeRunner]:
    """The ``evaluator`` role (its envs and its own policy network) of an algorithm whose policy network
    is ``policy_of``."""

    @role("evaluator", recover="replace")
    def evaluator(ctx: RoleContext, cfg: Config) -> EpisodeRunner:
        envs = ctx.make_envs()
        policy = policy_of(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.cnn)
        return EpisodeRunner(envs, policy, ctx.seed, cfg.eval_episodes)

    return evaluator


@dataclass(kw_only=True)
class CriticState:
    """The ``critic`` role: the twin Q networks, their targets, the policy its targets act with, and the
    optimizer. An algorithm's critic adds what else its targets need."""

    cfg: Any
    q: TwinQ
    target: TwinQ
    policy: nn.Module
    """The policy the targets act with: SAC's the actor's as of the last exchange, TD3's a target copy."""
    optimizer: torch.optim.Optimizer
    gen: torch.Generator
    device: torch.device
    steps: int = 0
    step: CapturedStep | None = None  # one gradient step, replayed from a CUDA graph where asked
    augment: Shift = Shift()  # augment_shift's, on every batch observation

    def state_dict(self) -> dict:
        return {
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "opt": self.optimizer.state_dict(),
            "steps": self.steps,
            "policy": self.policy.state_dict(),
            "gen": self.gen.get_state(),
        }

    def load_state_dict(self, sd: dict) -> None:
        self.q.load_state_dict(sd["q"])
        self.target.load_state_dict(sd["target"])
        load_state(self.optimizer, sd["opt"])
        self.steps = sd["steps"]
        if "gen" in sd:  # checkpoints written before exact resume hold neither
            self.policy.load_state_dict(sd["policy"])
            self.gen.set_state(sd["gen"])
        restored(self.cfg, self.device, [self.optimizer], *self.captured_steps())

    def captured_steps(self) -> list[CapturedStep | None]:
        """The gradient steps replayed from CUDA graphs (an algorithm's critic may have more)."""
        return [self.step]

    def receive(self, published: Published) -> None:
        """Take the actor's weights (and values) as published, for this update call's targets."""
        raise NotImplementedError

    def gradient_step(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One gradient step on batch ``b`` (and the targets' Polyak step where due); its outputs."""
        raise NotImplementedError


@dataclass(kw_only=True)
class ActorState:
    """The ``actor`` role: the policy, its optimizer, and the critic's Q as of the last exchange (the
    policy loss differentiates through it, never into it)."""

    cfg: Any
    policy: nn.Module
    q: TwinQ
    optimizer: torch.optim.Optimizer
    gen: torch.Generator  # the policy's draws and augment_shift's
    device: torch.device
    steps: int = 0
    batches: int = 0
    """The critic's batches this actor has seen, across update calls (what ``every`` counts)."""
    step: CapturedStep | None = None  # one gradient step, replayed from a CUDA graph where asked
    augment: Shift = Shift()  # augment_shift's, on every batch observation

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "opt": self.optimizer.state_dict(),
            "steps": self.steps,
            "batches": self.batches,
            "q": self.q.state_dict(),
            "gen": self.gen.get_state(),
        }

    def load_state_dict(self, sd: dict) -> None:
        self.policy.load_state_dict(sd["policy"])
        load_state(self.optimizer, sd["opt"])
        self.steps = sd["steps"]
        self.batches = sd.get("batches", self.steps * self.every)  # a checkpoint from before it was counted
        if "gen" in sd:  # checkpoints written before exact resume hold neither
            self.q.load_state_dict(sd["q"])
            self.gen.set_state(sd["gen"])
        restored(self.cfg, self.device, self.optimizers(), self.step)

    every: int = 1
    """A policy step on every ``every``-th batch (TD3's ``policy_delay``)."""
    charts: dict[str, str] = field(default_factory=lambda: {"losses/policy": "loss"})
    """Metric name -> the step output it averages."""

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """What the actor's steps update (an algorithm's actor may have more: SAC's temperature)."""
        return [self.optimizer]

    def published(self) -> dict[str, float]:
        """The values published beside the policy's weights (:class:`Published`)."""
        return {}


def new_critic(
    ctx: RoleContext,
    cfg: Config,
    state_of: type[CriticState],
    policy_of: PolicyOf,
    lr: float,
    step: Callable[..., dict[str, torch.Tensor]],
    **fields: Any,
) -> Any:
    """The critic role's state ``state_of``: the twin Q networks and a policy (SAC's copy of the actor's,
    TD3's target policy) seeded alike in every algorithm, the Q target, an Adam optimizer with
    learning rate ``lr``, and ``step(state, batch)`` as its gradient step; ``fields`` are the
    algorithm's own."""
    dev = torch.device(ctx.device)
    q, policy = seeded(ctx, lambda: twin_q(ctx, cfg), policy_maker(ctx, cfg, policy_of))
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    state = state_of(
        cfg=cfg, q=q, target=target_of(q, ctx, cfg), policy=policy, device=dev,
        optimizer=torch.optim.Adam(q.parameters(), lr=lr, capturable=graphs),
        gen=torch.Generator(device=dev).manual_seed(ctx.seed), **fields,
    )  # fmt: skip
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = captured(state, step)
    return state


def captured(state: CriticState | ActorState, step: Callable[..., dict[str, torch.Tensor]]) -> CapturedStep:
    """``step(state, batch)``, replayed from a CUDA graph where the graph asks for them on a GPU."""
    enabled = wants_graphs(state.cfg.cuda_graphs, state.device)
    return CapturedStep(partial(step, state), state.device, [state.gen], enabled=enabled)


def new_actor(
    ctx: RoleContext,
    cfg: Config,
    state_of: type[ActorState],
    policy_of: PolicyOf,
    lr: float,
    step: Callable[..., dict[str, torch.Tensor]],
    seed: int,
    **fields: Any,
) -> Any:
    """The actor role's state ``state_of``: its policy and its copy of the critic's Q (frozen), seeded
    alike in every algorithm, an Adam optimizer with learning rate ``lr`` for what it trains (with
    ``share_encoder``, not the trunk it copies), a generator from ``seed`` and ``step(state, batch)`` as
    its gradient step; ``fields`` are the algorithm's own."""
    dev = torch.device(ctx.device)
    policy, q = seeded(ctx, policy_maker(ctx, cfg, policy_of), lambda: twin_q(ctx, cfg))
    q.requires_grad_(False)  # the critic's copy: the policy loss differentiates through it, never into it
    trained = policy.net.parameters() if cfg.share_encoder else policy.parameters()
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    state = state_of(
        cfg=cfg, policy=policy, q=q, optimizer=torch.optim.Adam(trained, lr=lr, capturable=graphs),
        gen=torch.Generator(device=dev).manual_seed(seed), device=dev, **fields,
    )  # fmt: skip
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = captured(state, step)
    return state


def actor_steps(
    state: ActorState, samples: list[Sample | None], critic_out: CriticOut, every: int = 1
) -> tuple[list[dict[str, torch.Tensor]], float]:
    """The actor's gradient steps on every ``every``-th of the critic's batches, counted across update calls
    (TD3's ``policy_delay``: the critic's steps ``every``, ``2 every``, ... as the critic's Polyak steps,
    however many a call makes), against the critic's Q as sent (and its encoder, with
    ``share_encoder``); with the frames the batches held."""
    batches = minibatches(samples, state.cfg.batch_size, state.device)
    frames = float(len(batches) * state.cfg.batch_size)
    seen, state.batches = state.batches, state.batches + len(batches)
    batches = [b for n, b in enumerate(batches, seen + 1) if n % every == 0]
    if not batches:  # nothing sampled yet, or not this call's turn
        return [], frames
    state.q.load_state_dict(as_tensors(critic_out.q, state.device))
    if state.cfg.share_encoder:
        state.policy.trunk.load_state_dict(state.q.trunk.state_dict())  # published with the policy
    outs = [state.step(b) for b in batches]
    state.steps += len(outs)
    return outs, frames


class BoundedPolicy(nn.Module):
    """A policy network for a ``Box`` action space: its actions are squashed to [-1, 1] and scaled to
    the bounds with the buffers :attr:`scale` and :attr:`bias` (saved with the weights)."""

    def __init__(self, act_space: gym.Space, algorithm: str):
        super().__init__()
        if not isinstance(act_space, gym.spaces.Box):
            raise TypeError(f"{algorithm} needs a continuous (Box) action space, got {act_space}")
        self.register_buffer("scale", torch.as_tensor((act_space.high - act_space.low) / 2, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((act_space.high + act_space.low) / 2, dtype=torch.float32))

    def scaled(self, squashed: torch.Tensor) -> torch.Tensor:
        """An action in [-1, 1] at the bounds' scale."""
        return squashed * self.scale + self.bias

    def sample(self, obs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The stochastic policy's action (``dagrl eval --stochastic``); a deterministic policy's own
        action, as Stable-Baselines3's TD3 ``predict`` gives (its exploration noise is the sampler's)."""
        return self.greedy(obs)


def descend(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One gradient step of ``optimizer`` on ``loss``."""
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def regress_twin_q(state: CriticState, obs: torch.Tensor, action: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """One step of both Q heads toward ``target`` (mean squared error summed over the heads); the loss."""
    q1, q2 = state.q(obs, action)
    loss = ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()
    descend(state.optimizer, loss)
    return loss


# ---------------------------------------------------------------------------------------------------
# Fragments and the iteration
# ---------------------------------------------------------------------------------------------------


@fragment(role="actor")
def publish(state: ActorState) -> Published:
    return Published(to_numpy(state.policy), state.published())


@fragment(role="sampler")
def collect(state: SamplerState, weights: Published) -> Transitions:
    """``steps`` steps of every env: uniform random actions until ``learning_starts``, then the
    policy's exploring ones (its ``explore``)."""
    state.policy.load_state_dict(as_tensors(weights.policy, torch.device("cpu")))
    return collect_steps(state, lambda obs: state.policy.explore(obs, state))


@fragment(role="critic")
def update_critic(state: CriticState, samples: list[Sample | None], weights: Published) -> CriticOut:
    """The critic's gradient steps, one per batch, with the actor's weights as published."""
    state.receive(weights)
    outs = [state.gradient_step(b) for b in minibatches(samples, state.cfg.batch_size, state.device)]
    return CriticOut(to_numpy(state.q), step_means(outs, {"losses/q": "loss"}) if outs else {})


@fragment(role="actor")
def update_actor(state: ActorState, samples: list[Sample | None], critic_out: CriticOut) -> Metrics:
    """The actor's steps against the critic's Q as sent."""
    outs, frames = actor_steps(state, samples, critic_out, every=state.every)
    if not frames:
        return {"perf/frames": 0.0}
    charts = {f"charts/{k}": v for k, v in state.published().items()}
    own = step_means(outs, state.charts) if outs else {}  # a call between two delayed policy steps: the critic's
    return {**critic_out.metrics, **own, **charts, "perf/frames": frames}


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Published) -> Metrics:
    """``eval_episodes`` whole episodes with the policy's ``greedy`` action (no exploration; or its
    ``sample``, see :attr:`EpisodeRunner.deterministic`)."""
    state.net.load_state_dict(as_tensors(weights.policy))
    return state.run(state.pick(state.net.greedy, lambda obs: state.net.sample(obs, state.gen)))


@evaluation
def eval_iteration():
    return evaluate(publish())


@iteration
def train_iteration():
    weights = publish()
    stored = add(collect(weights))
    batch = sample(stored)
    return update_actor(batch, update_critic(batch, weights))


# ---------------------------------------------------------------------------------------------------
# What both algorithms' gradient steps do
# ---------------------------------------------------------------------------------------------------


NextAction = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | float]]
"""The targets' action at the next observations, and what each target value gives up for it (SAC's
``alpha * log_prob``; TD3's nothing)."""


def twin_q_step(state: CriticState, b: dict[str, torch.Tensor], next_action: NextAction) -> torch.Tensor:
    """One step of both Q heads toward ``reward + discount * (min target Q(s', a') - penalty)`` on batch
    ``b`` (observations augmented), ``a'`` and ``penalty`` from ``next_action``; the loss."""
    obs, next_obs = state.augment(b["obs"], state.gen), state.augment(b["next_obs"], state.gen)
    with torch.no_grad():
        action, penalty = next_action(next_obs)
        tq1, tq2 = state.target(next_obs, action)
        discount = b.get("discount", state.cfg.gamma)  # n-step rows carry theirs
        target = b["reward"] + discount * (1 - b["terminated"]) * (torch.min(tq1, tq2) - penalty)
    return regress_twin_q(state, obs, b["action"], target)


def through_q(state: ActorState, b: dict[str, torch.Tensor], act: Callable[[torch.Tensor], Any]) -> tuple:
    """``act``'s output for batch ``b``'s observations (augmented), from the policy's trunk or, with
    ``share_encoder``, from the critic's features (which the actor's loss does not train); and both Q
    heads at its action (``act`` may return ``(action, ...)``)."""
    obs = state.augment(b["obs"], state.gen)
    if state.cfg.share_encoder:
        with torch.no_grad():
            features = state.q.trunk(obs)
        out = act(features)
        return out, *state.q.heads(features, out[0] if isinstance(out, tuple) else out)
    out = act(state.policy.trunk(obs))
    return out, *state.q(obs, out[0] if isinstance(out, tuple) else out)
