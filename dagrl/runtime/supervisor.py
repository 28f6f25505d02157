"""Supervision of role actors: Dask does not rebuild an actor whose worker died, so dagrl does.

Every call to a remote role host is *watched*: it ends as soon as the scheduler removes the actor's
worker (its ``remove-worker`` event, :class:`~dagrl.runtime.workers.Departures`), and checks every
``poll_s`` that the worker is still in the cluster and that the call has not run past
``hang_timeout_s``. A failed call raises :class:`RoleFailure` naming the handle and what happened:

* ``lost``: the worker died (SIGKILL, out of memory, preemption) or was cut off: the pending call
  fails when the scheduler removes the worker, a later one is caught by the liveness check;
* ``hung``: no answer within ``hang_timeout_s``: the worker process is restarted (the only way to
  stop a stuck thread) and the role treated as lost;
* ``raised``: the fragment raised (an env error in ``step`` names the env id, with its traceback).

:meth:`Supervisor.replace` recreates the role replica on a live worker. Who calls it, and what is
restored, is the role's ``recover`` (``@role(..., recover=...)``, see the design notes below):
``replace`` roles (samplers, replay shards, evaluators) are replaced in place by the policy and the
iteration goes on (a sampler gets current weights with its next call, a replay shard reopens its
zarr store); ``rollback`` roles (learners) are replaced by the driver, which rolls the run back to
the last checkpoint. More than
``max_restarts`` restarts of one role within ``window_s`` is a crash loop: :class:``CrashLoop``
stops the run, naming the role, the worker and the exception, and the last checkpoint stays.

Design notes
------------

Dask does not rebuild an actor whose worker died, so every remote call is *watched*. A call on a dead worker
does not fail by itself: Dask waits for the actor's task (or a task pinned to that worker) to come back, which
for a role never happens. The driver hears the scheduler remove a worker (its ``remove-worker`` event,
``dagrl.runtime.workers.Departures``), and every call waiting on that worker fails then, as ``lost``. It listens
on each role worker's own event topic, not on the scheduler's ``all``: Dask keeps one handler per topic and
client, and a user's own handler of ``all`` on the same client would replace dagrl's (or dagrl's the user's). A
call that waits is also checked every ``poll_s`` against the scheduler's worker list, and one running past
``hang_timeout_s`` is *hung* (its worker is restarted, the only way to stop a stuck thread). That list is asked
of the scheduler each time (``dagrl.runtime.workers.workers``), never read from ``client.scheduler_info()``: that
returns the client's cached identity, which the client's own refresh replaces every 2 s with one holding no
workers, and a check that read it just then found every role's worker gone (a killed sampler was once blamed
on the learner, which was rolled back for nothing). A fragment that raises is a failure too; envs are wrapped
so their errors name the env id and the role replica and carry the env's traceback.

What happens is the role's ``recover``, declared beside its replication and independent of it: `@role("sampler",
many=True)`` defaults to ``recover="replace"``, ``@role("learner")`` to ``recover="rollback"`, and
``@role("evaluator", recover="replace")`` is a single instance that is nevertheless replaced in place (it holds
no run state). One component decides, for every policy: ``runtime/recovery.Recovery`` turns a ``RoleFailure`` into
an action from that declaration and the graph, and carries out those the run goes on after; a policy reports
what failed (and whose failure it is: a sampler that cannot reach the inference role reports the role's loss
when the role does not answer either) and does what its shape needs next (redo the iteration, restart a
sampler's loop, serve again). ``Recovery.attempt`` runs a piece of work again after each failure it recovers (an
iteration, an evaluation, a checkpoint's states); ``RoleFailure`` is caught there and in the driver only.

* sampler, evaluator, inference role (``recover="replace"``): action: replace; who carries it out: ``Recovery``,
  in place; what is restored: nothing: current weights go with the next call; lost: the rollout in flight
  (``sync``: the iteration is redone)
* replay shard (``replace``): action: replace; who carries it out: ``Recovery``, in place; the loops that call it
  restart on the replacement; what is restored: the store reopens from its zarr path; lost: rows not yet
  flushed/spilled
* sampler lost with its worker, above the replicas a growing stream started with (``max_replicas``): action:
  drop; who carries it out: ``Recovery``; its slot waits for a worker that joins; what is restored: nothing;
  lost: the rollout in flight
* a stream's learner replica past the first, lost with its worker (``async``/``apex`` with
  ``roles.learner.replicas: K``): action: regroup; who carries it out: ``Recovery``;
  ``runtime/groups.Groups.regroup``: replica 0's state to every replica, the group formed anew, the learner loop
  restarted on the same hub; what is restored: nothing: the survivors hold identical weights; lost: the round
  in progress and its rollouts
* learner (``rollback``); any replica of a ``dp-learners`` group, or a stream group's replica 0 (a replica that
  raised because a peer was lost is not blamed: the peer is): action: roll back; who carries it out: the
  driver; what is restored: every single-instance role from the last checkpoint; counters go back to it;
  metrics rows of redone iterations are dropped; lost: iterations since that checkpoint

Replacements go to a live worker that fits the role, preferring one with no actor (the nanny's restarted
worker, within ~2 s here). After ``respawn_after_s`` (15 s) without one, on a LocalCluster of the driver's
process whose nanny did not bring the dead worker back (seen on a loaded 2-core machine), the worker's spec
entry is replaced by a copy under a new name and a fresh worker starts in its place (same resources and
environment), so the cluster keeps its size; on a cluster reached by address the replacement shares the least
loaded worker that fits. A replacement's seed is shifted so it does not replay its predecessor's episodes.
More than ``max_restarts`` failures of one role within ``window_s`` is a crash loop: the run stops with the role,
worker, exception and traceback, keeping the last checkpoint. The driver writes a checkpoint at iteration 0,
so a learner that dies early has something to go back to, and refuses to write one whose weights hold NaN/inf.
Restarts and rollbacks are lines of ``events.jsonl``; each metrics row carries ``sup/restarts`` and
``sup/restarts/<role>``. On SLURM a worker *job* that ends under the run (preemption, ``scancel``, walltime) is
resubmitted in the same pool by ``slurm.Resubmitter`` (a worker name missing for 3 s; at most 3 times per
worker), and the supervisor places the lost role on the new worker (8 s from ``scancel`` to a working sampler on
the test SLURM).

A host cut off by a partition closes no socket, and Dask's worker TTL is 5 minutes. On a cluster spanning
several hosts the supervisor compares each worker's last heartbeat with the newest: one ``probe_after_s`` (2 s)
behind has its address asked for a TCP connection from the scheduler (``runtime/workers.answers``, 1 s to
answer). The host's kernel completes that handshake whatever the worker process is doing, so a worker busy in
a long fragment answers and keeps its roles; a host behind the partition does not, and its worker is removed
from the scheduler and its roles replaced (4.7 s from the cut to a working learner on emulated hosts). One
that answers but stays silent for ``unreachable_s`` (10 s) goes the same way. On clusters large enough for Dask
to space heartbeats out (1 s from 11 workers, 2 s from 50, more from 200) both bounds rise to at least 2 and 5
heartbeat intervals, so a worker between two beats is not probed for it (``lateness_bounds``). A worker heard
from again after it was cut off is restarted: what it still runs belongs to roles replaced meanwhile.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from dagrl.core.graph import Graph
from dagrl.runtime.workers import WorkerGone, answers, departures
from dagrl.runtime.workers import workers as live_workers

log = logging.getLogger("dagrl")

PROBE_TIMEOUT_S = 1.0
"""How long a lagging worker's host has to accept a connection (:meth:`Supervisor._probe`): a host on
the same network answers in milliseconds."""


def lateness_bounds(spec: Any, n_workers: int) -> tuple[float, float]:
    """How late (s) a worker's heartbeats may be before its host is probed, and before it is taken for
    lost: ``probe_after_s`` and ``unreachable_s``, raised to 2 and 5 of Dask's heartbeat intervals on
    clusters large enough for the scheduler to space heartbeats out (0.5 s up to 10 workers, 1 s to 50,
    2 s to 200, then growing with the count), so a worker between two beats is not probed for it.

    >>> from dagrl.core.graph import SupervisionSpec
    >>> lateness_bounds(SupervisionSpec(), 8), lateness_bounds(SupervisionSpec(), 100)
    ((2.0, 10.0), (4.0, 10.0))
    """
    from distributed.scheduler import heartbeat_interval

    beat = float(heartbeat_interval(n_workers))
    return max(spec.probe_after_s, 2 * beat), max(spec.unreachable_s, 5 * beat)


class RoleFailure(Exception):
    """A call to ``handle`` failed: ``kind`` is ``lost``, ``hung`` or ``raised``."""

    def __init__(self, handle: Any, kind: str, cause: BaseException):
        self.handle, self.kind, self.cause = handle, kind, cause
        super().__init__(f"{handle.role}[{handle.index}] on {handle.address}: {describe(kind, cause)}")


class CrashLoop(RuntimeError):
    """A role kept failing; the run stops (driver: ``TrainingError``)."""


DEBUG_ENV = "DAGRL_DEBUG"
"""Set by ``dagrl --debug``: errors keep the tracebacks their one line stands for."""


def shows_traceback(cause: BaseException) -> bool:
    """Whether a crash loop's message carries the failure's traceback: not for an env's error, whose
    line names env, role and call (``--debug`` shows it all the same), but for a bug in a role's code."""
    from dagrl.core.context import EnvError

    return bool(os.environ.get(DEBUG_ENV)) or not isinstance(cause, EnvError)


