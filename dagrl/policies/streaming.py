"""The round engine ``async``, ``apex`` and ``split-learner`` ran on before the streams
(:mod:`dagrl.policies.pull`): what the benchmarks run as ``async-before`` and ``apex-before``, to
measure the streams against it in the same run.

The iteration is split at its stream (:func:`dagrl.core.distribution.stream_shape`):

* **before** fragments (``publish``) run once per weights version, as tasks on the learner's
  worker; their outputs stay there as futures that the stream's calls name as inputs, so each
  sampler worker fetches a version's weights once, peer to peer;
* the **stream** (``collect``) runs back to back on every sampler: a driver thread per sampler
  keeps ``in_flight`` calls queued on its worker, so the worker never idles waiting for the driver;
  **insert** fragments (a replay ``add``) follow each call on shard ``i % K``, taking the rollout
  straight from the sampler's worker;
* **learn** fragments (``sample -> update``, or ``update`` on the arrived rollouts) run as one
  learner *round* at a time, submitted as a whole (under ``apex`` and ``split-learner``, the next one
  behind it while it runs); a :class:`~dagrl.runtime.ratelimit.RateLimiter` ties rounds to arrivals
  both ways (its lead is the backpressure on samplers);
* **delayed edges** (``split-learner``) feed a round the previous round's value, so two learner
  roles update at once.

``async`` consumes ``rollouts_per_update`` rollouts per round and drops those staler than
``max_staleness`` versions; ``apex``/``split-learner`` consume what the inserts stored.

An off-policy algorithm learns nothing until its replay holds ``learning_starts`` env steps
(:func:`~dagrl.core.distribution.warmup_steps`). Until then the samplers run free and an iteration only
counts a round's worth of arrivals: a learner round would be a chain of tasks doing nothing, and
with the rate limiter tying samplers to it, the samplers' random steps would run at the rate of
those task chains rather than at their own.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dagrl.core.distribution import stream_shape, warmup_steps
from dagrl.core.fragment import Node
from dagrl.core.graph import Graph
from dagrl.policies.base import Policy, StepResult, learn_time
from dagrl.runtime.announce import when_done
from dagrl.runtime.executor import Call, Executor, route
from dagrl.runtime.hosts import Handle
from dagrl.runtime.ratelimit import RateLimiter
from dagrl.runtime.report import Report
from dagrl.runtime.supervisor import RoleFailure

WARMUP_IN_FLIGHT = 8
"""Stream calls queued per sampler during the warm-up: nothing there goes stale (the weights do not
change), so a deeper queue only hides the task round trip."""

WARMUP_BACKLOG = 4
"""Iterations' worth of arrivals that may wait for the driver during the warm-up before samplers
pause: an arrival keeps its rollout alive on the sampler's worker until the driver counts it."""


@dataclass
class Arrival:
    """One finished stream call: which sampler, with which weights version, its output and report."""

    version: int
    source: int
    call: Call
    report: Report


@dataclass
class _Pending:
    version: int
    call: Call
    report: Call
    inserts: list[tuple[Node, int, Call]]
    watch: list[Call]


@dataclass
class _Round:
    """One learner round, submitted: the arrivals it took (counted into ``res``), its calls, and the
    ``publish`` calls of the version it ends (``None`` when it ends none)."""

    res: StepResult
    taken: list[Arrival]
    version: int
    """The weights version its learner tasks start from."""
    calls: dict[int, list[Call]]
    learn: list[Call]
    watch: list[Call]
    publish: dict[int, list[Call]] | None
    previous: dict[int, list[Call]]
    """The delayed edges' values before it was submitted (what a redo takes)."""
    t0: float
    counted: bool
    """Whether the limiter counted it when it was submitted (a policy that runs ahead), not when it ends."""


