"""V-trace (Espeholt et al., 2018): value targets and advantages corrected for stale rollouts, IMPALA's
hyperparameters, and the learner's gradient steps that IMPALA and IMPALA-LSTM share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dagrl.algos.common.actor_critic import Config as ActorCriticConfig
from dagrl.algos.common.actor_critic import LearnerState
from dagrl.algos.common.distributions import ActionDist
from dagrl.algos.common.epochs import entropy_term
from dagrl.algos.common.rollouts import Rollout
from dagrl.core.schema import Widths, at_least, positive, unit_interval, widths_fit
from dagrl.nn.encoders import CNN


@dataclass
class Config:
    num_steps: int = 32
    """Env steps per env per rollout."""
    gamma: float = 0.98
    """Discount factor."""
    vtrace_lambda: float = 1.0
    """Lambda of the trace coefficients c_t (1: the paper's)."""
    rho_bar: float = 1.0
    """Truncation of the importance ratio in the TD errors and the policy gradient."""
    c_bar: float = 1.0
    """Truncation of the importance ratio in the traces."""
    vtrace: bool = True
    """False: ratios taken as 1 (no off-policy correction), for comparison. On stale enough rollouts of
    ``dagrl.envs:LaterPayoff-v0`` that goes wrong where V-trace does not (``dagrl bench vtrace``)."""
    lr: float = 5e-4
    """Adam learning rate. Nothing bounds how far a step moves the policy (no ratio clip, unlike PPO): on
    CartPole under ``async``, 1e-3 let 5 of 12 runs collapse for good (one action always, entropy near 0)
    after a batch whose mean KL reached 0.02-0.12; at 5e-4 none of 12 did (BENCHMARKS.md)."""
    kl_adaptive_lr: float | None = None
    """A KL per batch to hold the step size to: after each batch, the policy's move over it (mean KL
    estimate, the batch's start against after its last step) sets the next batch's learning rate,
    divided by 1.5 above twice this, multiplied by 1.5 below half of it, within ``lr / 100`` and
    ``lr * kl_adaptive_lr_max`` (the adaptive schedule of rl_games' PPO); ``None``: ``lr`` throughout.
    The rate is the optimizer's, so a checkpoint keeps it. The CartPole graphs use 0.004: 475 came
    after ~40-60k env steps at the median instead of ~115-125k at a constant 5e-4 (BENCHMARKS.md)."""
    kl_adaptive_lr_max: float = 10.0
    """The highest rate ``kl_adaptive_lr`` may reach, as a multiple of ``lr``. A rate grown high while
    batches moved the policy little lets one batch move it far: on CartPole under ``async``, 10 x left 3
    of 8 runs under 475 at the end (one collapsed for good), 3 x one of 8, at 1.5 x the env steps to
    first reach 475 (BENCHMARKS.md); ``graphs/impala-cartpole.yaml`` uses 3."""
    update_epochs: int = 2
    """Gradient steps per batch of rollouts, each with targets recomputed from the current critic. On
    CartPole four steps per batch at ``lr`` 1e-3 collapsed the policy more often than two."""
    target_kl: float | None = None
    """Stop a batch's gradient steps once the policy has moved this far from where the batch began
    (mean KL estimate over the batch's states), as PPO's ``target_kl``; ``None``: run them all. It bounds
    one batch's move, not the drift over many: on CartPole with four steps per batch, 0.02 did not stop
    the collapses that two steps per batch avoid."""
    norm_adv: bool = False
    """Standardise the batch's policy-gradient advantages (mean 0, std 1) before the step, as PPO does
    per minibatch; ``False``: V-trace's advantages as they are (the paper's update), whose scale follows
    the returns'. On CartPole under ``async`` it made learning worse: over 6 seeds of 150k env steps,
    475 reached by 1 run at ``lr`` 1e-3 and 4 at 5e-4 (most fell back below 300), against 10 of 12
    without it at 5e-4 (BENCHMARKS.md)."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    hidden: Widths = 64
    """The hidden layers' widths of the actor and of the critic: one width for two layers, or each layer's in order
    (``[400, 300]``)."""
    cnn: CNN = "nature"
    """Encoder of image observations, as PPO's."""
    norm_obs: bool = False
    """Running observation standardisation, as PPO's."""
    norm_reward: bool = False
    """Rewards divided by the running std of discounted returns, as PPO's."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), acting greedily."""

    def __post_init__(self) -> None:
        at_least(self, 1, "num_steps", "update_epochs", "hidden", "eval_episodes", "kl_adaptive_lr_max")
        widths_fit(self, "hidden")
        at_least(self, 0, "ent_coef", "vf_coef")
        positive(self, "lr", "max_grad_norm", "rho_bar", "c_bar", "target_kl", "kl_adaptive_lr")
        unit_interval(self, "gamma", "vtrace_lambda")

    check_spaces = ActorCriticConfig.check_spaces


def vtrace(
    log_rhos: torch.Tensor,
    rewards: torch.Tensor,
    dones: torch.Tensor,
    values: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets ``v_s`` and policy-gradient advantages for ``[T, N]`` tensors.

    ``dones[t]`` cuts the bootstrap after step t. With every ``log_rhos`` 0 (on-policy) and
    ``lam`` 1, ``v_s`` is the n-step return bootstrapped from ``last_value``.

    >>> T = torch.tensor
    >>> v, adv = vtrace(T([[0.0], [0.0]]), T([[1.0], [1.0]]), T([[0.0], [0.0]]), T([[0.0], [0.0]]), T([0.0]), 0.5)
    >>> v.flatten().tolist(), adv.flatten().tolist()
    ([1.5, 1.0], [1.5, 1.0])
    """
    rhos = log_rhos.exp()
    clipped_rho = rhos.clamp(max=rho_bar)
    cs = lam * rhos.clamp(max=c_bar)
    live = 1.0 - dones
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)])
    deltas = clipped_rho * (rewards + gamma * live * next_values - values)
    diffs = torch.zeros_like(values)  # v_s - V(x_s)
    running = torch.zeros_like(last_value)
    for t in reversed(range(len(rewards))):
        running = deltas[t] + gamma * live[t] * cs[t] * running
        diffs[t] = running
    targets = values + diffs
    next_targets = torch.cat([targets[1:], last_value.unsqueeze(0)])
    advantages = clipped_rho * (rewards + gamma * live * next_targets - values)
    return targets, advantages


Forward = Callable[[], tuple[ActionDist, torch.Tensor, torch.Tensor]]
"""The network over a batch, with gradients: the policy at its ``T * n`` steps (flat), the values
``[T, n]``, and the values of the observations after its last steps ``[n]``."""


def learn(
    state: LearnerState,
    rollouts: list[Rollout],
    forward: Forward,
    flat_obs: torch.Tensor,
    policy: Callable[[], ActionDist] | None = None,
) -> dict[str, float]:
    """IMPALA's gradient steps on the batch ``rollouts`` make (stacked along envs), the network run by
    ``forward`` (feed-forward here, unrolled by ``impala_lstm``); ``flat_obs``, its observations, for the
    running statistics. ``policy`` runs the policy alone (``kl_adaptive_lr``'s look at where the batch
    left it), when that costs less than ``forward``."""
    cfg, agent, dev = state.cfg, state.agent, state.device
    params = list(agent.parameters())
    T = len(rollouts[0].rewards)

    def cat(field: str) -> torch.Tensor:
        return torch.as_tensor(np.concatenate([getattr(r, field) for r in rollouts], axis=1), device=dev)

    actions, behaviour, dones = cat("actions"), cat("logprobs"), cat("dones")
    rewards = torch.as_tensor(np.concatenate([agent.scaled_rewards(r.rewards) for r in rollouts], axis=1), device=dev)
    n = actions.shape[1]
    flat_act = actions.reshape(T * n, *actions.shape[2:])
    stats = {"policy": 0.0, "value": 0.0, "entropy": 0.0, "rho_mean": 0.0, "rho_clipfrac": 0.0, "approx_kl": 0.0}
    start: torch.Tensor | None = None  # log-probs of the batch's actions before its first step
    steps = 0
    for _ in range(cfg.update_epochs):
        dist, values, last = forward()
        logp = dist.log_prob(flat_act).reshape(T, n)
        if start is None:
            start = logp.detach()
        with torch.no_grad():
            logratio = logp - start
            approx_kl = ((logratio.exp() - 1) - logratio).mean().item()
        if cfg.target_kl is not None and steps and state.ctx.mean_over_replicas(approx_kl) > cfg.target_kl:
            break
        steps += 1
        stats["approx_kl"] += approx_kl
        with torch.no_grad():
            log_rhos = logp - behaviour if cfg.vtrace else torch.zeros_like(logp)
            targets, adv = vtrace(
                log_rhos, rewards, dones, values, last, cfg.gamma, cfg.vtrace_lambda, cfg.rho_bar, cfg.c_bar
            )
            rhos = (logp - behaviour).exp()
            if cfg.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = -(logp * adv).mean()
        v_loss = ((values - targets) ** 2).mean()
        entropy = entropy_term(cfg.ent_coef, dist)
        loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
        state.optimizer.zero_grad()
        loss.backward()
        state.ctx.average_gradients(params)
        nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        state.optimizer.step()
        stats["policy"] += pg_loss.item()
        stats["value"] += v_loss.item()
        stats["entropy"] += entropy.item()
        stats["rho_mean"] += rhos.mean().item()
        stats["rho_clipfrac"] += (rhos > cfg.rho_bar).float().mean().item()
    if cfg.kl_adaptive_lr is not None:
        with torch.no_grad():
            dist = policy() if policy is not None else forward()[0]
            logratio = dist.log_prob(flat_act).reshape(T, n) - start
            moved = state.ctx.mean_over_replicas(((logratio.exp() - 1) - logratio).mean().item())
        adapt_lr(state.optimizer, moved, cfg.kl_adaptive_lr, cfg.lr, cfg.kl_adaptive_lr_max)
    agent.fold_statistics(flat_obs, [r.disc_returns for r in rollouts], state.ctx.sum_over_replicas)
    state.updates += 1
    metrics = {f"losses/{k}": v / steps for k, v in stats.items()}
    metrics["losses/lr"] = state.optimizer.param_groups[0]["lr"]
    metrics["losses/steps"] = float(steps)
    metrics["perf/frames"] = float(steps * T * n)
    return metrics


def adapt_lr(optimizer: torch.optim.Optimizer, kl: float, target: float, base: float, most: float = 10.0) -> None:
    """The next batch's learning rate from this batch's move ``kl`` (:attr:`Config.kl_adaptive_lr`)."""
    for group in optimizer.param_groups:
        if kl > 2.0 * target:
            group["lr"] = max(group["lr"] / 1.5, base / 100)
        elif kl < 0.5 * target:
            group["lr"] = min(group["lr"] * 1.5, base * most)
