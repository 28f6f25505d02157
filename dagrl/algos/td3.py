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

from dagrl.algos.common import offpolicy
from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.algos.common.offpolicy import (
    ACTION_SPACES,
    CriticOut,
    Metrics,
    SamplerState,
    actor_networks,
    actor_steps,
    collect_steps,
    episode_runner,
    new_sampler,
    policy_maker,
    polyak,
    seeded,
    target_of,
    twin_q,
)
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, iteration, role
from dagrl.core.schema import at_least, positive
from dagrl.nn.cuda_graphs import CapturedStep, step_means, wants_graphs
from dagrl.nn.encoders import CNN, encoder, image_shift
from dagrl.nn.networks import Weights, as_tensors, minibatches, mlp, to_numpy
from dagrl.replay import Sample, Transitions
from dagrl.replay.role import add, sample  # noqa: F401 (the replay role's fragments)

__all__ = [
    "ACTION_SPACES", "Config", "actor", "collect", "critic", "eval_iteration", "evaluate", "evaluator", "publish",
    "replay", "sampler", "train_iteration", "update_actor", "update_critic",
]  # fmt: skip

# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


@dataclass
class Config(offpolicy.Config):
    """TD3's hyperparameters: the off-policy ones (:class:`dagrl.algos.common.offpolicy.Config`) and these."""

    gamma: float = 0.98
    """Discount factor."""
    lr: float = 1e-3
    """Adam learning rate of the policy and the Q networks."""
    policy_delay: int = 2
    """Critic steps per policy step."""
    exploration_noise: float = 0.1
    """Std of the Gaussian action noise of samplers, relative to the action range's half-width."""
    target_noise: float = 0.2
    """Std of the target-policy smoothing noise (relative)."""
    target_noise_clip: float = 0.5
    """Clip of the smoothing noise (relative)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "policy_delay")
        at_least(self, 0, "exploration_noise", "target_noise", "target_noise_clip")
        positive(self, "lr")


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


class Policy(offpolicy.BoundedPolicy):
    """Deterministic, tanh-squashed and scaled to the action bounds."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: int, cnn: CNN = "nature"):
        super().__init__(act_space, "TD3")
        self.trunk, n_obs = encoder(obs_space, hidden, cnn)  # its own; share_encoder: the critic's, copied
        self.net = mlp(n_obs, int(np.prod(act_space.shape)), hidden)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.act(self.trunk(obs))

    def act(self, features: torch.Tensor) -> torch.Tensor:
        """The action for the trunk's ``features``."""
        return self.scaled(torch.tanh(self.net(features)))


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CriticState(offpolicy.CriticState):
    target_policy: Policy
    given: Policy  # the policy weights of the current call, which the target policy drifts toward
    synced: bool = False  # the target policy starts as a copy of the first policy weights received
    step_and_polyak: CapturedStep | None = None  # a gradient step, then the targets' Polyak step

    def state_dict(self) -> dict:
        return {**super().state_dict(), "target_policy": self.target_policy.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.target_policy.load_state_dict(sd["target_policy"])
        super().load_state_dict(sd)
        self.synced = True

    def captured_steps(self) -> list[CapturedStep | None]:
        return [self.step, self.step_and_polyak]


ActorState = offpolicy.ActorState


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    return new_sampler(ctx, cfg, Policy)


replay = offpolicy.replay  # the shared replay role, bound here so that roles keep their order (and seeds)


@role("critic")
def critic(ctx: RoleContext, cfg: Config) -> CriticState:
    dev = torch.device(ctx.device)
    q, target_policy = seeded(ctx, lambda: twin_q(ctx, cfg), policy_maker(ctx, cfg, Policy))
    target = target_of(q, ctx, cfg)
    given = Policy(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(dev)
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr, capturable=graphs)
    gen = torch.Generator(device=dev).manual_seed(ctx.seed)
    state = CriticState(
        cfg=cfg, q=q, target=target, target_policy=target_policy, given=given, optimizer=opt, gen=gen, device=dev
    )
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(critic_step, state, and_polyak=False), dev, [gen], enabled=graphs)
    state.step_and_polyak = CapturedStep(partial(critic_step, state, and_polyak=True), dev, [gen], enabled=graphs)
    return state


@role("actor")
def actor(ctx: RoleContext, cfg: Config) -> ActorState:
    dev = torch.device(ctx.device)
    policy, q, trained = actor_networks(ctx, cfg, Policy)
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    gen = torch.Generator(device=dev).manual_seed(ctx.seed + 1)
    opt = torch.optim.Adam(trained, lr=cfg.lr, capturable=graphs)
    state = ActorState(cfg=cfg, policy=policy, q=q, optimizer=opt, gen=gen, device=dev)
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(actor_step, state), dev, [gen], enabled=graphs)
    return state


@role("evaluator", recover="replace")
def evaluator(ctx: RoleContext, cfg: Config) -> EpisodeRunner:
    return episode_runner(ctx, cfg, Policy)


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
    space = state.envs.single_action_space
    state.policy.load_state_dict(as_tensors(weights, torch.device("cpu")))
    half = (space.high - space.low) / 2

    def act(obs: torch.Tensor) -> np.ndarray:
        action = state.policy(obs).numpy()
        noise = state.rng.normal(0.0, state.cfg.exploration_noise, action.shape) * half
        return np.clip(action + noise, space.low, space.high).astype(space.dtype)

    return collect_steps(state, act)


def critic_step(state: CriticState, b: dict[str, torch.Tensor], and_polyak: bool) -> dict[str, torch.Tensor]:
    """One clipped double-Q gradient step on batch ``b``; with ``and_polyak``, then the targets' Polyak step
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
    loss = offpolicy.regress_twin_q(state, obs, b["action"], target)
    if and_polyak:
        polyak(state.q.parameters(), state.target.parameters(), cfg.tau)
        polyak(state.given.state_dict().values(), policy.state_dict().values(), cfg.tau)
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
    offpolicy.descend(state.optimizer, loss)
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
    outs, frames = actor_steps(state, samples, critic_out, every=state.cfg.policy_delay)
    if not outs:
        return {"perf/frames": 0.0}
    return {**critic_out.metrics, **step_means(outs, {"losses/policy": "loss"}), "perf/frames": frames}


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