class Streaming(Policy):
    """Samplers stream; the learner runs rate-limited rounds on what arrived (see the module docstring)."""

    ratio: float = 1.0
    max_lead: int = 2
    limited: bool = True
    publish_every: int = 1
    max_staleness: int | None = None
    """Drop arrivals staler than this (``async``); ``None``: keep all (they are in replay)."""
    batch: int | None = None
    """Arrivals one round consumes (``async``); ``None``: all that arrived."""
    in_flight: int = 2
    runs_ahead: bool = False
    """Whether the next learner round may be submitted behind the one in flight (:meth:`step`)."""

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Executor | None = None):
        super().__init__(graph, hosts, executor)
        self.shape = stream_shape(graph.algorithm)
        self.roles = graph.algorithm.roles
        self.delayed: set[tuple[int, int]] = set()
        self.configure()
        self.round_collects = max(1, round(1 / self.ratio))
        """Collects per learner round (what a warm-up iteration counts)."""
        self.warmup = warmup_steps(graph.config)
        """Env steps still to arrive before the first learner round."""
        self.limiter = RateLimiter(self.ratio, self.max_lead, self.limited, warmup=self.warmup > 0)
        self.cond = threading.Condition()
        self.version = 0
        self.current: dict[int, list[Call]] = {}
        self.latest: dict[int, list[Call | None]] = {n.id: [None] * len(hosts[n.role]) for n in self.shape.insert}
        self.arrivals: list[Arrival] = []
        self.previous: dict[int, list[Call]] = {}
        self.posted: RoleFailure | None = None
        """A learner-side failure a sampler thread noticed, for the driver to handle."""
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.rounds = self.collects = self.stale_dropped = 0
        self.submitted = 0
        """Learner rounds submitted (those in flight included, abandoned ones not)."""
        self.ahead: _Round | None = None
        """The next round, submitted while this one ran (``step(ahead=True)``)."""
        self.last_step_end = self.last_round_end = 0.0

    def configure(self) -> None:
        """Set the class attributes above from ``self.options`` (each policy its own)."""

    # -- weights versions --------------------------------------------------------------------------

    def _refresh(self, new_version: bool = False) -> None:
        """Submit the fragments before the stream (``publish``) for a new version and use it at once."""
        self._use(self._publish(), new_version)

    def _publish(self, after: list[Call] | None = None) -> dict[int, list[Call]]:
        """Submit ``publish`` (not waited for); ``after``: the calls it must follow (a round's learner tasks)."""
        order = (lambda node, calls: after) if after else None
        return self.executor.run_nodes(
            self.shape.before, self.hosts, self.roles, calls={}, inputs=self._input, after=order
        )

    def _use(self, calls: dict[int, list[Call]], new_version: bool = False) -> None:
        """Make a version's ``publish`` calls the weights the samplers' next calls take; ``new_version``:
        count the version up with it, under the same lock, so that no sampler call is tagged with the
        new version and submitted with the old weights (or, after a rollback, a dead learner's)."""
        with self.cond:
            self.version += new_version
            self.current = calls
            self.cond.notify_all()

    def _input(self, arg: Node, node: Node) -> list[Any] | None:
        """The calls that input ``arg`` of ``node`` stands for outside a plain submission."""
        if arg.id in self.current and node not in self.shape.before:
            return self.current[arg.id]
        if (arg.id, node.id) in self.delayed and arg.id in self.previous:
            return self.previous[arg.id]  # last round's value: both ends of the edge run at once
        if arg.id in self.latest:
            return self.latest[arg.id]
        return None

    # -- the sampler side --------------------------------------------------------------------------

    def start(self) -> None:
        self.last_step_end = time.perf_counter()
        self._refresh()
        for i in range(len(self.hosts[self.shape.stream.role])):
            t = threading.Thread(target=self._stream, args=(i,), name=f"dagrl-stream-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def _submit_one(self, i: int, previous: _Pending | None, seen: int) -> _Pending:
        """One stream call on sampler ``i`` and its inserts, in order after ``previous`` (still in flight).

        Dask runs the ready tasks of a worker in priority (here: submission) order, but tasks that
        wait for the *same* input fetched from another worker start in an arbitrary order once it
        arrives. So a call whose weights version the sampler has not run with yet (``seen``) waits for
        the pending call with the same version, and each insert for the previous insert on its
        shard: a shard stores one sampler's rollouts in the order they were collected. In the steady
        state neither edge delays anything (the weights are already there; an insert queues anyway).
        """
        stream, ex = self.shape.stream, self.executor
        with self.cond:
            version, current = self.version, self.current
        handles = self.hosts[stream.role]
        args = [
            route(current[a.id], a.role, stream.role, self.roles, i, len(handles)) if isinstance(a, Node) else a
            for a in stream.inputs
        ]
        fresh = previous is not None and previous.version == version != seen
        call = ex.submit(
            handles[i], stream.name, args, after=[previous.call] if fresh else [], announce=True, stamp=False
        )  # stamped by _stream when it has waited for them, as are the inserts and the report
        inserts = []
        for node in self.shape.insert:
            shards = self.hosts[node.role]
            k = i % len(shards)
            node_args = [
                [call] if a is stream else route(current[a.id], a.role, node.role, self.roles, k, len(shards))
                if isinstance(a, Node) else a
                for a in node.inputs
            ]  # fmt: skip
            after = [c for n, _, c in previous.inserts if n is node] if previous is not None else []
            inserts.append((node, k, ex.submit(shards[k], node.name, node_args, after=after, stamp=False)))
        watch = [c for cs in current.values() for c in cs]
        return _Pending(version, call, ex.report(call, stamp=False), inserts, watch)

    def _stream(self, i: int) -> None:
        """Keep ``in_flight`` stream calls (and their inserts) queued on sampler ``i``; record arrivals."""
        pending: collections.deque[_Pending] = collections.deque()
        seen = -1  # the weights version of this sampler's last finished call
        stop = self.stopping.is_set
        try:
            while not stop():
                try:
                    depth = self.in_flight if self.warmup <= 0 else max(self.in_flight, WARMUP_IN_FLIGHT)
                    while (
                        len(pending) < depth
                        and not self._backlogged()
                        and (self.limiter.try_start_insert() if pending else self.limiter.start_insert(stop))
                    ):
                        pending.append(self._submit_one(i, pending[-1] if pending else None, seen))
                    if not pending:
                        with self.cond:
                            self.cond.wait_for(lambda: not self._backlogged() or stop(), 0.2)
                        continue
                    p = pending[0]
                    ins = [c for _, _, c in p.inserts]
                    values = self.executor.wait([p.report, *ins], [*p.watch, p.call, *ins])
                    done = time.perf_counter()  # when the driver learnt they finished (Call.done_at)
                    for c in (p.call, p.report, *ins):
                        c.done_at = done
                    pending.popleft()
                    seen = p.version
                    with self.cond:
                        for node, k, c in p.inserts:
                            self.latest[node.id][k] = c
                        self.arrivals.append(Arrival(p.version, i, p.call, values[0]))
                        self.collects += 1
                        self.cond.notify_all()
                    self.limiter.insert_done()
                except RoleFailure as failure:
                    self.executor.cancel([c for p in pending for c in (p.call, p.report, *(c for *_, c in p.inserts))])
                    self.limiter.insert_cancelled(len(pending))
                    pending.clear()
                    self._on_failure(failure)
        except BaseException as err:  # handed to the driver thread, which raises it
            self.error = err
            self.limiter.wake()

    def _on_failure(self, failure: RoleFailure) -> None:
        """A sampler or replay shard is replaced here; a learner-side failure goes to the driver, and this
        sampler waits for the weights of the restored learner."""
        if self.roles[failure.handle.role].recover == "replace":
            self.replace_in_place(failure)
            for node in self.shape.insert:
                if node.role == failure.handle.role:
                    self.latest[node.id][failure.handle.index] = None  # its stored count died with it
            return
        with self.cond:
            if self.posted is None:
                self.posted = failure
            version = self.version
            while self.version == version and not self.stopping.is_set():
                self.cond.wait(0.2)

    # -- the learner side --------------------------------------------------------------------------

    def _raise_posted(self) -> None:
        if self.error is not None:
            raise self.error
        with self.cond:
            failure, self.posted = self.posted, None
        if failure is not None:
            raise failure

    def _take(self, res: StepResult) -> list[Arrival] | None:
        """The arrivals this round consumes (counted into ``res``, stale ones dropped); ``None``: not enough yet."""
        with self.cond:
            arrived = self.arrivals
            if self.max_staleness is not None:
                stale = [a for a in arrived if self.version - a.version > self.max_staleness]
                arrived = [a for a in arrived if self.version - a.version <= self.max_staleness]
                for a in stale:
                    res.add_output(a.report, source=a.source)
                self.stale_dropped += len(stale)
                if stale:
                    self.limiter.insert_discarded(len(stale))
            if self.batch is not None and len(arrived) < self.batch:
                self.arrivals = arrived
                return None
            n = len(arrived) if self.batch is None else self.batch
            taken, self.arrivals = arrived[:n], arrived[n:]
        for a in taken:
            res.add_output(a.report, source=a.source)
        return taken

    def resumed(self, env_steps: int) -> None:
        self.warmup -= env_steps
        if self.warmup <= 0:
            self.limiter.end_warmup()

    def _backlogged(self) -> bool:
        """During the warm-up: as many arrivals wait for the driver as :data:`WARMUP_BACKLOG` allows."""
        return self.warmup > 0 and len(self.arrivals) >= WARMUP_BACKLOG * self.round_collects

    def _warmup_step(self) -> StepResult:
        """An iteration of the warm-up: a round's worth of arrivals counted, no learner round."""
        res, n = StepResult(), self.round_collects
        while True:
            self._raise_posted()
            with self.cond:
                if len(self.arrivals) >= n:
                    taken, self.arrivals = self.arrivals[:n], self.arrivals[n:]
                    self.cond.notify_all()  # samplers paused on the backlog may go on
                    break
                self.cond.wait(0.2)
        for a in taken:
            res.add_output(a.report, source=a.source)
        self.warmup -= res.env_steps
        if self.warmup <= 0:
            self.limiter.end_warmup()
        self.report_lag(res, [])
        now = time.perf_counter()
        res.sample_time, self.last_step_end = now - self.last_step_end, now
        return res

    def step(self, ahead: bool = False) -> StepResult:
        """One learner round. ``ahead`` (the driver's word that it asks for the next one right after,
        with nothing due in between): where the policy :attr:`runs_ahead`, the next round is submitted
        now, behind this one, if the limiter allows it, so the learner's tasks run back to back
        without a round trip through the driver between rounds."""
        if not self.threads:
            self.start()
        if self.warmup > 0:
            return self._warmup_step()
        while True:
            current, self.ahead = self.ahead or self._start_round(), None
            try:
                if ahead and self.runs_ahead and self.executor.remote:
                    self.ahead = self._start_round(prev=current, ended=self._ended(current))
                out = self._finish_round(current)
                break
            except RoleFailure as failure:
                self.drop_ahead()
                self._abandon(current)
                if self.roles[failure.handle.role].recover != "replace":
                    raise  # a learner: the driver rolls back
                self._on_failure(failure)  # a replay shard or the sampler of a taken rollout: redo the round
                kept = [a for a in current.taken if a.call.handle is not failure.handle]
                self.limiter.insert_discarded(len(current.taken) - len(kept))
                with self.cond:
                    self.arrivals[:0] = kept
        res = current.res
        self.report_lag(res, [current.version - a.version for a in current.taken])
        self.rounds += 1
        if not current.counted:
            self.limiter.round_done()
        if current.publish is not None:
            self._use(current.publish, new_version=True)
        res.update_time = learn_time(self.graph.algorithm.graph, self.roles, current.calls, current.t0)
        if isinstance(out, dict):
            res.metrics = {**out, **res.metrics}
        now = time.perf_counter()
        res.sample_time, self.last_step_end = now - self.last_step_end, now  # samplers never pause for us
        return res

    @property
    def pending(self) -> bool:
        return self.ahead is not None

    def report_lag(self, res: StepResult, lags: list[int]) -> None:
        res.metrics["perf/weights_lag"] = float(np.mean(lags)) if lags else 0.0
        res.metrics["perf/collects"] = float(self.collects)

    def _start_round(self, prev: _Round | None = None, ended: Callable[[], bool] | None = None) -> _Round | None:
        """Wait for the limiter, take the arrivals of the next round and submit it as a whole.

        ``prev``, a round still in flight: this one follows it. It takes the weights ``prev`` publishes,
        and its tasks queue behind ``prev``'s on each learner worker (a role's tasks run in submission
        order). ``ended`` says whether ``prev`` has ended: then no round is submitted ahead (``None``).
        A round that ends a weights version submits that version's ``publish`` at once, ordered after
        the round's learner tasks, rather than when the driver learns that the round ended.
        """
        res = StepResult()
        while True:
            while not self.limiter.start_round(timeout=0.2, stop=ended):
                if ended is not None and ended():
                    return None
                self._raise_posted()
            self._raise_posted()
            taken = self._take(res)
            if taken is not None:
                break
            if ended is not None:
                return None
        with self.cond:
            weights = prev.publish if prev is not None and prev.publish is not None else self.current
            version = self.version + (prev is not None and prev.publish is not None)
        t0 = time.perf_counter()
        stream = self.shape.stream
        calls: dict[int, list[Call]] = {stream.id: [a.call for a in taken]}

        def inputs(arg: Node, node: Node) -> list[Any] | None:
            return weights[arg.id] if arg.id in weights else self._input(arg, node)

        def after(node: Node, calls: dict[int, list[Call]]) -> list[Call]:
            return prev.calls[node.id] if prev is not None else []  # in order on each role, whatever arrives first

        self.executor.run_nodes(self.shape.learn, self.hosts, self.roles, calls=calls, inputs=inputs, after=after)
        learn = [c for n in self.shape.learn for c in calls[n.id]]
        self.submitted += 1
        publish = None
        if self.submitted % self.publish_every == 0:
            publishers = {n.role for n in self.shape.before}
            publish = self._publish(after=[c for c in learn if c.handle.role in publishers] or learn)
        # Running ahead, the limiter counts a round as submitted, so the next one may be decided on now.
        # Otherwise it counts it when it ends: counted earlier, the samplers' lead would grow by a round
        # while each round runs, and with it the staleness of what ``async`` learns from.
        counted = self.runs_ahead and self.executor.remote
        if counted:
            self.limiter.round_done()
        watch = [
            *calls[stream.id],
            *(c for cs in weights.values() for c in cs),
            *(c for cs in (*self.latest.values(), *self.previous.values()) for c in cs if c is not None),
            *learn,
        ]
        previous = dict(self.previous)
        for src, _ in self.delayed:
            self.previous[src] = calls[src]  # the next round's value of the delayed edge
        return _Round(res, taken, version, calls, learn, watch, publish, previous, t0, counted)

    def _output(self, r: _Round) -> Call:
        out_node = self.graph.algorithm.graph.output
        return r.calls[out_node.id][0] if out_node is not None else r.learn[-1]

    def _ended(self, r: _Round) -> Callable[[], bool]:
        """Whether round ``r``'s output is done (finished, erred, cancelled); the limiter is woken then."""
        future = self._output(r).future
        when_done(future, lambda _f: self.limiter.wake())
        return lambda: future.status != "pending"

    def _finish_round(self, r: _Round) -> Any:
        """Wait for round ``r``'s output."""
        r.t0 = max(r.t0, self.last_round_end)  # a round submitted ahead starts when the one before ends
        (out,) = self.executor.wait([self._output(r)], r.watch)
        self.last_round_end = time.perf_counter()
        return out

    def _abandon(self, r: _Round) -> None:
        """Forget a round that will not finish (it failed, or it followed one that did)."""
        self.executor.cancel([*r.learn, *(c for cs in (r.publish or {}).values() for c in cs)])
        if r.counted:
            self.limiter.round_cancelled()
        self.submitted -= 1
        self.previous = r.previous  # a redone round takes the delayed edges' values this one took

    def drop_ahead(self) -> None:
        """Cancel a round submitted ahead; its arrivals go back to the front of the queue."""
        if self.ahead is not None:
            r, self.ahead = self.ahead, None
            self._abandon(r)
            with self.cond:
                self.arrivals[:0] = r.taken

    def after_restore(self) -> None:
        self.drop_ahead()
        with self.cond:
            self.posted = None
        self.previous.clear()
        self._refresh(new_version=True)

    def close(self) -> None:
        self.drop_ahead()
        self.stopping.set()
        self.limiter.wake()
        with self.cond:
            self.cond.notify_all()
        for t in self.threads:
            t.join(timeout=30)
        super().close()


class Rounds(Streaming):
    """Samplers collect continuously with the weights they have; the learner updates on each
    ``rollouts_per_update`` arrivals; rollouts staler than ``max_staleness`` updates are dropped (their
    env steps and episodes still count). The algorithm corrects for what remains (PPO: the ratio against
    the behaviour log-probs in the rollout). What ``async`` was before the streams (the benchmarks'
    ``async-before``); ``async`` itself runs without the driver in the rollout's path (:mod:`dagrl.policies.pull`)."""

    name = "async-rounds"

    @property
    def stream_options(self) -> Any:
        """The :class:`~dagrl.core.distribution.AsyncOptions` this stream runs with."""
        return self.options

    def configure(self) -> None:
        o = self.stream_options
        self.batch = o.rollouts_per_update
        self.ratio, self.max_lead = 1.0 / o.rollouts_per_update, o.rollouts_per_update
        self.max_staleness, self.in_flight = o.max_staleness, o.in_flight

    def report_lag(self, res: StepResult, lags: list[int]) -> None:
        res.metrics["perf/staleness"] = float(np.mean(lags)) if lags else 0.0
        res.metrics["perf/dropped_rollouts"] = float(self.stale_dropped)


class RoundsApex(Streaming):
    """Samplers stream into replay shards (sampler i -> shard i mod K); the learner samples and updates in
    rounds, ``update_ratio`` rounds per collect both ways (``rate_limit: false``: free). The engine of
    ``split-learner``; ``apex`` itself runs without the driver in the rollout's path
    (:mod:`dagrl.policies.pull`)."""

    name = "apex-rounds"
    runs_ahead = True

    def configure(self) -> None:
        o, samplers = self.options, len(self.hosts[self.shape.stream.role])
        self.ratio = o.update_ratio if o.update_ratio is not None else 1.0 / samplers
        self.max_lead = o.max_lead if o.max_lead is not None else 2 * samplers
        self.limited, self.publish_every, self.in_flight = o.rate_limit, o.publish_every, o.in_flight
