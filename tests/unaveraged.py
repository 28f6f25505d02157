"""PPO whose learner never averages its gradients: data-parallel replicas drift apart (for the tests)."""

from __future__ import annotations

from dagrl.algos import ppo
from dagrl.algos.ppo import Config, sampler, train_iteration
from dagrl.core.fragment import Manifest, role


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


ALGORITHM = Manifest(config=Config, roles=[sampler, learner], iteration=train_iteration)
