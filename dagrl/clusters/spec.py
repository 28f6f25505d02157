"""Cluster configs (``clusters/*.yaml``), validated; :mod:`dagrl.clusters.connect` starts what they describe.

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

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dagrl.core.graph import Graph
from dagrl.core.schema import ConfigError, from_dict, read_yaml

log = logging.getLogger("dagrl")

__all__ = ["LocalClusterSpec", "SchedulerSpec", "SlurmError", "SlurmSpec", "check_local", "load_cluster"]


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
    pack_samplers: bool = True
    """Where a graph asks for more samplers than this machine has cores, run as many as the cores allow,
    stepping the same envs in all (8 of 4 envs on 2 cores: 2 of 16; :func:`dagrl.app.packing.packed_samplers`);
    false: as the graph is written. A cluster you start yourself runs the graph as written."""
    scheduler_preload: list[str] = field(default_factory=lambda: ["dagrl.dashboard"])
    """Modules the scheduler imports as it starts (Dask's ``--preload``): ``dagrl.dashboard`` adds the RL
    page to its dashboard; add your own scheduler plugins here."""

    def __post_init__(self) -> None:
        if self.workers != "auto" and self.workers < 1:
            raise ValueError(f"workers must be >= 1 or auto, got {self.workers}")
        if self.threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {self.threads_per_worker}")
        if self.gpu_workers != "auto" and self.gpu_workers < 0:
            raise ValueError(f"gpu_workers must be >= 0 or auto, got {self.gpu_workers}")
        check_address(self.dashboard_address, "dashboard_address")
        limit = self.memory_per_worker
        if limit != "auto" and parse_memory(limit, "memory_per_worker") < MIN_WORKER_MEMORY:
            raise ValueError(
                f"memory_per_worker must be at least 512MiB (a worker with torch loaded holds ~350 MB), "
                f"got {self.memory_per_worker!r}"
            )


MIN_WORKER_MEMORY = 512 * 2**20


def check_address(address: str, key: str) -> None:
    """Refuse a ``host:port`` whose port is no port or whose host does not resolve here, before a
    cluster tries to listen on it."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not (port.isdigit() and 0 <= int(port) < 65536):
        raise ValueError(f"{key}: expected HOST:PORT (':0' for a free port), got {address!r}")
    host = host.strip("[]")
    if host:
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            raise ValueError(f"{key}: the host {host!r} of {address!r} does not resolve here") from None


def check_local(spec: LocalClusterSpec, graph: Graph) -> None:
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
    scheduler_preload: list[str] = field(default_factory=lambda: ["dagrl.dashboard"])
    """Modules the scheduler imports as it starts (Dask's ``--preload``): ``dagrl.dashboard`` adds the RL
    page to its dashboard; add your own scheduler plugins here."""
    requeue: bool = True
    """The driver job of ``dagrl submit`` may go back to the queue (``sbatch --requeue``): after a node
    failure or a preemption SLURM starts it again, and on the walltime warning (``signal_lead_s``) it
    queues itself again once its checkpoint is written; each time it continues the run from its newest
    checkpoint, until a stop condition holds. ``false``: the job ends there."""
    signal_lead_s: int = 120
    """Seconds before the driver job's walltime that SLURM sends it ``SIGUSR1`` (``sbatch
    --signal=B:USR1@N``): the driver finishes its iteration, writes a checkpoint and, with ``requeue``,
    goes back to the queue. SLURM checks time limits about once a minute, so the signal may come up to
    60 s early. 0: no warning (the ``SIGTERM`` at the walltime, 30 s before the ``SIGKILL``, still
    checkpoints if an iteration finishes in ``checkpoint.stop_wait_s``)."""

    def __post_init__(self) -> None:
        if self.signal_lead_s < 0:
            raise ValueError(f"signal_lead_s: must be >= 0, got {self.signal_lead_s}")
        walltime = slurm_seconds(self.driver.walltime or self.walltime, "walltime")
        if self.signal_lead_s >= walltime:
            raise ValueError(
                f"signal_lead_s: {self.signal_lead_s} s is not before the driver job's walltime "
                f"({self.driver.walltime or self.walltime}, {walltime} s)"
            )
        if not self.pools:
            raise ValueError("pools: name at least one pool, e.g. pools: {cpu: {cores: 1, memory: 4GiB}}")
        for name in self.pools:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"pools: pool names are letters, digits, - and _, got {name!r}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s: must be > 0, got {self.start_timeout_s}")


def slurm_seconds(text: str, key: str = "walltime") -> int:
    """Seconds of a SLURM time limit: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` or ``D-HH:MM:SS``.

    >>> slurm_seconds("01:30:00"), slurm_seconds("90"), slurm_seconds("2-00:00:00"), slurm_seconds("1-12")
    (5400, 5400, 172800, 129600)
    """
    days, dash, rest = str(text).strip().rpartition("-")
    try:
        parts = [int(p) for p in rest.split(":")]
        if dash:
            h, m, sec = (parts + [0, 0])[:3]
            total = int(days) * 86400 + h * 3600 + m * 60 + sec
        else:
            m_s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
            total = m_s[0] * 3600 + m_s[1] * 60 + m_s[2]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{key}: expected a SLURM time such as 01:00:00 or 2-00:00:00, got {text!r}") from None
    if total <= 0 or any(p < 0 for p in parts):
        raise ValueError(f"{key}: must be a positive time, got {text!r}")
    return total


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
