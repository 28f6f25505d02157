"""Cluster configs (``clusters/*.yaml``) and starting the Dask cluster they describe.

Launching is a flat dispatch over ``kind``:

* ``local``: an embedded LocalCluster of worker *processes*, started and stopped by dagrl (default);
* ``scheduler``: attach to a running Dask scheduler at ``address``.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dagrl.schema import ConfigError, from_dict, read_yaml

log = logging.getLogger("dagrl")

__all__ = ["LocalClusterSpec", "SchedulerSpec", "connect", "load_cluster"]


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
    profile: bool = False
    """Dask's statistical profiler in each worker; it samples every thread's stack every 10 ms, which
    cost Python-heavy samplers ~15-20 % of their throughput here, so it is off unless asked for."""

    def __post_init__(self) -> None:
        if self.workers != "auto" and self.workers < 1:
            raise ValueError(f"workers must be >= 1 or auto, got {self.workers}")
        if self.threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {self.threads_per_worker}")


@dataclass
class SchedulerSpec:
    kind: Literal["scheduler"]
    address: str
    """``tcp://HOST:PORT`` (or ``tls://``) of a running Dask scheduler."""

    def __post_init__(self) -> None:
        if "://" not in self.address:
            raise ValueError(f"address must look like tcp://HOST:PORT, got {self.address!r}")


ClusterSpec = LocalClusterSpec | SchedulerSpec
_KINDS: dict[str, type] = {"local": LocalClusterSpec, "scheduler": SchedulerSpec}


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
    return from_dict(_KINDS[kind], data, path)


def cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # a broken CUDA install is "no GPU" here; the learner logs its fallback
        return 0


@contextlib.contextmanager
def connect(spec: ClusterSpec, n_actors: int) -> Iterator[Any]:
    """Yield a ``distributed.Client`` for ``spec``; a cluster started here is closed on exit."""
    from distributed import Client

    if isinstance(spec, SchedulerSpec):
        with Client(spec.address, direct_to_workers=True) as client:
            yield client
        return
    cluster = local_cluster(spec, n_actors)
    try:
        with Client(cluster, direct_to_workers=True) as client:
            yield client
    finally:
        cluster.close()


def local_cluster(spec: LocalClusterSpec, n_actors: int) -> Any:
    """A LocalCluster of worker processes for ``n_actors`` role actors (one each with ``workers: auto``).

    Workers ignore a terminal's Ctrl-C (see ``dagrl.runtime.preload``) and advertise ``GPU`` when
    this machine has CUDA devices.
    """
    import dask
    from distributed import LocalCluster

    n_workers = n_actors if spec.workers == "auto" else spec.workers
    resources = dict(spec.resources)
    if "GPU" not in resources and cuda_count():
        resources["GPU"] = float(cuda_count())
    with dask.config.set({"distributed.worker.profile.enabled": spec.profile}):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=spec.threads_per_worker,
            processes=True,
            memory_limit=spec.memory_per_worker,
            resources=resources or None,
            dashboard_address=spec.dashboard_address,
            host="127.0.0.1",
            preload=["dagrl.runtime.preload"],
        )
