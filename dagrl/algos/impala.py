"""IMPALA: an actor-critic learner correcting stale rollouts with V-trace (Espeholt et al., 2018).

Samplers act with whatever weights they last received; the learner's policy has moved on since, so
each rollout is off-policy by a few updates. V-trace weighs every step by the truncated importance
ratio rho_t = min(rho_bar, pi(a|x) / mu(a|x)) of the learner's policy pi against the behaviour
policy mu (whose log-probs the rollout carries), and builds value targets

    v_s = V(x_s) + delta_s + gamma c_s (v_{s+1} - V(x_{s+1})),   delta_s = rho_s (r_s + gamma V(x_{s+1}) - V(x_s)),

with c_s = lambda min(c_bar, ratio), cut at episode ends. The policy follows rho_s grad log pi(a_s|x_s)
(r_s + gamma v_{s+1} - V(x_s)). With ``vtrace: false`` every ratio is taken as 1: the same updates
without the correction (what staleness costs, measured by ``dagrl bench vtrace``).

Samplers, their rollouts, the learner's state, ``publish`` and the evaluator are PPO's
(:mod:`dagrl.algos.ppo`, which reads only the hyperparameters both ``Config``s have): only the
learner's update differs. Runs under every policy; it is meant for ``async`` with a large
``max_staleness`` (``graphs/impala-cartpole.yaml``).
"""

from __future__ import annotations

import numpy as np
import torch

from dagrl.algos.common.actor_critic import (  # PPO's roles, publish, collect, evaluate
    ACTION_SPACES,
    LearnerState,
    collect,
    eval_iteration,
    evaluate,
    evaluator,
    inference,
    learner,
    publish,
    sampler,
)
from dagrl.algos.common.rollouts import Rollout
from dagrl.algos.common.vtrace import Config, learn, vtrace
from dagrl.core.fragment import Manifest, fragment, iteration

__all__ = [
    "ALGORITHM", "Config", "collect", "eval_iteration", "evaluate", "publish", "train_iteration", "update", "vtrace",
]  # fmt: skip


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[Rollout]) -> dict[str, float]:
    """``update_epochs`` gradient steps on the whole batch, V-trace targets recomputed for each; fewer
    once the policy moved past ``target_kl`` (the KL estimate of PPO's update, against the batch's start)."""
    agent, dev = state.agent, state.device
    T = len(rollouts[0].rewards)  # every rollout has the same shape: stack them along envs
    obs = torch.as_tensor(np.concatenate([r.obs for r in rollouts], axis=1), device=dev)
    last_obs = torch.as_tensor(np.concatenate([r.last_obs for r in rollouts]), device=dev)
    n = obs.shape[1]
    flat_obs = obs.reshape(T * n, *obs.shape[2:])

    def forward() -> tuple[torch.distributions.Distribution, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            last = agent.value(last_obs)
        return agent.dist(flat_obs), agent.value(flat_obs).reshape(T, n), last

    return learn(state, rollouts, forward, flat_obs, policy=lambda: agent.dist(flat_obs))


@iteration
def train_iteration():
    return update(collect(publish()))


ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, learner, evaluator, inference],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
)
