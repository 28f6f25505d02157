"""TD3: twin Q with clipped double-Q targets, delayed policy updates, target policy smoothing.

Two learner roles, as in ``sac.py``: the ``critic`` role keeps the twin Q networks, their targets
and a target copy of the policy (Polyak-averaged toward the policy weights it receives); the
``actor`` role keeps the deterministic policy and makes one step per ``policy_delay`` critic steps.
They exchange weights once per update call.
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

ACTION_SPACES = (gym.spaces.Box,)  # a deterministic action scaled to the bounds

# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


@dataclass
class Config:
    steps: int = 16
    """Env steps per env per ``collect`` call."""
    gamma: float = 0.98
    """Discount factor."""
    n_step: int = 1
    """Steps of reward each replay row folds before bootstrapping (as DQN's ``n_step``)."""
    tau: float = 0.005
    """Polyak factor of the target networks."""
    lr: float = 1e-3
    """Adam learning rate of the policy and the Q networks."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gradient_steps: int = 16
    """Critic steps per update call; the two roles exchange weights after each call."""
    policy_delay: int = 2
    """Critic steps per policy step."""
    exploration_noise: float = 0.1
    """Std of the Gaussian action noise of samplers, relative to the action range's half-width."""
    target_noise: float = 0.2
    """Std of the target-policy smoothing noise (relative)."""
    target_noise_clip: float = 0.5
    """Clip of the smoothing noise (relative)."""
    buffer_size: int = 100_000
    """Replay capacity."""
    learning_starts: int = 1_000
    """Transitions stored before learning begins; samplers act uniformly at random until then."""
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
    pixels (DrQ's random shift, :func:`dagrl.nn.networks.random_shift`, which DrQ-v2 pairs with a
    deterministic actor as here; 4 for 84x84); 0: none."""
    share_encoder: bool = False
    """Image observations only: the actor reads the critic's encoder, its features detached (DrQ-v2's
    actor; Stable-Baselines3's ``share_features_extractor``), instead of training a CNN of its own. The
    actor's trunk is then the critic's, copied at each exchange and sent with the policy."""

    def __post_init__(self) -> None:
        at_least(self, 1, "steps", "batch_size", "gradient_steps", "policy_delay", "buffer_size", "hidden")
        at_least(self, 1, "eval_episodes", "n_step")
        at_least(self, 0, "learning_starts", "exploration_noise", "target_noise", "target_noise_clip", "augment_shift")
        positive(self, "lr")
        unit_interval(self, "gamma", "tau")

    def check_spaces(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Refuse, before any cluster starts, what the env's spaces rule out."""
        check_shift(self.augment_shift, obs_space)
        check_share_encoder(self.share_encoder, obs_space)


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


class Policy(nn.Module):
    """Deterministic, tanh-squashed and scaled to the action bounds."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: int, cnn: CNN = "nature"):
        super().__init__()
        if not isinstance(act_space, gym.spaces.Box):
            raise TypeError(f"TD3 needs a continuous (Box) action space, got {act_space}")
        self.trunk, n_obs = encoder(obs_space, hidden, cnn)  # its own; share_encoder: the critic's, copied
        self.net = mlp(n_obs, int(np.prod(act_space.shape)), hidden)
        self.register_buffer("scale", torch.as_tensor((act_space.high - act_space.low) / 2, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((act_space.high + act_space.low) / 2, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.act(self.trunk(obs))

    def act(self, features: torch.Tensor) -> torch.Tensor:
        """The action for the trunk's ``features``."""
        return torch.tanh(self.net(features)) * self.scale + self.bias


Metrics = dict[str, float]


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
    rng: np.random.Generator
    obs: np.ndarray
    recorder: Recorder
    random_steps: int
    steps_done: int = 0


@dataclass
class CriticState:
    cfg: Config
    q: TwinQ
    target: TwinQ
    target_policy: Policy
    given: Policy  # the policy weights of the current call, which the target policy drifts toward
    optimizer: torch.optim.Optimizer
    gen: torch.Generator
    device: torch.device
    steps: int = 0
    synced: bool = False  # the target policy starts as a copy of the first policy weights received
    step: CapturedStep | None = None  # one gradient step, replayed from a CUDA graph where asked
    step_and_polyak: CapturedStep | None = None  # the same, then the targets' Polyak step
    augment: Shift = Shift()  # augment_shift's, on every batch observation

    def state_dict(self) -> dict:
        return {
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "target_policy": self.target_policy.state_dict(),
            "opt": self.optimizer.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.q.load_state_dict(sd["q"])
        self.target.load_state_dict(sd["target"])
        self.target_policy.load_state_dict(sd["target_policy"])
        self.optimizer.load_state_dict(sd["opt"])
        self.steps = sd["steps"]
        self.synced = True
        set_capturable(self.optimizer, wants_graphs(self.cfg.cuda_graphs, self.device))
        for step in (self.step, self.step_and_polyak):
            if step is not None:
                step.reset()  # the optimizer's state tensors are new ones


@dataclass
class ActorState:
    cfg: Config
    policy: Policy
    q: TwinQ  # the critic's, as of the last exchange
    optimizer: torch.optim.Optimizer
    device: torch.device
    gen: torch.Generator  # augment_shift's draws
    steps: int = 0
    step: CapturedStep | None = None  # one gradient step, replayed from a CUDA graph where asked
    augment: Shift = Shift()  # augment_shift's, on every batch observation

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "opt": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, sd: dict) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.optimizer.load_state_dict(sd["opt"])
        self.steps = sd["steps"]
        set_capturable(self.optimizer, wants_graphs(self.cfg.cuda_graphs, self.device))
        if self.step is not None:
            self.step.reset()  # the optimizer's state tensors are new ones


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs = ctx.make_envs()
    obs, _ = envs.reset(seed=[ctx.seed + i for i in range(envs.num_envs)])
    envs.action_space.seed(ctx.seed)
    policy = Policy(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.cnn)
    random_steps = ctx.per_replica(cfg.learning_starts)
    rng = np.random.default_rng(ctx.seed)
    done = ctx.per_replica(ctx.env_steps)  # a resumed run or a replacement acts as the run has got to
    return SamplerState(cfg, envs, policy, rng, obs, Recorder(envs.num_envs, cfg.n_step, cfg.gamma), random_steps, done)


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
        target_policy = Policy(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    target = TwinQ(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    target.load_state_dict(q.state_dict())
    given = Policy(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr, capturable=graphs)
    gen = torch.Generator(device=dev).manual_seed(ctx.seed)
    state = CriticState(cfg, q, target, target_policy, given, opt, gen, dev)
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(critic_step, state, polyak=False), dev, [gen], enabled=graphs)
    state.step_and_polyak = CapturedStep(partial(critic_step, state, polyak=True), dev, [gen], enabled=graphs)
    return state


@role("actor")
def actor(ctx: RoleContext, cfg: Config) -> ActorState:
    dev = torch.device(ctx.device)
    with torch.random.fork_rng():
        torch.manual_seed(ctx.seed)
        policy = Policy(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
        q = TwinQ(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    q.requires_grad_(False)  # the critic's copy: the policy loss differentiates through it, never into it
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    gen = torch.Generator(device=dev).manual_seed(ctx.seed + 1)
    trained = policy.net.parameters() if cfg.share_encoder else policy.parameters()
    opt = torch.optim.Adam(trained, lr=cfg.lr, capturable=graphs)
    state = ActorState(cfg, policy, q, opt, dev, gen)
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(actor_step, state), dev, [gen], enabled=graphs)
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
def publish(state: ActorState) -> Weights:
    return to_numpy(state.policy)


@fragment(role="sampler")
def collect(state: SamplerState, weights: Weights) -> Transitions:
    """``steps`` steps of every env: uniform random actions until ``learning_starts``, then the
    policy plus Gaussian noise, clipped to the action bounds."""
    envs, space = state.envs, state.envs.single_action_space
    state.policy.load_state_dict(as_tensors(weights, torch.device("cpu")))
    half = (space.high - space.low) / 2
    for _ in range(state.cfg.steps):
        if state.steps_done < state.random_steps:
            action = envs.action_space.sample()
        else:
            with torch.no_grad():
                action = state.policy(torch.as_tensor(state.obs, dtype=torch.float32)).numpy()
            noise = state.rng.normal(0.0, state.cfg.exploration_noise, action.shape) * half
            action = np.clip(action + noise, space.low, space.high).astype(space.dtype)
        state.obs = state.recorder.step(envs, state.obs, action)
        state.steps_done += envs.num_envs
    return state.recorder.take(envs)


def critic_step(state: CriticState, b: dict[str, torch.Tensor], polyak: bool) -> dict[str, torch.Tensor]:
    """One clipped double-Q gradient step on batch ``b``; with ``polyak``, then the targets' Polyak step
    (the target policy toward ``state.given``)."""
    cfg, policy = state.cfg, state.target_policy
    half = policy.scale
    obs, next_obs = state.augment(b["obs"], state.gen), state.augment(b["next_obs"], state.gen)
    with torch.no_grad():
        noise = torch.randn(b["action"].shape, generator=state.gen, device=state.device) * cfg.target_noise
        noise = noise.clamp(-cfg.target_noise_clip, cfg.target_noise_clip) * half
        low, high = policy.bias - half, policy.bias + half
        next_action = torch.max(torch.min(policy(next_obs) + noise, high), low)
        tq1, tq2 = state.target(next_obs, next_action)
        discount = b.get("discount", cfg.gamma)  # n-step rows carry theirs
        target = b["reward"] + discount * (1 - b["terminated"]) * torch.min(tq1, tq2)
    q1, q2 = state.q(obs, b["action"])
    loss = ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.step()
    if polyak:
        with torch.no_grad():
            for p, tp in zip(state.q.parameters(), state.target.parameters(), strict=True):
                tp.lerp_(p, cfg.tau)
            for tp, gp in zip(policy.state_dict().values(), state.given.state_dict().values(), strict=True):
                if tp.is_floating_point():
                    tp.lerp_(gp, cfg.tau)
    return {"loss": loss.detach()}


def actor_step(state: ActorState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One deterministic policy-gradient step on batch ``b`` against Q1."""
    obs = state.augment(b["obs"], state.gen)
    if state.cfg.share_encoder:  # the critic's features, which the actor's loss does not train
        with torch.no_grad():
            features = state.q.trunk(obs)
        loss = -state.q.heads(features, state.policy.act(features))[0].mean()
    else:
        loss = -state.q(obs, state.policy(obs))[0].mean()
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.step()
    return {"loss": loss.detach()}


@fragment(role="critic")
def update_critic(state: CriticState, samples: list[Sample | None], policy_weights: Weights) -> CriticOut:
    """Clipped double-Q regression; the target policy drifts toward the policy weights as given."""
    cfg = state.cfg
    state.given.load_state_dict(as_tensors(policy_weights))
    if not state.synced:
        state.target_policy.load_state_dict(state.given.state_dict())
        state.synced = True
    outs = []
    for b in minibatches(samples, cfg.batch_size, state.device):
        state.steps += 1
        step = state.step_and_polyak if state.steps % cfg.policy_delay == 0 else state.step
        outs.append(step(b))
    return CriticOut(to_numpy(state.q), step_means(outs, {"losses/q": "loss"}) if outs else {})


@fragment(role="actor")
def update_actor(state: ActorState, samples: list[Sample | None], critic_out: CriticOut) -> Metrics:
    """One deterministic policy-gradient step per ``policy_delay`` batches, against the given Q1."""
    cfg = state.cfg
    every = minibatches(samples, cfg.batch_size, state.device)
    batches = every[:: cfg.policy_delay]
    if not batches:
        return {"perf/frames": 0.0}
    state.q.load_state_dict(as_tensors(critic_out.q, state.device))
    if cfg.share_encoder:
        state.policy.trunk.load_state_dict(state.q.trunk.state_dict())  # published with the policy
    outs = [state.step(b) for b in batches]
    state.steps += len(outs)
    return {
        **critic_out.metrics,
        **step_means(outs, {"losses/policy": "loss"}),
        "perf/frames": float(len(every) * cfg.batch_size),
    }


# ---------------------------------------------------------------------------------------------------
# One training iteration
# ---------------------------------------------------------------------------------------------------


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Weights) -> Metrics:
    """``eval_episodes`` whole episodes with the deterministic policy (no exploration noise)."""
    state.net.load_state_dict(as_tensors(weights))
    return state.run(state.net)


@evaluation
def eval_iteration():
    return evaluate(publish())


@iteration
def train_iteration():
    policy_weights = publish()
    stored = add(collect(policy_weights))
    batch = sample(stored)
    return update_actor(batch, update_critic(batch, policy_weights))
