"""Starting role hosts in-process or as Dask actors, behind one handle type with ``.result()`` calls."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from dagrl.core.context import RoleContext
from dagrl.core.distribution import data_parallel_roles
from dagrl.core.graph import Graph
from dagrl.envs.wrappers import parse as parse_wrappers
from dagrl.runtime.host import CLOSE_WAIT_S, Done, RoleHost
from dagrl.runtime.placement import place
from dagrl.runtime.workers import workers as live_workers

log = logging.getLogger("dagrl")


class Handle:
    """A role host reached either directly (``single``) or through a Dask actor proxy."""

    def __init__(
        self, role: str, index: int, target: Any, address: str | None = None, future: Any = None, host_id: str = ""
    ):
        self.role, self.index, self.target, self.address = role, index, target, address
        self.host_id = host_id or getattr(target, "host_id", "")
        """Finds the host on its worker (:func:`~dagrl.runtime.host.run_fragment`)."""
        self.future = future  # keeps a Dask actor alive; released by close()
        self.remote = address is not None
        self.supervisor: Any = None
        """Set by :class:`~dagrl.runtime.supervisor.Supervisor`: calls are then watched for failures."""

    def _invoke(self, method: str, *args: Any) -> Any:
        """Call ``method`` on the host: in-process at once, remotely as a (watched) future."""
        if not self.remote:
            if method == "heartbeat":
                method = "heartbeat_now"
            return Done(getattr(self.target, method)(*args))
        if self.supervisor is None:
            return getattr(self.target, method)(*args)
        from dagrl.runtime.supervisor import Failed, RoleFailure, Watched

        try:
            return Watched(getattr(self.target, method)(*args), self, self.supervisor)
        except Exception as err:  # Dask refuses calls on an actor whose worker is known lost
            return Failed(RoleFailure(self, "lost", err))

    def heartbeat(self) -> Any:
        """Liveness and progress, answered even while a fragment runs (an ``async`` actor method)."""
        return self._invoke("heartbeat")

    def call(self, fragment: str, *args: Any) -> Any:
        return self._invoke("call", fragment, *args)

    def state_dict(self) -> Any:
        return self._invoke("state_dict")

    def load_state_dict(self, sd: Any) -> Any:
        return self._invoke("load_state_dict", sd)

    def info(self) -> Any:
        return self._invoke("info")

    def join_group(self, *args: Any) -> Any:
        return self._invoke("join_group", *args)

    def digest(self) -> Any:
        return self._invoke("digest")

    def serve(self, expected: int, max_wait_ms: float) -> Any:
        return self._invoke("serve", expected, max_wait_ms)

    def inference_stats(self) -> Any:
        return self._invoke("inference_stats")

    def attach_inference(self, endpoint: tuple[str, int, str, bool]) -> Any:
        return self._invoke("attach_inference", endpoint)

    def acting_stats(self) -> Any:
        return self._invoke("acting_stats")

    def start_close(self, wait_s: float = CLOSE_WAIT_S) -> Any:
        """Ask the host to close its role state (:meth:`RoleHost.close`, which waits up to ``wait_s`` for
        a fragment in progress): a future of whether it closed (``Done`` in-process), or ``None`` where
        the actor can no longer be reached."""
        if not self.remote:
            return Done(self.target.close(wait_s))
        if self.future is None:
            return None
        try:
            return self.target.close(wait_s)  # not watched: a lost actor is not replaced to be closed
        except Exception:  # Dask refuses calls on an actor whose worker is known lost
            return None

    def release(self) -> None:
        """Let Dask drop the actor (a remote host); the handle is unusable after it."""
        if self.future is not None:
            with contextlib.suppress(Exception):  # the client may be closing, or the actor's worker gone
                self.future.release()
            self.future = None

    def close(self, wait_s: float = 10.0) -> None:
        """Close the role state (:meth:`start_close`), waiting up to ``wait_s``, then release the actor.
        ``wait_s=0``: release only (the actor is lost or hung)."""
        close_all([self], wait_s)

    def __repr__(self) -> str:
        return f"<{self.role}[{self.index}] at {self.address or 'in-process'}>"


def close_all(handles: list[Handle], wait_s: float = 10.0) -> None:
    """Close every handle's role state at once, waiting for all of them up to ``wait_s`` in total, then
    release the actors. A state that fails to close, or takes longer, is logged, not raised: the run's
    results are already saved when this runs."""

    def failed(h: Handle, err: Exception) -> None:
        if isinstance(err, TimeoutError):
            log.warning("%s[%d] did not close within %.0f s; releasing it", h.role, h.index, wait_s)
        else:
            log.warning("%s[%d] closing: %s: %s", h.role, h.index, type(err).__name__, err)

    closing = []
    for h in handles:
        try:  # the host gives up on a hung fragment before this gives up on the host
            closing.append(h.start_close(0.8 * wait_s) if wait_s > 0 else None)
        except Exception as err:  # noqa: BLE001 (an in-process state that fails to close)
            failed(h, err)
            closing.append(None)
    deadline = time.monotonic() + wait_s
    for h, pending in zip(handles, closing, strict=True):
        if pending is not None:
            try:
                if not pending.result(timeout=max(0.1, deadline - time.monotonic())) and h.remote:
                    log.warning(
                        "%s[%d] is still running a fragment; it closes when that returns. Until then it takes a "
                        "thread of worker %s, where a later run's actor may wait for it "
                        "(client.restart_workers([%r]) frees it)",
                        h.role, h.index, h.address, h.address,
                    )  # fmt: skip
            except Exception as err:  # noqa: BLE001 (the run is over; say what did not close cleanly)
                failed(h, err)
        h.release()


def role_seed(graph: Graph, role: str, index: int, offset: int = 0) -> int:
    """Distinct, reproducible seeds per role replica; ``offset`` shifts them on resume."""
    position = list(graph.algorithm.roles).index(role)
    return graph.spec.seed + 100_003 * position + 1_009 * index + offset


def role_path(graph: Graph, role: str, index: int, run_dir: str | None) -> str | None:
    rspec = graph.role(role)
    if rspec.path is not None:
        return os.path.join(rspec.path, str(index))
    return None if run_dir is None else os.path.join(run_dir, f"{role}-{index}")


@dataclass(frozen=True)
class Start:
    """Where role replicas start within their run (the same for every replica started at once)."""

    seed_offset: int = 0
    """Shifts every seed: a resume or a replacement does not replay the env streams of the start."""
    run_dir: str | None = None
    """The run's directory (a role's ``path`` defaults to ``<run_dir>/<role>-<index>``)."""
    env_steps: int = 0
    """The run's env steps so far: schedules (random phase, epsilon) go on from there."""


