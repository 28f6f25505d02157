"""Cluster configs (``clusters/*.yaml``) and starting the Dask cluster they describe.

Launching is a flat dispatch over ``kind``:

* ``local``: an embedded LocalCluster of worker *processes*, started and stopped by dagrl (default);
* ``scheduler``: attach to a running Dask scheduler at ``address``;
* ``slurm``: a scheduler in this process and one SLURM job per role actor, in per-role pools
  (:mod:`dagrl.clusters.slurm`); ``dagrl submit`` runs that process itself as a SLURM job.

Example ``clusters/local.yaml``::

    kind: local
    workers: auto            # one per role replica, the default
    threads_per_worker: 1
    memory_per_worker: auto
    dashboard_address: 127.0.0.1:8787
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dagrl.core.schema import ConfigError, from_dict, read_yaml

log = logging.getLogger("dagrl")

__all__ = ["LocalClusterSpec", "SchedulerSpec", "SlurmError", "SlurmSpec", "check_local", "connect", "load_cluster"]


class SlurmError(RuntimeError):
    """SLURM refused something (sbatch's own reason, on one line), or its jobs did not start."""


@dataclass
class LocalClusterSpec:
    kind: Literal["local"] = "local"
    workers: int | Literal["auto"] = "auto"
    """Worker processes; ``auto``: one per role replica of the graph."""
    threads_per_worker: int = 1
    memory_per_worker: str = "auto"
    """Memory limit per worker (``4GiB``) or ``auto`` (the machine's memory split evenly)."""
    dashboard_address: str = "127.0.0.1:8787"
    """Where the Dask dashboard listens; loopback unless you name another address (``:0`` picks a free port)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Resources every worker advertises; ``GPU`` defaults to the number of CUDA devices seen here."""
    gpu_workers: int | Literal["auto"] = "auto"
    """Workers that each own one GPU (``CUDA_VISIBLE_DEVICES`` pinned, advertising ``GPU=1``); the
    other workers are CPU-only. ``auto``: one per CUDA device seen here (none on a CPU machine)."""
    profile: bool = False
    """Dask's statistical profiler in each worker; it samples every thread's stack every 10 ms, which
    cost Python-heavy samplers ~15-20 % of their throughput here, so it is off unless asked for."""
    quiet: bool = True
    """Dask's periodic housekeeping at the calmer intervals of :data:`QUIET_CONFIG`, and messages not
    sized for Dask's offload thread; ``false``: Dask's own."""

    def __post_init__(self) -> None:
        if self.workers != "auto" and self.workers < 1:
            raise ValueError(f"workers must be >= 1 or auto, got {self.workers}")
        if self.threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {self.threads_per_worker}")
        if self.gpu_workers != "auto" and self.gpu_workers < 0:
            raise ValueError(f"gpu_workers must be >= 0 or auto, got {self.gpu_workers}")
        limit = self.memory_per_worker
        if limit != "auto" and parse_memory(limit, "memory_per_worker") < MIN_WORKER_MEMORY:
            raise ValueError(
                f"memory_per_worker must be at least 512MiB (a worker with torch loaded holds ~350 MB), "
                f"got {self.memory_per_worker!r}"
            )


MIN_WORKER_MEMORY = 512 * 2**20


def check_local(spec: LocalClusterSpec, graph: Any) -> None:
    """Refuse, before anything starts, a graph the local cluster of ``spec`` cannot host: a role
    asking for a resource or more threads than its workers have, or more workers than this machine
    can run (a typo such as ``replicas: 10000``)."""

    cores = os.cpu_count() or 1
    most = max(64, 8 * cores)
    n_workers = graph.n_actors if spec.workers == "auto" else spec.workers
    roles = graph.active_roles
    if n_workers > most and graph.n_actors <= most:
        raise ConfigError(
            "cluster", "workers", f"{spec.workers}: more worker processes than the {most} one {cores}-core machine runs"
        )
    if graph.n_actors > most:
        name = max(roles, key=lambda r: roles[r].replicas)
        raise ConfigError(
            graph.path,
            f"roles.{name}.replicas",
            f"{roles[name].replicas}: {graph.n_actors} role actors in all, more than the {most} one "
            f"{cores}-core machine runs (use a SLURM cluster file for more)",
        )
    offered = {**spec.resources, "CPU": spec.threads_per_worker}
    for name, role in roles.items():
        for key, amount in role.resources.items():
            if key == "GPU":
                continue  # judged by gpu_fallback
            if key not in offered:
                raise ConfigError(
                    graph.path,
                    f"roles.{name}.resources.{key}",
                    f"{amount:g}: no worker of the local cluster advertises {key} "
                    f"(add it to the cluster file's resources:)",
                )
            if amount > offered[key]:
                what = "threads_per_worker" if key == "CPU" else f"resources.{key}"
                raise ConfigError(
                    graph.path,
                    f"roles.{name}.resources.{key}",
                    f"{amount:g}: the local cluster's workers offer {offered[key]:g} ({what})",
                )


@dataclass
class SchedulerSpec:
    kind: Literal["scheduler"]
    address: str
    """``tcp://HOST:PORT`` (or ``tls://``) of a running Dask scheduler."""

    def __post_init__(self) -> None:
        if "://" not in self.address:
            raise ValueError(f"address must look like tcp://HOST:PORT, got {self.address!r}")


@dataclass
class PoolSpec:
    """One kind of SLURM worker job; every role actor gets a job of the pool its resources fit."""

    cores: int = 1
    memory: str = "4GiB"
    gpus: int = 0
    """GPUs per job: ``--gres=gpu:N``, and the worker advertises ``GPU=N``."""
    partition: str | None = None
    """Overrides the cluster's partition for this pool (e.g. a GPU partition)."""
    account: str | None = None
    walltime: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    """Further resources the pool's workers advertise (``SSD: 1``)."""
    job_extra: list[str] = field(default_factory=list)
    """Extra ``#SBATCH`` options, e.g. ``--constraint=a100``."""

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")
        parse_memory(self.memory)


@dataclass
class DriverJobSpec:
    """The job ``dagrl submit`` runs the driver (and the Dask scheduler) in."""

    cores: int = 1
    memory: str = "4GiB"
    walltime: str | None = None

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}")
        parse_memory(self.memory)


