"""Independent PPO: every group of agents learns as if alone, its critic reading only what its agents
see (de Witt et al., "Is Independent Learning All You Need in the StarCraft Multi-Agent Challenge?").

The baseline MAPPO's central critic is measured against; it differs from :mod:`dagrl.algos.mappo` only
in ``critic: local``. The roles, collect and update are :mod:`dagrl.algos.common.multiagent`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dagrl.algos.common import multiagent
from dagrl.algos.common.actor_critic import publish
from dagrl.algos.common.multiagent import (
    ACTION_SPACES,
    MULTI_AGENT,
    collect,
    evaluate,
    evaluator,
    learner,
    sampler,
    update,
)
from dagrl.core.fragment import evaluation, iteration

__all__ = [
    "ACTION_SPACES", "MULTI_AGENT", "Config", "collect", "eval_iteration", "evaluate", "evaluator", "learner",
    "publish", "sampler", "train_iteration", "update",
]  # fmt: skip


@dataclass
class Config(multiagent.Config):
    critic: Literal["central", "local"] = "local"
    """``local``: each critic reads only what its agents see (IPPO); ``central`` makes this MAPPO."""


@iteration
def train_iteration():
    weights = publish()
    rollouts = collect(weights)
    return update(rollouts)


@evaluation
def eval_iteration():
    return evaluate(publish())
