"""The driver's side of a stream: it opens the hub, starts the loops, watches them, and hands on the rounds.

The hub and its messages are in :mod:`dagrl.runtime.stream`, the loops in :mod:`dagrl.runtime.loops`;
a policy that streams (:mod:`dagrl.policies.pull`) says only how its hub takes what the samplers make
(:attr:`StreamWatch.options`). The watch runs at a bounded rate (:meth:`StreamWatch.next_round`): it
receives the finished rounds (one iteration each, with the reports of the rollouts they counted),
grants the hub the rounds it may run before the driver must act (a checkpoint, a blocking
evaluation, a stop it can foresee), and supervises. What a loss means is :class:`Recovery`'s to say:

* a sampler whose loop raised, whose worker died, or which has put nothing for ``hang_timeout_s``
  (while not waiting for room) is replaced and its loop restarted, or, above the replicas a growing
  stream (``max_replicas``) started with, dropped: its slot waits for a worker that joins, and the
  hub's budget follows the count; the other loops never stop;
* a replay shard a loop failed on (its worker died, its fragment raised) is replaced and the loops
  that call it restart on the replacement (the learner's on the same hub: no rollback);
* a learner replica past the first of a data-parallel group (``roles.learner.replicas: K``) lost with
  its worker is replaced, given replica 0's state and the group formed anew (:meth:`Hooks.regroup`);
  the learner loop starts again on the same hub, no rollback: the round it was in is lost, its
  rollouts with it;
* a learner whose loop raised, whose worker died, or whose round runs past ``hang_timeout_s`` is the
  driver's to roll back (:class:`~dagrl.runtime.supervisor.RoleFailure`). The restored learner gets a
  new hub (:meth:`StreamWatch.new_generation`: versions past every older one); the old hub, if it
  answers, refuses every later put and redirects its sampler to the new hub, so no rollout made with
  weights from before the rollback reaches the restored learner (``stream/refused`` counts them).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagrl.core.distribution import stream_shape
from dagrl.core.fragment import Node
from dagrl.core.graph import Graph
from dagrl.runtime import spans
from dagrl.runtime.hosts import Handle
from dagrl.runtime.loops import learner_loop, sampler_loop
from dagrl.runtime.recovery import Action, Recovery
from dagrl.runtime.stream import Hub, HubGone, Learned, PeerFailed, Status
from dagrl.runtime.supervisor import RoleFailure, describe

__all__ = ["Hooks", "Loop", "StreamWatch"]

log = logging.getLogger("dagrl")

POLL_S = 0.5
"""The longest the driver's call to the hub waits for a round (it returns as soon as one is there)."""
MIN_POLL_S = 0.05
"""The shortest interval between two of the driver's calls: its cost per env step falls as rounds grow."""
CALL_TIMEOUT_S = 30.0
"""How long a call to the hub may take before its worker is judged gone."""
GROW_EVERY_S = 2.0
"""How often a stream below ``max_replicas`` looks for workers that joined."""


@dataclass
class Loop:
    """One sampler's loop as the driver knows it."""

    future: Any = None
    """Its long-running task (``None``: not started, or dropped)."""
    generation: int = 0
    """The hub generation it was started on (a loop may outlive its hub by a rollback)."""
    started: float = field(default_factory=time.monotonic)
    """When it was (re)started: a new loop is not hung for its predecessor's silence."""
    token: str = ""
    """What it speaks to the hub with (:meth:`Hub.own`): a loop the driver replaced is told to stop."""
    peers: dict[tuple[str, int], Handle] = field(default_factory=dict)
    """The other roles' hosts it calls (a replay shard), as they were when it started."""


class Hooks:
    """What a policy adds to its stream (central inference: the role the samplers act through)."""

    def hub_opened(self) -> None:
        """A hub was opened (at the start, or for a restored learner)."""

    def loop_starting(self, index: int) -> None:
        """Sampler ``index``'s loop is about to start (first, or again)."""

    def sampler_failed(self, index: int, failure: RoleFailure) -> bool:
        """Sampler ``index``'s loop failed: ``True`` if the policy took care of it."""
        return False

    def watched(self) -> None:
        """One look at the stream ended: the policy's own loops may be looked at too."""

    def regroup(self, role: str) -> None:
        """A replica of ``role``'s data-parallel group was replaced: the group forms anew, each replica with
        replica 0's state."""


