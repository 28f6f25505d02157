"""PPO whose update costs ``update_us_per_row`` more per row it learns from, slept: a learner bound by its
device (a GPU), on a machine of few cores, for ``dagrl bench scaling --learners``.

The cost is what ``CostlyCartPole`` is to the samplers: each row of each epoch (``perf/frames``) adds
``update_us_per_row`` microseconds after the update, which a replica of a learner group pays for its
own share only. Sleeping, it leaves the CPU to the others, as a GPU kernel would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dagrl.algos import ppo
from dagrl.core.fragment import Manifest, fragment, iteration


@dataclass
class Config(ppo.Config):
    update_us_per_row: float = 0.0
    """Microseconds each row of each epoch costs the learner on top of its update."""


@fragment(role="learner")
def update(state: ppo.LearnerState, rollouts: list[ppo.Rollout]) -> ppo.Metrics:
    metrics = ppo.update(state, rollouts)
    time.sleep(state.cfg.update_us_per_row * metrics["perf/frames"] / 1e6)
    return metrics


@iteration
def train_iteration():
    weights = ppo.publish()
    rollouts = ppo.collect(weights)
    return update(rollouts)


ALGORITHM = Manifest(config=Config, roles=[ppo.sampler, ppo.learner], iteration=train_iteration)
