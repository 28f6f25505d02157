"""``async`` and ``apex``: samplers stream to the learner's hub; the learner pulls what has arrived.

The iteration runs without the driver (:mod:`dagrl.runtime.stream`, :mod:`dagrl.runtime.loops`): one
long-running task per sampler collects back to back and hands each rollout on, worker to worker; one
on the learner's worker runs the learner's rounds and publishes each new weights version, which each
sampler takes between two rollouts. No scheduler task and no driver decision per rollout.

* ``async``: the rollouts go to the hub, and each round takes ``min_rollouts_per_update`` to
  ``rollouts_per_update`` of them (by default one per sampler);
* ``apex``: each sampler stores its rollouts in its replay shard itself (``add`` on the shard's
  worker) and the hub gets their reports; the rounds (``sample -> update -> reprioritize``) follow the
  inserts at ``update_ratio``, both ways, after the warm-up (``learning_starts``).

The driver watches at a bounded rate (:meth:`Stream._poll`): it receives the finished rounds (one
iteration each, with the reports of the rollouts they counted), grants the hub the rounds it may
run before the driver must act (:attr:`horizon`: a checkpoint, a blocking evaluation, a stop it can
foresee), and supervises:

* a sampler whose loop raised, whose worker died, or which has put nothing for ``hang_timeout_s``
  (while not waiting for room) is replaced and its loop restarted; the others never stop. A stream
  that may grow (``max_replicas``) drops instead a sampler whose worker left while it has more than
  ``replicas``: its slot waits for a worker that joins, and the hub's budget follows the count;
* a replay shard a loop failed on (its worker died, its fragment raised) is replaced and the loops
  that call it restart on the replacement (the learner's on the same hub: no rollback);
* a learner whose loop raised, whose worker died, or whose round runs past ``hang_timeout_s`` is the
  driver's to roll back (:class:`~dagrl.runtime.supervisor.RoleFailure`). The restored learner gets a
  new hub (a new generation, versions past every older one); the old hub, if it answers, refuses
  every later put and redirects its sampler to the new hub, so no rollout made with weights from
  before the rollback reaches the restored learner (``stream/refused`` counts them).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import uuid
from typing import Any

import numpy as np

from dagrl.core.distribution import delayed_edges, stream_shape, warmup_steps
from dagrl.core.fragment import Node
from dagrl.core.graph import Graph
from dagrl.policies.base import Policy, StepResult
from dagrl.runtime import spans
from dagrl.runtime.hosts import Handle
from dagrl.runtime.loops import learner_loop, sampler_loop
from dagrl.runtime.stream import Hub, HubGone, Learned, Limit, PeerFailed, Status
from dagrl.runtime.supervisor import RoleFailure, describe

POLL_S = 0.5
"""The longest the driver's call to the hub waits for a round (it returns as soon as one is there)."""
MIN_POLL_S = 0.05
"""The shortest interval between two of the driver's calls: its cost per env step falls as rounds grow."""
log = logging.getLogger("dagrl")
CALL_TIMEOUT_S = 30.0
GROW_EVERY_S = 2.0
"""How often a stream below ``max_replicas`` looks for workers that joined."""
"""How long a call to the hub may take before its worker is judged gone."""


