"""A connected Dask client for a cluster spec: a LocalCluster started here, a running scheduler, or SLURM."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import ClusterSpec, SchedulerSpec, SlurmSpec
from dagrl.core.graph import Graph

CONNECT_TIMEOUT_S = 10
"""How long ``--scheduler ADDRESS`` waits for the scheduler to answer before a one-line error."""
WORKERS_TIMEOUT_S = 120
"""How long ``--scheduler ADDRESS`` waits for a first worker to join (workers started at the same time
as the run, by hand or by a job script, take some seconds)."""


@contextlib.contextmanager
def connect(spec: ClusterSpec, graph: Graph, run_dir: str | Path | None = None) -> Iterator[Any]:
    """Yield a ``distributed.Client`` for ``spec``, sized for ``graph``; a cluster started here is closed on exit."""
    from distributed import Client

    if isinstance(spec, SchedulerSpec):
        with Client(spec.address, direct_to_workers=True, timeout=CONNECT_TIMEOUT_S) as client:
            _wait_for_a_worker(client, spec.address)
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


def _wait_for_a_worker(client: Any, address: str, timeout: float = WORKERS_TIMEOUT_S) -> None:
    """Return once the scheduler has a worker; a one-line error after ``timeout`` seconds without one."""
    import logging

    from dagrl.runtime.placement import PlacementError
    from dagrl.runtime.workers import workers

    if workers(client):
        return
    logging.getLogger("dagrl").info("waiting up to %.0f s for a worker to join %s", timeout, address)
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise PlacementError(
            f"no worker joined {address} in {timeout:.0f} s: start workers with `dagrl worker {address}`"
        ) from None