def role_context(
    graph: Graph, role: str, index: int, seed_offset: int = 0, run_dir: str | None = None, env_steps: int = 0
) -> RoleContext:
    rspec = graph.role(role)
    inference = None
    if graph.traits.inference and graph.algorithm.roles[role].many:
        from dagrl.runtime.inference import InferenceClient

        inference = InferenceClient(f"{role}[{index}]", timeout_s=graph.spec.supervision.hang_timeout_s)
    return RoleContext(
        role=role,
        index=index,
        replicas=rspec.replicas,
        seed=role_seed(graph, role, index, seed_offset),
        env_id=graph.env_id,  # importable in a fresh worker
        env_kwargs=graph.env_kwargs,
        env_wrappers=parse_wrappers(graph.spec.env.wrappers),
        num_envs=rspec.envs,
        vector=rspec.vector,
        vector_threads=rspec.vector_threads,
        double_buffer=rspec.double_buffer,
        observation_space=graph.observation_space,
        action_space=graph.action_space,
        path=role_path(graph, role, index, run_dir),
        memory_bytes=rspec.memory_bytes,
        codec=rspec.codec,
        env_steps=env_steps,
        env_steps_budget=graph.spec.stop.env_steps,
        inference=inference,
    )


def _host_args(graph: Graph, role: str, index: int, start: Start) -> tuple[tuple, dict]:
    ctx = role_context(graph, role, index, start.seed_offset, start.run_dir, start.env_steps)
    args = (graph.spec.algorithm, role, ctx, graph.config)
    kwargs = {
        "wants_gpu": graph.role(role).gpus > 0,
        "gpu_fallback": graph.spec.gpu_fallback,
        "torch_threads": graph.spec.torch_threads,
        "shared_memory": graph.spec.shared_memory,
        "snapshots": graph.traits.snapshots,
    }
    return args, kwargs


