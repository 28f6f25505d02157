"""Double-buffered stepping: a sampler's envs in two groups, one stepping while the other's actions
are picked (Sample Factory's double-buffered sampling).

A sampler that steps its envs and then picks their actions leaves one of the two idle at any time:
its envs while its network runs (or while it waits for the ``inference`` role's answer under
``central-inference``), its network while the envs step. With the envs in two halves A and B, the
collect loop becomes::

    pick A's actions | start A stepping | pick B's actions   | wait for A, record it
    start B stepping | pick A's next    | wait for B, record | ...

so B's actions are picked while A's envs step, and A's while B's step. Each env still steps with the
actions picked from its own last observation: what a run learns is the same algorithm, and a run is
reproducible with itself (the groups' draws come in a fixed order); its draws differ from one
stepping all envs at once.

It can pay only where picking actions and stepping envs overlap: the envs step in threads of their
own (``vector: threads``, or ``auto`` once its first steps showed them waiting: a remote or sleeping
simulator) or the actions come from elsewhere (``central-inference``: the request for one group is
out while the other steps). Where envs compute in turn on the sampler's thread and its own network
picks the actions, nothing overlaps, and halving each forward only costs. Where it can, whether it
does depends on the machine and the env: on a GPU the forward's latency is worth hiding; on 2 cores,
where the inference role, the learner and the samplers share the CPU, two requests per step cost more
than they hide, and a Python env's threads take the GIL from the forward each time one wakes (8 envs
sleeping 5 ms a step: a forward's ops took 2-3 x as long beside them, and the collect was slower
double-buffered; benchmarks/RESULTS.md). Envs that step without the GIL (C simulators, remote ones
answering on a socket) leave the forward alone.

So ``roles.sampler.double_buffer: auto`` (the default) measures, as ``vector: auto`` does: where it
can pay, a sampler's collects after the first alternate between the two ways, four each, and it
double-buffers from then on only if that was at least 10 % faster (:class:`Trial`; a wrong choice
costs more than a near tie gains), saying so in one log line.
``true`` (``on``) always double-buffers (envs ``auto`` or ``threads``); ``false`` (``off``) never.

Only vector envs that can step a slice of their envs alone take part (``vector: auto`` and
``threads``: :meth:`dagrl.envs.vector.ThreadVectorEnv.send_rows`); EnvPool's and gymnasium's own
backends step all their envs at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["Trial", "chosen", "double_buffering", "double_buffers", "env_groups", "step_in_groups"]

log = logging.getLogger("dagrl")

Record = Callable[[int, slice, np.ndarray, tuple, tuple], None]
"""``record(t, rows, obs, picked, stepped)``: step ``t`` of the envs ``rows`` from observations ``obs``,
with ``picked`` (what the acting object returned: actions first) and ``stepped`` (what the vector
env's step returned for those envs: observations, rewards, terminations, truncations, infos)."""


def env_groups(num_envs: int, groups: int = 2) -> list[slice]:
    """``num_envs`` envs cut into ``groups`` contiguous slices, as even as they go.

    >>> env_groups(5)
    [slice(0, 2, None), slice(2, 5, None)]
    """
    bounds = np.linspace(0, num_envs, groups + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def remote(acting: Any) -> bool:
    """Whether ``acting`` answers from elsewhere (the ``inference`` role's client: it can send a
    request and be asked for the answer later)."""
    return callable(getattr(acting, "send", None)) and callable(getattr(acting, "receive", None))


def double_buffers(envs: Any, acting: Any, mode: str | None = None) -> bool:
    """Whether a collect of ``envs`` acting by ``acting`` may double-buffer under ``mode`` (``None``:
    the mode the envs were made with, ``auto`` if none): ``auto`` then tries it (:class:`Trial`)."""
    mode = mode or getattr(envs, "double_buffer", "auto")
    if mode == "off" or envs.num_envs < 2 or not getattr(envs, "can_step_rows", False):
        return False
    return mode == "on" or remote(acting) or getattr(envs, "backend", "threads") == "threads"


class Trial:
    """``auto``'s measurement, as ``vector: auto`` measures its envs: after :attr:`WARMUP` collects, the
    next ones alternate between double-buffered and not, :attr:`EACH` of each; the sampler then keeps
    double-buffering only if its median collect took at most :attr:`MARGIN` of the other's."""

    WARMUP, EACH, MARGIN = 1, 4, 0.9

    def __init__(self) -> None:
        self.seconds: dict[bool, list[float]] = {True: [], False: []}
        self.collects = 0
        self.chosen: bool | None = None

    def next(self) -> bool:
        """Whether the next collect double-buffers."""
        if self.chosen is not None:
            return self.chosen
        return self.collects >= self.WARMUP and (self.collects - self.WARMUP) % 2 == 0

    def took(self, buffered: bool, seconds: float, owner: str) -> None:
        if self.chosen is not None:
            return
        self.collects += 1
        if self.collects > self.WARMUP:
            self.seconds[buffered].append(seconds)
        if min(len(v) for v in self.seconds.values()) < self.EACH:
            return
        on, off = (float(np.median(self.seconds[b])) for b in (True, False))
        self.chosen = on <= self.MARGIN * off
        log.info(
            "%s: double_buffer: auto: a collect took %.1f ms in two groups, %.1f ms all at once: %s",
            owner, 1e3 * on, 1e3 * off, "in two groups from now on" if self.chosen else "all at once from now on",
        )  # fmt: skip


def chosen(envs: Any, acting: Any) -> bool | None:
    """Whether a collect of ``envs`` acting by ``acting`` double-buffers now; ``None`` while ``auto``'s
    :class:`Trial` still times both ways."""
    if not double_buffers(envs, acting):
        return False
    if getattr(envs, "double_buffer", "auto") == "on":
        return True
    trial = getattr(envs, "double_buffer_trial", None)
    return None if trial is None else trial.chosen


@contextlib.contextmanager
def double_buffering(envs: Any, acting: Any) -> Iterator[bool]:
    """Whether this collect double-buffers (:func:`chosen`, or the :class:`Trial`'s turn while it times
    both ways); the collect runs inside, timed for the trial."""
    way = chosen(envs, acting)
    if way is not None:
        yield way
        return
    trial = getattr(envs, "double_buffer_trial", None)
    if trial is None:
        trial = envs.double_buffer_trial = Trial()
    buffered, start = trial.next(), time.perf_counter()
    yield buffered
    trial.took(buffered, time.perf_counter() - start, getattr(envs, "owner", "sampler"))


def pick(acting: Any, obs: np.ndarray) -> Callable[[], tuple]:
    """Start picking actions for ``obs``; the returned call gives them (a remote acting object's request
    is in flight until then; a local one has picked already)."""
    if remote(acting):
        acting.send(obs)
        return acting.receive
    picked = acting(obs)
    return lambda: picked


def step_in_groups(
    envs: Any,
    obs: np.ndarray,
    steps: int,
    acting: Any,
    record: Record,
    env_actions: Callable[[np.ndarray], np.ndarray] = lambda a: a,
) -> np.ndarray:
    """``steps`` steps of every env of ``envs`` in two groups, double-buffered (module docstring), from
    the observations ``obs``; each step of each group goes to ``record``. ``env_actions`` turns the
    picked actions into what the envs take (a clip to the action space). Returns the last observations.

    Each group goes round the same ring: start picking its actions, have them, start its envs
    stepping, have the step (and record it). Where the loop waits decides what overlaps: with its own
    network it waits for a group's step while the other group's envs step (their actions were picked
    meanwhile); with the ``inference`` role it waits for a group's answer while the other's request is
    out (the group's envs step meanwhile, in turn or on threads).
    """
    groups = env_groups(envs.num_envs)
    last = [obs[rows] for rows in groups]
    picking: list[Callable[[], tuple]] = [lambda: ()] * len(groups)
    picked: list[tuple] = [()] * len(groups)
    sent: list[Any] = [None] * len(groups)

    def start_pick(g: int, t: int) -> None:
        picking[g] = pick(acting, last[g])

    def have_pick(g: int, t: int) -> None:
        picked[g] = picking[g]()

    def start_step(g: int, t: int) -> None:
        sent[g] = envs.send_rows(groups[g], env_actions(picked[g][0]))

    def have_step(g: int, t: int) -> None:
        stepped = envs.receive_rows(sent[g])
        record(t, groups[g], last[g], picked[g], stepped)
        last[g] = stepped[0]

    ring = (start_pick, have_pick, start_step, have_step)
    cut = 1 if remote(acting) else 3  # where the loop waits: for an answer, or for a step
    for g in range(len(groups)):
        for op in ring[:cut]:
            op(g, 0)
    for t in range(steps):
        for g in range(len(groups)):
            for op in ring[cut:]:
                op(g, t)
            if t + 1 < steps:
                for op in ring[:cut]:
                    op(g, t + 1)
    return np.concatenate(last)
