"""The scheduler's worker list, read one way (see :func:`workers`)."""

from __future__ import annotations

from typing import Any


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
