"""``async``: samplers stream rollouts to the learner's hub; the learner pulls what has arrived.

The iteration runs without the driver (:mod:`dagrl.runtime.stream`): one long-running task per
sampler collects back to back and pushes each rollout worker to worker; one on the learner's worker
takes what has arrived (``min_rollouts_per_update`` to ``rollouts_per_update`` rollouts: by default
one per sampler), updates and publishes the next weights version, which each sampler takes between
two rollouts. No scheduler task and no driver decision per rollout.

The driver watches at a bounded rate (:meth:`Async._poll`): it receives the finished rounds (one
iteration each, with the reports of the rollouts they counted), grants the hub the rounds it may
run before the driver must act (:attr:`horizon`: a checkpoint, a blocking evaluation, a stop it can
foresee), and supervises:

* a sampler whose loop raised, whose worker died, or which has put nothing for ``hang_timeout_s``
  (while not waiting for room) is replaced and its loop restarted; the others never stop;
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

from dagrl.distribution import stream_shape
from dagrl.fragment import Node
from dagrl.policies.base import Policy, StepResult
from dagrl.runtime.hosts import Handle
from dagrl.runtime.stream import Hub, HubGone, Learned, Status, learner_loop, sampler_loop
from dagrl.runtime.supervisor import RoleFailure

log = logging.getLogger("dagrl")

POLL_S = 0.5
"""The longest the driver's call to the hub waits for a round (it returns as soon as one is there)."""
MIN_POLL_S = 0.05
"""The shortest interval between two of the driver's calls: its cost per env step falls as rounds grow."""
CALL_TIMEOUT_S = 30.0
"""How long a call to the hub may take before its worker is judged gone."""