class Stream(Policy):
    """Samplers loop and push, the learner loops and pulls, the driver watches (module docstring);
    :class:`Async` and :class:`Apex` say how the learner takes what the samplers made."""

    staleness_key = "perf/staleness"

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        algo = graph.algorithm
        self.shape = stream_shape(algo)
        self.samplers = len(hosts[self.shape.stream.role])
        self.most = max(graph.role(self.shape.stream.role).max_replicas or 0, self.samplers)
        """The most samplers the stream may grow to (``max_replicas``); the hub is sized for them."""
        self.next_growth = 0.0
        self.least = self.samplers
        """``replicas``: a stream that may grow (``max_replicas``) drops a sampler lost with its worker only
        above this count (below it, or in a stream that may not grow, a lost one is replaced)."""
        self.gone: set[int] = set()
        """Indices of samplers dropped with their workers: slots that a worker which joins takes first."""
        learn_roles = [n.role for n in self.shape.learn if not algo.roles[n.role].many]
        if not learn_roles:
            raise TypeError(f"{self.name}: the iteration has no learner fragment after {self.shape.stream.name}")
        self.learner_role = learn_roles[0]
        self.generation = 0
        self.version = 0
        """The newest weights version the driver has heard of (a new hub starts past it)."""
        self.starts: dict[int, int] = {}
        """Each generation's first weights version (a new hub's starts past every older one)."""
        self.hub: Any = None
        self.hub_future: Any = None
        self.retired: list[Any] = []
        """Hubs of earlier generations that still answer: they redirect their samplers until the end."""
        self.hub_key = ""
        self.hub_address = ""
        self.learner: Any = None
        """The learner loop's future."""
        self.loops: list[Any] = [None] * self.samplers
        self.loop_generation = [0] * self.samplers
        """The generation each sampler loop was started on (a loop may outlive its hub by a rollback)."""
        self.loop_started = [0.0] * self.samplers
        """When each loop was (re)started: a new loop is not hung for its predecessor's silence."""
        self.loop_peers: list[dict[tuple[str, int], Handle]] = [{} for _ in range(self.samplers)]
        """The other roles' hosts each loop calls (a replay shard), as they were when it started."""
        self.loop_tokens: dict[int, str] = {}
        """Per sampler index, the token its current loop speaks to the hub with (:meth:`Hub.own`)."""
        self.learner_peers: dict[tuple[str, int], Handle] = {}
        self.delayed: set[tuple[int, int]] = set()
        """``split-learner``: learn-side edges carrying the previous round's value (:class:`SplitLearner`)."""
        self.queue: collections.deque[Learned] = collections.deque()
        self.delivered = 0
        """Rounds of the current hub handed to the driver."""
        self.status: Status | None = None
        self.refused_before = 0
        """Rollouts refused by the hubs of earlier generations."""
        self.dropped_before = 0
        self.started = self.stopped = False

    def hub_options(self) -> dict[str, Any]:
        """How this policy's hub takes what the samplers make (:class:`~dagrl.runtime.stream.Hub`)."""
        raise NotImplementedError

    # -- starting ----------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        return self.executor.client

    def start(self) -> None:
        with contextlib.suppress(Exception):  # a picture only (Dask's Task Stream): the run goes on without it
            spans.install(self.client)
        self._open_hub()
        for i in range(self.samplers):
            self._start_sampler(i)
        self.started = True

    def _open_hub(self) -> None:
        """A hub (generation ``self.generation``) and its learner loop on the learner's worker."""
        home = self.hosts[self.learner_role][0]
        key = f"stream-hub-{self.generation}-{uuid.uuid4().hex}"
        self.starts[self.generation] = self.version + (self.generation > 0)
        self.hub_future = self.client.submit(
            Hub, key, self.generation, self.starts[self.generation], samplers=self.most, **self.hub_options(),
            actor=True, workers=[home.address], allow_other_workers=False, key=key,
        )  # fmt: skip
        self.hub = self.hub_future.result()
        self.hub_key, self.hub_address, self.delivered = key, home.address, 0
        for i, token in self.loop_tokens.items():  # loops moving over from the retired hub keep their word
            self.hub.own(i, token).result(timeout=CALL_TIMEOUT_S)
        self._start_learner()

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

    def _start_sampler(self, i: int) -> None:
        h = self.hosts[self.shape.stream.role][i]
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
        self.loop_generation[i] = self.generation
        self.loop_started[i] = time.monotonic()
        self.loop_peers[i] = peers
        token = self.loop_tokens[i] = uuid.uuid4().hex
        try:
            self._at_hub("own", i, token)  # before the loop's first word
        except RoleFailure:  # the learner's loss, found while replacing a sampler: after_restore starts this loop
            with contextlib.suppress(Exception):
                self.client.cancel([self.loops[i]])
            self.loops[i] = None
            raise
        self.loops[i] = self.client.submit(
            sampler_loop, (self.hub_address, self.hub_key), h.host_id, i, stream.name, spec(stream),
            self.generation, inserts, token, workers=[h.address], allow_other_workers=False, pure=False,
            key=f"{stream.name}-loop-{h.role}-{i}-{token[:8]}",
        )  # fmt: skip

    # -- the driver's iteration --------------------------------------------------------------------

    def step(self, ahead: bool = False) -> StepResult:
        if not self.started:
            self.start()
        while not self.queue:
            self._poll()
        return self._result(self.queue.popleft())

    @property
    def pending(self) -> bool:
        """Rounds the learner finished past the stop: stop the stream, then hand them over (they count)."""
        if self.started and not self.stopped:
            self._stop_stream()  # waits for the loops: a round in progress ends and is filed
            with contextlib.suppress(Exception):  # a hub lost now: nothing more to count
                self._take_status(self.hub.drain(0, 0.0, 0.0).result(timeout=CALL_TIMEOUT_S))
        return bool(self.queue)

    def _allow(self) -> int:
        ahead = self.horizon if self.horizon is not None else 1 << 30
        return self.delivered + len(self.queue) + max(1, ahead)

    def _poll(self) -> None:
        """One look at the stream: its finished rounds, then the loops' health."""
        status = self._at_hub("drain", self._allow(), POLL_S, MIN_POLL_S)
        self._take_status(status)
        self._check(status)

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
        from distributed import wait

        learner = self.hosts[self.learner_role][0]
        sup = self.supervisor
        if self.learner.status == "error" or status.error is not None:
            if self.learner.status == "pending":  # the hub heard first: Dask's own error keeps the traceback
                with contextlib.suppress(Exception):
                    wait([self.learner], timeout=5.0)
            err = self.learner.exception() if self.learner.status == "error" else status.error
            if isinstance(err, PeerFailed) and self._peer_replaced(err, self.learner_peers):
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
        for i, loop in enumerate(self.loops):
            if i in self.gone:
                continue
            h = self.hosts[self.shape.stream.role][i]
            failure = None
            silent = min(status.samplers[i].since_put, time.monotonic() - self.loop_started[i])
            if loop.status == "error":
                err = loop.exception()
                if isinstance(err, HubGone):
                    if self.loop_generation[i] < self.generation:  # the hub of a learner rolled back
                        self._start_sampler(i)
                        continue
                    raise RoleFailure(learner, "lost", err)  # its hub is the learner's worker
                if isinstance(err, PeerFailed) and self._peer_replaced(err, self.loop_peers[i]):
                    self._start_sampler(i)  # on the shard's replacement
                    continue
                failure = RoleFailure(h, "lost" if not sup.alive(h.address, fresh=True) else "raised", err)
            elif not sup.alive(h.address):
                failure = RoleFailure(h, "lost", OSError("worker gone"))
            elif loop.status == "finished":  # it returned without being stopped (its hub was): start it again
                self._start_sampler(i)
            elif silent > hang and not status.samplers[i].blocked:
                failure = RoleFailure(
                    h, "hung", TimeoutError(f"no rollout for {silent:.0f} s (hang_timeout_s {hang:g})")
                )
            if failure is not None:
                self._sampler_failed(i, failure)
        self._grow()

    @property
    def active(self) -> int:
        """The samplers streaming (or being replaced): all but the dropped ones."""
        return self.samplers - len(self.gone)

    def dropped(self, handle: Handle) -> bool:
        role = self.shape.stream.role
        return handle.role == role and handle.index in self.gone and self.hosts[role][handle.index] is handle

    def role_failed(self, failure: RoleFailure) -> None:
        """A sampler found failed outside the watch (asked for its state at a checkpoint) is handled as
        the watch handles one: dropped, or replaced with its loop started again."""
        h = failure.handle
        if self.started and h.role == self.shape.stream.role and self.hosts[h.role][h.index] is h:
            self._sampler_failed(h.index, failure)
        else:
            super().role_failed(failure)

    def _sampler_failed(self, i: int, failure: RoleFailure) -> None:
        """Sampler ``i``'s loop failed with ``failure`` (its own): replace it, start its loop again; or,
        lost with its worker in a stream above ``replicas`` that may grow, drop it."""
        if failure.kind == "lost" and self.most > self.least and self.active > self.least:
            self._drop(i, failure)
            return
        self.replace_in_place(failure)
        self._start_sampler(i)

    def _drop(self, i: int, failure: RoleFailure) -> None:
        """Sampler ``i`` left with its worker: not replaced. Its loop, should its worker come back, is
        refused by the hub (a token nobody holds); the hub's budget follows the count."""
        self.gone.add(i)
        if self.supervisor is not None:
            self.supervisor.drop(failure)
        self._at_hub("own", i, uuid.uuid4().hex)
        with contextlib.suppress(Exception):
            self.client.cancel(self.loops[i])
        self._resize()
        log.warning(
            "%s[%d] on %s: %s; not replaced (above replicas): %d sampler(s) stream, at least %d, at most %d",
            failure.handle.role, i, failure.handle.address, describe(failure.kind, failure.cause), self.active,
            self.least, self.most,
        )  # fmt: skip

    def _resize(self) -> None:
        """The hub's budget per round and room, for the samplers streaming now."""
        options = self.hub_options()
        self._at_hub("resize", options["budget"], options["capacity"], options["least"])

    def _grow(self) -> None:
        """Below ``max_replicas``: a sampler on every worker that fits it and hosts nothing (one that
        joined during the run), each streaming from then on; the hub's budget follows their count."""
        sup, role = self.supervisor, self.shape.stream.role
        if sup is None or self.active >= self.most or time.monotonic() < self.next_growth:
            return
        self.next_growth = time.monotonic() + GROW_EVERY_S
        from dagrl.runtime.placement import place_one

        workers = sup.workers(max_age=0.0)
        load = collections.Counter(h.address for hs in self.hosts.values() for h in hs if h.address in workers)
        rspec = self.graph.role(role)
        while self.active < self.most:
            addr = place_one(role, rspec, workers, load, self.graph.spec.gpu_fallback, frozenset())
            if addr is None or load[addr] > 0:
                return
            i = min(self.gone) if self.gone else self.samplers  # a dropped sampler's slot first
            handle = sup.start(role, i, addr, sup.seed_offset, sup.env_steps)
            handle.supervisor = sup
            load[addr] += 1
            if i in self.gone:
                self.hosts[role][i] = handle
                self.gone.discard(i)
            else:
                self.hosts[role].append(handle)
                self.samplers += 1
                self.loops.append(None)
                self.loop_generation.append(self.generation)
                self.loop_started.append(time.monotonic())
                self.loop_peers.append({})
            self._resize()
            self._start_sampler(i)
            log.info(
                "%s[%d] added on %s, a worker that joined: %d of at most %d", role, i, addr, self.active, self.most
            )

    def _peer_replaced(self, err: PeerFailed, peers: dict[tuple[str, int], Handle]) -> bool:
        """Replace the host a loop failed on (a replay shard: ``recover: replace``), unless that is done
        already; ``False`` if it is not such a role (then the failure is the loop's own)."""
        old = peers.get((err.role, err.index))
        if old is None or self.graph.algorithm.roles[err.role].recover != "replace":
            return False
        sup = self.supervisor
        kind = err.kind if sup is None or err.kind == "lost" or sup.alive(old.address, fresh=True) else "lost"
        self.replace_in_place(RoleFailure(old, kind, err))
        return True

    def _result(self, r: Learned) -> StepResult:
        res = StepResult()
        for source, rep in r.reports:
            res.add_output(rep, source=source)
        s = self.status
        res.metrics = dict(r.metrics)
        res.metrics[self.staleness_key] = float(np.mean(r.lags)) if r.lags else 0.0
        res.metrics["perf/rollouts_per_update"] = float(len(r.lags))
        res.metrics["stream/version"] = float(r.version)
        res.metrics["stream/oldest_version"] = float(r.oldest)
        res.metrics["perf/collects"] = float(r.collects)
        res.metrics["samplers/active"] = float(self.active)
        if s is not None:
            res.metrics["perf/dropped_rollouts"] = float(self.dropped_before + s.dropped)
            res.metrics["stream/refused"] = float(self.refused_before + s.refused)
        res.update_time, res.sample_time = r.update_s, r.wall_s
        self.delivered += 1
        return res

    # -- recovery and the end ----------------------------------------------------------------------

    def after_restore(self) -> None:
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
            if loop is None or loop.status != "pending":  # failed on the lost hub, returned, or never started
                self._start_sampler(i)

    def _stop_stream(self) -> None:
        self.stopped = True
        with contextlib.suppress(Exception):
            self.hub.stop().result(timeout=5.0)
        futures = [f for f in (self.learner, *self.loops) if f is not None]
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(f.status == "pending" for f in futures):
            time.sleep(0.02)

    def close(self) -> None:
        if self.started and not self.stopped:
            self._stop_stream()
        futures = [f for f in (self.learner, *self.loops, self.hub_future, *self.retired) if f is not None]
        with contextlib.suppress(Exception):
            self.client.cancel(futures)
        self.hub = None
        super().close()


