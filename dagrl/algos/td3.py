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
from dagrl.algos.common.offpolicy import (  # the fragments and the iterations SAC and TD3 share
    ACTION_SPACES,
    Published,
    add,
    collect,
    eval_iteration,
    evaluate,
    polyak,
    publish,
    sample,
    train_iteration,
    update_actor,
    update_critic,
)
from dagrl.core.context import RoleContext
from dagrl.core.fragment import Manifest, role
from dagrl.core.schema import at_least, positive
from dagrl.nn.cuda_graphs import CapturedStep
from dagrl.nn.encoders import CNN, encoder
from dagrl.nn.networks import Widths, as_tensors, mlp

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

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: Widths, cnn: CNN = "nature"):
        super().__init__(act_space, "TD3")
        self.trunk, n_obs = encoder(obs_space, hidden, cnn)  # its own; share_encoder: the critic's, copied
        self.net = mlp(n_obs, int(np.prod(act_space.shape)), hidden)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.act(self.trunk(obs))

    def act(self, features: torch.Tensor) -> torch.Tensor:
        """The action for the trunk's ``features``."""
        return self.scaled(torch.tanh(self.net(features)))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The action itself (evaluation: no exploration noise)."""
        return self(obs)

    def explore(self, obs: torch.Tensor, sampler: offpolicy.SamplerState) -> np.ndarray:
        """The action plus Gaussian noise (``exploration_noise`` of the half-range), clipped to the bounds."""
        space = sampler.envs.single_action_space
        action = self(obs).numpy()
        noise = sampler.rng.normal(0.0, sampler.cfg.exploration_noise, action.shape) * (space.high - space.low) / 2
        return np.clip(action + noise, space.low, space.high).astype(space.dtype)


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CriticState(offpolicy.CriticState):
    given: Policy  # the policy weights of the current call, which the target policy drifts toward
    synced: bool = False  # the target policy starts as a copy of the first policy weights received
    step_and_polyak: CapturedStep | None = None  # a gradient step, then the targets' Polyak step

    def state_dict(self) -> dict:
        return {**super().state_dict(), "target_policy": self.policy.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.policy.load_state_dict(sd["target_policy"])
        super().load_state_dict(sd)
        self.synced = True

    def captured_steps(self) -> list[CapturedStep | None]:
        return [self.step, self.step_and_polyak]

    def receive(self, published: Published) -> None:
        self.given.load_state_dict(as_tensors(published.policy))
        if not self.synced:
            self.policy.load_state_dict(self.given.state_dict())
            self.synced = True

    def gradient_step(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A step; every ``policy_delay``-th also moves the targets (as the actor steps then)."""
        self.steps += 1
        return (self.step_and_polyak if self.steps % self.cfg.policy_delay == 0 else self.step)(b)


ActorState = offpolicy.ActorState
sampler = offpolicy.sampler_of(Policy)
replay = offpolicy.replay  # the roles bound in their order, which gives each its seed


@role("critic")
def critic(ctx: RoleContext, cfg: Config) -> CriticState:
    given = Policy(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.cnn).to(torch.device(ctx.device))
    state = offpolicy.new_critic(
        ctx, cfg, CriticState, Policy, cfg.lr, partial(critic_step, and_polyak=False), given=given
    )
    state.step_and_polyak = offpolicy.captured(state, partial(critic_step, and_polyak=True))
    return state


@role("actor")
def actor(ctx: RoleContext, cfg: Config) -> ActorState:
    return offpolicy.new_actor(ctx, cfg, ActorState, Policy, cfg.lr, actor_step, ctx.seed + 1, every=cfg.policy_delay)


evaluator = offpolicy.evaluator_of(Policy)


# ---------------------------------------------------------------------------------------------------
# Gradient steps
# ---------------------------------------------------------------------------------------------------


def critic_step(state: CriticState, b: dict[str, torch.Tensor], and_polyak: bool) -> dict[str, torch.Tensor]:
    """One clipped double-Q gradient step on batch ``b``, the target policy's actions smoothed by clipped
    noise; with ``and_polyak``, then the targets' Polyak step (the target policy toward ``state.given``)."""
    cfg, policy = state.cfg, state.policy

    def smoothed(next_obs: torch.Tensor) -> tuple[torch.Tensor, float]:
        noise = torch.randn(b["action"].shape, generator=state.gen, device=state.device) * cfg.target_noise
        noise = noise.clamp(-cfg.target_noise_clip, cfg.target_noise_clip) * policy.scale
        low, high = policy.bias - policy.scale, policy.bias + policy.scale
        return torch.max(torch.min(policy(next_obs) + noise, high), low), 0.0

    loss = offpolicy.twin_q_step(state, b, smoothed)
    if and_polyak:
        polyak(state.q.parameters(), state.target.parameters(), cfg.tau)
        polyak(state.given.state_dict().values(), policy.state_dict().values(), cfg.tau)
    return {"loss": loss.detach()}


def actor_step(state: ActorState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One deterministic policy-gradient step on batch ``b`` against Q1."""
    _, q1, _ = offpolicy.through_q(state, b, state.policy.act)
    loss = -q1.mean()
    offpolicy.descend(state.optimizer, loss)
    return {"loss": loss.detach()}


__all__ = [
    "ALGORITHM", "Config", "add", "collect", "eval_iteration", "evaluate", "publish", "sample", "train_iteration",
    "update_actor", "update_critic",
]  # fmt: skip

ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, replay, critic, actor, evaluator],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
)
