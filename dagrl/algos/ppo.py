"""Proximal Policy Optimization (clipped), as fragments: samplers collect, the learner updates.

What PPO is: its update (clipped-PPO epochs over the rollouts, advantages from the learner's current
critic) and its iteration. The actor-critic, its roles and the sampler's ``collect`` are
:mod:`dagrl.algos.common.actor_critic`, shared with IMPALA. Nothing here knows how it is distributed.
Under ``async`` the rollouts a learner receives may come from older weights; the PPO ratio is taken
against the *behaviour* log-probs carried in each rollout, and advantages are recomputed with the
learner's current critic, so stale data is corrected the way APPO does (the runtime bounds how stale it
may be).
"""

from __future__ import annotations

import torch

from dagrl.algos.common.actor_critic import (  # the actor-critic, its roles, publish, collect, evaluate
    ACTION_SPACES,
    Config,
    LearnerState,
    Metrics,
    collect,
    end_update,
    eval_iteration,
    evaluate,
    evaluator,
    inference,
    learner,
    publish,
    sampler,
    start_update,
)
from dagrl.algos.common.epochs import clipped_loss, proximal, train_epochs
from dagrl.algos.common.rollouts import Rollout, gae
from dagrl.core.fragment import Manifest, fragment, iteration

__all__ = ["ALGORITHM", "Config", "collect", "eval_iteration", "evaluate", "publish", "train_iteration", "update"]


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[Rollout]) -> Metrics:
    """Clipped-PPO epochs over the gathered rollouts; advantages from the current critic."""
    cfg, agent, dev = state.cfg, state.agent, state.device
    obs, actions, logprobs, advantages, returns = [], [], [], [], []
    with torch.no_grad():
        for r in rollouts:
            T, N = r.rewards.shape
            o = torch.as_tensor(r.obs, device=dev).reshape(T * N, *r.obs.shape[2:])
            values = agent.value(o).reshape(T, N).cpu().numpy()
            last = agent.value(torch.as_tensor(r.last_obs, device=dev)).cpu().numpy()
            adv = gae(agent.scaled_rewards(r.rewards), values, r.dones, last, cfg.gamma, cfg.gae_lambda)
            obs.append(o)
            actions.append(torch.as_tensor(r.actions, device=dev).reshape(T * N, *r.actions.shape[2:]))
            logprobs.append(torch.as_tensor(r.logprobs, device=dev).reshape(-1))
            advantages.append(torch.as_tensor(adv, device=dev).reshape(-1))
            returns.append(torch.as_tensor(adv + values, device=dev).reshape(-1))
    b_obs, b_act, b_logp = torch.cat(obs), torch.cat(actions), torch.cat(logprobs)
    b_adv, b_ret = torch.cat(advantages), torch.cat(returns)
    batch = len(b_obs)
    mb = min(cfg.minibatch_size, batch)
    prox, stale = proximal(cfg, batch, mb, lambda s: agent.dist(b_obs[s]).log_prob(b_act[s]), b_logp)

    def loss_of(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dist, value = agent.dist_value(b_obs[idx])
        p = None if prox is None else prox[idx]
        return clipped_loss(cfg, dist, value, b_act[idx], b_logp[idx], b_adv[idx], b_ret[idx], p)

    lr = start_update(state)
    metrics, steps = train_epochs(state, batch, mb, loss_of)
    metrics.update(stale)
    agent.fold_statistics(b_obs, [r.disc_returns for r in rollouts], state.ctx.sum_over_replicas)
    end_update(state, metrics, lr, sum(r.env_steps for r in rollouts))
    metrics["perf/frames"] = float(steps * mb)
    return metrics


# ---------------------------------------------------------------------------------------------------
# One training iteration
# ---------------------------------------------------------------------------------------------------


@iteration
def train_iteration():
    weights = publish()
    rollouts = collect(weights)
    return update(rollouts)


ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, learner, evaluator, inference],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
)
