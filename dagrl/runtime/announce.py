"""Reports that fragment tasks announce as Dask events, so the driver counts a rollout without a task of
its own per output (:class:`Announcements`), and the futures that stand on them (:class:`Announced`)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import CancelledError
from typing import Any

from dagrl.runtime.report import Report, report_from_message


class Announcements:
    """The reports that fragment tasks log as Dask events (``run_fragment``'s ``announce``), by task key.

    A sampler output that other tasks consume stays on its worker, and the driver needs only its
    :class:`Report`. A task per report (:func:`report` on the output's worker) costs the scheduler,
    the worker and this client a task's round trips and bookkeeping per rollout; an event is one
    message from the worker through the scheduler to this client's handler. A worker's messages reach
    the scheduler in the order it sent them, and the scheduler's reach this client in order, so a
    call's event has been handled here by the time its future reads ``finished``.
    """

    def __init__(self, client: Any):
        self.topic = f"dagrl-reports-{uuid.uuid4().hex[:12]}"
        self.client = client
        self.cond = threading.Condition()
        self.got: dict[str, Report] = {}
        self.forgotten: set[str] = set()
        """Keys forgotten before their event came (a cancelled call that still finished)."""
        client.subscribe_topic(self.topic, self._on_event)

    def _on_event(self, event: tuple[float, dict[str, Any]]) -> None:
        msg = event[1]
        with self.cond:
            if msg["key"] in self.forgotten:
                self.forgotten.discard(msg["key"])
                return
            self.got[msg["key"]] = report_from_message(msg)
            self.cond.notify_all()

    def take(self, key: str, timeout: float) -> Report | None:
        with self.cond:
            self.cond.wait_for(lambda: key in self.got, timeout)
            return self.got.pop(key, None)

    def forget(self, keys: Iterable[str]) -> None:
        with self.cond:
            for key in keys:
                if self.got.pop(key, None) is None:
                    self.forgotten.add(key)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the client may be closing
            self.client.unsubscribe_topic(self.topic)


class Announced:
    """The :class:`Report` of an announced call, shaped like the Dask future of a report task.

    Its status is the call's own (the call's output never travels); its result is the event the
    call's task logged. Should the event be missing once the call has finished (it never was in any
    run; the ordering in :class:`Announcements` says why), a report task computes it after
    ``GRACE_S``.
    """

    GRACE_S = 5.0

    def __init__(self, future: Any, board: Announcements, fallback: Any):
        self.future, self.board, self.fallback = future, board, fallback
        self.key = future.key
        self._value: Report | None = None
        self._finished_seen: float | None = None
        self._task: Any = None

    @property
    def status(self) -> str:
        return self.future.status

    def exception(self) -> BaseException | None:
        return self.future.exception()

    def add_done_callback(self, fn: Any) -> None:
        when_done(self.future, lambda _f: fn(self))

    def result(self, timeout: float | None = None) -> Report:
        if self._value is not None:
            return self._value
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.05 if deadline is None else min(0.05, max(0.0, deadline - time.monotonic()))
            got = self.board.take(self.key, left)
            if got is not None:
                self._value = got
                return got
            status = self.future.status
            if status == "error":
                raise self.future.exception()
            if status == "cancelled":
                raise CancelledError(self.key)
            if status == "finished":
                now = time.monotonic()
                self._finished_seen = self._finished_seen or now
                if now - self._finished_seen > self.GRACE_S:
                    self._task = self._task or self.fallback(self.future)
                    self._value = self._task.result(timeout)
                    return self._value
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no report of {self.key} yet")


def when_done(future: Any, fn: Any) -> None:
    """``fn(future)`` once ``future`` has finished (erred, cancelled), on the client's event loop.

    For a stamp of a time. ``Future.add_done_callback`` would hand each call to Dask's callback
    thread, a thread switch per fragment task; Dask's own coroutine behind it runs ``fn`` on the loop.
    """
    from distributed import Future
    from distributed.client import done_callback

    if isinstance(future, Future):
        future.client.loop.add_callback(done_callback, future, fn)
    else:
        future.add_done_callback(fn)


def dask_future(future: Any) -> Any:
    """The Dask future behind a call's future (an :class:`Announced` report stands on its call's)."""
    return future.future if isinstance(future, Announced) else future
