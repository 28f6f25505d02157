"""dagrl: write an RL algorithm once as fragments; choose how it is distributed in a graph file."""

from __future__ import annotations

from dagrl.context import RoleContext
from dagrl.episodes import Episodes, EpisodeTracker
from dagrl.fragment import evaluation, fragment, iteration, load_algorithm, role, trace
from dagrl.training import train

__version__ = "0.1.0"

__all__ = [
    "EpisodeTracker",
    "Episodes",
    "RoleContext",
    "evaluation",
    "fragment",
    "iteration",
    "load_algorithm",
    "role",
    "trace",
    "train",
]