def start_local(graph: Graph, start: Start | None = None) -> dict[str, list[Handle]]:
    """Every role replica as an in-process :class:`RoleHost`."""
    start = start or Start()
    hosts: dict[str, list[Handle]] = {}
    for role in graph.active_roles:
        hosts[role] = []
        for i in range(graph.role(role).replicas):
            args, kwargs = _host_args(graph, role, i, start)
            hosts[role].append(Handle(role, i, RoleHost(*args, **kwargs)))
    _log_devices(hosts)
    return hosts


def check_fits(graph: Graph, roles: dict[str, Any], run_dir: str | None = None) -> None:
    """Raise ``ValueError`` naming the role if checkpointed role states ``roles`` cannot load into ``graph``,
    or if data a role keeps in ``run_dir`` cannot be reopened by it.

    Learner-side roles (one instance each) are built here, on the CPU, and loaded: a resume whose
    ``--set`` changed a network's shape fails in one line before any cluster starts, not in a worker.
    So is every replica whose directory exists in the run (a replay store): one whose ``--set`` changed
    what it stores (``n_step``'s discount field, ``buffer_size``) refuses to open it, before writing.
    """
    from dagrl.replay.schema import ReplayError

    algo = graph.algorithm
    extra = sorted(set(roles) - set(algo.roles))
    if extra:
        raise ValueError(f"roles {', '.join(extra)} are not roles of algorithm {graph.spec.algorithm}")
    for role, states in roles.items():
        if algo.roles[role].many or not any(s is not None for s in states or []):
            continue
        cpu_host(graph, role, 0, Start(), states[0])
    if run_dir is None:
        return
    for role in graph.active_roles:
        for i in range(graph.role(role).replicas):
            path = role_path(graph, role, i, run_dir)
            if path is None or not os.path.isdir(path):
                continue
            try:
                cpu_host(graph, role, i, Start(run_dir=run_dir), None)  # reopens the role's data, or refuses
            except ReplayError as err:
                raise ValueError(f"role {role}[{i}]: {err}") from None


def cpu_host(graph: Graph, role: str, index: int, start: Start, state: Any) -> RoleHost:
    """Replica ``index`` of ``role`` in this process on the CPU, loaded with ``state`` (if not None);
    a state that does not load raises ``ValueError`` naming the role, in the algorithm's own terms."""
    args, kwargs = _host_args(graph, role, index, start)
    host = RoleHost(*args, **{**kwargs, "wants_gpu": False})
    try:
        host.load_state_dict(state)
    except Exception as err:  # a shape or key mismatch
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = " ".join(lines[:2])
        raise ValueError(f"role {role}: {detail[:300] or type(err).__name__}") from None
    return host


class WorkerLeft(RuntimeError):
    """The worker a role's actor was starting on left the cluster before the actor started."""


START_ATTEMPTS = 3
"""How many workers one replica is started on while the ones it was placed on leave under it."""
START_REPLACE_WAIT_S = 15.0
"""How long a replica whose worker left waits for a worker hosting nothing (a nanny restarts a killed
worker within seconds) before it shares a busy one that fits."""


def start_actors(
    client: Any, graph: Graph, start: Start | None = None, roles: list[str] | None = None
) -> dict[str, list[Handle]]:
    """Every replica of ``roles`` (default: all) as a Dask actor, pinned to a worker chosen by :func:`place`.

    A worker that leaves while its replicas start (preempted, killed, out of memory) does not end the
    run: each of its replicas is started again on another worker that fits, :data:`START_ATTEMPTS`
    times at most."""
    start = start or Start()
    workers = live_workers(client)
    wanted = {r: graph.spec.roles[r] for r in (roles or graph.active_roles)}
    learners = [r for r in data_parallel_roles(graph.algorithm) if r in wanted]
    placement = place(wanted, workers, gpu_fallback=graph.spec.gpu_fallback, near=learners)
    futures = {key: _submit(client, graph, *key, addr, start) for key, addr in placement.items()}
    hosts: dict[str, list[Handle]] = {role: [] for role in wanted}
    for (role, i), fut in sorted(futures.items()):
        for attempt in range(1, START_ATTEMPTS + 1):
            address = placement[(role, i)]
            try:
                actor = _started(client, fut, address, f"{role}[{i}]")
                break
            except WorkerLeft as err:
                fut.release()
                if attempt == START_ATTEMPTS:
                    raise RuntimeError(f"{err} ({attempt} workers tried)") from None
                placement[(role, i)] = _another_worker(client, graph, role, i, placement, address)
                log.warning("%s; starting it on %s", err, placement[(role, i)])
                fut = _submit(client, graph, role, i, placement[(role, i)], start)
        hosts[role].append(Handle(role, i, actor, placement[(role, i)], fut, host_id=fut.key))
    _log_devices(hosts)
    return hosts


