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
from dagrl.core.schema import positive
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

    def __init__(self, obs_space: gym.spaces.Box, act_space: gym.spaces.Box, hidden: int, cnn: CNN = "nature"):
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


@dataclass
class ActorWeights:
    policy: Weights
    alpha: float


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CriticState(offpolicy.CriticState):
    policy: Policy  # the actor's, as of the last exchange: the soft targets' next actions


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
        self.alpha_optimizer.load_state_dict(sd["alpha_opt"])
        super().load_state_dict(sd)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer, self.alpha_optimizer]


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    return new_sampler(ctx, cfg, Policy)


replay = offpolicy.replay  # the shared replay role, bound here so that roles keep their order (and seeds)


@role("critic")
def critic(ctx: RoleContext, cfg: Config) -> CriticState:
    dev = torch.device(ctx.device)
    q, policy = seeded(ctx, lambda: twin_q(ctx, cfg), policy_maker(ctx, cfg, Policy))
    target = target_of(q, ctx, cfg)
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    opt = torch.optim.Adam(q.parameters(), lr=cfg.q_lr, capturable=graphs)
    gen = torch.Generator(device=dev).manual_seed(ctx.seed)
    state = CriticState(cfg=cfg, q=q, target=target, policy=policy, optimizer=opt, gen=gen, device=dev)
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(critic_step, state), dev, [state.gen], enabled=graphs)
    return state


@role("actor")
def actor(ctx: RoleContext, cfg: Config) -> ActorState:
    dev = torch.device(ctx.device)
    policy, q, trained = actor_networks(ctx, cfg, Policy)
    log_alpha = torch.zeros(1, device=dev, requires_grad=True)
    graphs = wants_graphs(cfg.cuda_graphs, dev)
    state = ActorState(
        cfg=cfg, policy=policy, q=q, optimizer=torch.optim.Adam(trained, lr=cfg.policy_lr, capturable=graphs),
        gen=torch.Generator(device=dev).manual_seed(ctx.seed), device=dev, log_alpha=log_alpha,
        alpha_optimizer=torch.optim.Adam([log_alpha], lr=cfg.policy_lr, capturable=graphs),
        target_entropy=-float(np.prod(ctx.action_space.shape)),
    )  # fmt: skip
    state.augment = image_shift(ctx.observation_space, cfg.augment_shift)
    state.step = CapturedStep(partial(actor_step, state), dev, [state.gen], enabled=graphs)
    return state


@role("evaluator", recover="replace")
def evaluator(ctx: RoleContext, cfg: Config) -> EpisodeRunner:
    return episode_runner(ctx, cfg, Policy)


# ---------------------------------------------------------------------------------------------------
# Fragments
# ---------------------------------------------------------------------------------------------------


@fragment(role="actor")
def publish(state: ActorState) -> ActorWeights:
    return ActorWeights(to_numpy(state.policy), state.alpha())


@fragment(role="sampler")
def collect(state: SamplerState, weights: ActorWeights) -> Transitions:
    """``steps`` steps of every env: uniform random actions until ``learning_starts``, then the policy."""
    state.policy.load_state_dict(as_tensors(weights.policy))
    return collect_steps(state, lambda obs: state.policy(obs, state.gen)[0].numpy())


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
    loss = offpolicy.regress_twin_q(state, obs, b["action"], target)
    polyak(state.q.parameters(), state.target.parameters(), cfg.tau)
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
    offpolicy.descend(state.optimizer, loss)
    out = {"loss": loss.detach(), "entropy": -logp.detach().mean()}
    if cfg.alpha is None:
        alpha_loss = -(state.log_alpha * (logp.detach() + state.target_entropy)).mean()
        offpolicy.descend(state.alpha_optimizer, alpha_loss)
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
    outs, frames = actor_steps(state, samples, critic_out)
    if not outs:
        return {"perf/frames": 0.0}
    return {
        **critic_out.metrics,
        **step_means(outs, {"losses/policy": "loss", "losses/alpha": "alpha_loss", "charts/entropy": "entropy"}),
        "charts/alpha": state.alpha(),
        "perf/frames": frames,
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
