"""Multi-Agent PPO (Yu et al., "The Surprising Effectiveness of PPO in Cooperative Multi-Agent
Games"): PPO for the agents of a PettingZoo game, each group's critic reading the global state.

A graph runs it on a PettingZoo env (``env: {id: "mpe2:simple_spread_v3", api: pettingzoo}``); agents
of one group share a policy (``share_parameters``), and every policy acts on its agent's own
observation alone, so what is trained can act without the state. The roles, collect and update are
:mod:`dagrl.algos.common.multiagent`, shared with IPPO; nothing here knows how it is distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """MAPPO's hyperparameters: :class:`dagrl.algos.common.multiagent.Config`, a central critic."""


@iteration
def train_iteration():
    weights = publish()
    rollouts = collect(weights)
    return update(rollouts)


@evaluation
def eval_iteration():
    return evaluate(publish())