def describe(kind: str, cause: BaseException) -> str:
    if kind == "lost":
        return "its worker died"
    if kind == "hung":
        return str(cause)
    return f"{type(cause).__name__}: {cause}"


@dataclass
class Event:
    """One restart (or, ``action: drop``, an instance let go: an elastic stream's sampler above
    ``replicas``), as written to ``events.jsonl``."""

    role: str
    index: int
    worker: str | None
    kind: str
    reason: str
    time: float = field(default_factory=time.time)
    new_worker: str | None = None
    replace_s: float | None = None
    """Seconds from noticing the failure to a working replacement."""
    env_steps: int | None = None
    """The run's env steps the replacement started from (its samplers' schedules go on from there)."""
    traceback: str | None = None
    failed_starts: list[str] = field(default_factory=list)
    """Why replacements started before the working one failed (a constructor that raised, a worker
    that left before the actor started), in order; ``kind`` and ``reason`` stay the first failure's."""
    action: str = "restart"
    """``restart``, or ``drop`` for an instance not replaced (:meth:`Supervisor.drop`)."""


class Watched:
    """A pending call on a remote host whose ``result()`` turns failures into :class:`RoleFailure`."""

    def __init__(self, future: Any, handle: Any, supervisor: Supervisor):
        self.future, self.handle, self.supervisor = future, handle, supervisor

    def result(self) -> Any:
        sup, start = self.supervisor, time.monotonic()
        while True:
            try:
                return sup.departures.wait(self.future, self.handle.address, sup.spec.poll_s)
            except WorkerGone:
                raise RoleFailure(self.handle, "lost", OSError("worker removed from the scheduler")) from None
            except TimeoutError:
                waited = time.monotonic() - start
                if not sup.alive(self.handle.address):
                    raise RoleFailure(self.handle, "lost", OSError("worker gone")) from None
                if waited > sup.spec.hang_timeout_s:
                    msg = f"no answer for {waited:.0f} s (hang_timeout_s {sup.spec.hang_timeout_s:g})"
                    raise RoleFailure(self.handle, "hung", TimeoutError(msg)) from None
            except OSError as err:  # "Unable to contact Actor's worker", CommClosedError, or the fragment's own
                raise RoleFailure(self.handle, self._os_error_kind(err), err) from None
            except Exception as err:
                raise RoleFailure(self.handle, "raised", err) from None

    def _os_error_kind(self, err: OSError) -> str:
        """``lost`` if the worker is gone (or Dask says it cannot reach it), else the fragment ``raised`` it."""
        from distributed.comm.core import CommClosedError

        if isinstance(err, CommClosedError) or "contact Actor's worker" in str(err):
            return "lost"
        end = time.monotonic() + 2.0  # the scheduler may learn of the death a moment after us
        while time.monotonic() < end:
            if not self.supervisor.alive(self.handle.address, fresh=True):
                return "lost"
            time.sleep(0.2)
        return "raised"


