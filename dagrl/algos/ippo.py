"""Independent PPO: every group of agents learns as if alone, its critic reading only what its agents
see (de Witt et al., "Is Independent Learning All You Need in the StarCraft Multi-Agent Challenge?").

The baseline MAPPO's central critic is measured against: the roles, fragments and iterations of
:mod:`dagrl.algos.common.multiagent`, with ``critic: local``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dagrl.algos.common import multiagent
from dagrl.algos.common.multiagent import *  # noqa: F403  (the roles, fragments and iterations)

__all__ = multiagent.__all__


@dataclass
class Config(multiagent.Config):
    critic: Literal["central", "local"] = "local"
    """``local``: each critic reads only what its agents see (IPPO); ``central`` makes this MAPPO."""
