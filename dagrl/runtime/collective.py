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


def free_port() -> int:
    """A TCP port nobody listens on here now (the rendezvous of a group whose rank 0 is this host)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def join(backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
    """Make this process rank ``rank`` of a fresh default group (leaving any earlier one)."""
    global _JOINED
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()  # an earlier run's, or the worker code's own: a replica needs the default one
    _JOINED = False
    if world == 1:
        return
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    _JOINED = True


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
    port = client.run(free_port, workers=[addresses[0]])[addresses[0]]
    joins = [h.join_group(backend, host, port, rank, len(handles), timeout_s) for rank, h in enumerate(handles)]
    for f in joins:
        f.result()
    log.info("%s: %d data-parallel replicas, %s group at %s:%d", handles[0].role, len(handles), backend, host, port)
