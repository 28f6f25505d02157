"""Streams: samplers loop on their own workers and push rollouts to a hub; the learner loops beside it and pulls.

The policies that stream (``async``) keep the driver and the scheduler off the path of every rollout:

* a :class:`Hub` is a Dask actor on the learner's worker. It queues arrived rollouts, holds the
  newest published weights under a version number, and keeps what each learner round produced until
  the driver asks. Its sampler- and driver-facing methods are ``async``: Dask runs them on the
  worker's event loop, so a sampler waiting for room never holds a thread;
* :func:`sampler_loop` is one long-running task per sampler (it secedes from the worker's pool). It
  runs the stream fragment (``collect``) back to back against its role host, pushes each output with
  its :class:`~dagrl.runtime.executor.Report` to the hub (:meth:`Hub.put`, one worker-to-worker
  actor call; on the same host a large rollout crosses through :mod:`dagrl.runtime.shm`) and takes
  the newest weights between rollouts when the reply says there are newer ones;
* :func:`learner_loop` is one long-running task on the learner's worker. It takes what has arrived
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

The hub's ``take``/``learned`` (learner thread) and its ``async`` methods (event loop) share one
condition; a learner-side change wakes the event loop's waiters with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagrl.distribution import stream_shape
from dagrl.fragment import Node, load_algorithm
from dagrl.runtime.executor import Report, report, route
from dagrl.runtime.host import HOSTS, _host
from dagrl.runtime.shm import unwrap, wrap

__all__ = ["Arrival", "Hub", "HubGone", "Learned", "learner_loop", "sampler_loop"]

HUBS: weakref.WeakValueDictionary[str, Hub] = weakref.WeakValueDictionary()
"""The hubs living in this process, by id (the learner loop finds its hub here)."""


class HubGone(RuntimeError):
    """A sampler loop lost its hub (the learner's worker died): not the sampler's failure."""


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


@dataclass
class Status:
    """What :meth:`Hub.drain` answers: the rounds since the last call and the loops' liveness."""

    rounds: list[Learned]
    version: int
    refused: int
    dropped: int
    arrived: int
    since_put: list[float]
    """Seconds since each sampler's last put (``inf``: none yet)."""
    blocked: list[bool]
    """Whether each sampler is waiting for room (a learner that does not consume, not a hung sampler)."""
    round_s: float | None
    """How long the round in progress has run (``None``: none running)."""
    error: str | None = None
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

    Examples
    --------
    >>> import asyncio
    >>> hub = Hub("doc", 0, 0, samplers=1, budget=2, capacity=2, max_staleness=1)
    >>> hub.publish(0, {})
    >>> asyncio.run(hub.put(0, 0, 0, "rollout", Report(env_steps=4)))
    ('ok', 0)
    >>> hub.allowed = 1
    >>> [a.value for a in hub.take(0)[0]]
    ['rollout']
    """

    def __init__(
        self, hub_id: str, generation: int, version: int, *, samplers: int, budget: int, capacity: int,
        max_staleness: int | None, least: int = 1,
    ) -> None:  # fmt: skip
        self.hub_id, self.generation = hub_id, generation
        self.budget, self.capacity, self.max_staleness = budget, max(capacity, budget, 1), max_staleness
        self.least = max(1, min(least, budget))
        self.stale: list[Arrival] = []
        """Rollouts dropped as stale and not yet counted in a round."""
        self.cond = threading.Condition()
        self.queue: collections.deque[Arrival] = collections.deque()
        self.version = version
        self.published: dict[int, list[Any]] | None = None
        self.rounds = self.allowed = 0
        self.out: list[Learned] = []
        self.stopped = False
        self.retired: tuple[str, str, int] | None = None
        """(address, key, generation) of the hub that replaced this one."""
        self.refused = self.dropped = self.arrived = 0
        self.last_put = [float("inf")] * samplers
        self.blocked = [False] * samplers
        self.round_started: float | None = None
        self.error: str | None = None
        self.aloop: asyncio.AbstractEventLoop | None = None
        self.waiters: list[asyncio.Future] = []
        self.last_drain = 0.0
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

    async def put(self, source: int, generation: int, version: int, value: Any, rep: Report) -> tuple:
        """A rollout from sampler ``source``, made with weights ``version`` of ``generation``.

        Answers ``("ok", newest version)`` once there is room for the sampler's next rollout: a sampler
        waits *before* collecting, not with a rollout in hand, so what it collects next is made with
        the weights current when the learner freed the room. Answers ``("moved", address, key,
        generation)`` from a retired hub, ``("refused", generation)`` for weights of another
        generation, and ``("stop",)`` once stopped."""
        with self.cond:
            self.last_put[source] = time.monotonic()
            if self.retired is not None:
                self.refused += 1
                return ("moved", *self.retired)
            if self.stopped:
                return ("stop",)
            if generation != self.generation:
                self.refused += 1
                return ("refused", self.generation)
            self.queue.append(Arrival(source, version, value, rep))
            self.arrived += 1
            self.blocked[source] = True
            self.cond.notify_all()
        while not await self._until(lambda: len(self.queue) < self.capacity or self._ended(self.generation), 60.0):
            pass
        with self.cond:
            self.blocked[source] = False
            self.last_put[source] = time.monotonic()
            return ("stop",) if self.stopped and self.retired is None else ("ok", self.version)

    async def weights(self, have: int) -> tuple[int, int, dict[int, list[Any]]] | None:
        """``(generation, version, values)`` of the newest weights if newer than ``have`` (waiting for the
        first publish), else ``None``. ``values``: the output of each node before the stream, by id."""
        await self._until(lambda: self.published is not None or self.stopped, 3600.0)
        with self.cond:
            if self.published is None or self.version <= have:
                return None
            return self.generation, self.version, self.published

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
                [now - t for t in self.last_put], list(self.blocked),
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
            self.retired = (address, key, generation)
            self.refused += len(self.queue)
            self.queue.clear()
            self.cond.notify_all()
        self._release()
        return self.refused

    async def ping(self) -> int:
        return self.generation

    # -- the learner loop (its thread) ---------------------------------------------------------------

    def _ended(self, generation: int) -> bool:
        return self.stopped or self.retired is not None or generation != self.generation

    def publish(self, version: int, values: dict[int, list[Any]]) -> None:
        """Make ``values`` the weights samplers take next, as ``version``."""
        with self.cond:
            self.version, self.published = version, values
            self.cond.notify_all()
        self._wake()

    def take(self, generation: int) -> tuple[list[Arrival], list[Arrival], float] | None:
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
            if not self.queue:  # every one was stale: count them with the next round, wait again
                self._wake()
                return self.take(generation)
            taken = [self.queue.popleft() for _ in range(min(self.budget, len(self.queue)))]
            stale, self.stale = self.stale, []
            self.round_started = time.monotonic()
        self._wake()  # room for waiting samplers
        return taken, stale, time.perf_counter() - t0

    def learned(self, generation: int, item: Learned, published: dict[int, list[Any]] | None) -> bool:
        """File a finished round and publish its weights; ``False`` if this hub no longer serves ``generation``.

        A round that ends after :meth:`stop` is still filed: its update is in the learner's state, so
        the driver counts it (and the final checkpoint holds what the counters say)."""
        with self.cond:
            if self.retired is not None or generation != self.generation:
                return False
            self.rounds += 1
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
            self.error = f"{type(error).__name__}: {error}"
            self.round_started = None
        self._wake()


# -- the loops --------------------------------------------------------------------------------------


class _Caller:
    """Calls fragments of the learn side: on a host of this process directly, else by its actor."""

    def __init__(self, hosts: dict[str, list[tuple[str, str]]]):
        self.hosts = hosts
        self.actors: dict[str, Any] = {}

    def call(self, role: str, replica: int, fragment: str, *args: Any) -> Any:
        host_id, address = self.hosts[role][replica]
        host = HOSTS.get(host_id)
        if host is not None:
            return host.call(fragment, *args)
        actor = self.actors.get(host_id)
        if actor is None:
            from distributed import Actor

            from dagrl.runtime.host import RoleHost

            actor = self.actors[host_id] = Actor(RoleHost, address, host_id)
        return unwrap(actor.call(fragment, *args).result())

    def run(self, nodes: list[Node], values: dict[int, list[Any]], roles: Any) -> dict[int, list[Any]]:
        """Each node on every replica of its role, inputs routed as the executor routes them."""
        for node in nodes:
            n = len(self.hosts[node.role])
            row = []
            for r in range(n):
                args = [
                    route(values[a.id], a.role, node.role, roles, r, n) if isinstance(a, Node) else a
                    for a in node.inputs
                ]
                row.append(self.call(node.role, r, node.name, *args))
            values[node.id] = row
        return values


def learner_loop(hub_id: str, algorithm: str, hosts: dict[str, list[tuple[str, str]]], generation: int) -> int:
    """The learner side of a stream, as one long-running task on the hub's worker (see the module
    docstring): publish, then take, learn, publish, until the hub stops. Returns the rounds it ran."""
    from distributed import secede

    secede()  # a loop, not a task: the worker's thread goes back to its pool (evaluation's publish)
    hub = HUBS[hub_id]
    algo = load_algorithm(algorithm)
    shape, roles = stream_shape(algo), algo.roles
    output = algo.graph.output
    caller = _Caller(hosts)
    rounds = 0
    try:
        published = caller.run(shape.before, {}, roles)
        hub.publish(hub.version, published)
        last = time.perf_counter()
        while True:
            got = hub.take(generation)
            if got is None:
                return rounds
            taken, stale, _ = got
            version = hub.version
            t0 = time.perf_counter()
            values = dict(published)
            values[shape.stream.id] = [a.value for a in taken]
            values = caller.run(shape.learn, values, roles)
            update_s = time.perf_counter() - t0
            published = caller.run(shape.before, {}, roles)
            out = values[output.id][0] if output is not None and output.id in values else None
            now = time.perf_counter()
            item = Learned(
                0, dict(out) if isinstance(out, dict) else {},
                [(a.source, a.report) for a in (*taken, *stale)],
                [version - a.version for a in taken], min(a.version for a in taken), update_s, now - last, version,
            )  # fmt: skip
            last = now
            if not hub.learned(generation, item, published):
                return rounds
            rounds += 1
    except BaseException as err:
        hub.failed(err)
        raise


class _Remote:
    """A hub's methods called from a task on another worker, by Dask's actor RPC (worker to worker).

    Not through :class:`distributed.Actor`: its proxy holds every call to an actor whose worker died
    until the actor comes back, which a pinned one never does; here such a call fails at once
    (:class:`HubGone`), and the sampler's loop ends so that the driver starts it on the next hub."""

    def __init__(self, address: str, key: str):
        from distributed import get_worker

        self.worker, self.address, self.key = get_worker(), address, key

    def __call__(self, method: str, *args: Any) -> Any:
        from distributed.protocol import to_serialize
        from distributed.utils import sync

        async def call() -> Any:
            return await self.worker.rpc(self.address).actor_execute(
                function=method, actor=self.key, args=[to_serialize(a) for a in args], kwargs={}
            )

        try:
            result = sync(self.worker.loop, call)
        except Exception as err:  # noqa: BLE001 (any failure to reach the hub is the hub's)
            raise HubGone(f"stream hub at {self.address}: {type(err).__name__}: {err}") from None
        if result["status"] != "OK":
            raise HubGone(f"stream hub at {self.address}: {result['exception']!r}")
        return result["result"]