def _another_worker(client: Any, graph: Graph, role: str, index: int, placement: dict, gone: str) -> str:
    """A live worker for ``role[index]`` after ``gone`` left: one hosting nothing if one comes within
    :data:`START_REPLACE_WAIT_S`, else the least loaded that fits (never one of its own data-parallel
    group's)."""
    import collections

    from dagrl.runtime.placement import place_one

    spec, end = graph.spec.roles[role], time.monotonic() + START_REPLACE_WAIT_S
    parallel = not graph.algorithm.roles[role].many and spec.replicas > 1
    while True:
        workers = {a: w for a, w in live_workers(client).items() if a != gone}
        load = collections.Counter(a for key, a in placement.items() if key != (role, index) and a in workers)
        avoid = frozenset(a for (r, j), a in placement.items() if parallel and r == role and j != index)
        address = place_one(role, spec, workers, load, graph.spec.gpu_fallback, avoid)
        if address is not None and (load[address] == 0 or time.monotonic() > end):
            return address
        if time.monotonic() > end + 60.0:
            raise RuntimeError(f"{role}[{index}]: no live worker can host it (needs {spec.resources})")
        time.sleep(0.25)


ACTOR_START_TIMEOUT_S = 300.0
"""How long a role actor may take to build its state (envs, networks, a replay store) on its worker."""


def _started(client: Any, fut: Any, address: str, what: str) -> Any:
    """The actor of ``fut``, or an error naming the role when its worker leaves (:class:`WorkerLeft`:
    an actor pinned to a dead worker would wait forever) or it does not start in
    :data:`ACTOR_START_TIMEOUT_S`."""
    from distributed import wait

    end = time.monotonic() + ACTOR_START_TIMEOUT_S
    while True:
        try:  # not fut.result(timeout=...): its timeout can surface as UnboundLocalError (dask/distributed#8514)
            wait(fut, timeout=2.0)
            return fut.result()
        except TimeoutError:
            if address not in live_workers(client):
                raise WorkerLeft(f"{what}: worker {address} left before the role's actor started") from None
            if time.monotonic() > end:
                raise RuntimeError(f"{what}: actor not started on {address} in {ACTOR_START_TIMEOUT_S:g} s") from None
        except Exception as err:
            if address in live_workers(client) or not _lost_with_worker(err):
                raise  # the role's own constructor raised
            raise WorkerLeft(f"{what}: worker {address} left before the role's actor started") from None


def _lost_with_worker(err: BaseException) -> bool:
    """Whether ``err`` is Dask's word for a task whose worker died (not the task's own exception)."""
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    return isinstance(err, KilledWorker | CommClosedError | OSError)


def start_one(client: Any, graph: Graph, role: str, index: int, address: str, start: Start) -> Handle:
    """One role replica as a Dask actor on ``address`` (a replacement for a failed one)."""
    fut = _submit(client, graph, role, index, address, start)
    try:
        return Handle(role, index, _started(client, fut, address, f"{role}[{index}]"), address, fut, host_id=fut.key)
    except BaseException:
        fut.release()
        raise


def _submit(client: Any, graph: Graph, role: str, index: int, address: str, start: Start) -> Any:
    args, kwargs = _host_args(graph, role, index, start)
    key = f"host-{role}-{index}-{uuid.uuid4().hex}"  # also the host's id on its worker
    return client.submit(
        RoleHost, *args, **kwargs, host_id=key, actor=True, workers=[address], allow_other_workers=False, key=key
    )


def _log_devices(hosts: dict[str, list[Handle]]) -> None:
    """Say where a role asked for a device it did not get; a worker lost meanwhile is the supervisor's
    to find at the first iteration."""
    for handles in hosts.values():
        for h in handles:
            try:
                info = h.info().result()
            except Exception as err:  # its worker left just now
                log.warning("%s[%d] on %s did not answer (%s)", h.role, h.index, h.address, err)
                continue
            if info["device_note"]:
                log.warning("%s[%d] on %s: %s", h.role, h.index, h.address or "this process", info["device_note"])
            log.debug("%s[%d] on %s pid %s device %s", h.role, h.index, h.address, info["pid"], info["device"])
