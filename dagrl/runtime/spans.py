"""The streams' fragment calls in Dask's own Task Stream, without a task per call.

A sampler or learner loop (:mod:`dagrl.runtime.loops`) is one long-running task: Dask would show it
only when it ends, and nothing of the rollouts inside it. Each loop therefore keeps the spans of its
fragment calls and, at most every :data:`EVERY_S`, logs them as one Dask event
(``Worker.log_event``, on the worker's batched stream to the scheduler: no task, no round trip).
:class:`SpanPlugin` on the scheduler turns each span into a record of the Task Stream (the plugin
behind the dashboard's Task Stream page, ``distributed.diagnostics.task_stream``), keyed
``<fragment>-<role>-<replica>-<n>`` as a fragment task would be, so the page draws them as it draws
tasks. The records are read-only pictures: the scheduler keeps no task state for them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["EVERY_S", "TOPIC", "SpanPlugin", "Spans", "install"]

TOPIC = "dagrl-spans"
EVERY_S = 1.0
"""How often a loop sends the spans it gathered (one event each time, whatever their number)."""


class Spans:
    """The fragment spans of one role host's calls from the loops, sent in batches (module docstring)."""

    def __init__(self, role: str, index: int):
        from distributed import get_worker

        self.worker = get_worker()
        self.prefix = f"{role}-{index}"
        self.lock = threading.Lock()
        self.pending: list[tuple[str, int, float, float]] = []
        self.count = 0
        self.sent = -EVERY_S  # the first span goes at once: a short run still shows each loop

    def add(self, fragment: str, start: float, stop: float) -> None:
        """A call of ``fragment`` from ``start`` to ``stop`` (``time.time()``, as Dask's own records), on
        this thread."""
        with self.lock:
            self.pending.append((fragment, threading.get_ident(), start, stop))
            due = time.monotonic() - self.sent >= EVERY_S
        if due:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            if not self.pending:
                return
            spans, self.pending = self.pending, []
            first = self.count
            self.count += len(spans)
            self.sent = time.monotonic()
        msg = {"worker": self.worker.address, "prefix": self.prefix, "first": first, "spans": [list(s) for s in spans]}
        with contextlib.suppress(Exception):  # a picture only: a worker closing loses it
            self.worker.log_event(TOPIC, msg)


class SpanPlugin(SchedulerPlugin):
    """A scheduler plugin adding the loops' spans to the Task Stream (see the module docstring);
    registered by the stream policies (``Client.register_plugin``)."""

    name = "dagrl-spans"

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TOPIC:
            add_spans(self.scheduler, msg)


def install(client: Any) -> None:
    """Register :class:`SpanPlugin` on ``client``'s scheduler unless it has one (a kept cluster's later
    runs, a sweep's trials: Dask would warn that it overwrites it)."""
    if not client.run_on_scheduler(_installed):
        client.register_plugin(SpanPlugin())


def _installed(dask_scheduler: Any) -> bool:
    return SpanPlugin.name in dask_scheduler.plugins


def add_spans(scheduler: Any, msg: dict[str, Any]) -> None:
    """Append the spans of one event as Task Stream records."""
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    stream = scheduler.plugins.get(TaskStreamPlugin.name)
    if stream is None:
        stream = TaskStreamPlugin(scheduler)
        scheduler.add_plugin(stream)
    for n, (fragment, thread, start, stop) in enumerate(msg["spans"], msg["first"]):
        stream.buffer.append({
            "key": f"{fragment}-{msg['prefix']}-{n}", "worker": msg["worker"], "thread": thread,
            "startstops": [{"action": "compute", "start": start, "stop": stop}], "status": "OK",
            "nbytes": 0, "type": None,
        })  # fmt: skip
        stream.index += 1
