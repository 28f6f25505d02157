"""PPO whose learner raises once, mid-run (``DAGRL_FAULT_DIR`` marker): a learner failure whose worker
survives, for the stream's rollback tests. Everything else is :mod:`dagrl.algos.ppo`'s own."""

from __future__ import annotations

from dagrl import fragment, iteration
from dagrl.algos import ppo
from dagrl.algos.ppo import Config, learner, sampler  # noqa: F401  (the roles and config this algorithm runs)
from tests.faulty import once

FAIL_AT_UPDATE = 6


@fragment(role="learner")
def publish(state: ppo.LearnerState) -> ppo.Weights:
    return ppo.publish.fn(state)


@fragment(role="sampler")
def collect(state: ppo.SamplerState, weights: ppo.Weights) -> ppo.Rollout:
    return ppo.collect.fn(state, weights)


@fragment(role="learner")
def update(state: ppo.LearnerState, rollouts: list[ppo.Rollout]) -> ppo.Metrics:
    if state.updates >= FAIL_AT_UPDATE and once("learner-raised"):
        raise RuntimeError("the optimiser diverged")
    return ppo.update.fn(state, rollouts)


@iteration
def train_iteration():
    return update(collect(publish()))
