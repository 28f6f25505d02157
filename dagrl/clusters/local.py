"""The embedded LocalCluster: worker processes started and stopped by dagrl, and the environment
and Dask config its workers (and SLURM's) start with."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from typing import Any

from dagrl.clusters.spec import LocalClusterSpec

log = logging.getLogger("dagrl")


def cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # a broken CUDA install is "no GPU" here; the learner logs its fallback
        return 0


WORKER_ENVIRON_NOTE = """Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (glibc gives
freed memory back to the system eagerly); torch then pays for it on every allocation: a SAC update of
16 gradient steps took 110 ms in such a worker and 53 ms without it (or in the driver process) on the
2-core reference machine. dagrl's workers start without it (the thread caps stay): local ones through
the nanny config :func:`untrimmed` sets, SLURM and ``dagrl worker`` ones through :data:`STARTED_WORKER_ENVIRON` (a
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
        "to ~2 x slower. Start workers with `dagrl worker SCHEDULER` (or a cluster from Python inside "
        "`with dagrl.clusters.local.untrimmed():`), as dagrl's own clusters are."
    )


STARTED_WORKER_ENVIRON = {
    "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": "{'MALLOC_TRIM_THRESHOLD_': None}",
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
}
"""The environment of a worker dagrl does not start itself (a SLURM job, ``dagrl worker``): its nanny
starts it without ``MALLOC_TRIM_THRESHOLD_`` (Dask leaves out a pre-spawn variable whose value is None;
this one merges into Dask's defaults), and Dask's profiler is off (as :class:`LocalClusterSpec`'s default)."""


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
            scheduler_kwargs={"preload": list(spec.scheduler_preload)},  # the RL page: before the dashboard
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


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as a container or ``taskset`` sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
