"""The role host: one instance of a role's state and the fragments that run on it.

The same class runs in-process (policy ``single``) and as a persistent Dask actor (every other
policy): it holds state between calls and nothing else. Users never subclass it.

On a worker, fragments do not reach the host through actor calls: each fragment call is a Dask
*task* (:func:`run_fragment`) pinned to the host's worker, which finds the host in :data:`HOSTS`
by its id. Dask runs tasks on the worker's thread pool and actor methods (``state_dict``, ``info``)
on a separate actor thread, so the host serialises them with a lock: one fragment at a time per
role state, and a checkpoint never sees half an update.

When the run ends, ``Policy.close`` closes every host at once, on its worker, before releasing the
actors: the state's own ``close`` if it has one (a replay's prefetch thread), every vector env
``RoleContext.make_envs`` made (env threads, env subprocesses, EnvPool) and a sampler's inference
socket. An algorithm whose state holds other resources gives it a ``close()``. A replaced host is
closed the same way if it raised, and only released if its worker was lost or hung. A host whose
fragment is still running after 8 s (an env that hangs as the run ends) is not waited for on the
actor thread, which is the worker's only one and every actor there shares: it refuses new fragments
from then on, and the fragment closes the state when it returns. A kept cluster (a notebook's) then
serves the next run's actors on that worker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from dagrl.core.context import RoleContext, close_each
from dagrl.core.fragment import load_algorithm
from dagrl.runtime import mailbox, shm
from dagrl.runtime.wire import to_cpu

log = logging.getLogger("dagrl")


def resolve_device(wants_gpu: bool, fallback: bool) -> tuple[str, str]:
    """The torch device for a role and a note on how it was chosen."""
    import torch

    if not wants_gpu:
        return "cpu", ""
    if torch.cuda.is_available():
        return "cuda", ""
    if not fallback:
        raise RuntimeError(f"GPU requested but {socket.gethostname()} has no CUDA device (gpu_fallback is false)")
    return "cpu", "GPU requested but no CUDA device here: falling back to CPU"


HOSTS: weakref.WeakValueDictionary[str, RoleHost] = weakref.WeakValueDictionary()
"""The role hosts living in this process, by id. Weak: a host released by Dask (its actor future
dropped) disappears from here too."""


CLOSE_WAIT_S = 10.0
"""How long :meth:`RoleHost.close` waits for the fragment in progress before leaving the close to it."""
SNAPSHOT_WAIT_S = 1.0
"""How long a lockstep checkpoint waits for a sampler's fragment before saving no snapshot of it (between
iterations none runs: one that does is hung, and the checkpoint goes on without it)."""


@dataclass
class Done:
    """An in-process call's result, shaped like a finished future (in-process calls look like actor
    calls and Dask tasks)."""

    value: Any
    status = "finished"

    def result(self, timeout: float | None = None) -> Any:
        return self.value


class HostGone(RuntimeError):
    """A fragment task reached a worker that no longer has its role host (released, or the worker restarted)."""


def _host(host_id: str) -> RoleHost:
    host = HOSTS.get(host_id)
    if host is None:
        raise HostGone(f"role host {host_id} is not on worker process {os.getpid()} (released or restarted)")
    return host


@dataclass
class Reported:
    """A fragment output for the driver, with the :class:`~dagrl.runtime.report.Report` of each
    sampler output its task consumed (``reports[j][r]``: the ``j``-th reported argument, replica ``r``)."""

    value: Any
    reports: list[list[Any]]


def run_fragment(
    host_id: str,
    fragment: str,
    *args: Any,
    after: Any = None,
    reports: tuple[int, ...] = (),
    announce: str | None = None,
    mail: tuple[str, int] | None = None,
) -> Any:
    """The Dask task of one fragment call: ``fragment(state, *args)`` on host ``host_id`` of this worker.

    Dask resolves futures among ``args`` (fetched peer to peer from the workers that hold them)
    before this runs; the return value stays on this worker until a consumer task fetches it.
    ``after`` holds futures that must finish first and are otherwise ignored (ordering only).
    Large arrays in the output may reach a same-host consumer through shared memory
    (:mod:`dagrl.runtime.shm`); an input that comes from this worker arrives in that envelope.
    ``reports``: positions of arguments (sampler outputs, gathered) whose reports the driver wants;
    the output, which only the driver reads, then comes back :class:`Reported` (one task fewer per
    sampler than a report task each).
    ``announce``: a Dask event topic; the :class:`~dagrl.runtime.report.Report` of the output is
    logged there under this task's key before the task ends, for a driver that needs the report of an
    output other tasks consume (:class:`~dagrl.runtime.announce.Announcements`).
    ``mail``: (box, sequence number): the output is also posted to that same-host mailbox, where
    consumer tasks wait for it (:mod:`dagrl.runtime.mailbox`); an argument that is a
    :class:`~dagrl.runtime.mailbox.Ticket` (or holds some, gathered) is such a value, waited for before
    the fragment runs.
    """
    host = _host(host_id)
    inputs = [_resolve(a) for a in args]
    producer = f"{host_id}:{fragment}"  # its next posting replaces this one, not another replica's
    try:
        out = host.call(fragment, *inputs)
    except BaseException as err:
        if mail is not None:
            mailbox.post_error(*mail, err, producer=producer)
        raise
    if mail is not None:
        mailbox.post(*mail, out, producer=producer)
    if announce is not None:
        from distributed import get_worker

        from dagrl.runtime.report import report_message

        worker = get_worker()
        worker.log_event(announce, {"key": worker.get_current_task(), **report_message(out)})
    if reports:
        from dagrl.runtime.report import report

        gathered = [inputs[i] if isinstance(inputs[i], list) else [inputs[i]] for i in reports]
        return Reported(out, [[report(v) for v in values] for values in gathered])
    return shm.wrap(out) if host.shared_memory else out


def _resolve(arg: Any) -> Any:
    """An argument as the fragment receives it: a mailbox ticket's value (also inside a gathered list),
    an envelope's value (:func:`shm.unwrap`)."""
    if isinstance(arg, mailbox.Ticket):
        try:
            return mailbox.take(arg)
        except mailbox.NotPosted:  # no room on /dev/shm: the producer's output, through Dask
            from distributed import Future, get_client

            return shm.unwrap(Future(arg.producer, get_client()).result())
    if isinstance(arg, list):
        return [_resolve(a) for a in arg]
    return shm.unwrap(arg)