class Failed:
    """A call that could not even be sent: ``result()`` raises its :class:`RoleFailure`."""

    def __init__(self, failure: RoleFailure):
        self.failure = failure

    def result(self) -> Any:
        raise self.failure


class Supervisor:
    """Replaces failed role actors of one run; counts restarts; detects crash loops."""

    def __init__(self, client: Any, graph: Graph, hosts: dict[str, list[Any]], start: Any, seed_offset: int = 0):
        self.client, self.graph, self.hosts = client, graph, hosts
        self.spec = graph.spec.supervision
        self.start = start  # start(role, index, address, seed_offset, env_steps) -> Handle
        self.seed_offset = seed_offset
        self.env_steps = 0
        """The run's env steps as the driver last counted them (a replacement starts from there)."""
        self.lock = threading.RLock()
        self.events: list[Event] = []
        self.recent: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._workers: tuple[float, dict[str, Any]] = (0.0, {})
        self.names: dict[str, Any] = {}
        """Worker address -> Dask worker name (a cluster's spec key), of every worker seen alive."""
        self.cut_off: dict[str, float] = {}
        """Workers taken for lost because their heartbeats stopped (:meth:`_unreachable`): address ->
        the scheduler's ``last_seen`` of it then. They count as dead until restarted on their return."""
        self._probed: dict[str, float] = {}
        """Worker address -> when its host was last asked whether it answers (:meth:`_probe`)."""
        self.listeners: list[Any] = []
        self.departures = departures(client)
        """Workers removed from the scheduler, as it removes them: a watched call on one fails at once."""
        self._released = False
        for handles in hosts.values():
            for h in handles:
                h.supervisor = self
                if h.address is not None:
                    self.departures.watch(h.address)
        self.workers(max_age=0.0)  # names of the workers as they start (a dead one's is needed later)

    def close(self) -> None:
        """Stop hearing of the scheduler's departures (the client stays the caller's)."""
        if not self._released:
            self._released = True
            self.departures.release()  # a call watched after this waits on polls alone

    # -- liveness --------------------------------------------------------------------------------

    def workers(self, max_age: float = 0.5) -> dict[str, Any]:
        stamp, workers = self._workers
        if time.monotonic() - stamp > max_age:
            try:
                workers = live_workers(self.client)
            except OSError:  # a client reconnecting, or closed under a thread still watching: the last list stands
                return workers
            workers = self._unreachable(workers)
            self._workers = (time.monotonic(), workers)
            self.names.update((addr, w.get("name")) for addr, w in workers.items())
        return workers

    def _unreachable(self, workers: dict[str, Any]) -> dict[str, Any]:
        """``workers`` less those cut off: a worker whose last heartbeat lags the newest by more than
        ``unreachable_s`` is cut off now (removed from the scheduler, so that Dask too stops counting on
        it), and so is one lagging ``probe_after_s`` whose host no longer accepts a connection
        (:meth:`_probe`). One cut off earlier that the scheduler hears from again has healed: it is
        restarted, since what it still runs belongs to roles replaced meanwhile, and then serves as
        spare capacity."""
        seen = {a: float(w.get("last_seen") or 0.0) for a, w in workers.items()}
        newest = max(seen.values(), default=0.0)  # the scheduler's clock on both sides: no skew
        hosts = {w.get("host") for w in workers.values()}
        spans_hosts = len(hosts) > 1  # one host's workers (a LocalCluster) cannot be cut off from each other
        probe_after, unreachable = lateness_bounds(self.spec, len(workers))
        for addr, last in seen.items():
            if addr in self.cut_off:
                if last > self.cut_off[addr]:  # heard from again
                    del self.cut_off[addr]
                    log.warning("worker %s is reachable again: restarting it (its roles were replaced)", addr)
                    self.cut_off[addr] = float("inf")  # until the restart is through
                    threading.Thread(target=self._restart_returned, args=(addr,), daemon=True).start()
            elif spans_hosts and newest - last > unreachable:
                lag = newest - last
                self._cut(addr, last, f"no heartbeat for {lag:.0f} s while others' arrive (bound {unreachable:g} s)")
            elif spans_hosts and newest - last > probe_after:
                self._probe_soon(addr, last, probe_after)
        return {a: w for a, w in workers.items() if a not in self.cut_off}

    def _cut(self, address: str, last_seen: float, why: str) -> None:
        if address in self.cut_off:
            return
        self.cut_off[address] = last_seen
        log.warning("worker %s: %s: taken for lost", address, why)
        threading.Thread(target=self._remove_worker, args=(address,), daemon=True).start()

    def _probe_soon(self, address: str, last_seen: float, every: float) -> None:
        """Ask once per ``every`` seconds whether a lagging worker's host still answers (in a thread:
        an unanswered connection takes its whole timeout)."""
        now = time.monotonic()
        if now - self._probed.get(address, -float("inf")) < every:
            return
        self._probed[address] = now
        threading.Thread(target=self._probe, args=(address, last_seen), daemon=True).start()

    def _probe(self, address: str, last_seen: float) -> None:
        """A worker whose heartbeats are late but whose host accepts a TCP connection is busy, and
        waits out ``unreachable_s``; one whose host does not answer is cut off from the scheduler
        now, seconds before that bound (a partition, a host gone without closing its sockets)."""
        if not answers(self.client, address, timeout_s=PROBE_TIMEOUT_S):
            self._cut(address, last_seen, f"heartbeats late and no answer to a connection in {PROBE_TIMEOUT_S:g} s")

    def _restart_returned(self, address: str) -> None:
        self._restart_worker(address)
        self.cut_off.pop(address, None)

    def _remove_worker(self, address: str) -> None:
        """Tell the scheduler to forget ``address`` (without reaching it: it cannot be reached)."""

        async def remove(dask_scheduler: Any) -> None:
            if address in dask_scheduler.workers:
                await dask_scheduler.remove_worker(address, stimulus_id="dagrl-unreachable", close=False)

        try:
            self.client.run_on_scheduler(remove)
        except Exception as err:  # noqa: BLE001 (the roles are replaced either way)
            log.warning("could not remove unreachable worker %s from the scheduler: %s", address, err)

    def removed(self, address: str | None) -> bool:
        """Whether the scheduler has removed ``address``'s worker (heard as it happens: no round trip)."""
        return address is not None and self.departures.left(address)

    def alive(self, address: str | None, fresh: bool = False) -> bool:
        if address is None:
            return True
        return not self.removed(address) and address in self.workers(max_age=0.0 if fresh else 0.5)

    # -- restarts --------------------------------------------------------------------------------

    def restarts(self) -> dict[str, int]:
        counts: dict[str, int] = collections.Counter(e.role for e in self.events)
        return dict(counts)

    def replace(self, failure: RoleFailure) -> Any:
        """A working replacement for ``failure.handle`` (the current one if another thread made it)."""
        old = failure.handle
        with self.lock:
            current = self.hosts[old.role][old.index]
            if current is not old:
                return current
            event = Event(old.role, old.index, old.address, failure.kind, describe(failure.kind, failure.cause))
            if failure.kind == "raised":
                event.traceback = remote_traceback(failure.cause)
            t0 = time.monotonic()
            cause: BaseException = failure.cause
            attempt = event  # each failed start counts toward a crash loop; the event keeps the first failure
            while True:
                self._count(attempt, cause)
                log.warning("%s[%d] on %s: %s; restarting it", old.role, old.index, old.address, attempt.reason)
                if failure.kind == "hung" and old.address:
                    self._restart_worker(old.address)
                old.close(wait_s=5.0 if failure.kind == "raised" else 0.0)  # a raised host still answers
                try:
                    where, shift = self._choose_worker(old), self._seed_shift(old.role)
                    new = self.start(old.role, old.index, where, shift, self.env_steps)
                    break
                except Exception as err:  # the constructor failed (e.g. the env raises on reset)
                    cause = err
                    attempt = Event(old.role, old.index, old.address, "raised", describe("raised", err))
                    attempt.traceback = remote_traceback(err)
                    event.failed_starts.append(attempt.reason)
                    time.sleep(min(2.0, 0.2 * len(self.recent[old.role])))
            new.supervisor = self
            if new.address is not None:
                self.departures.watch(new.address)
            event.new_worker, event.replace_s = new.address, time.monotonic() - t0
            event.env_steps = self.env_steps
            self.hosts[old.role][old.index] = new
            for listener in self.listeners:
                listener(event)
            return new

    def drop(self, failure: RoleFailure) -> None:
        """``failure.handle`` is let go, not replaced (an elastic stream's sampler above ``replicas``):
        the listeners hear of it as a ``drop``; it does not count toward a crash loop."""
        old = failure.handle
        event = Event(old.role, old.index, old.address, failure.kind, describe(failure.kind, failure.cause))
        event.action, event.env_steps = "drop", self.env_steps
        for listener in self.listeners:
            listener(event)

    def _count(self, event: Event, cause: BaseException) -> None:
        now = time.monotonic()
        recent = self.recent[event.role]
        while recent and now - recent[0] > self.spec.window_s:
            recent.popleft()
        recent.append(now)
        self.events.append(event)
        if len(recent) > self.spec.max_restarts:
            where = event.worker or "this process"
            raise CrashLoop(
                f"{event.role}[{event.index}] on {where} failed {len(recent)} times in {self.spec.window_s:g} s "
                f"(max_restarts {self.spec.max_restarts}): {describe(event.kind, cause)}"
                + (f"\n{event.traceback}" if event.traceback and shows_traceback(cause) else "")
            )

    def _seed_shift(self, role: str) -> int:
        """A replacement samples new episodes, not the ones its predecessor already produced."""
        return self.seed_offset + 7_919 * sum(1 for e in self.events if e.role == role)

    def _restart_worker(self, address: str) -> None:
        try:
            self.client.restart_workers([address], timeout=60, raise_for_error=False)
        except Exception as err:  # the worker may be gone already
            log.warning("could not restart worker %s: %s", address, err)

    def _choose_worker(self, old: Any) -> str:
        """A live worker that fits the role, preferring one hosting no actor (a restarted worker).

        Waits up to ``respawn_after_s`` for such a worker (the nanny restarts a killed worker within a
        few seconds); then, if the dead worker's cluster runs in this process, starts a fresh worker
        in its place (:meth:`_respawn`) and waits for that one; else shares the least loaded one. It
        does not wait where no nanny can be restarting the worker: its host was cut off, or no worker
        of its host is left (a host that crashed).
        """
        from dagrl.core.distribution import data_parallel_roles
        from dagrl.runtime.placement import host_of, place_one

        end = time.monotonic() + (0.0 if self._host_gone(old.address) else self.spec.respawn_after_s)
        give_up = end + 120.0
        respawned = False
        while True:
            workers = self.workers(max_age=0.0)
            load = collections.Counter(
                h.address for hs in self.hosts.values() for h in hs if h is not old and h.address in workers
            )
            role = self.graph.role(old.role)
            parallel = not self.graph.algorithm.roles[old.role].many and role.replicas > 1  # dp-learners
            avoid = frozenset(h.address for h in self.hosts[old.role] if h is not old) if parallel else frozenset()
            learners = set(data_parallel_roles(self.graph.algorithm)) - {old.role}
            near = frozenset(host_of(workers, h.address) for r in learners for h in self.hosts.get(r, []) if h.address)
            addr = place_one(old.role, role, workers, load, self.graph.spec.gpu_fallback, avoid, near)
            if addr is not None and load[addr] == 0:
                return addr
            if time.monotonic() > end and not respawned:
                respawned = True
                if self._respawn(old.address):
                    end = time.monotonic() + 60.0  # the fresh worker has registered; let it be chosen
                    continue
            if addr is not None and time.monotonic() > end:
                return addr
            if time.monotonic() > give_up:
                raise RuntimeError(f"no live worker can host {old.role} (needs {role.resources})")
            time.sleep(0.25)

    def _host_gone(self, address: str | None) -> bool:
        """Whether the host of the lost worker ``address`` is gone: the worker was cut off, or the
        scheduler has no worker left on its host (while it has some elsewhere)."""
        if address is None:
            return False
        if address in self.cut_off:
            return True
        from distributed.comm.addressing import get_address_host

        workers = self.workers(max_age=0.0)
        host = get_address_host(address)
        return bool(workers) and all(get_address_host(a) != host for a in workers)

    def _respawn(self, address: str | None) -> bool:
        """Start a fresh worker in place of the dead one at ``address`` whose nanny did not bring it
        back (seen on a loaded 2-core machine), on a LocalCluster of this process: its spec entry is
        replaced by a copy under a new name (same resources, same environment, e.g. its GPU), so the
        cluster keeps its size. Whether one was started. SLURM worker jobs are resubmitted by the
        job watcher instead (:mod:`dagrl.clusters.slurm`); a cluster reached by address is not this process's."""
        from distributed import LocalCluster

        cluster = getattr(self.client, "cluster", None)
        if address is None or not isinstance(cluster, LocalCluster) or self.alive(address, fresh=True):
            return False
        name = self.names.get(address)
        spec = cluster.worker_spec.get(name)
        if spec is None:
            return False
        new_name = f"{name}-r{len(self.events)}"
        log.warning("worker %s (%s) did not come back: starting worker %s in its place", address, name, new_name)
        try:
            cluster.worker_spec[new_name] = {"cls": spec["cls"], "options": dict(spec.get("options", {}))}
            del cluster.worker_spec[name]
            cluster.sync(cluster._correct_state)
        except Exception as err:  # the new worker failed to start: share a live one instead
            log.warning("could not start a worker in place of %s: %s", address, err)
            return False
        return True


def remote_traceback(err: BaseException) -> str:
    """The traceback of an exception raised in an actor (Dask re-raises it with the remote frames)."""
    text = getattr(err, "traceback_text", None)
    if text:
        return text
    return "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip()


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a loss became NaN); the last good checkpoint is kept."""
