"""Multi-Agent PPO (Yu et al., "The Surprising Effectiveness of PPO in Cooperative Multi-Agent
Games"): PPO for the agents of a PettingZoo game, each group's critic reading the global state.

A graph runs it on a PettingZoo env (``env: {id: "mpe2:simple_spread_v3", api: pettingzoo}``); agents
of one group share a policy (``share_parameters``), and every policy acts on its agent's own
observation alone, so what is trained can act without the state. Its roles, fragments and iterations
are :mod:`dagrl.algos.common.multiagent`, whose defaults are MAPPO's (``critic: central``); IPPO
differs only in its critic. Nothing here knows how it is distributed.
"""

from __future__ import annotations

from dagrl.algos.common.multiagent import (  # the roles, fragments and iterations
    ACTION_SPACES,
    Config,
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

ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, learner, evaluator],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
    multi_agent=True,
)
