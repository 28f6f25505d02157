"""Process groups for data-parallel role replicas (``dp-learners``): forming them, checking them.

Each replica of a data-parallel role lives in its own worker process, so the process's default
``torch.distributed`` group is that role's group. The driver picks the rendezvous (replica 0's host
and a port free there, asked of that worker), every replica joins with its rank at once, and
replica 0's state is copied to the others. Gradients are then averaged by the algorithm's own call
to :meth:`dagrl.core.context.RoleContext.average_gradients`; :func:`digest` lets the policy check that
the replicas really stayed identical.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import socket
from typing import Any

import numpy as np

log = logging.getLogger("dagrl")

# -- in the worker process ---------------------------------------------------------------------------


_RESERVED: dict[int, socket.socket] = {}
"""Rendezvous sockets this process listens on (:func:`reserve_port`), by port, until :func:`leave`."""


def reserve_port(host: str) -> int:
    """Listen on a free TCP port of ``host`` (this worker's Dask address), held for the rendezvous of a
    group whose rank 0 is this process: its store serves on that socket, so it is reachable on the
    interface Dask uses and no other, and no other process can take the port meanwhile."""
    sock = socket.create_server((host, 0), backlog=128)
    port = int(sock.getsockname()[1])
    _RESERVED[port] = sock
    return port


def interface_of(host: str) -> str | None:
    """The network interface holding address ``host`` here (``127.0.0.1`` -> ``lo``), if any.

    >>> interface_of("127.0.0.1")
    'lo'
    """
    import psutil

    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    return None


def _pin_interfaces(own_host: str | None) -> None:
    """Gloo's and NCCL's own connections on the interface of this worker's Dask address (where the user
    has not chosen one): both otherwise pick by the host name, which may be another network."""
    import os

    name = interface_of(own_host) if own_host else None
    if name:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, name)


def join(
    backend: str, host: str, port: int, rank: int, world: int, timeout_s: float, own_host: str | None = None
) -> None:
    """Make this process rank ``rank`` of a fresh default group (leaving any earlier one). Rank 0 serves
    the group's store on the socket :func:`reserve_port` holds for ``port``; the others connect to it."""
    global _JOINED
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()  # an earlier run's, or the worker code's own: a replica needs the default one
    _JOINED = False
    if world == 1:
        _release(port)
        return
    _pin_interfaces(own_host or (host if rank == 0 else None))
    timeout = datetime.timedelta(seconds=timeout_s)
    held = _RESERVED.get(port) if rank == 0 else None
    if rank == 0 and held is None:
        raise RuntimeError(f"rendezvous port {port} was not reserved in this process (reserve_port)")
    store = dist.TCPStore(
        host, port, world, rank == 0, timeout=timeout, master_listen_fd=held.fileno() if held else None
    )  # fmt: skip
    if held is not None:  # the store's server owns the descriptor now and closes it when the group goes:
        _RESERVED.pop(port, None)  # closing it again here would close whatever reused its number since
        held.detach()  # (once a replay shard's zarr event loop, which then hung every read)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    _JOINED = True


def _release(port: int | None = None) -> None:
    for p in [port] if port is not None else list(_RESERVED):
        sock = _RESERVED.pop(p, None)
        if sock is not None:
            sock.close()


_JOINED = False
"""This process's default group is one :func:`join` formed (not one its own code made)."""


def leave() -> None:
    """Leave the group :func:`join` made this process part of, if any (a local teardown: no peer is
    waited for). A group the process's own code formed is left alone."""
    global _JOINED
    import torch.distributed as dist

    if _JOINED and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _JOINED = False
    _release()


def digest(obj: Any) -> str:
    """A hash of a (nested) state dict's arrays and values: equal digests, bit-identical states."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                feed(x[k])
        elif isinstance(x, list | tuple):
            for v in x:
                feed(v)
        elif hasattr(x, "detach"):  # a tensor
            feed(x.detach().cpu().numpy())
        elif isinstance(x, np.ndarray):
            h.update(str(x.dtype).encode() + str(x.shape).encode())
            h.update(np.ascontiguousarray(x).tobytes())
        else:
            h.update(repr(x).encode())

    feed(obj)
    return h.hexdigest()


def gpu_id() -> str | None:
    """This process's CUDA device, as a UUID (two replicas on one GPU cannot use NCCL)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


# -- on the driver -----------------------------------------------------------------------------------


def choose_backend(wanted: str, infos: list[dict[str, Any]]) -> str:
    """``auto``: NCCL when every replica is on CUDA with a GPU of its own, else gloo.

    >>> choose_backend("auto", [{"device": "cuda", "gpu": "a"}, {"device": "cuda", "gpu": "b"}])
    'nccl'
    >>> choose_backend("auto", [{"device": "cuda", "gpu": "a"}, {"device": "cuda", "gpu": "a"}])
    'gloo'
    """
    if wanted != "auto":
        return wanted
    gpus = [i.get("gpu") for i in infos]
    on_cuda = all(i.get("device") == "cuda" for i in infos)
    return "nccl" if on_cuda and None not in gpus and len(set(gpus)) == len(gpus) else "gloo"


def form_group(client: Any, handles: list[Any], backend: str, timeout_s: float) -> None:
    """Join ``handles`` (the replicas of one role, one per worker) into a process group (``backend``
    as the graph says, ``auto`` chosen here). Raises :class:`~dagrl.runtime.supervisor.RoleFailure`
    if a replica is gone."""
    from distributed.comm import get_address_host

    addresses = [h.address for h in handles]
    if len(set(addresses)) != len(addresses):
        raise RuntimeError(
            f"{handles[0].role}: data-parallel replicas must run on distinct worker processes, got {addresses}"
        )
    infos = [f.result() for f in [h.info() for h in handles]]
    backend = choose_backend(backend, infos)
    host = get_address_host(addresses[0])
    port = client.run(reserve_port, host, workers=[addresses[0]])[addresses[0]]
    joins = [
        h.join_group(backend, host, port, rank, len(handles), timeout_s, get_address_host(h.address))
        for rank, h in enumerate(handles)
    ]
    for f in joins:
        f.result()
    log.info("%s: %d data-parallel replicas, %s group at %s:%d", handles[0].role, len(handles), backend, host, port)