class Async(Stream):
    """``async``: the learner takes the rollouts themselves, ``min_rollouts_per_update`` to
    ``rollouts_per_update`` of them; staler than ``max_staleness`` versions: dropped (counted)."""

    name = "async"

    @property
    def stream_options(self) -> Any:
        """The :class:`~dagrl.core.distribution.AsyncOptions` this stream runs with."""
        return self.options

    def hub_options(self) -> dict[str, Any]:
        o = self.stream_options
        budget = o.per_update(self.active)
        return {
            "budget": budget, "capacity": max(budget, (o.in_flight - 1) * self.active),
            "max_staleness": o.max_staleness, "least": o.least_per_update(self.active),
        }  # fmt: skip


class Apex(Stream):
    """``apex``: each sampler stores its rollouts in replay shard i mod K itself; the learner's rounds
    (``sample -> update -> reprioritize``) follow ``update_ratio`` rounds per insert both ways
    (``rate_limit: false``: free), from the point the replay holds ``learning_starts`` env steps; until
    then an iteration counts a round's worth of inserts and nothing learns."""

    name = "apex"
    staleness_key = "perf/weights_lag"
    runs_ahead = True
    """Its learner's rounds follow each other without the driver (what :mod:`dagrl.app.tune.model` calls
    running ahead; ``async``'s do too, and the model has a form of its own for them)."""

    def hub_options(self) -> dict[str, Any]:
        o = self.options
        ratio = o.update_ratio if o.update_ratio is not None else 1.0 / self.samplers
        limit = Limit(
            ratio, o.max_lead if o.max_lead is not None else 2 * self.samplers, o.rate_limit,
            warmup_steps(self.graph.config), max(1, round(1 / ratio)), o.publish_every,
        )  # fmt: skip
        shards = {n.id: len(self.hosts[n.role]) for n in self.shape.insert}
        return {"budget": 1, "capacity": 1, "max_staleness": None, "limit": limit, "shards": shards}


class SplitLearner(Apex):
    """``split-learner``: as ``apex``, but a value passed between two single-instance learner roles in a
    round (SAC: the critic's new weights to the actor) arrives one round late, so both learner roles
    update at once, on their own workers and devices (Spreeze's dual-GPU idea). The learner loop calls
    the two updates of a round together (:meth:`~dagrl.runtime.loops.Caller.run`)."""

    name = "split-learner"

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        self.delayed = delayed_edges(graph.algorithm)
