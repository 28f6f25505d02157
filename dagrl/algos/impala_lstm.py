"""IMPALA with a recurrent policy, the paper's own shape: V-trace over whole env sequences, an LSTM.

The roles and the sampler side are ``ppo_lstm``'s (each env's LSTM state carried across rollouts, a
rollout carrying the state it began with; under ``central-inference`` the states travel with the
observations); the learner is IMPALA's (:func:`dagrl.algos.vtrace.learn`), its network unrolled over
each batch's env sequences from the states they began with, as the paper's learner does with the
actors' stored states. Stale rollouts under ``async`` are corrected by V-trace as in ``impala``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dagrl.algos.common import vtrace
from dagrl.algos.common.actor_critic import LearnerState
from dagrl.algos.common.recurrent import (  # PPO-LSTM's roles, publish, collect, evaluate
    ACTION_SPACES,
    Recurrent,
    RecurrentRollout,
    Sequences,
    collect,
    eval_iteration,
    evaluate,
    evaluator,
    inference,
    learner,
    publish,
    sampler,
)
from dagrl.core.fragment import Manifest, fragment, iteration

__all__ = ["ALGORITHM", "Config", "collect", "eval_iteration", "evaluate", "publish", "train_iteration", "update"]


@dataclass
class Config(Recurrent, vtrace.Config):
    """IMPALA's hyperparameters and the LSTM's width."""


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[RecurrentRollout]) -> dict[str, float]:
    """IMPALA's gradient steps on the batch, the LSTM unrolled over every env sequence for each."""
    agent = state.agent
    seq = Sequences.of(rollouts, state.device, agent)

    def forward() -> tuple[torch.distributions.Distribution, torch.Tensor, torch.Tensor]:
        flat, values, last = seq.values(agent)
        return agent.heads.dist(flat), values, last.detach()

    flat_obs = seq.obs.reshape(-1, *seq.obs.shape[2:])
    return vtrace.learn(state, rollouts, forward, flat_obs)


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
