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


def answers(client: Any, address: str, timeout_s: float = 1.0) -> bool:
    """Whether ``address``'s host accepts a TCP connection from the scheduler within ``timeout_s``.

    The host's kernel completes the handshake whatever the worker process is doing, so a worker busy
    in a long fragment (its event loop held, its heartbeats late) answers, while one behind a
    partition (the connection attempt unanswered) or whose process is gone (refused) does not. True
    when this cannot be asked (no TCP address, or no scheduler reached): the caller then waits for
    its own, longer bound.
    """
    from distributed.comm import get_address_host_port

    try:
        host, port = get_address_host_port(address)
    except ValueError:
        return True

    async def connect() -> bool:
        import asyncio

        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        return True

    try:
        return bool(client.run_on_scheduler(connect))
    except Exception:  # noqa: BLE001 (a client reconnecting: no verdict)
        return True