@dataclass
class SlurmSpec:
    kind: Literal["slurm"]
    pools: dict[str, PoolSpec]
    """Named job shapes; each role goes to the pool its resource annotations fit."""
    partition: str | None = None
    account: str | None = None
    walltime: str = "01:00:00"
    driver: DriverJobSpec = field(default_factory=DriverJobSpec)
    prologue: list[str] = field(default_factory=list)
    """Shell lines run first in every job (``module load cuda``, ``conda activate dagrl``)."""
    python: str | None = None
    """Python on the compute nodes; default: the one running dagrl now."""
    interface: str | None = None
    """Network interface scheduler and workers talk over (``ib0``); default: the hostname's address."""
    log_directory: str | None = None
    """Where job logs go; default ``<run dir>/logs``."""
    tls: bool = True
    """Scheduler, workers and client talk TLS with certificates generated per run."""
    dashboard_address: str = "127.0.0.1:8787"
    """Loopback on the driver's node unless you name another address; reach it with an ssh tunnel."""
    start_timeout_s: float = 600.0
    """How long to wait for every worker job to start before giving up (jobs queued behind others)."""
    quiet: bool = True
    """Dask's periodic housekeeping at the calmer intervals of :data:`QUIET_CONFIG`, and messages not
    sized for Dask's offload thread, in the scheduler and every worker job; ``false``: Dask's own."""

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("pools: name at least one pool, e.g. pools: {cpu: {cores: 1, memory: 4GiB}}")
        for name in self.pools:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"pools: pool names are letters, digits, - and _, got {name!r}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s: must be > 0, got {self.start_timeout_s}")


def workers(client: Any) -> dict[str, dict[str, Any]]:
    """The scheduler's workers now: address -> info (``resources``, ``name``, ``nthreads``, ``status``).

    Not ``client.scheduler_info(n_workers=-1)["workers"]``: that returns the client's shared cached
    identity, which the client's own periodic refresh (``distributed.client.scheduler-info-interval``,
    2 s) overwrites with one asked for ``n_workers=0``, whose ``workers`` is empty. A thread reading it
    just after that refresh sees a cluster with no workers, and every role on it as lost.

    Raises ``OSError`` where the client has no scheduler to ask (closed, or its scheduler gone).
    """
    scheduler = client.scheduler
    if scheduler is None or client.status not in ("running", "connecting"):
        raise OSError(f"the Dask client is {client.status}: no scheduler to ask for its workers")
    return dict(client.sync(scheduler.identity, n_workers=-1).get("workers", {}))


def parse_memory(text: str, key: str = "memory") -> int:
    from dask.utils import parse_bytes

    try:
        return parse_bytes(text)
    except (ValueError, TypeError):
        raise ValueError(f"{key} must look like 4GiB or 512MB, got {text!r}") from None


ClusterSpec = LocalClusterSpec | SchedulerSpec | SlurmSpec
_KINDS: dict[str, type] = {"local": LocalClusterSpec, "scheduler": SchedulerSpec, "slurm": SlurmSpec}


