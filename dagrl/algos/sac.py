"""Soft Actor-Critic (twin Q, target networks, automatic entropy tuning) for continuous actions.

Written with two learner roles, as Spreeze splits them: the ``critic`` role holds the twin Q
networks and their targets, the ``actor`` role holds the policy and the entropy temperature. They
exchange weights once per update call (``gradient_steps`` steps): the critic computes targets with
the actor's weights it was given, the actor its loss with the critic's. Under ``single`` both roles
live in one process; a distribution policy may put them on two devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, iteration, role
from dagrl.core.schema import at_least, positive, unit_interval
from dagrl.nn.cuda_graphs import CapturedStep, set_capturable, step_means, wants_graphs
from dagrl.nn.networks import (
    CNN,
    Shift,
    TwinQ,
    Weights,
    as_tensors,
    check_share_encoder,
    check_shift,
    encoder,
    image_shift,
    minibatches,
    mlp,
    to_numpy,
)
from dagrl.replay import ReplayState, Sample, Schema, Transitions, replay_state
from dagrl.replay.record import Recorder
from dagrl.replay.role import add, sample  # noqa: F401 (the replay role's fragments)

ACTION_SPACES = (gym.spaces.Box,)  # a squashed Gaussian scaled to the bounds

# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


@dataclass
class Config:
    steps: int = 16
    """Env steps per env per ``collect`` call."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Steps of reward each replay row folds before bootstrapping (as DQN's ``n_step``)."""
    tau: float = 0.005
    """Polyak factor of the target Q networks."""
    policy_lr: float = 1e-3
    """Adam learning rate of the policy and the temperature."""
    q_lr: float = 1e-3
    """Adam learning rate of the Q networks."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gradient_steps: int = 16
    """Gradient steps per update call; the two roles exchange weights after each call."""
    buffer_size: int = 100_000
    """Replay capacity."""
    learning_starts: int = 1_000
    """Transitions stored before learning begins; samplers act uniformly at random until then."""
    alpha: float | None = None
    """Fixed entropy temperature; ``None`` tunes it toward ``-action_dim`` entropy."""
    hidden: int = 128
    """Width of the two hidden layers of every network."""
    cnn: CNN = "nature"
    """Encoder of image observations: ``nature`` or ``impala`` (:data:`dagrl.nn.networks.CNNS`)."""
    cuda_graphs: bool = False
    """Replay each gradient step of a learner on a CUDA device from a CUDA graph (no effect on the CPU)."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), without exploration."""
    augment_shift: int = 0
    """Image observations only: in every gradient step, each batch image moved by up to this many
    pixels (DrQ's random shift, :func:`dagrl.nn.networks.random_shift`; 4 for 84x84 in DrQ); 0: none."""
    share_encoder: bool = False
    """Image observations only: the actor reads the critic's encoder, its features detached (DrQ's and
    DrQ-v2's actor; Stable-Baselines3's ``share_features_extractor``), instead of training a CNN of its
    own: one CNN forward per actor step instead of three passes. The actor's trunk is then the
    critic's, copied at each exchange and sent with the policy."""

    def __post_init__(self) -> None:
        at_least(self, 1, "steps", "n_step", "batch_size", "gradient_steps", "buffer_size", "hidden", "eval_episodes")
        at_least(self, 0, "learning_starts", "augment_shift")
        positive(self, "policy_lr", "q_lr", "alpha")
        unit_interval(self, "gamma", "tau")

    def check_spaces(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Refuse, before any cluster starts, what the env's spaces rule out."""
        check_shift(self.augment_shift, obs_space)
        check_share_encoder(self.share_encoder, obs_space)


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


class Policy(nn.Module):
    """Tanh-squashed Gaussian, scaled to the action bounds."""

    def __init__(self, obs_space: gym.spaces.Box, act_space: gym.spaces.Box, hidden: int, cnn: CNN = "nature"):
        super().__init__()
        if not isinstance(act_space, gym.spaces.Box):
            raise TypeError(f"SAC needs a continuous (Box) action space, got {act_space}")
        n_act = int(np.prod(act_space.shape))
        self.trunk, n_obs = encoder(obs_space, hidden, cnn)  # its own; share_encoder: the critic's, copied
        self.net = mlp(n_obs, 2 * n_act, hidden)
        self.register_buffer("scale", torch.as_tensor((act_space.high - act_space.low) / 2, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((act_space.high + act_space.low) / 2, dtype=torch.float32))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The squashed mean action (evaluation)."""
        mean = self.net(self.trunk(obs)).chunk(2, dim=-1)[0]
        return torch.tanh(mean) * self.scale + self.bias

    def forward(self, obs: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.act(self.trunk(obs), gen)

    def act(self, features: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled action and its log-probability from the trunk's ``features``."""
        mean, log_std = self.net(features).chunk(2, dim=-1)
        log_std = -5 + 3.5 * (torch.tanh(log_std) + 1)  # in [-5, 2]
        std = log_std.exp()
        noise = torch.randn(mean.shape, generator=gen, device=mean.device)
        u = mean + std * noise
        squashed = torch.tanh(u)
        log_prob = (-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        log_prob = log_prob - torch.log(self.scale * (1 - squashed**2) + 1e-6).sum(-1)
        return squashed * self.scale + self.bias, log_prob


Metrics = dict[str, float]


@dataclass
class ActorWeights:
    policy: Weights
    alpha: float


@dataclass
class CriticOut:
    q: Weights
    metrics: Metrics


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


@dataclass
class SamplerState:
    cfg: Config
    envs: gym.vector.VectorEnv
    policy: Policy
    gen: torch.Generator
    obs: np.ndarray
    recorder: Recorder
    random_steps: int
    steps_done: int = 0


@dataclass
class CriticState:
    cfg: Config
    q: TwinQ
    target: TwinQ
    policy: Policy  # the actor's, as of the last exchange
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
        }

    def load_state_dict(self, sd: dict) -> None:
        self.q.load_state_dict(sd["q"])
        self.target.load_state_dict(sd["target"])
        self.optimizer.load_state_dict(sd["opt"])
        self.steps = sd["steps"]
        set_capturable(self.optimizer, wants_graphs(self.cfg.cuda_graphs, self.device))
        if self.step is not None:
            self.step.reset()  # the optimizer's state tensors are new ones


@dataclass
class ActorState:
    cfg: Config
    policy: Policy
    q: TwinQ  # the critic's, as of the last exchange
    optimizer: torch.optim.Optimizer
    log_alpha: torch.Tensor
    alpha_optimizer: torch.optim.Optimizer
    target_entropy: float
    gen: torch.Generator
    device: torch.device
    steps: int = 0
    step: CapturedStep | None = None  # one gradient step, replayed from a CUDA graph where asked
    augment: Shift = Shift()  # augment_shift's, on every batch observation

    def alpha(self) -> float:
        return self.cfg.alpha if self.cfg.alpha is not None else float(self.log_alpha.detach().exp())

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "opt": self.optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().cpu(),
            "alpha_opt": self.alpha_optimizer.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.optimizer.load_state_dict(sd["opt"])
        with torch.no_grad():
            self.log_alpha.copy_(sd["log_alpha"])
        self.alpha_optimizer.load_state_dict(sd["alpha_opt"])
        self.steps = sd["steps"]
        for opt in (self.optimizer, self.alpha_optimizer):
            set_capturable(opt, wants_graphs(self.cfg.cuda_graphs, self.device))
        if self.step is not None:
            self.step.reset()  # the optimizers' state tensors are new ones


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs = ctx.make_envs()
    obs, _ = envs.reset(seed=[ctx.seed + i for i in range(envs.num_envs)])
    envs.action_space.seed(ctx.seed)
    policy = Policy(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.cnn)
    random_steps = ctx.per_replica(cfg.learning_starts)
    gen = torch.Generator().manual_seed(ctx.seed)
    done = ctx.per_replica(ctx.env_steps)  # a resumed run or a replacement acts as the run has got to
    return SamplerState(cfg, envs, policy, gen, obs, Recorder(envs.num_envs, cfg.n_step, cfg.gamma), random_steps, done)


@role("replay", many=True)
def replay(ctx: RoleContext, cfg: Config) -> ReplayState:
    schema = Schema.transitions(ctx.observation_space, ctx.action_space, cfg.n_step)
    return replay_state(
        ctx, schema, capacity=cfg.buffer_size, batch_size=cfg.batch_size, batches=cfg.gradient_steps,
        learning_starts=cfg.learning_starts,
    )  # fmt: skip


@role("critic")
def critic(ctx: RoleContext, cfg: Config) -> CriticState:
    dev = torch.device(ctx.device)
    with torch.random.fork_rng():
        torch.manual_seed(ctx.seed)
        q = TwinQ(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
        policy = Policy(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    target = TwinQ(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    target.load_state_dict(q.state_dict())
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    opt = torch.optim.Adam(q.parameters(), lr=cfg.q_lr, capturable=graphs)
    state = CriticState(cfg, q, target, policy, opt, torch.Generator(device=dev).manual_seed(ctx.seed), dev)
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(critic_step, state), dev, [state.gen], enabled=graphs)
    return state


@role("actor")
def actor(ctx: RoleContext, cfg: Config) -> ActorState:
    dev = torch.device(ctx.device)
    with torch.random.fork_rng():
        torch.manual_seed(ctx.seed)
        policy = Policy(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
        q = TwinQ(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    q.requires_grad_(False)  # the critic's copy: the policy loss differentiates through it, never into it
    log_alpha = torch.zeros(1, device=dev, requires_grad=True)
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    trained = policy.net.parameters() if cfg.share_encoder else policy.parameters()
    state = ActorState(
        cfg, policy, q, torch.optim.Adam(trained, lr=cfg.policy_lr, capturable=graphs), log_alpha,
        torch.optim.Adam([log_alpha], lr=cfg.policy_lr, capturable=graphs), -float(np.prod(ctx.action_space.shape)),
        torch.Generator(device=dev).manual_seed(ctx.seed), dev,
    )  # fmt: skip
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(actor_step, state), dev, [state.gen], enabled=graphs)
    return state


@role("evaluator", recover="replace")
def evaluator(ctx: RoleContext, cfg: Config) -> EpisodeRunner:
    envs = ctx.make_envs()
    policy = Policy(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.cnn)
    return EpisodeRunner(envs, policy, ctx.seed, cfg.eval_episodes)


# ---------------------------------------------------------------------------------------------------
# Fragments
# ---------------------------------------------------------------------------------------------------


@fragment(role="actor")
def publish(state: ActorState) -> ActorWeights:
    return ActorWeights(to_numpy(state.policy), state.alpha())


@fragment(role="sampler")
def collect(state: SamplerState, weights: ActorWeights) -> Transitions:
    """``steps`` steps of every env: uniform random actions until ``learning_starts``, then the policy."""
    envs = state.envs
    state.policy.load_state_dict(as_tensors(weights.policy))
    for _ in range(state.cfg.steps):
        if state.steps_done < state.random_steps:
            action = envs.action_space.sample()
        else:
            with torch.no_grad():
                action = state.policy(torch.as_tensor(state.obs, dtype=torch.float32), state.gen)[0].numpy()
        state.obs = state.recorder.step(envs, state.obs, action)
        state.steps_done += envs.num_envs
    return state.recorder.take(envs)


def critic_step(state: CriticState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One twin-Q gradient step on batch ``b`` (``b["alpha"]``: the actor's temperature), then Polyak."""
    cfg = state.cfg
    obs, next_obs = state.augment(b["obs"], state.gen), state.augment(b["next_obs"], state.gen)
    with torch.no_grad():
        next_action, next_logp = state.policy(next_obs, state.gen)
        tq1, tq2 = state.target(next_obs, next_action)
        soft = torch.min(tq1, tq2) - b["alpha"] * next_logp
        discount = b.get("discount", cfg.gamma)  # n-step rows carry theirs
        target = b["reward"] + discount * (1 - b["terminated"]) * soft
    q1, q2 = state.q(obs, b["action"])
    loss = ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.step()
    with torch.no_grad():
        for p, tp in zip(state.q.parameters(), state.target.parameters(), strict=True):
            tp.lerp_(p, cfg.tau)
    return {"loss": loss.detach()}


def actor_step(state: ActorState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One policy gradient step on batch ``b``; then, unless fixed, one temperature step."""
    cfg = state.cfg
    alpha = cfg.alpha if cfg.alpha is not None else state.log_alpha.detach().exp()
    obs = state.augment(b["obs"], state.gen)
    if cfg.share_encoder:  # the critic's features, which the actor's loss does not train
        with torch.no_grad():
            features = state.q.trunk(obs)
        action, logp = state.policy.act(features, state.gen)
        q1, q2 = state.q.heads(features, action)
    else:
        action, logp = state.policy(obs, state.gen)
        q1, q2 = state.q(obs, action)
    loss = (alpha * logp - torch.min(q1, q2)).mean()
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.step()
    out = {"loss": loss.detach(), "entropy": -logp.detach().mean()}
    if cfg.alpha is None:
        alpha_loss = -(state.log_alpha * (logp.detach() + state.target_entropy)).mean()
        state.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        state.alpha_optimizer.step()
        out["alpha_loss"] = alpha_loss.detach()
    return out


@fragment(role="critic")
def update_critic(state: CriticState, samples: list[Sample | None], actor_weights: ActorWeights) -> CriticOut:
    """Twin-Q regression on soft Bellman targets, computed with the actor's weights as given."""
    cfg = state.cfg
    state.policy.load_state_dict(as_tensors(actor_weights.policy))
    alpha = torch.tensor(actor_weights.alpha, dtype=torch.float32, device=state.device)
    outs = [state.step({**b, "alpha": alpha}) for b in minibatches(samples, cfg.batch_size, state.device)]
    state.steps += len(outs)
    return CriticOut(to_numpy(state.q), step_means(outs, {"losses/q": "loss"}) if outs else {})


@fragment(role="actor")
def update_actor(state: ActorState, samples: list[Sample | None], critic_out: CriticOut) -> Metrics:
    """Policy steps against the critic's Q as given; temperature steps toward the target entropy."""
    cfg = state.cfg
    batches = minibatches(samples, cfg.batch_size, state.device)
    if not batches:
        return {"perf/frames": 0.0}
    state.q.load_state_dict(as_tensors(critic_out.q))
    if cfg.share_encoder:
        state.policy.trunk.load_state_dict(state.q.trunk.state_dict())  # published with the policy
    outs = [state.step(b) for b in batches]
    state.steps += len(outs)
    return {
        **critic_out.metrics,
        **step_means(outs, {"losses/policy": "loss", "losses/alpha": "alpha_loss", "charts/entropy": "entropy"}),
        "charts/alpha": state.alpha(),
        "perf/frames": float(len(batches) * cfg.batch_size),
    }


# ---------------------------------------------------------------------------------------------------
# One training iteration
# ---------------------------------------------------------------------------------------------------


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: ActorWeights) -> Metrics:
    """``eval_episodes`` whole episodes with the mean action (no sampling)."""
    state.net.load_state_dict(as_tensors(weights.policy))
    return state.run(state.net.greedy)


@evaluation
def eval_iteration():
    return evaluate(publish())


@iteration
def train_iteration():
    actor_weights = publish()
    stored = add(collect(actor_weights))
    batch = sample(stored)
    return update_actor(batch, update_critic(batch, actor_weights))
