"""The scheduler's worker list, read one way (see :func:`workers`)."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
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


class WorkerGone(Exception):
    """The worker a call waits on was removed from the scheduler (:meth:`Departures.wait`)."""


class Departures:
    """The workers the scheduler removes, heard as it removes them (its ``remove-worker`` events).

    A call to a Dask actor whose worker is SIGKILLed does not fail: Dask retries it once the actor's
    task is back, which for a role never happens. A watch that asks the scheduler every ``poll_s``
    notices the death up to ``poll_s`` late; :meth:`wait` ends at the scheduler's event instead.

    It hears each watched worker on that worker's own event topic (the scheduler logs a removal there
    and on ``"all"``), not on ``"all"``: Dask keeps one handler per topic and client, so a user's own
    ``client.subscribe_topic("all", ...)`` would silence it, or it the user's. One per client
    (:func:`departures`).
    """

    def __init__(self, client: Any):
        self.loop = client.loop
        self._client = weakref.ref(client)  # not the client itself: the registry keys on it weakly
        self.users = 0
        """Who holds it (:func:`departures`, :meth:`release`): the last to let go unsubscribes, before
        its client closes (the scheduler otherwise tells the closing client of its own removal)."""
        self.gone: set[str] = set()
        self.topics: set[str] = set()
        """The addresses watched (:meth:`watch`): their topics are subscribed."""
        self._events: dict[str, Any] = {}
        """Address -> an ``asyncio.Event`` set on its removal, made on the client's loop as waits ask."""

    def watch(self, address: str) -> None:
        """Hear of ``address``'s removal from now on (a removal before this is found by a poll)."""
        if address in self.topics:  # asked at every look of a waiting call: no lock once watched
            return
        client = self._client()
        with _LOCK:
            if address in self.topics or client is None or self.users <= 0:
                return
            self.topics.add(address)
        client.subscribe_topic(address, functools.partial(self._on_event, address))

    def left(self, address: str) -> bool:
        """Whether the scheduler removed ``address``'s worker since it was first watched (no round trip)."""
        self.watch(address)
        return address in self.gone

    def _on_event(self, address: str, event: tuple[float, dict[str, Any]]) -> None:  # on the client's loop
        action = event[1].get("action")
        if action == "remove-worker":
            self.gone.add(address)
            if address in self._events:
                self._events.pop(address).set()
        elif action == "add-worker":  # a worker started again at that address
            self.gone.discard(address)

    def wait(self, future: Any, address: str | None, timeout: float) -> Any:
        """``future.result(timeout)``, or :class:`WorkerGone` as soon as ``address`` leaves."""
        from distributed.actor import ActorFuture

        if address is None or not isinstance(future, ActorFuture):
            return future.result(timeout=timeout)
        self.watch(address)

        async def first() -> Any:
            import asyncio

            if address in self.gone:
                raise WorkerGone(address)
            if address not in self._events:
                self._events[address] = asyncio.Event()
            left = self._events[address]

            async def call() -> Any:
                return await future

            answer, removed = asyncio.ensure_future(call()), asyncio.ensure_future(left.wait())
            await asyncio.wait({answer, removed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                removed.cancel()
                return answer.result()
            answer.cancel()
            if removed.done():
                raise WorkerGone(address)
            removed.cancel()
            raise TimeoutError

        from distributed.utils import sync

        return sync(self.loop, first)

    def release(self) -> None:
        """One holder lets go; the last unsubscribes."""
        with _LOCK:
            self.users -= 1
            client = self._client()
            if self.users > 0 or client is None:
                return
            _DEPARTURES.pop(client, None)
            topics, self.topics = self.topics, set()
        for address in topics:
            with contextlib.suppress(Exception):  # the client may be closing
                client.unsubscribe_topic(address)


_DEPARTURES: weakref.WeakKeyDictionary[Any, Departures] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def departures(client: Any) -> Departures:
    """The client's one :class:`Departures`, held until :meth:`Departures.release`."""
    with _LOCK:
        if client not in _DEPARTURES:
            _DEPARTURES[client] = Departures(client)
        found = _DEPARTURES[client]
        found.users += 1
        return found