def load_cluster(path: str | Path | None = None, scheduler: str | None = None) -> ClusterSpec:
    """Read and validate a cluster file; ``scheduler`` (an address) overrides it; neither: local."""
    if scheduler is not None:
        return from_dict(SchedulerSpec, {"kind": "scheduler", "address": scheduler}, "--scheduler")
    if path is None:
        return LocalClusterSpec()
    data = read_yaml(path)
    kind = data.get("kind", "local")
    if kind not in _KINDS:
        raise ConfigError(path, "kind", f"unknown cluster kind {kind!r} (expected one of: {', '.join(_KINDS)})")
    spec = from_dict(_KINDS[kind], data, path)
    if kind == "slurm":
        try:
            import dask_jobqueue  # noqa: F401
        except ImportError:
            raise ConfigError(path, "kind", "slurm needs dask-jobqueue: pip install 'dagrl[slurm]'") from None
    return spec


def cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # a broken CUDA install is "no GPU" here; the learner logs its fallback
        return 0


CONNECT_TIMEOUT_S = 10
"""How long ``--scheduler ADDRESS`` waits for the scheduler to answer before a one-line error."""


@contextlib.contextmanager
def connect(spec: ClusterSpec, graph: Any, run_dir: str | Path | None = None) -> Iterator[Any]:
    """Yield a ``distributed.Client`` for ``spec``, sized for ``graph``; a cluster started here is closed on exit."""
    from distributed import Client

    if isinstance(spec, SchedulerSpec):
        with Client(spec.address, direct_to_workers=True, timeout=CONNECT_TIMEOUT_S) as client:
            yield client
        return
    if isinstance(spec, SlurmSpec):
        from dagrl.clusters import slurm

        with slurm.cluster(spec, graph, run_dir) as client:
            yield client
        return
    cluster = local_cluster(spec, graph.n_actors, graph.n_gpu_actors)
    try:
        with Client(cluster, direct_to_workers=True) as client:
            yield client
    finally:
        cluster.close()


WORKER_ENVIRON_NOTE = """Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (glibc gives
freed memory back to the system eagerly); torch then pays for it on every allocation: a SAC update of
16 gradient steps took 110 ms in such a worker and 53 ms without it (or in the driver process) on the
2-core reference machine. dagrl's workers start without it (the thread caps stay): local ones through
the nanny config :func:`untrimmed` sets, SLURM ones through the job script (``slurm.UNSET_TRIM``: a
pre-spawn variable set to None in Dask's config is left out)."""


DASK_TRIM = "65536"
"""Dask's default ``MALLOC_TRIM_THRESHOLD_`` for workers (``distributed.nanny.pre-spawn-environ``)."""


def trim_warning(actors: list[dict[str, Any]]) -> str | None:
    """What to tell a user whose actors (``policy.actors()``) run with Dask's trim threshold, if any do."""
    slow = sorted({f"{a['role']}[{a['index']}]" for a in actors if "MALLOC_TRIM_THRESHOLD_" in a.get("env", {})})
    if not slow:
        return None
    return (
        f"{', '.join(slow)} run with MALLOC_TRIM_THRESHOLD_ set (Dask's nanny default): torch updates there run up "
        "to ~2 x slower. Start the cluster inside `with dagrl.clusters.spec.untrimmed():`, as dagrl's own clusters "
        "are."
    )


def worker_environ(quiet: bool = False) -> dict[str, Any]:
    """What Dask's nannies set before starting a worker, less ``MALLOC_TRIM_THRESHOLD_``
    (:data:`WORKER_ENVIRON_NOTE`); with ``quiet``, :data:`QUIET_CONFIG`'s offload setting, which a
    worker reads as it imports Dask."""
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    if quiet:
        environ.update(config_environ({"distributed.comm.offload": QUIET_CONFIG["distributed.comm.offload"]}))
    trim = environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    # a nanny sets its pre-spawn variables in its own process too, so every worker spawned from here
    # later inherits them: drop the one a plain LocalCluster of this process left behind
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") in {str(trim), DASK_TRIM}:  # the config's, or Dask's default
        del os.environ["MALLOC_TRIM_THRESHOLD_"]
    return environ


@contextlib.contextmanager
def untrimmed(quiet: bool = False) -> Iterator[None]:
    """Clusters started inside start their workers without ``MALLOC_TRIM_THRESHOLD_`` (a nanny reads the
    setting when it is created: workers added later, e.g. by adaptive scaling, are not covered)."""
    import dask

    with dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ(quiet)}):
        yield


def config_environ(config: dict[str, Any]) -> dict[str, str]:
    """``config`` as the environment variables Dask reads it from (``DASK_A__B_C`` is ``a.b-c``)."""
    return {f"DASK_{key.upper().replace('.', '__').replace('-', '_')}": str(value) for key, value in config.items()}


