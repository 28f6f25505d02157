"""PPO whose learner never averages its gradients: data-parallel replicas drift apart (for the tests)."""

from __future__ import annotations

from dagrl.algos import ppo
from dagrl.algos.ppo import Config, collect, publish, sampler, train_iteration, update  # noqa: F401
from dagrl.core.fragment import role


class Alone:
    """A context that ignores the other replicas."""

    def average_gradients(self, parameters):
        pass

    def mean_over_replicas(self, value):
        return value

    def sum_over_replicas(self, values):
        return values


@role("learner")
def learner(ctx, cfg):
    state = ppo.learner(ctx, cfg)
    state.ctx = Alone()
    return state