class Async(Policy):
    """``async`` (module docstring)."""

    name = "async"

    def __init__(self, graph: Any, hosts: dict[str, list[Handle]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        algo = graph.algorithm
        self.shape = stream_shape(algo)
        self.samplers = len(hosts[self.shape.stream.role])
        o = self.stream_options
        self.budget = o.per_update(self.samplers)
        self.capacity = max(self.budget, (o.in_flight - 1) * self.samplers)
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
        self.loop_started = [0.0] * self.samplers
        """When each loop was (re)started: a new loop is not hung for its predecessor's silence."""
        """The generation each sampler loop was started on (a loop may outlive its hub by a rollback)."""
        self.queue: collections.deque[Learned] = collections.deque()
        self.delivered = 0
        """Rounds of the current hub handed to the driver."""
        self.status: Status | None = None
        self.refused_before = 0
        """Rollouts refused by the hubs of earlier generations."""
        self.dropped_before = 0
        self.started = self.stopped = False
        self.last_step_end = 0.0

    @property
    def stream_options(self) -> Any:
        """The :class:`~dagrl.distribution.AsyncOptions` this stream runs with."""
        return self.options

    # -- starting ----------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        return self.executor.client

    def start(self) -> None:
        self._open_hub()
        for i in range(self.samplers):
            self._start_sampler(i)
        self.started = True
        self.last_step_end = time.perf_counter()

    def _open_hub(self) -> None:
        """A hub (generation ``self.generation``) and its learner loop on the learner's worker."""
        home = self.hosts[self.learner_role][0]
        key = f"stream-hub-{self.generation}-{uuid.uuid4().hex}"
        o = self.stream_options
        self.starts[self.generation] = self.version + (self.generation > 0)
        self.hub_future = self.client.submit(
            Hub, key, self.generation, self.starts[self.generation],
            samplers=self.samplers, budget=self.budget, capacity=self.capacity, max_staleness=o.max_staleness,
            least=o.least_per_update(self.samplers),
            actor=True, workers=[home.address], allow_other_workers=False, key=key,
        )  # fmt: skip
        self.hub = self.hub_future.result()
        self.hub_key, self.hub_address, self.delivered = key, home.address, 0
        hosts = {
            role: [(h.host_id, h.address) for h in handles]
            for role, handles in self.hosts.items()
            if any(n.role == role for n in (*self.shape.before, *self.shape.learn))
        }
        self.learner = self.client.submit(
            learner_loop, key, self.graph.spec.algorithm, hosts, self.generation,
            workers=[home.address], allow_other_workers=False, pure=False,
            key=f"learn-loop-{self.learner_role}-{self.generation}-{uuid.uuid4().hex[:8]}",
        )  # fmt: skip

    def _start_sampler(self, i: int) -> None:
        h = self.hosts[self.shape.stream.role][i]
        inputs = [("node", a.id) if isinstance(a, Node) else ("value", a) for a in self.shape.stream.inputs]
        self.loop_generation[i] = self.generation
        self.loop_started[i] = time.monotonic()
        self.loops[i] = self.client.submit(
            sampler_loop, (self.hub_address, self.hub_key), h.host_id, i, self.shape.stream.name, inputs,
            self.generation, workers=[h.address], allow_other_workers=False, pure=False,
            key=f"{self.shape.stream.name}-loop-{h.role}-{i}-{uuid.uuid4().hex[:8]}",
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
        try:
            status = self.hub.drain(self._allow(), POLL_S, MIN_POLL_S).result(timeout=CALL_TIMEOUT_S)
        except Exception as err:  # the hub's worker: the learner's
            raise RoleFailure(self.hosts[self.learner_role][0], "lost", err) from None
        self._take_status(status)
        self._check(status)

    def _take_status(self, status: Status) -> None:
        self.status = status
        self.version = max(self.version, status.version)
        self.queue.extend(status.rounds)

    def _check(self, status: Status) -> None:
        learner = self.hosts[self.learner_role][0]
        sup = self.supervisor
        if self.learner.status == "error" or status.error is not None:
            err = self.learner.exception() if self.learner.status == "error" else RuntimeError(status.error)
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
            h = self.hosts[self.shape.stream.role][i]
            failure = None
            if loop.status == "error":
                err = loop.exception()
                if isinstance(err, HubGone):
                    if self.loop_generation[i] < self.generation:  # the hub of a learner rolled back
                        self._start_sampler(i)
                        continue
                    raise RoleFailure(learner, "lost", err)  # its hub is the learner's worker
                failure = RoleFailure(h, "lost" if not sup.alive(h.address, fresh=True) else "raised", err)
            elif not sup.alive(h.address):
                failure = RoleFailure(h, "lost", OSError("worker gone"))
            elif loop.status == "finished":  # it returned without being stopped (its hub was): start it again
                self._start_sampler(i)
            elif min(status.since_put[i], time.monotonic() - self.loop_started[i]) > hang and not status.blocked[i]:
                msg = f"no rollout for {min(status.since_put[i], time.monotonic() - self.loop_started[i]):.0f} s"
                msg += f" (hang_timeout_s {hang:g})"
                failure = RoleFailure(h, "hung", TimeoutError(msg))
            if failure is not None:
                self.replace_in_place(failure)
                self._start_sampler(i)

    def _result(self, r: Learned) -> StepResult:
        res = StepResult()
        for source, rep in r.reports:
            res.add_output(rep, source=source)
        s = self.status
        res.metrics = dict(r.metrics)
        res.metrics["perf/staleness"] = float(np.mean(r.lags)) if r.lags else 0.0
        res.metrics["perf/rollouts_per_update"] = float(len(r.lags))
        res.metrics["stream/version"] = float(r.version)
        res.metrics["stream/oldest_version"] = float(r.oldest)
        if s is not None:
            res.metrics["perf/dropped_rollouts"] = float(self.dropped_before + s.dropped)
            res.metrics["stream/refused"] = float(self.refused_before + s.refused)
            res.metrics["perf/collects"] = float(s.arrived)
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
            if loop.status != "pending":  # failed on the lost hub, or returned: a loop on the new one
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