QUIET_CONFIG = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.scheduler.work-stealing": False,
    "distributed.comm.offload": False,
}
"""Dask's periodic callbacks on dagrl's local clusters (Dask's defaults: 20 ms, 500 ms, 100 ms, on),
and messages serialized on the event loop (Dask's default: sized first, those over 10 MiB handed to
a thread).

Every worker, every nanny and the scheduler run them, and the nannies and the scheduler share the
driver's process. An idle LocalCluster of 9 workers used 0.26 cores of this 2-core machine with
Dask's defaults and 0.05 with these (BENCHMARKS.md). The tick only measures event-loop stalls, the
system monitor feeds the dashboard's CPU and memory plots, the memory monitor enforces the worker's
memory limit (within half a second instead of a tenth), and work stealing moves tasks that may run
elsewhere, which no dagrl task may: each is pinned to its role's worker. Offloading sizes every
message before it is sent (``dask.sizeof`` samples the items of a list), 7 % of the driver
process's busy time in a profile of image rollouts moving between workers, for messages whose
arrays travel as frames without a copy anyway; without it a `sync` PPO run took 0.93 x as long
(median of 24 alternated runs, BENCHMARKS.md).
"""


def quiet_here(config: dict[str, Any]) -> Any:
    """``dask.config.set(config)`` for a cluster started in this process, plus what Dask reads only
    when it is imported: ``distributed.comm.offload`` (a module constant of ``distributed.comm.utils``,
    set here for the rest of the process: the scheduler and nannies it starts live that long). Worker
    processes read it from the environment (:func:`worker_environ`, the job scripts' exports)."""
    import dask
    from distributed.comm import utils

    if "distributed.comm.offload" in config:
        utils.OFFLOAD_THRESHOLD = config["distributed.comm.offload"]
    return dask.config.set(config)


def local_cluster(spec: LocalClusterSpec, n_actors: int, gpu_actors: int = 0) -> Any:
    """A LocalCluster of worker processes for ``n_actors`` role actors (one each with ``workers: auto``).

    ``gpu_actors`` of them ask for a GPU: each GPU worker gets a thread for each it may host
    (``ceil(gpu_actors / GPUs)``, at least ``threads_per_worker``), so roles sharing a GPU
    (``GPU: 0.5`` each) run their fragments at the same time, as they would on GPUs of their own.

    Workers ignore a terminal's Ctrl-C (see ``dagrl.runtime.preload``), advertise ``GPU`` when
    this machine has CUDA devices, and start without Dask's ``MALLOC_TRIM_THRESHOLD_``
    (:data:`WORKER_ENVIRON_NOTE`). With ``spec.quiet`` the scheduler, nannies and workers keep
    house at the intervals of :data:`QUIET_CONFIG`.
    """
    from distributed import LocalCluster

    from dagrl.dashboard import register

    register()  # the RL page, before the scheduler's dashboard starts
    gpus = cuda_count() if spec.gpu_workers == "auto" else spec.gpu_workers
    n_workers = max(n_actors if spec.workers == "auto" else spec.workers, gpus)
    config = {"distributed.worker.profile.enabled": spec.profile, **(QUIET_CONFIG if spec.quiet else {})}
    with untrimmed(spec.quiet), quiet_here(config):
        cluster = LocalCluster(
            n_workers=n_workers - gpus,
            threads_per_worker=spec.threads_per_worker,
            processes=True,
            memory_limit=spec.memory_per_worker,
            resources=dict(spec.resources) or None,
            dashboard_address=spec.dashboard_address,
            host="127.0.0.1",
            preload=["dagrl.runtime.preload"],
        )
        if gpus:
            threads = max(spec.threads_per_worker, math.ceil(gpu_actors / gpus))
            add_gpu_workers(cluster, gpus, spec.resources, threads)
        return cluster


def add_gpu_workers(cluster: Any, count: int, resources: dict[str, float], threads: int | None = None) -> None:
    """Add ``count`` workers to a LocalCluster, worker ``i`` seeing only CUDA device ``i`` and advertising ``GPU=1``;
    ``threads`` each (default: the cluster's threads per worker).

    LocalCluster starts identical workers; it is a SpecCluster, so differently shaped workers are
    further entries of its ``worker_spec``.
    """
    template = cluster.new_spec
    for i in range(count):
        options = dict(template["options"])
        options["resources"] = {**resources, "GPU": 1.0}
        if threads is not None:
            options["nthreads"] = threads
        options["env"] = {**options.get("env", {}), "CUDA_VISIBLE_DEVICES": str(i)}
        cluster.worker_spec[f"gpu-{i}"] = {"cls": template["cls"], "options": options}
    cluster.sync(cluster._correct_state)
    cluster.wait_for_workers(len(cluster.worker_spec))