class StreamWatch:
    """The driver's side of one stream (module docstring).

    Parameters
    ----------
    graph, hosts : the run's graph and the policy's role hosts (replacements take their places).
    client : the Dask client the loops are submitted with.
    recovery : what a loss means (:class:`~dagrl.runtime.recovery.Recovery`), with the supervisor.
    options : the hub's options for a number of samplers streaming (:class:`~dagrl.runtime.stream.Hub`'s
        ``budget``, ``capacity``, ``least``, ``max_staleness``, with replay ``limit`` and ``shards``).
    delayed : ``split-learner``'s learn-side edges carrying the previous round's value.
    hooks : what the policy adds (:class:`Hooks`).
    """

    def __init__(
        self, graph: Graph, hosts: dict[str, list[Handle]], client: Any, recovery: Recovery,
        options: Callable[[int], dict[str, Any]], delayed: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
        hooks: Hooks | None = None,
    ) -> None:  # fmt: skip
        algo = graph.algorithm
        self.graph, self.hosts, self.client, self.recovery = graph, hosts, client, recovery
        self.options, self.delayed, self.hooks = options, delayed, hooks or Hooks()
        self.shape = stream_shape(algo)
        self.role = self.shape.stream.role
        self.most = max(graph.role(self.role).max_replicas or 0, len(hosts[self.role]))
        """The most samplers the stream may grow to (``max_replicas``); the hub is sized for them."""
        learn_roles = [n.role for n in self.shape.learn if not algo.roles[n.role].many]
        if not learn_roles:
            raise TypeError(
                f"{graph.spec.policy}: the iteration has no learner fragment after {self.shape.stream.name}"
            )
        self.learner_role = learn_roles[0]
        self.group = len(hosts[self.learner_role])
        """The learner's replicas (a data-parallel group past 1): each round is shared among them."""
        self.loops = [Loop() for _ in hosts[self.role]]
        self.generation = self.version = 0
        """The hub's generation, and the newest weights version the driver has heard of."""
        self.starts: dict[int, int] = {}
        """Each generation's first weights version (a new hub's starts past every older one)."""
        self.hub: Any = None
        self.hub_future: Any = None
        self.hub_key = self.hub_address = ""
        self.retired: list[Any] = []
        """Hubs of earlier generations that still answer: they redirect their samplers until the end."""
        self.learner: Any = None
        """The learner loop's future."""
        self.learner_peers: dict[tuple[str, int], Handle] = {}
        self.queue: collections.deque[Learned] = collections.deque()
        self.delivered = 0
        """Rounds of the current hub handed to the driver."""
        self.status: Status | None = None
        self.refused_before = self.dropped_before = 0
        """Rollouts refused by, and dropped as stale at, the hubs of earlier generations."""
        self.next_growth = 0.0
        self.started = self.stopped = False

    @property
    def supervisor(self) -> Any:
        return self.recovery.supervisor

    @property
    def active(self) -> int:
        """The samplers streaming (or being replaced): all but the dropped ones."""
        return self.recovery.active(self.role)

    @property
    def refused(self) -> int:
        return self.refused_before + (self.status.refused if self.status is not None else 0)

    @property
    def dropped(self) -> int:
        return self.dropped_before + (self.status.dropped if self.status is not None else 0)

    # -- starting ----------------------------------------------------------------------------------

    def start(self) -> None:
        with contextlib.suppress(Exception):  # a picture only (Dask's Task Stream): the run goes on without it
            spans.install(self.client)
        self._open_hub()
        for i in range(len(self.loops)):
            self.start_sampler(i)
        self.started = True

    def _open_hub(self) -> None:
        """A hub (generation ``self.generation``) and its learner loop on the learner's worker."""
        home = self.hosts[self.learner_role][0]
        key = f"stream-hub-{self.generation}-{uuid.uuid4().hex}"
        self.starts[self.generation] = self.version + (self.generation > 0)
        self.hub_future = self.client.submit(
            Hub, key, self.generation, self.starts[self.generation], samplers=self.most, **self.options(self.active),
            group=self.group, actor=True, workers=[home.address], allow_other_workers=False, key=key,
        )  # fmt: skip
        self.hub = self.hub_future.result()
        self.hub_key, self.hub_address, self.delivered = key, home.address, 0
        for i, loop in enumerate(self.loops):  # loops moving over from the retired hub keep their word
            if loop.token:
                self.hub.own(i, loop.token).result(timeout=CALL_TIMEOUT_S)
        self._start_learner()
        self.hooks.hub_opened()

    def _start_learner(self) -> None:
        home = self.hosts[self.learner_role][0]
        hosts = {
            role: [(h.host_id, h.address) for h in handles]
            for role, handles in self.hosts.items()
            if any(n.role == role for n in (*self.shape.before, *self.shape.learn))
        }
        self.learner_peers = {(h.role, h.index): h for role in hosts for h in self.hosts[role]}
        self.learner = self.client.submit(
            learner_loop, self.hub_key, self.graph.spec.algorithm, hosts, self.generation, sorted(self.delayed),
            workers=[home.address], allow_other_workers=False, pure=False,
            key=f"learn-loop-{self.learner_role}-{self.generation}-{uuid.uuid4().hex[:8]}",
        )  # fmt: skip

    def start_sampler(self, i: int) -> None:
        """(Re)start sampler ``i``'s loop on its current host, speaking to the current hub."""
        self.hooks.loop_starting(i)
        h = self.hosts[self.role][i]
        stream = self.shape.stream

        def spec(node: Node) -> list[tuple[str, Any]]:
            return [
                ("stream", None) if a is stream else ("node", a.id) if isinstance(a, Node) else ("value", a)
                for a in node.inputs
            ]

        inserts, peers = [], {}
        for node in self.shape.insert:  # sampler i stores into shard i mod K
            shards = self.hosts[node.role]
            shard = shards[i % len(shards)]
            inserts.append((node.id, node.name, node.role, shard.index, shard.host_id, shard.address, spec(node)))
            peers[(node.role, shard.index)] = shard
        loop = self.loops[i] = Loop(self.loops[i].future, self.generation, token=uuid.uuid4().hex, peers=peers)
        try:
            self._at_hub("own", i, loop.token)  # before the loop's first word
        except BaseException:  # the learner's loss, found while replacing a sampler: new_generation starts this loop
            with contextlib.suppress(Exception):
                self.client.cancel([loop.future])
            loop.future = None
            raise
        loop.future = self.client.submit(
            sampler_loop, (self.hub_address, self.hub_key), h.host_id, i, stream.name, spec(stream),
            self.generation, inserts, loop.token, workers=[h.address], allow_other_workers=False, pure=False,
            key=f"{stream.name}-loop-{h.role}-{i}-{loop.token[:8]}",
        )  # fmt: skip

    # -- the driver's iteration --------------------------------------------------------------------

    def next_round(self, horizon: int | None) -> Learned:
        """The next round the learner finished, once there is one; ``horizon``: the iterations, that one
        included, that may end before the driver must act (``None``: no bound)."""
        if not self.started:
            self.start()
        while not self.queue:
            self._poll(horizon)
        self.delivered += 1
        return self.queue.popleft()

    def finish(self) -> bool:
        """Stop the stream (a round in progress ends and is filed); whether rounds are left to hand on."""
        if self.started and not self.stopped:
            self._stop_stream()
            with contextlib.suppress(Exception):  # a hub lost now: nothing more to count
                self._take_status(self.hub.drain(0, 0.0, 0.0).result(timeout=CALL_TIMEOUT_S))
        return bool(self.queue)

    def _poll(self, horizon: int | None) -> None:
        """One look at the stream: its finished rounds, then the loops' health."""
        ahead = horizon if horizon is not None else 1 << 30
        allow = self.delivered + len(self.queue) + max(1, ahead)
        status = self._at_hub("drain", allow, POLL_S, MIN_POLL_S)
        self._take_status(status)
        self._check(status)
        self.hooks.watched()

    def _at_hub(self, method: str, *args: Any) -> Any:
        """The hub's answer to ``method(*args)``. The hub lives on the learner's worker, so failing to
        reach it (Dask already counting that worker lost, or :meth:`_answer`'s timeout) is the learner's
        loss: a :class:`RoleFailure` for the driver to roll back, whatever was being done then (a
        sampler replaced at a checkpoint, a sampler dropped or added)."""
        learner = self.hosts[self.learner_role][0]
        try:
            return self._answer(getattr(self.hub, method)(*args), learner)
        except Exception as err:  # noqa: BLE001 (Dask's RuntimeError for a lost actor, a timeout, a closed comm)
            raise RoleFailure(learner, "lost", err) from None

    def _answer(self, future: Any, handle: Any) -> Any:
        """``future``'s result, from a hub on ``handle``'s worker: raises ``TimeoutError`` after
        ``CALL_TIMEOUT_S``, or as soon as the supervisor counts that worker lost (a host cut off does not
        close its sockets: without this, the call would wait out the whole timeout)."""
        sup, end = self.supervisor, time.monotonic() + CALL_TIMEOUT_S
        while True:
            try:
                return future.result(timeout=min(1.0, max(0.01, end - time.monotonic())))
            except TimeoutError:
                if time.monotonic() >= end:
                    raise
                if sup is not None and not sup.alive(handle.address):
                    raise TimeoutError(f"{handle.address} is lost") from None

    def _take_status(self, status: Status) -> None:
        self.status = status
        self.version = max(self.version, status.version)
        self.queue.extend(status.rounds)

    def _check(self, status: Status) -> None:
        self._check_learner(status)
        sup = self.supervisor
        if sup is None:
            return
        hang = sup.spec.hang_timeout_s
        for i, loop in enumerate(self.loops):
            if i in self.recovery.gone[self.role]:
                continue
            h = self.hosts[self.role][i]
            failure = None
            silent = min(status.samplers[i].since_put, time.monotonic() - loop.started)
            if loop.future.status == "error":
                err = loop.future.exception()
                if isinstance(err, HubGone):
                    if loop.generation < self.generation:  # the hub of a learner rolled back
                        self.start_sampler(i)
                        continue
                    raise RoleFailure(self.hosts[self.learner_role][0], "lost", err)  # the hub: the learner's worker
                if isinstance(err, PeerFailed) and self.recovery.peer(err, loop.peers) is not None:
                    self.start_sampler(i)  # on the shard's replacement
                    continue
                failure = RoleFailure(h, "lost" if not sup.alive(h.address, fresh=True) else "raised", err)
            elif not sup.alive(h.address):
                failure = RoleFailure(h, "lost", OSError("worker gone"))
            elif loop.future.status == "finished":  # it returned without being stopped (its hub was): start it again
                self.start_sampler(i)
            elif silent > hang and not status.samplers[i].blocked:
                failure = RoleFailure(
                    h, "hung", TimeoutError(f"no rollout for {silent:.0f} s (hang_timeout_s {hang:g})")
                )
            if failure is not None:
                self.sampler_failed(i, failure)
        self._grow()

    def _check_learner(self, status: Status) -> None:
        """The learner loop's health: a failure on a replaced peer restarts it on the same hub; any other
        is the learner's, raised for the driver to roll back."""
        from distributed import wait

        learner = self.hosts[self.learner_role][0]
        sup = self.supervisor
        if self.learner.status == "error" or status.error is not None:
            if self.learner.status == "pending":  # the hub heard first: Dask's own error keeps the traceback
                with contextlib.suppress(Exception):
                    wait([self.learner], timeout=5.0)
            err = self.learner.exception() if self.learner.status == "error" else status.error
            if isinstance(err, PeerFailed) and self._peer_replaced(err):
                self.hub.clear().result(timeout=CALL_TIMEOUT_S)
                self._start_learner()  # the same hub: the learner's own state is untouched
                return
            lost = sup is not None and not sup.alive(learner.address, fresh=True)
            raise RoleFailure(learner, "lost" if lost else "raised", err)
        if sup is None:
            return
        if not sup.alive(learner.address):
            raise RoleFailure(learner, "lost", OSError("worker gone"))
        hang = sup.spec.hang_timeout_s
        if status.round_s is not None and status.round_s > hang:
            msg = f"a round has run {status.round_s:.0f} s (hang_timeout_s {hang:g})"
            raise RoleFailure(learner, "hung", TimeoutError(msg))

    def _peer_replaced(self, err: PeerFailed) -> bool:
        """Whether the learner loop's failure on another host (``err``) was recovered in place: a replay
        shard replaced, or a learner replica regrouped (:class:`~dagrl.runtime.recovery.Recovery`)."""
        outcome = self.recovery.peer(err, self.learner_peers)
        if outcome is not None and outcome.action is Action.REGROUP:
            self.hooks.regroup(err.role)
            log.warning("%s[%d] replaced: the group of %d formed anew, no rollback", err.role, err.index, self.group)
        return outcome is not None

    def sampler_failed(self, i: int, failure: RoleFailure) -> None:
        """Sampler ``i`` failed with ``failure`` (its own): replaced and its loop started again, or dropped
        (:class:`~dagrl.runtime.recovery.Recovery` decides)."""
        if self.hooks.sampler_failed(i, failure):
            return
        if self.recovery.recover(failure).action is Action.DROP:
            self._dropped(i, failure)
        else:
            self.start_sampler(i)

    def _dropped(self, i: int, failure: RoleFailure) -> None:
        """Sampler ``i`` left with its worker and is not replaced. Its loop, should its worker come back,
        is refused by the hub (a token nobody holds); the hub's budget follows the count."""
        loop = self.loops[i]
        loop.token = uuid.uuid4().hex
        self._at_hub("own", i, loop.token)
        with contextlib.suppress(Exception):
            self.client.cancel(loop.future)
        self._resize()
        log.warning(
            "%s[%d] on %s: %s; not replaced (above replicas): %d sampler(s) stream, at least %d, at most %d",
            failure.handle.role, i, failure.handle.address, describe(failure.kind, failure.cause), self.active,
            self.recovery.floor[self.role], self.most,
        )  # fmt: skip

    def _resize(self) -> None:
        """The hub's budget per round and room, for the samplers streaming now."""
        options = self.options(self.active)
        self._at_hub("resize", options["budget"], options["capacity"], options["least"], self.group)

    def _grow(self) -> None:
        """Below ``max_replicas``: a sampler on every worker that fits it and hosts nothing (one that
        joined during the run), each streaming from then on; the hub's budget follows their count."""
        sup, role = self.supervisor, self.role
        if sup is None or self.active >= self.most or time.monotonic() < self.next_growth:
            return
        self.next_growth = time.monotonic() + GROW_EVERY_S
        from dagrl.runtime.placement import place_one

        workers = sup.workers(max_age=0.0)
        load = collections.Counter(h.address for hs in self.hosts.values() for h in hs if h.address in workers)
        rspec, gone = self.graph.role(role), self.recovery.gone[role]
        while self.active < self.most:
            addr = place_one(role, rspec, workers, load, self.graph.spec.gpu_fallback, frozenset())
            if addr is None or load[addr] > 0:
                return
            i = min(gone) if gone else len(self.loops)  # a dropped sampler's slot first
            handle = sup.start(role, i, addr, sup.seed_offset, sup.env_steps)
            handle.supervisor = sup
            load[addr] += 1
            if i in gone:
                self.hosts[role][i] = handle
                self.recovery.rejoined(role, i)
            else:
                self.hosts[role].append(handle)
                self.loops.append(Loop(generation=self.generation))
            self._resize()
            self.start_sampler(i)
            log.info(
                "%s[%d] added on %s, a worker that joined: %d of at most %d", role, i, addr, self.active, self.most
            )

    # -- recovery and the end ----------------------------------------------------------------------

    def new_generation(self) -> None:
        """The learner was replaced and restored: a new hub for it; the old one redirects its samplers."""
        old, old_future, old_learner = self.hub, self.hub_future, self.learner
        self.queue.clear()
        seen = self.status.refused if self.status is not None else 0
        self.dropped_before += self.status.dropped if self.status is not None else 0
        self.generation += 1
        self._open_hub()  # its versions start past every one a sampler may hold
        self.status = None
        try:
            seen = old.retire(self.hub_address, self.hub_key, self.generation).result(timeout=5.0)
            self.retired.append(old_future)  # it answers: it redirects its samplers from now on
        except Exception:  # noqa: BLE001 (its worker died with the learner)
            # Dask would hold every call to it until the actor came back, which a pinned one never
            # does: cancelled, its samplers' calls fail, and their loops start again on the new hub
            with contextlib.suppress(Exception):
                self.client.cancel([old_future], force=True)
        self.refused_before += seen
        with contextlib.suppress(Exception):
            self.client.cancel([old_learner])
        for i, loop in enumerate(self.loops):
            if i in self.recovery.gone[self.role]:
                continue
            if loop.future is None or loop.future.status != "pending":  # failed on the lost hub, or returned
                self.start_sampler(i)

    def _stop_stream(self) -> None:
        self.stopped = True
        with contextlib.suppress(Exception):
            self.hub.stop().result(timeout=5.0)
        futures = [f for f in (self.learner, *(loop.future for loop in self.loops)) if f is not None]
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(f.status == "pending" for f in futures):
            time.sleep(0.02)

    def close(self) -> None:
        if self.started and not self.stopped:
            self._stop_stream()
        loops = [loop.future for loop in self.loops]
        futures = [f for f in (self.learner, *loops, self.hub_future, *self.retired) if f is not None]
        with contextlib.suppress(Exception):
            self.client.cancel(futures)
        self.hub = None