def load_acting(host_id: str, *weights: Any, after: Any = None) -> None:
    """The Dask task that gives the ``inference`` role the weights a sampler fragment receives:
    ``state.load(*weights)`` under the host's lock, so no batch is answered with half of them."""
    host = _host(host_id)
    with host.lock:
        host.state.load(*[shm.unwrap(w) for w in weights])


def _address_host() -> str:
    """This worker's host as other workers reach it (its Dask address's host), else the loopback."""
    try:
        from distributed import get_worker
        from distributed.comm import get_address_host

        return get_address_host(get_worker().address)
    except ValueError:  # not in a worker
        return "127.0.0.1"


_REPORTED_ENV = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "MALLOC_TRIM_THRESHOLD_")
"""Where a role really runs, as its own process sees it (``actors.json``, ``dagrl status``)."""


class RoleHost:
    """Hosts one role instance: builds its state with the algorithm's factory, runs its fragments.

    Examples
    --------
    >>> from dagrl.core.context import RoleContext, close_each
    >>> from dagrl.algos.ppo import Config
    >>> ctx = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", num_envs=2)
    >>> host = RoleHost("ppo", "sampler", ctx, Config(num_steps=4))
    >>> host.info()["role"]
    'sampler'
    """

    def __init__(
        self,
        algorithm: str,
        role: str,
        ctx: RoleContext,
        config: Any,
        *,
        wants_gpu: bool = False,
        gpu_fallback: bool = True,
        torch_threads: int | None = None,
        host_id: str | None = None,
        shared_memory: bool = False,
        snapshots: bool = False,
    ):
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)
        ctx.device, self.device_note = resolve_device(wants_gpu, gpu_fallback)
        if not any(h.in_group for h in HOSTS.values()):
            from dagrl.runtime.collective import leave

            leave()  # a group left by a run that ended without closing its hosts: its peers are gone
        self.in_group = False
        """This host's process joined its role's data-parallel group (``dp-learners``)."""
        algo = load_algorithm(algorithm)
        self.role, self.index, self.device = role, ctx.index, ctx.device
        self.fragments = algo.fragments
        self.ctx = ctx
        self.shared_memory = shared_memory
        self.snapshots = snapshots
        """A state without ``state_dict`` (a sampler's) is checkpointed whole (:mod:`dagrl.runtime.snapshot`)."""
        self.state = algo.roles[role].factory(ctx, config)
        self.batcher: Any = None
        self.server: Any = None  # the inference role's BatchServer
        self.calls = 0
        self.busy_s: dict[str, float] = {}  # seconds spent inside each fragment
        self.running: tuple[str, float] | None = None  # (fragment, start) of the call in progress
        self.lock = threading.RLock()  # fragment tasks (worker pool) vs actor methods (actor thread)
        self.flags = threading.Lock()  # a fragment's end (``running`` cleared) vs a close marking ``close_after``
        self.host_id = host_id or f"{role}-{ctx.index}-{id(self):x}"
        self.closed = False
        """New fragments are refused."""
        self.ended = False
        """The state and its envs are closed."""
        self.close_after = False
        """The fragment in progress closes the state when it returns (:meth:`close` did not wait for it)."""
        self.spans: Any = None
        """The spans of :meth:`traced` calls not yet sent (made on first use, on a worker)."""
        HOSTS[self.host_id] = self

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """End the role instance after the fragment in progress: the state's own ``close`` if it has
        one (a replay's prefetch thread), the envs its context made (their threads or processes) and
        its inference socket, where each of them is. Once; a fragment called after it is refused.
        The first error is raised after everything was tried.

        A fragment still running after ``wait_s`` (an env that hangs) is not waited for: new fragments
        are refused from then on, and that fragment closes the state when it returns. On a worker this
        method runs on the worker's only actor thread, which every actor there shares; waiting on it
        for a hung env would stall them all, the actors of later runs on a kept cluster included.
        Returns whether the state is closed now (``False``: it is left to the fragment in progress)."""
        while not self.lock.acquire(timeout=max(wait_s, 0.01)):
            with self.flags:
                self.closed = True
                HOSTS.pop(self.host_id, None)
                if self.running is not None:
                    fragment, since = self.running
                    self.close_after = True
                    log.warning(
                        "%s[%d]: %s still running after %.0f s; the role closes when it returns",
                        self.role, self.index, fragment, time.perf_counter() - since,
                    )  # fmt: skip
                    return False
            # the lock's holder was not a fragment (a weights load, a batch of inference): wait again
        try:
            self._end()
        finally:
            self.lock.release()
        return True

    def _end(self) -> None:
        """Close the state, its envs and its socket (the lock held), once."""
        with self.flags:
            if self.ended:
                return
            self.ended = self.closed = True
            self.close_after = False
        HOSTS.pop(self.host_id, None)
        close_each(
            [getattr(self.state, "close", None), self.ctx.close, getattr(self.server, "close", None), self._leave]
        )

    def _leave(self) -> None:
        """Leave the data-parallel group: the process's default group outlives the run otherwise, and a
        later run's learner on this worker would average its gradients with the gone replicas (and wait
        for them until the group's timeout)."""
        if self.in_group:
            from dagrl.runtime.collective import leave

            self.in_group = False
            leave()

    def call(self, fragment: str, *args: Any) -> Any:
        """Run ``fragment(state, *args)`` under the host's lock (one fragment at a time per role state)."""
        with self.lock:
            if self.closed:
                raise HostGone(f"{self.role}[{self.index}] is closed (its run ended); {fragment} not run")
            self.calls += 1
            t0 = time.perf_counter()
            self.running = (fragment, t0)  # one assignment: a close reads it under ``flags``, then or later
            try:
                return self.fragments[fragment](self.state, *args)
            finally:
                self.busy_s[fragment] = self.busy_s.get(fragment, 0.0) + time.perf_counter() - t0
                with self.flags:
                    self.running = None
                    close_now = self.close_after
                if close_now:
                    self._end_late(fragment)

    def traced(self, fragment: str, *args: Any) -> Any:
        """:meth:`call`, its span added to Dask's Task Stream (:mod:`dagrl.runtime.spans`): how the
        streams' loops call fragments, which are no Dask tasks of their own."""
        start = time.time()
        try:
            return self.call(fragment, *args)
        finally:
            if self.spans is None:
                from dagrl.runtime.spans import Spans

                self.spans = Spans(self.role, self.index)
            self.spans.add(fragment, start, time.time())

    def _end_late(self, fragment: str) -> None:
        """The close a hung ``fragment`` held up, once it returned; an error is logged (nobody waits)."""
        try:
            self._end()
        except Exception as err:  # noqa: BLE001 (the run that closed the role is gone)
            log.warning("%s[%d] closing after %s: %s: %s", self.role, self.index, fragment, type(err).__name__, err)

    def state_dict(self) -> Any:
        """The role state's checkpoint, or ``None`` for roles without one (samplers): at once, without
        waiting for the fragment in progress (a sampler streaming under ``apex`` always has one)."""
        fn = getattr(self.state, "state_dict", None)
        if fn is None:
            if not self.snapshots:
                return None
            from dagrl.runtime.snapshot import snapshot

            where = f"{self.role}[{self.index}]"
            if not self.lock.acquire(timeout=SNAPSHOT_WAIT_S):  # lockstep checkpoints fall between
                fragment, _ = self.running or ("a fragment", 0.0)  # iterations: this one is hung
                log.warning("%s: still inside %s: this checkpoint holds no snapshot of it", where, fragment)
                return None
            try:
                snap = snapshot(self.state, where)
            finally:
                self.lock.release()
            self.snapshots = snap is not None  # said once: an env that cannot be saved stays so
            return snap
        with self.lock:
            return to_cpu(fn())

    def load_state_dict(self, sd: Any) -> None:
        from dagrl.runtime.snapshot import KEY, restore

        if sd is None:
            return
        with self.lock:
            if isinstance(sd, dict) and KEY in sd:
                restore(self.state, sd, f"{self.role}[{self.index}]")
            else:
                self.state.load_state_dict(sd)

    def join_group(
        self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float, own_host: str | None = None
    ) -> None:
        """Become rank ``rank`` of this role's data-parallel group (after any running fragment); ``own_host``:
        this worker's address, whose interface the group's connections keep to."""
        from dagrl.runtime.collective import join

        with self.lock:
            join(backend, host, port, rank, world, timeout_s, own_host)
            self.in_group = world > 1

    def digest(self) -> str | None:
        """A hash of the role state's checkpoint (data-parallel replicas must agree on it)."""
        from dagrl.runtime.collective import digest

        sd = self.state_dict()
        return None if sd is None else digest(sd)

    # -- central inference (policy ``central-inference``) --------------------------------------------

    def serve(self, expected: int, max_wait_ms: float) -> tuple[str, int, str, bool]:
        """Answer sampler requests in batches of ``expected`` (or after ``max_wait_ms``) on a socket of
        this worker's host: the inference role. Returns what samplers connect with (host, port, token,
        TLS: where the cluster's comms are TLS, so is this socket)."""
        from dagrl.runtime.inference import Batcher, BatchServer, worker_tls

        if self.server is not None:
            self.server.close()
        self.batcher = Batcher(self.state, self.lock, expected, max_wait_ms / 1e3)
        self.server = BatchServer(self.batcher, _address_host(), tls=worker_tls(server=True))
        weakref.finalize(self, self.server.close)  # the actor released: its thread and sockets go too
        return self.server.endpoint

    def inference_stats(self) -> dict[str, float]:
        return self.batcher.stats() if self.batcher is not None else {}

    def attach_inference(self, endpoint: tuple[str, int, str, bool]) -> None:
        """A sampler: act through the inference role's socket at ``endpoint`` from now on."""
        self.ctx.inference.attach(endpoint)

    def acting_stats(self) -> tuple[int, float]:
        """A sampler: inference calls made and seconds waited since last asked."""
        return self.ctx.inference.stats() if self.ctx.inference is not None else (0, 0.0)

    async def heartbeat(self) -> dict[str, Any]:
        """Liveness and progress. ``async``: Dask runs it on the worker's event loop, so it answers
        while a fragment is running in the actor's thread."""
        return self.heartbeat_now()

    def heartbeat_now(self) -> dict[str, Any]:
        fragment, since = self.running or (None, None)
        stats = getattr(self.state, "stats", None)  # a replay role: rows in RAM and on disk
        return {
            "stats": stats() if callable(stats) else None,
            "pid": os.getpid(),
            "device": self.device,
            "calls": self.calls,
            "running": fragment,
            "running_s": None if since is None else time.perf_counter() - since,
            "busy_s": dict(self.busy_s),
            "env_s": self.ctx.env_seconds(),
        }

    def info(self) -> dict[str, Any]:
        from dagrl.runtime.collective import gpu_id

        return {
            "gpu": gpu_id() if self.device == "cuda" else None,
            "role": self.role,
            "index": self.index,
            "device": self.device,
            "device_note": self.device_note,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at_env_steps": self.ctx.env_steps,
            "calls": self.calls,
            "busy_s": dict(self.busy_s),
            "env_s": self.ctx.env_seconds(),
            "envs": self.ctx.num_envs,
            "vector": self.ctx.env_backends(),
            "double_buffered": self.ctx.double_buffered(),
            "env": {k: os.environ[k] for k in _REPORTED_ENV if k in os.environ},
        }
