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
from dagrl.core.schema import positive
from dagrl.nn.cuda_graphs import wants_graphs
from dagrl.nn.encoders import CNN, encoder
from dagrl.nn.networks import Widths, as_tensors, mlp
from dagrl.nn.optim import load_state

# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


@dataclass
class Config(offpolicy.Config):
    """SAC's hyperparameters: the off-policy ones (:class:`dagrl.algos.common.offpolicy.Config`) and these."""

    policy_lr: float = 1e-3
    """Adam learning rate of the policy and the temperature."""
    q_lr: float = 1e-3
    """Adam learning rate of the Q networks."""
    alpha: float | None = None
    """Fixed entropy temperature; ``None`` tunes it toward ``-action_dim`` entropy."""

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "policy_lr", "q_lr", "alpha")


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


class Policy(offpolicy.BoundedPolicy):
    """Tanh-squashed Gaussian, scaled to the action bounds."""

    def __init__(self, obs_space: gym.spaces.Box, act_space: gym.spaces.Box, hidden: Widths, cnn: CNN = "nature"):
        super().__init__(act_space, "SAC")
        n_act = int(np.prod(act_space.shape))
        self.trunk, n_obs = encoder(obs_space, hidden, cnn)  # its own; share_encoder: the critic's, copied
        self.net = mlp(n_obs, 2 * n_act, hidden)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The squashed mean action (evaluation)."""
        mean = self.net(self.trunk(obs)).chunk(2, dim=-1)[0]
        return self.scaled(torch.tanh(mean))

    def forward(self, obs: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.act(self.trunk(obs), gen)

    def sample(self, obs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """A sampled action (``dagrl eval --stochastic``)."""
        return self(obs, gen)[0]

    def explore(self, obs: torch.Tensor, sampler: offpolicy.SamplerState) -> np.ndarray:
        """A sampled action (a sampler's, from its generator)."""
        return self(obs, sampler.gen)[0].numpy()

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
        return self.scaled(squashed), log_prob


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CriticState(offpolicy.CriticState):
    alpha: torch.Tensor | None = None  # the actor's temperature, as of the last exchange

    def receive(self, published: Published) -> None:
        self.policy.load_state_dict(as_tensors(published.policy))
        self.alpha = torch.tensor(published.values["alpha"], dtype=torch.float32, device=self.device)

    def gradient_step(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.steps += 1
        return self.step({**b, "alpha": self.alpha})


@dataclass(kw_only=True)
class ActorState(offpolicy.ActorState):
    log_alpha: torch.Tensor
    alpha_optimizer: torch.optim.Optimizer
    target_entropy: float

    def alpha(self) -> float:
        return self.cfg.alpha if self.cfg.alpha is not None else float(self.log_alpha.detach().exp())

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "log_alpha": self.log_alpha.detach().cpu(),
            "alpha_opt": self.alpha_optimizer.state_dict(),
        }

    def load_state_dict(self, sd: dict) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(sd["log_alpha"])
        load_state(self.alpha_optimizer, sd["alpha_opt"])
        super().load_state_dict(sd)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer, self.alpha_optimizer]

    def published(self) -> dict[str, float]:
        return {"alpha": self.alpha()}


sampler = offpolicy.sampler_of(Policy)
replay = offpolicy.replay  # the roles bound in their order, which gives each its seed


@role("critic")
def critic(ctx: RoleContext, cfg: Config) -> CriticState:
    return offpolicy.new_critic(ctx, cfg, CriticState, Policy, cfg.q_lr, critic_step)


@role("actor")
def actor(ctx: RoleContext, cfg: Config) -> ActorState:
    log_alpha = torch.zeros(1, device=torch.device(ctx.device), requires_grad=True)
    alpha_optimizer = torch.optim.Adam(
        [log_alpha], lr=cfg.policy_lr, capturable=wants_graphs(cfg.cuda_graphs, ctx.device)
    )
    return offpolicy.new_actor(
        ctx, cfg, ActorState, Policy, cfg.policy_lr, actor_step, ctx.seed, log_alpha=log_alpha,
        alpha_optimizer=alpha_optimizer, target_entropy=-float(np.prod(ctx.action_space.shape)),
        charts={"losses/policy": "loss", "losses/alpha": "alpha_loss", "charts/entropy": "entropy"},
    )  # fmt: skip


evaluator = offpolicy.evaluator_of(Policy)


# ---------------------------------------------------------------------------------------------------
# Gradient steps
# ---------------------------------------------------------------------------------------------------


def critic_step(state: CriticState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One twin-Q gradient step on batch ``b`` toward soft targets (``b["alpha"]``: the actor's
    temperature), then Polyak."""

    def soft(next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        next_action, next_logp = state.policy(next_obs, state.gen)
        return next_action, b["alpha"] * next_logp

    loss = offpolicy.twin_q_step(state, b, soft)
    polyak(state.q.parameters(), state.target.parameters(), state.cfg.tau)
    return {"loss": loss.detach()}


def actor_step(state: ActorState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One policy gradient step on batch ``b``; then, unless fixed, one temperature step."""
    cfg = state.cfg
    alpha = cfg.alpha if cfg.alpha is not None else state.log_alpha.detach().exp()
    (_, logp), q1, q2 = offpolicy.through_q(state, b, partial(state.policy.act, gen=state.gen))
    loss = (alpha * logp - torch.min(q1, q2)).mean()
    offpolicy.descend(state.optimizer, loss)
    out = {"loss": loss.detach(), "entropy": -logp.detach().mean()}
    if cfg.alpha is None:
        alpha_loss = -(state.log_alpha * (logp.detach() + state.target_entropy)).mean()
        offpolicy.descend(state.alpha_optimizer, alpha_loss)
        out["alpha_loss"] = alpha_loss.detach()
    return out


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
