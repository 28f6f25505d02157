"""dagrl: write an RL algorithm once as fragments; choose how it is distributed in a graph file."""

from __future__ import annotations

from dagrl.app.agent import Agent, load
from dagrl.app.training import train
from dagrl.core.context import RoleContext
from dagrl.core.fragment import Manifest, evaluation, fragment, iteration, load_algorithm, role, trace
from dagrl.envs.episodes import Episodes, EpisodeTracker

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "EpisodeTracker",
    "Episodes",
    "Manifest",
    "RoleContext",
    "evaluation",
    "fragment",
    "iteration",
    "load",
    "load_algorithm",
    "role",
    "trace",
    "train",
]
