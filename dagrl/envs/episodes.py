"""Finished episodes as samplers report them, and which of them the run's stop window may count.

Why a sampler's first episodes are kept out of the window
---------------------------------------------------------
A sampler resets all its envs at once when it starts: at the start of a run, after ``--resume``
(samplers are not checkpointed) and when supervision replaces it. Its envs then finish their first
episodes in order of length, shortest first, so a window of the last ``stop.window`` episodes filled
from them holds the shortest of the lot. Where length and return go together (Pong's blowouts are
short; CartPole's return *is* its length) the window's mean is biased and ``stop.mean_return`` can
fire on it: a Pong run resumed from a checkpoint with a true mean near 18 stopped on a window mean of
20.9, all of it from the first episodes to finish after the resume.

So an episode counts for the window only once every env of its sampler has finished one since that
reset (:attr:`Episodes.in_window`); until then the window keeps what it had (the checkpoint restores
it after a resume). By that time the envs' phases are spread by their first episodes' lengths, and a
simulation of Pong-like episodes (length and return tied, 14 samplers x 8 envs, window 20) shows the
window's mean, right after a resume, at the steady state's (17.8-17.9 with a true mean of 17.86),
where counting every episode gives 18.5 at first and 16.9 later. On real CartPole under a random
policy (return = length; 32 envs, window 16, 40 resets) the first full window of every episode
averages 0.65 of the steady state's mean, the counted one 0.96 (``tests/test_episodes.py`` checks 12).

The episode count, ``charts/episode_return`` (each iteration's own episodes) and the RL page's
episode dots still include every episode; the window's mean (``charts/episode_return_mean``, the
progress bar's ``ret``) is empty until a first episode counts, unless a checkpoint restored it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["EpisodeTracker", "Episodes"]


@dataclass
class Episodes:
    """Episodes that finished during a fragment call; the runtime reads these from sampler outputs.

    A fragment output that carries an ``episodes: Episodes`` attribute and an ``env_steps: int``
    attribute is counted in the run's progress, metrics and stop conditions.
    """

    returns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    in_window: np.ndarray | None = None
    """Per episode, whether the stop window may count it (module docstring); ``None``: every one."""

    def __len__(self) -> int:
        return len(self.returns)

    def window_returns(self) -> np.ndarray:
        """The returns the stop window counts, in the order the episodes finished."""
        return self.returns if self.in_window is None else self.returns[self.in_window]

    @staticmethod
    def concat(parts: list[Episodes]) -> Episodes:
        """One :class:`Episodes` of ``parts`` in order."""
        if not parts:
            return Episodes()
        masks = [np.ones(len(p), bool) if p.in_window is None else p.in_window for p in parts]
        return Episodes(
            np.concatenate([p.returns for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            None if all(p.in_window is None for p in parts) else np.concatenate(masks),
        )


class EpisodeTracker:
    """Sums rewards and steps per env of a vector env and keeps the episodes finished since the last
    :meth:`take`, each marked for the stop window (module docstring).

    Examples
    --------
    >>> t = EpisodeTracker(2)
    >>> t.step(np.array([1.0, 1.0]), np.array([True, False]))  # env 0 ends first
    >>> t.step(np.array([1.0, 1.0]), np.array([True, True]))   # env 1 ends its first too
    >>> t.step(np.array([1.0, 1.0]), np.array([False, True]))  # every env had ended one before
    >>> ep = t.take()
    >>> ep.returns.tolist(), ep.in_window.tolist()
    ([1.0, 1.0, 2.0, 1.0], [False, False, False, True])
    """

    def __init__(self, num_envs: int):
        self.ret = np.zeros(num_envs)
        self.length = np.zeros(num_envs, np.int64)
        self.ended_one = np.zeros(num_envs, bool)
        self.settled = False
        """Every env has finished an episode since they were reset together."""
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._in_window: list[bool] = []

    def step(self, reward: np.ndarray, done: np.ndarray, rows: slice = slice(None)) -> None:
        """Add one vector step's rewards; ``done`` marks the envs whose episode ended with it. ``rows``:
        the envs they are of, where a step is of some envs only (a double-buffered sampler's group)."""
        self.ret[rows] += reward
        self.length[rows] += 1
        if not done.any():
            return
        ended = np.arange(len(self.ret))[rows][done]
        counted = self.settled  # the step that settles the sampler ends first episodes: not counted
        if not self.settled:
            self.ended_one[ended] = True
            self.settled = bool(self.ended_one.all())
        self._returns.extend(self.ret[ended].tolist())
        self._lengths.extend(self.length[ended].tolist())
        self._in_window.extend([counted] * len(ended))
        self.ret[ended], self.length[ended] = 0.0, 0

    def take(self) -> Episodes:
        """The episodes finished since the last call."""
        out = Episodes(
            np.asarray(self._returns, np.float64),
            np.asarray(self._lengths, np.int64),
            np.asarray(self._in_window, bool),
        )
        self._returns, self._lengths, self._in_window = [], [], []
        return out