def sampler_loop(
    hub: tuple[str, str], host_id: str, source: int, fragment: str, inputs: list[tuple[str, Any]], generation: int
) -> int:
    """One sampler's stream, as one long-running task on its worker (see the module docstring): collect,
    put, take newer weights when there are some, until the hub says stop. Returns its collects.

    ``inputs``: the stream fragment's arguments, ``("node", id)`` for a published value (broadcast from
    its single-instance role), ``("value", v)`` for a constant. Raises :class:`HubGone` when the hub
    cannot be reached (its worker died: the driver restarts the loop with the next hub)."""
    from distributed import secede

    secede()
    host = _host(host_id)
    ask = _Remote(*hub)
    have, newest, args, collects = -1, 0, None, 0

    while True:
        if args is None or newest > have:
            got = ask("weights", have)
            if got is not None:
                generation, have, values = got
                args = [values[v][source % len(values[v])] if kind == "node" else v for kind, v in inputs]
            elif args is None:
                return collects  # stopped before the first weights
        out = host.call(fragment, *args)
        collects += 1
        sent = wrap(out) if host.shared_memory else out
        reply = ask("put", source, generation, have, sent, report(out))
        if reply[0] == "ok":
            newest = reply[1]
        elif reply[0] == "stop":
            return collects
        elif reply[0] == "moved":  # a rollback: the restored learner's hub, and its weights
            ask, generation, have, args = _Remote(reply[1], reply[2]), reply[3], -1, None
        else:  # refused: weights of another generation
            generation, have, args = reply[1], -1, None
