"""Independent PPO: every group of agents learns as if alone, its critic reading only what its agents
see (de Witt et al., "Is Independent Learning All You Need in the StarCraft Multi-Agent Challenge?").

The baseline MAPPO's central critic is measured against: the roles, fragments and iterations of
:mod:`dagrl.algos.common.multiagent`, with ``critic: local``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dagrl.algos.common import multiagent
from dagrl.algos.common.multiagent import (  # the roles, fragments and iterations
    ACTION_SPACES,
    collect,
    eval_iteration,
    evaluate,
    evaluator,
    learner,
    publish,
    sampler,
    train_iteration,
    update,
)
from dagrl.core.fragment import Manifest

__all__ = ["ALGORITHM", "Config", "collect", "eval_iteration", "evaluate", "publish", "train_iteration", "update"]


@dataclass
class Config(multiagent.Config):
    critic: Literal["central", "local"] = "local"
    """``local``: each critic reads only what its agents see (IPPO); ``central`` makes this MAPPO."""
    layer_norm: Literal["none", "input", "all"] = "none"
    """As MAPPO's, but off by default: with it IPPO's value loss stayed at 4-8 on simple_spread, where
    without it the loss fell to 0.85-1.6 (MAPPO's: 0.5-0.9). Mean training return over 0.5-1M env steps
    without it and with it: -13.0 against -15.0 on mpe2's game (seed 1), -9.5 against -11.0 on the MAPPO
    paper's (seed 2; -8.0 against -10.7 over 2-2.5M). The first 300k env steps are slower without it
    (-16.7, -17.4, -16.8 against -16.2, -16.2, -16.0 over 200-300k, seeds 1-3)."""


ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, learner, evaluator],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
    multi_agent=True,
)
