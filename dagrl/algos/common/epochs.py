"""An on-policy update: PPO's clipped loss, and epochs of minibatches over a batch of rollouts."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dagrl.algos.common.actor_critic import Config, LearnerState, Metrics
from dagrl.algos.common.distributions import ActionDist
from dagrl.nn.cuda_graphs import step_means


def clipped_loss(
    cfg: Config,
    dist: ActionDist,
    value: torch.Tensor,
    actions: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    prox: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped objective on one minibatch (``logprobs``: the behaviour policy's): the loss to
    minimise and its parts (policy, value, entropy, approximate KL, clip fraction). With ``prox`` (the
    proximal policy's log-probs, :func:`proximal`) the ratio is taken against it and each sample is
    weighted by proximal / behaviour probability: decoupled PPO."""
    logratio = dist.log_prob(actions) - (logprobs if prox is None else prox)
    ratio = logratio.exp()
    adv = advantages
    if cfg.norm_adv and len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
    if prox is not None:
        surrogate = (prox - logprobs).exp() * surrogate
    pg_loss = surrogate.mean()
    v_loss = ((value - returns) ** 2).mean()
    entropy = entropy_term(cfg.ent_coef, dist)
    loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()
    parts = {"policy": pg_loss, "value": v_loss, "entropy": entropy, "approx_kl": approx_kl, "clipfrac": clipfrac}
    return loss, parts


def entropy_term(ent_coef: float, dist: ActionDist) -> torch.Tensor:
    """The mean entropy of ``dist``; outside the autograd graph when ``ent_coef`` is 0, where it is only
    logged: the loss still subtracts 0 x entropy, which leaves the weights bit for bit as they were, but
    nothing differentiates the entropy."""
    if ent_coef:
        return dist.entropy().mean()
    with torch.no_grad():
        return dist.entropy().mean()


def proximal(
    cfg: Config, n: int, mb: int, logprobs_of: Callable[[slice], torch.Tensor], behaviour: torch.Tensor
) -> tuple[torch.Tensor | None, Metrics]:
    """With ``decoupled``: the log-probs under the learner's weights before the update's first step of
    each of the ``n`` samples (``logprobs_of`` a slice of them, ``mb`` at a time; samples along the last
    dimension) for :func:`clipped_loss`'s ``prox``, and ``losses/stale_kl``; without, ``None`` and no
    metrics."""
    if not cfg.decoupled:
        return None, {}
    with torch.no_grad():
        prox = torch.cat([logprobs_of(slice(start, start + mb)) for start in range(0, n, mb)], dim=-1)
        logratio = behaviour - prox
        stale_kl = (logratio.exp() - 1 - logratio).mean().item()
    return prox, {"losses/stale_kl": stale_kl}


def train_epochs(
    state: LearnerState,
    n: int,
    mb: int,
    loss_of: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> tuple[Metrics, int]:
    """``update_epochs`` passes over ``n`` items (transitions, or whole env sequences) in random
    minibatches of ``mb``, a gradient step on ``loss_of(indices)`` each (gradients averaged over
    data-parallel replicas, clipped); stops early past ``target_kl``. The mean of the loss parts, and
    the number of gradient steps.

    The loss parts stay on the device until the end and are read back in one transfer
    (:func:`~dagrl.nn.cuda_graphs.step_means`): a read-back per step would make a GPU learner wait for
    each step's kernels before it queues the next step's (without ``target_kl`` nothing else syncs)."""
    cfg, agent = state.cfg, state.agent
    outs: list[dict[str, torch.Tensor]] = []
    params = list(agent.parameters())
    for _ in range(cfg.update_epochs):
        order = torch.randperm(n, generator=state.gen).to(state.device)
        for start in range(0, n - mb + 1, mb):
            loss, parts = loss_of(order[start : start + mb])
            state.optimizer.zero_grad()
            loss.backward()
            state.ctx.average_gradients(params)
            nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            state.optimizer.step()
            outs.append({k: v.detach() for k, v in parts.items()})
        if cfg.target_kl is not None and state.ctx.mean_over_replicas(parts["approx_kl"].item()) > cfg.target_kl:
            break
    names = {f"losses/{k}": k for k in (outs[0] if outs else {})}
    return step_means(outs, names), len(outs)
