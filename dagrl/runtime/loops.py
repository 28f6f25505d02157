"""The loops of a stream (:mod:`dagrl.runtime.stream`): one long-running task per sampler, one for the learner.

Each loop secedes from its worker's thread pool (it is a loop, not a task: the worker's thread goes
back to the pool, for an evaluation's ``publish`` or a report) and calls fragments on role hosts: on
its own worker directly (:data:`~dagrl.runtime.host.HOSTS`), elsewhere by Dask's actor RPC, worker to
worker (:class:`Remote`). Nothing here goes through the scheduler or the driver.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dagrl.core.distribution import stream_shape
from dagrl.core.fragment import Node, load_algorithm
from dagrl.runtime.executor import replica_args
from dagrl.runtime.host import HOSTS, _host
from dagrl.runtime.report import report
from dagrl.runtime.shm import unwrap, wrap
from dagrl.runtime.stream import HUBS, Go, HubGone, Learned, Moved, PeerFailed, Refused, Reply, Stop, Weights

__all__ = ["SAMPLER_NICE", "Remote", "learner_loop", "sampler_loop"]

SAMPLER_NICE = 5
"""How much lower a sampler loop's thread (and the env threads it starts) runs than the learner's, where
they share cores: a streaming learner is what bounds the run once it is busy, and the samplers wait
for room anyway (backpressure). Linux gives each thread its own nice value, so the worker's other
threads (a learner replica on the same worker, Dask's event loop) keep theirs."""


def lower_priority(nice: int) -> None:
    """This thread runs ``nice`` steps lower from now on (Linux; elsewhere, or refused, nothing changes).
    Only a loop's own thread takes it: a seceded thread ends with its task."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class Remote:
    """The methods of an actor on another worker (a hub, a role host), called from a task by Dask's
    actor RPC.

    Not through :class:`distributed.Actor`: its proxy holds every call to an actor whose worker died
    until the actor comes back, which a pinned one never does; here such a call fails at once with
    ``fail(kind, message)`` (``lost``: no answer; ``raised``: the method raised)."""

    def __init__(self, address: str, key: str, fail: Callable[[str, str], Exception], worker: Any = None):
        from distributed import get_worker

        self.worker, self.address, self.key, self.fail = worker or get_worker(), address, key, fail

    def __call__(self, method: str, *args: Any) -> Any:
        from distributed.protocol import to_serialize
        from distributed.utils import sync

        async def call() -> Any:
            return await self.worker.rpc(self.address).actor_execute(
                function=method, actor=self.key, args=[to_serialize(a) for a in args], kwargs={}
            )

        try:
            result = sync(self.worker.loop, call)
        except Exception as err:  # noqa: BLE001 (any failure to reach it is its worker's)
            raise self.fail("lost", f"{type(err).__name__}: {err}") from None
        if result["status"] != "OK":
            err = result["exception"]
            raise self.fail("raised", f"{type(err).__name__}: {err}") from None
        return result["result"]


def hub_of(address: str, key: str) -> Remote:
    return Remote(address, key, lambda kind, msg: HubGone(f"stream hub at {address}: {msg}"))


def host_of(role: str, index: int, host_id: str, address: str, worker: Any = None) -> Remote:
    return Remote(address, host_id, lambda kind, msg: PeerFailed(role, index, address, kind, msg), worker)


class Caller:
    """Calls fragments of the learn side: on a host of this process directly, else by its actor.

    A single-instance role given K replicas is a data-parallel group (:mod:`dagrl.runtime.groups`): its
    K calls of a fragment run at once, one thread each, since they all-reduce with each other; its
    ``publish`` (:meth:`publish`) runs on replica 0 alone, the others holding the same weights."""

    def __init__(self, hosts: dict[str, list[tuple[str, str]]], roles: Any = None):
        self.hosts = hosts
        self.remotes: dict[str, Remote] = {}
        self.delayed: frozenset[tuple[int, int]] = frozenset()
        """``split-learner``'s delayed edges (:meth:`learn`)."""
        self.previous: dict[int, list[Any]] = {}
        """The delayed edges' values of the last round."""
        self.groups = {r for r, hs in hosts.items() if len(hs) > 1 and roles is not None and not roles[r].many}
        """The roles running as data-parallel groups."""
        self.busy: dict[str, list[float]] = {r: [0.0] * len(hosts[r]) for r in self.groups}
        """Per group, each replica's seconds in fragments since :meth:`take_busy`."""
        self.pool = concurrent.futures.ThreadPoolExecutor(max((len(hosts[r]) for r in self.groups), default=1))
        self.worker: Any = None
        """This process's Dask worker, found in the loop's own thread (a pool's thread cannot look it up)."""
        if self.groups:
            from distributed import get_worker

            self.worker = get_worker()

    def publish(self, nodes: list[Node], roles: Any) -> dict[int, list[Any]]:
        """The weights samplers take: the nodes before the stream, a group's on its replica 0 only."""
        return self.run(nodes, {}, roles, first=True)

    @property
    def size(self) -> int:
        """The replicas of the largest group (1: none)."""
        return max((len(self.hosts[r]) for r in self.groups), default=1)

    def take_busy(self) -> list[float]:
        """The group's replicas' seconds in fragments since the last call (``[]``: no group)."""
        if not self.groups:
            return []
        role = min(self.groups)
        busy, self.busy[role] = self.busy[role], [0.0] * len(self.hosts[role])
        return busy

    def learn(self, nodes: list[Node], values: dict[int, list[Any]], roles: Any) -> dict[int, list[Any]]:
        """A round's learn fragments (:meth:`run`); with delayed edges, their ends take the last round's
        values, and this round's are kept for the next."""
        out = self.run(nodes, values, roles, self.delayed, self.previous)
        self.previous = {src: out[src] for src, _ in self.delayed}
        return out

    def call(self, role: str, replica: int, fragment: str, *args: Any) -> Any:
        host_id, address = self.hosts[role][replica]
        host = HOSTS.get(host_id)
        if host is not None:
            return host.traced(fragment, *args)
        remote = self.remotes.get(host_id)
        if remote is None:
            remote = self.remotes[host_id] = host_of(role, replica, host_id, address, self.worker)
        return unwrap(remote("traced", fragment, *[wrap(a) for a in args]))  # same host: large arrays by shm

    def run(
        self,
        nodes: list[Node],
        values: dict[int, list[Any]],
        roles: Any,
        delayed: frozenset[tuple[int, int]] = frozenset(),
        previous: dict[int, list[Any]] | None = None,
        first: bool = False,
    ) -> dict[int, list[Any]]:
        """Each node on every replica of its role, inputs routed as the executor routes them.

        ``delayed`` (``split-learner``): edges ``(src, dst)`` whose ``dst`` takes ``src``'s value of the
        previous round (``previous``, when there is one). Nodes run in waves, each as soon as its inputs
        are there; the nodes of one wave (an actor update beside the critic update it no longer waits
        for) run at once, each on its own role's host. ``first``: a group's nodes on replica 0 alone."""
        values = dict(values)
        previous = previous or {}

        def late(a: Node, node: Node) -> bool:
            return (a.id, node.id) in delayed and a.id in previous

        pending = list(nodes)
        while pending:
            wave = [
                n for n in pending if all(not isinstance(a, Node) or a.id in values or late(a, n) for a in n.inputs)
            ]
            if not wave:
                raise RuntimeError(f"learn fragments wait on each other: {[n.name for n in pending]}")
            if len(wave) == 1 or not delayed:
                wave = wave[:1]
                rows = [self._node(wave[0], values, previous, roles, late, first)]
            else:
                with concurrent.futures.ThreadPoolExecutor(len(wave)) as pool:
                    rows = list(pool.map(lambda n: self._node(n, values, previous, roles, late, first), wave))
            for node, row in zip(wave, rows, strict=True):
                values[node.id] = row
            pending = [n for n in pending if n not in wave]
        return values

    def _node(
        self, node: Node, values: dict[int, list[Any]], previous: dict[int, list[Any]], roles: Any, late: Callable,
        first: bool = False,
    ) -> list[Any]:  # fmt: skip
        n = len(self.hosts[node.role])

        def call(r: int) -> Any:
            args = replica_args(node, lambda a: (previous if late(a, node) else values)[a.id], roles, r, n)
            return self.call(node.role, r, node.name, *args)

        if node.role not in self.groups:
            return [call(r) for r in range(n)]
        if first:
            return [call(0)]
        return self._together(node.role, call, n)

    def _together(self, role: str, call: Callable[[int], Any], n: int) -> list[Any]:
        """A group's ``n`` calls at once (they all-reduce). A replica that could not be reached fails the
        round with its :class:`PeerFailed`, before the error its peers' broken all-reduce raised."""

        def timed(r: int) -> Any:
            t0 = time.perf_counter()
            try:
                return call(r)
            finally:
                self.busy[role][r] += time.perf_counter() - t0

        futures = [self.pool.submit(timed, r) for r in range(n)]
        concurrent.futures.wait(futures)
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise next((e for e in errors if isinstance(e, PeerFailed)), errors[0])
        return [f.result() for f in futures]


def learner_loop(
    hub_id: str,
    algorithm: str,
    hosts: dict[str, list[tuple[str, str]]],
    generation: int,
    delayed: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> int:
    """The learner side of a stream, as one long-running task on the hub's worker (see
    :mod:`dagrl.runtime.stream`): publish, then take, learn, publish, until the hub stops. Returns the
    rounds it ran. ``delayed`` (``split-learner``): learn-side edges that carry the previous round's
    value, so that the two learner roles at their ends update at once (:meth:`Caller.run`)."""
    from distributed import secede

    secede()
    hub = HUBS[hub_id]
    algo = load_algorithm(algorithm)
    shape, roles = stream_shape(algo), algo.roles
    caller = Caller(hosts, roles)
    caller.delayed, caller.previous = frozenset(map(tuple, delayed)), {}
    step = _replay_round if hub.limit is not None else _round
    rounds = 0
    try:
        published = caller.publish(shape.before, roles)
        hub.publish(hub.version, published)
        last = time.perf_counter()
        while True:
            got = step(hub, generation, caller, shape, algo, published)
            if got is None:
                return rounds
            item, new = got
            published = new or published
            now = time.perf_counter()
            item.wall_s, last = now - last, now
            if not hub.learned(generation, item, new):
                return rounds
            rounds += 1
    except BaseException as err:
        hub.failed(err)
        raise


def _output(algo: Any, values: dict[int, list[Any]], caller: Caller) -> dict[str, float]:
    """The round's metrics: the output node's first replica's, with a group's ``perf/frames`` summed over its
    replicas (the output's first K calls: the K learners', or the K replay shards passing them on)."""
    output = algo.graph.output
    row = values.get(output.id) if output is not None else None
    if not row or not isinstance(row[0], dict):
        return {}
    out = dict(row[0])
    if caller.size > 1 and "perf/frames" in out:
        out["perf/frames"] = float(sum(r.get("perf/frames", 0.0) for r in row[: caller.size] if isinstance(r, dict)))
    return out


def _round(hub: Any, generation: int, caller: Caller, shape: Any, algo: Any, published: dict) -> tuple | None:
    """One round on the rollouts that arrived; the next weights version."""
    got = hub.take(generation)
    if got is None:
        return None
    taken, stale = got.arrivals, got.stale
    version, collects = hub.version, hub.arrived
    t0 = time.perf_counter()
    values = dict(published)
    values[shape.stream.id] = [a.value for a in taken]
    try:
        values = caller.learn(shape.learn, values, algo.roles)
    except PeerFailed:
        hub.requeue(taken, stale)  # learnt by the next round, once the driver replaced the peer
        raise
    update_s = time.perf_counter() - t0
    new = caller.publish(shape.before, algo.roles)
    item = Learned(
        0, _output(algo, values, caller), [(a.source, a.report) for a in (*taken, *stale)],
        [version - a.version for a in taken], min(a.version for a in taken), update_s, 0.0, version, collects,
        busy=caller.take_busy(),
    )  # fmt: skip
    return item, new


def _replay_round(hub: Any, generation: int, caller: Caller, shape: Any, algo: Any, published: dict) -> tuple | None:
    """With replay: a warm-up iteration (counted inserts, no learning) or a learner round over what the
    shards hold; the next weights version every ``publish_every`` learner rounds."""
    got = hub.take_stored(generation)
    if got is None:
        return None
    reports, collects = got.reports, got.collects
    version = hub.version
    lags = [version - r.version for r in reports]
    oldest = min((r.version for r in reports), default=version)
    pairs = [(r.source, r.report) for r in reports]
    if not got.learn:
        return Learned(0, {}, pairs, lags, oldest, 0.0, 0.0, version, collects, learnt=False), None
    t0 = time.perf_counter()
    values = {**published, **got.shards}
    try:
        values = caller.learn(shape.learn, values, algo.roles)
    except PeerFailed:
        hub.untake(reports)  # counted by the next round, once the driver replaced the peer
        raise
    update_s = time.perf_counter() - t0
    new = None
    if (hub.learnt + 1) % hub.limit.publish_every == 0:
        new = caller.publish(shape.before, algo.roles)
    out = _output(algo, values, caller)
    return Learned(0, out, pairs, lags, oldest, update_s, 0.0, version, collects, busy=caller.take_busy()), new


def sampler_loop(
    hub: tuple[str, str],
    host_id: str,
    source: int,
    fragment: str,
    inputs: list[tuple[str, Any]],
    generation: int,
    inserts: list[tuple[int, str, str, int, str, str, list[tuple[str, Any]]]] = (),  # type: ignore[assignment]
    token: str = "",
) -> int:
    """One sampler's stream, as one long-running task on its worker (see :mod:`dagrl.runtime.stream`):
    collect, hand the rollout on, take newer weights when there are some, until the hub says stop.
    Returns its collects.

    ``inputs``: the stream fragment's arguments, ``("node", id)`` for a published value (broadcast from
    its single-instance role), ``("value", v)`` for a constant. ``inserts`` (with replay): for each
    insert fragment, ``(node id, fragment, role, shard, host id, address, inputs)``, its inputs as
    ``inputs`` plus ``("stream", None)`` for this sampler's rollout; the rollout is stored there and
    the hub gets its report only. ``token`` names this loop to the hub, which tells a loop it no longer
    owns its sampler index (the driver replaced it) to stop. Raises
    :class:`~dagrl.runtime.stream.HubGone` when the hub cannot be reached (the driver restarts the loop
    on the next hub) and
    :class:`~dagrl.runtime.stream.PeerFailed` when a shard fails."""
    from distributed import secede

    secede()
    lower_priority(SAMPLER_NICE)
    host = _host(host_id)
    ask = hub_of(*hub)
    shards = [(node_id, name, shard, host_of(role, shard, key, address), spec)
              for node_id, name, role, shard, key, address, spec in inserts]  # fmt: skip
    have, newest, args, values, collects = -1, 0, None, {}, 0

    def begin() -> Reply:
        return ask("begin", source, token) if shards else Go(newest)

    reply = begin()
    while True:
        match reply:
            case Stop():
                return collects
            case Moved(address, key, gen):  # a rollback: the restored learner's hub, and its weights
                ask, generation, have, args = hub_of(address, key), gen, -1, None
                reply = begin()
                continue
            case Refused(gen):  # weights of another generation
                generation, have, args = gen, -1, None
                reply = begin()
                continue
            case Go(version):
                newest = version
        if args is None or newest > have:
            got: Weights | None = ask("weights", have)
            if got is not None:
                generation, have, values = got.generation, got.version, got.values
                args = [values[v][source % len(values[v])] if kind == "node" else v for kind, v in inputs]
            elif args is None:
                return collects  # stopped before the first weights
        out = host.traced(fragment, *args)
        collects += 1
        if not shards:
            sent = wrap(out) if host.shared_memory else out
            reply = ask("put", source, generation, have, sent, report(out), token)
            continue
        stored = {}
        for node_id, name, shard, remote, spec in shards:
            node_args = [
                [out] if kind == "stream" else values[v][shard % len(values[v])] if kind == "node" else v
                for kind, v in spec
            ]
            local = HOSTS.get(remote.key)  # the shard on this very worker: no round trip through a socket
            stored[node_id] = (
                shard,
                local.traced(name, *node_args) if local is not None else remote("traced", name, *node_args),
            )
        reply = ask("inserted", source, generation, have, report(out), stored, token)


def inference_loop(hub: tuple[str, str], host_id: str, inputs: list[tuple[str, Any]]) -> int:
    """``central-inference``'s asynchronous form: a long-running task beside the inference role that
    loads each weights version into it as soon as the learner publishes it on the hub (``inputs``: the
    stream fragment's arguments, as :func:`sampler_loop` takes them). Samplers act on the version the role
    holds at each env step. Returns the loads made, once the hub stops or is retired."""
    from distributed import secede

    from dagrl.runtime.host import load_acting

    secede()
    ask, have, loads = hub_of(*hub), -1, 0
    while True:
        got = ask("newer", have, 1.0)
        if got is None:
            continue
        if isinstance(got, Stop):
            return loads
        have = got.version
        load_acting(host_id, *[got.values[v][0] for kind, v in inputs if kind == "node"])
        loads += 1
