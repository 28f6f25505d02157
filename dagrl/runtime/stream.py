"""Streams: samplers loop on their own workers and push rollouts to a hub; the learner loops beside it and pulls.

This module holds the hub and what passes through it; the loops are in :mod:`dagrl.runtime.loops`.

The policies that stream (``async``) keep the driver and the scheduler off the path of every rollout:

* a :class:`Hub` is a Dask actor on the learner's worker. It queues arrived rollouts, holds the
  newest published weights under a version number, and keeps what each learner round produced until
  the driver asks. Its sampler- and driver-facing methods are ``async``: Dask runs them on the
  worker's event loop, so a sampler waiting for room never holds a thread;
* :func:`~dagrl.runtime.loops.sampler_loop` is one long-running task per sampler (it secedes from the worker's pool). It
  runs the stream fragment (``collect``) back to back against its role host, pushes each output with
  its :class:`~dagrl.runtime.report.Report` to the hub (:meth:`Hub.put`, one worker-to-worker
  actor call; on the same host a large rollout crosses through :mod:`dagrl.runtime.shm`) and takes
  the newest weights between rollouts when the reply says there are newer ones;
* :func:`~dagrl.runtime.loops.learner_loop` is one long-running task on the learner's worker. It takes what has arrived
  (:meth:`Hub.take`: at least one rollout, at most the round's budget, the stale ones dropped and
  counted), runs the learn fragments (``update``) on the local role host, publishes the next weights
  version (``publish``) and files the round for the driver;
* the driver only watches (:meth:`Hub.drain`, at most every ``min_s``): it receives the rounds with
  their reports, sees the loops' liveness, and tells the hub how many rounds it may run before the
  driver must act (a checkpoint, a blocking evaluation, a stop it can foresee).

Backpressure: a put that leaves ``capacity`` rollouts waiting for the learner is answered only once
the learner has taken some, so a sampler waits *before* its next collect (never holding a rollout
that ages meanwhile) and collects it with the newest weights: staleness stays bounded without the
driver counting anything.

Generations: a learner rollback starts a new hub (a new generation). The old one, if it still
answers, is *retired*: every later put to it is refused (counted) and answered with the new hub's
address, so a sampler mid-rollout with weights from before the rollback never feeds the restored
learner; it fetches the new hub's weights and goes on.

With replay (``apex``: a :class:`Limit`), a sampler loop stores each rollout in its replay shard
(``add``, an actor call to the shard's worker) and hands the hub only its report and what the shard
answered; the learner's rounds (``sample -> update -> reprioritize``, the shards' fragments called on
their workers) are rate-limited against those inserts both ways, as Reverb's ``SampleToInsertRatio``:
a sampler waits before its next collect while it would run ``max_lead`` inserts past the ratio, the
learner while it would run ahead of it. Until the replay holds ``warmup`` env steps the samplers run
free and the hub files a round's worth of inserts as one iteration without learning.

A fragment of another role that fails under a loop (a replay shard's worker died, its ``add`` raised)
raises :class:`PeerFailed`, naming that role, so the driver replaces it, not the loop's own role.

The hub's ``take``/``learned`` (learner thread) and its ``async`` methods (event loop) share one
condition; a learner-side change wakes the event loop's waiters with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagrl.runtime.report import Report

__all__ = [
    "STOP", "Arrival", "Go", "Hub", "HubGone", "Inserted", "Learned", "Limit", "Moved", "PeerFailed", "Refused",
    "Reply", "Seat", "Seen", "Status", "Stop", "Stored", "Taken", "Weights",
]  # fmt: skip

HUBS: weakref.WeakValueDictionary[str, Hub] = weakref.WeakValueDictionary()
"""The hubs living in this process, by id (the learner loop finds its hub here)."""


class HubGone(RuntimeError):
    """A sampler loop lost its hub (the learner's worker died): not the sampler's failure."""


class PeerFailed(RuntimeError):
    """A fragment of another role, called from a loop, failed: ``role[index]`` on ``address``, ``kind``
    ``lost`` (its worker did not answer) or ``raised``."""

    def __init__(self, role: str, index: int, address: str, kind: str, message: str):
        super().__init__(f"{role}[{index}] on {address}: {message}")
        self.role, self.index, self.address, self.kind = role, index, address, kind

    def __reduce__(self) -> tuple:
        return PeerFailed, (self.role, self.index, self.address, self.kind, str(self).split(": ", 1)[-1])


@dataclass(frozen=True)
class Go:
    """To a sampler: collect the next rollout; the newest weights version is ``version``."""

    version: int


@dataclass(frozen=True)
class Stop:
    """To a loop: end (the hub stopped, or the driver gave this loop's sampler index to another)."""


STOP = Stop()


@dataclass(frozen=True)
class Moved:
    """From a retired hub: the learner was rolled back; its new hub is ``key`` on ``address``, serving
    ``generation``. The rollout just put was refused."""

    address: str
    key: str
    generation: int


@dataclass(frozen=True)
class Refused:
    """The rollout was made with weights of another generation than the hub's ``generation``: fetch its
    weights and collect again."""

    generation: int


Reply = Go | Stop | Moved | Refused
"""What a hub answers a sampler's ``put``, ``begin`` and ``inserted``."""


@dataclass(frozen=True)
class Weights:
    """Published weights: the output of each node before the stream, by node id, one per replica."""

    generation: int
    version: int
    values: dict[int, list[Any]]


@dataclass
class Seat:
    """One sampler index as its hub knows it."""

    token: str = ""
    """The loop that speaks for it (:meth:`Hub.own`); a loop the driver replaced is told to stop."""
    last_put: float = float("inf")
    """When its loop last put a rollout (monotonic; ``inf``: none yet)."""
    blocked: bool = False
    """Whether its loop waits for room (a learner that does not consume, not a hung sampler)."""


@dataclass(frozen=True)
class Seen:
    """One sampler in a :class:`Status`: seconds since its last put (``inf``: none yet) and whether it waits
    for room."""

    since_put: float
    blocked: bool


@dataclass(frozen=True)
class Inserted:
    """With replay: one insert as the hub counts it."""

    source: int
    version: int
    report: Report


@dataclass(frozen=True)
class Taken:
    """A round's rollouts as the learner loop takes them (:meth:`Hub.take`)."""

    arrivals: list[Arrival]
    stale: list[Arrival]
    """Dropped as stale since the last round: counted, not trained on."""
    waited_s: float


@dataclass(frozen=True)
class Stored:
    """With replay: the next iteration as the learner loop takes it (:meth:`Hub.take_stored`)."""

    learn: bool
    """``False``: a warm-up iteration (its inserts counted, nothing learnt)."""
    reports: list[Inserted]
    shards: dict[int, list[Any]]
    """Each insert fragment's newest answer per shard, by node id (what ``sample`` follows)."""
    collects: int


@dataclass(frozen=True)
class Limit:
    """How a hub with replay (``apex``) ties learner rounds to the samplers' inserts."""

    ratio: float
    """Learner rounds per insert."""
    max_lead: int
    """Inserts the samplers may run past the ratio."""
    limited: bool
    """``False``: both sides run free."""
    warmup: int
    """Env steps to store before the first learner round (``learning_starts``)."""
    round_collects: int
    """Inserts one iteration counts during the warm-up."""
    publish_every: int = 1
    """Learner rounds per weights version."""


@dataclass
class Arrival:
    """One rollout at the hub: which sampler, made with which weights version, its value and report."""

    source: int
    version: int
    value: Any
    report: Report


@dataclass
class Learned:
    """One learner round as the driver receives it."""

    index: int
    """The hub's round number, from 1."""
    metrics: dict[str, float]
    reports: list[tuple[int, Report]]
    """(sampler, report) of every rollout the round counted: those it trained on and the stale ones dropped."""
    lags: list[int]
    """Versions between the weights each trained-on rollout was made with and the learner's."""
    oldest: int
    """The oldest weights version among the rollouts trained on."""
    update_s: float
    wall_s: float
    """Seconds since the previous round ended (or the loop started)."""
    version: int
    """The weights version the round started from."""
    collects: int = 0
    """Rollouts the samplers had delivered when the round started (inserts, with replay)."""
    learnt: bool = True
    """``False``: a warm-up iteration (replay not yet full enough), counted without learning."""
    busy: list[float] = field(default_factory=list)
    """Per learner replica (a data-parallel group), its seconds in the round's fragments."""


@dataclass
class Status:
    """What :meth:`Hub.drain` answers: the rounds since the last call and the loops' liveness."""

    rounds: list[Learned]
    version: int
    refused: int
    dropped: int
    arrived: int
    samplers: list[Seen]
    round_s: float | None
    """How long the round in progress has run (``None``: none running)."""
    error: BaseException | None = None
    """What the learner loop failed with (a :class:`PeerFailed` names another role's host)."""
    extra: dict[str, float] = field(default_factory=dict)


class Hub:
    """The meeting point of one stream: queued rollouts, published weights, finished rounds.

    Parameters
    ----------
    hub_id : its key in :data:`HUBS` (and its Dask actor's key).
    generation : the learner lineage it serves; a rollback starts a new hub with the next one.
    version : the weights version its first publish takes (after a rollback: past every older one).
    samplers : how many sampler loops put into it (sources ``0 .. samplers - 1``).
    budget : the most rollouts a round takes.
    least : the fewest rollouts a round waits for (fewer once the queue is full, which it never is
        with ``capacity >= least``).
    capacity : the most rollouts waiting; a sampler whose put fills it waits before its next collect.
    max_staleness : rollouts older than this many versions when taken are dropped (still counted).
    group : the learner replicas a round's rollouts are shared among (a data-parallel group,
        :mod:`dagrl.runtime.groups`): a round takes a multiple of it, so every replica gets as many
        rollouts as the others and makes as many gradient steps.

    Examples
    --------
    >>> import asyncio
    >>> hub = Hub("doc", 0, 0, samplers=1, budget=2, capacity=2, max_staleness=1)
    >>> hub.publish(0, {})
    >>> asyncio.run(hub.put(0, 0, 0, "rollout", Report(env_steps=4)))
    Go(version=0)
    >>> hub.allowed = 1
    >>> [a.value for a in hub.take(0).arrivals]
    ['rollout']
    """

    def __init__(
        self, hub_id: str, generation: int, version: int, *, samplers: int, budget: int, capacity: int,
        max_staleness: int | None, least: int = 1, limit: Limit | None = None, shards: dict[int, int] | None = None,
        group: int = 1,
    ) -> None:  # fmt: skip
        self.hub_id, self.generation, self.max_staleness = hub_id, generation, max_staleness
        self.group = max(1, group)
        self._size(budget, capacity, least)
        self.stale: list[Arrival] = []
        """Rollouts dropped as stale and not yet counted in a round."""
        self.cond = threading.Condition()
        self.queue: collections.deque[Arrival] = collections.deque()
        self.version = version
        self.published: dict[int, list[Any]] | None = None
        self.rounds = self.allowed = 0
        self.out: list[Learned] = []
        self.stopped = False
        self.retired: Moved | None = None
        """Where the hub that replaced this one is."""
        self.refused = self.dropped = self.arrived = 0
        self.seats = [Seat() for _ in range(samplers)]
        self.round_started: float | None = None
        self.error: BaseException | None = None
        self.aloop: asyncio.AbstractEventLoop | None = None
        self.waiters: list[asyncio.Future] = []
        self.last_drain = 0.0
        self.limit = limit
        """With replay: how rounds follow inserts (``None``: rounds take the rollouts themselves)."""
        self.stored: dict[int, list[Any]] = {n: [None] * k for n, k in (shards or {}).items()}
        """With replay: each insert fragment's newest output per shard (what ``sample`` follows)."""
        self.reports: list[Inserted] = []
        """With replay: (sampler, version, report) of the inserts since the last round."""
        self.warm: list[Inserted] = []
        """With replay: the inserts of the warm-up not yet counted in an iteration."""
        self.warmup = limit.warmup if limit is not None else 0
        self.started = self.done = self.learnt = self.offset = 0
        HUBS[hub_id] = self

    # -- waking the event loop's waiters from any thread ----------------------------------------------

    def _wake(self) -> None:
        loop = self.aloop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        with self.cond:
            waiters, self.waiters = self.waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    async def _until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait on the event loop until ``ready()`` (checked under the condition) or ``timeout``."""
        loop = self.aloop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self.cond:
                if ready():
                    return True
                waiter = loop.create_future()
                self.waiters.append(waiter)
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, min(left, 0.5))

    # -- samplers (event loop) ---------------------------------------------------------------------------

    def _size(self, budget: int, capacity: int, least: int) -> None:
        """A round's budget and fewest rollouts, whole multiples of the group; the queue's room."""
        k = self.group
        self.budget = max(k, budget - budget % k)
        self.least = max(k, min(least + (-least) % k, self.budget))
        self.capacity = max(capacity, self.budget, 1)

    async def resize(self, budget: int, capacity: int, least: int, group: int | None = None) -> None:
        """Samplers were added or dropped, or the learner group changed: the learner's budget per round
        and the queue's room follow their count."""
        with self.cond:
            self.group = max(1, group or self.group)
            self._size(budget, capacity, least)
            self.cond.notify_all()
        self._wake()

    async def own(self, source: int, token: str) -> None:
        """From now on only the loop holding ``token`` speaks for sampler ``source``."""
        with self.cond:
            self.seats[source].token = token

    def _replaced(self, source: int, token: str) -> bool:
        """Whether ``token``'s loop no longer speaks for ``source`` (the driver replaced it, say on a host cut
        off and back): it is told to stop instead of being taken."""
        owner = self.seats[source].token
        return bool(token) and bool(owner) and owner != token

    def _refusal(self, source: int, generation: int, token: str = "") -> Reply | None:
        """Why a rollout from ``source`` is not taken (the answer to give), or ``None``; the condition held."""
        if self._replaced(source, token):  # a loop that was replaced: it ends
            self.refused += 1
            return STOP
        self.seats[source].last_put = time.monotonic()
        if self.retired is not None:
            self.refused += 1
            return self.retired
        if self.stopped:
            return STOP
        if generation != self.generation:
            self.refused += 1
            return Refused(self.generation)
        return None

    async def put(self, source: int, generation: int, version: int, value: Any, rep: Report, token: str = "") -> Reply:
        """A rollout from sampler ``source``, made with weights ``version`` of ``generation``.

        Answers :class:`Go` once there is room for the sampler's next rollout: a sampler waits *before*
        collecting, not with a rollout in hand, so what it collects next is made with the weights
        current when the learner freed the room. Answers :class:`Moved` from a retired hub,
        :class:`Refused` for weights of another generation, and :data:`STOP` once stopped or to a
        loop the driver replaced (``token``)."""
        with self.cond:
            refusal = self._refusal(source, generation, token)
            if refusal is not None:
                return refusal
            self.queue.append(Arrival(source, version, value, rep))
            self.arrived += 1
            self.seats[source].blocked = True
            self.cond.notify_all()
        while not await self._until(lambda: len(self.queue) < self.capacity or self._ended(self.generation), 60.0):
            pass
        with self.cond:
            seat = self.seats[source]
            seat.blocked, seat.last_put = False, time.monotonic()
            return STOP if self.stopped and self.retired is None else Go(self.version)

    def _may_start(self) -> bool:
        """With replay: whether a sampler may start its next collect now (the limiter's lead)."""
        lim = self.limit
        if lim is None or not lim.limited or self.warmup > 0:
            return True
        return self.started - self.offset < math.ceil((self.learnt + 1) / lim.ratio - 1e-9) + lim.max_lead

    async def begin(self, source: int, token: str = "") -> Reply:
        """With replay: wait until sampler ``source`` may start a collect, and count it started.
        Answers as :meth:`put`."""
        with self.cond:
            if self._replaced(source, token):
                self.refused += 1
                return STOP
            self.seats[source].blocked = True
        while not await self._until(lambda: self._may_start() or self._ended(self.generation), 60.0):
            pass
        with self.cond:
            seat = self.seats[source]
            seat.blocked, seat.last_put = False, time.monotonic()
            if self.retired is not None:
                return self.retired
            if self.stopped:
                return STOP
            self.started += 1
            return Go(self.version)

    async def inserted(
        self,
        source: int,
        generation: int,
        version: int,
        rep: Report,
        stored: dict[int, tuple[int, Any]],
        token: str = "",
    ) -> Reply:
        """With replay: sampler ``source`` stored a rollout (``stored``: insert node id -> (shard, its
        answer)); then as :meth:`begin` for its next collect."""
        with self.cond:
            refusal = self._refusal(source, generation, token)
            if refusal is not None:
                return refusal
            for node_id, (shard, value) in stored.items():
                self.stored[node_id][shard] = value
            self.done += 1
            self.arrived += 1
            if self.warmup > 0:
                self.warm.append(Inserted(source, version, rep))
                self.warmup -= rep.env_steps
                if self.warmup <= 0:
                    self.offset = self.done  # the warm-up's inserts owe no rounds
            else:
                self.reports.append(Inserted(source, version, rep))
            self.cond.notify_all()
        return await self.begin(source, token)

    async def weights(self, have: int) -> Weights | None:
        """The newest weights if newer than version ``have`` (waiting for the first publish), else ``None``."""
        await self._until(lambda: self.published is not None or self.stopped, 3600.0)
        with self.cond:
            if self.published is None or self.version <= have:
                return None
            return Weights(self.generation, self.version, self.published)

    async def newer(self, have: int, wait_s: float) -> Weights | Stop | None:
        """For the loop that loads the inference role: the weights once newer than version ``have`` are
        published, :data:`STOP` once this hub stopped or was retired, ``None`` after ``wait_s``
        without either."""
        await self._until(
            lambda: self.stopped or self.retired is not None or (self.published is not None and self.version > have),
            wait_s,
        )
        with self.cond:
            if self.stopped or self.retired is not None:
                return STOP
            if self.published is None or self.version <= have:
                return None
            return Weights(self.generation, self.version, self.published)

    # -- the driver (event loop) ---------------------------------------------------------------------

    async def drain(self, allow: int, wait_s: float, min_s: float = 0.05) -> Status:
        """Let the learner run rounds up to number ``allow``; return the rounds finished since the last
        call, waiting up to ``wait_s`` for one, and no sooner than ``min_s`` after the last call."""
        loop = self.aloop = asyncio.get_running_loop()
        with self.cond:
            if allow > self.allowed:
                self.allowed = allow
                self.cond.notify_all()
        await self._until(lambda: bool(self.out) or self.error is not None or self.stopped, wait_s)
        gap = self.last_drain + min_s - loop.time()
        if gap > 0:
            await asyncio.sleep(gap)
        self.last_drain = loop.time()
        now = time.monotonic()
        with self.cond:
            rounds, self.out = self.out, []
            return Status(
                rounds, self.version, self.refused, self.dropped, self.arrived,
                [Seen(now - seat.last_put, seat.blocked) for seat in self.seats],
                None if self.round_started is None else now - self.round_started, self.error,
            )  # fmt: skip

    async def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self._release()

    async def retire(self, address: str, key: str, generation: int) -> int:
        """Send every later put to the hub at ``address``/``key``; drop what waits here. Returns the
        rollouts refused so far (those dropped now included)."""
        with self.cond:
            self.retired = Moved(address, key, generation)
            self.refused += len(self.queue)
            self.queue.clear()
            self.cond.notify_all()
        self._release()
        return self.refused

    async def clear(self) -> None:
        """Forget a learner loop's failure (the driver replaced the peer it failed on and starts another)."""
        with self.cond:
            self.error = None
            self.round_started = None

    # -- the learner loop (its thread) ---------------------------------------------------------------

    def _ended(self, generation: int) -> bool:
        return self.stopped or self.retired is not None or generation != self.generation

    def publish(self, version: int, values: dict[int, list[Any]]) -> None:
        """Make ``values`` the weights samplers take next, as ``version``."""
        with self.cond:
            self.version, self.published = version, values
            self.cond.notify_all()
        self._wake()

    def take(self, generation: int) -> Taken | None:
        """The next round's rollouts (``least`` to ``budget`` of them), the stale ones dropped since the
        last round and the time waited, once enough fresh ones have arrived and the driver allows
        another round; ``None`` once stopped."""
        t0 = time.perf_counter()
        with self.cond:
            while True:
                ready = len(self.queue) >= self.least or (self.queue and len(self.queue) >= self.capacity)
                if self._ended(generation) or (ready and self.rounds < self.allowed):
                    break
                self.cond.wait(0.5)
            if self._ended(generation):
                return None
            stale = []
            if self.max_staleness is not None:
                stale = [a for a in self.queue if self.version - a.version > self.max_staleness]
            if stale:
                dropped = {id(a) for a in stale}
                self.queue = collections.deque(a for a in self.queue if id(a) not in dropped)
                self.dropped += len(stale)
                self.stale.extend(stale)
            n = min(self.budget, len(self.queue))
            n -= n % self.group  # an equal share for each learner replica
            if not n:  # every one was stale (or too few are left): count them with the next round, wait again
                self._wake()
                return self.take(generation)
            taken = [self.queue.popleft() for _ in range(n)]
            stale, self.stale = self.stale, []
            self.round_started = time.monotonic()
        self._wake()  # room for waiting samplers
        return Taken(taken, stale, time.perf_counter() - t0)

    def take_stored(self, generation: int) -> Stored | None:
        """With replay: the next iteration once the driver allows it. During the warm-up (and for its last
        inserts after it) one that learns nothing, over a round's worth of inserts; then each learner
        round, once the ratio allows it, with the reports since the last one and each shard's newest
        answer. ``None`` once stopped."""
        lim = self.limit
        assert lim is not None
        with self.cond:
            while True:
                if self._ended(generation):
                    return None
                if self.rounds < self.allowed:
                    if len(self.warm) >= lim.round_collects or (self.warm and self.warmup <= 0):
                        taken, self.warm = self.warm[: lim.round_collects], self.warm[lim.round_collects :]
                        return Stored(False, taken, {}, self.done)
                    due = not lim.limited or lim.ratio * (self.done - self.offset) >= self.learnt + 1 - 1e-9
                    if self.warmup <= 0 and due:
                        taken, self.reports = self.reports, []
                        self.round_started = time.monotonic()
                        return Stored(True, taken, {k: list(v) for k, v in self.stored.items()}, self.done)
                self.cond.wait(0.5)

    def untake(self, reports: list[Inserted]) -> None:
        """With replay: a round that failed on a peer hands its reports back (the next one counts them)."""
        with self.cond:
            self.reports[:0] = reports
            self.round_started = None

    def requeue(self, taken: list[Arrival], stale: list[Arrival]) -> None:
        """A round that failed on a peer (a learner replica lost) hands its rollouts back, first in line:
        the next round learns from them (their staleness judged again) and counts the stale ones' reports."""
        with self.cond:
            self.queue.extendleft(reversed(taken))
            self.stale[:0] = stale
            self.round_started = None
            self.cond.notify_all()

    def learned(self, generation: int, item: Learned, published: dict[int, list[Any]] | None) -> bool:
        """File a finished round and publish its weights; ``False`` if this hub no longer serves ``generation``.

        A round that ends after :meth:`stop` is still filed: its update is in the learner's state, so
        the driver counts it (and the final checkpoint holds what the counters say)."""
        with self.cond:
            if self.retired is not None or generation != self.generation:
                return False
            self.rounds += 1
            self.learnt += item.learnt and self.limit is not None
            item.index = self.rounds
            self.out.append(item)
            self.round_started = None
            if published is not None:
                self.version, self.published = self.version + 1, published
            self.cond.notify_all()
        self._wake()
        return True

    def failed(self, error: BaseException) -> None:
        with self.cond:
            try:  # handed to the driver as it is where it can be (its type says whose failure it is)
                pickle.dumps(error)
                self.error = error
            except Exception:  # noqa: BLE001 (an exception that does not pickle: its text)
                self.error = RuntimeError(f"{type(error).__name__}: {error}")
            self.round_started = None
        self._wake()
