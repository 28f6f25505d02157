"""Stop signals: how a run ends when it is asked to, rather than when its stop condition holds.

Ctrl-C (``SIGINT``), ``SIGTERM`` and ``SIGUSR1`` mean the same to a run: finish the iteration in
flight, write a checkpoint and ``summary.json``, release the workers and the shared memory, and exit
with ``128 + signal`` (130, 143, 138). SLURM ends a job with ``SIGTERM`` at its walltime, on
``scancel`` and on preemption, and then ``SIGKILL`` after ``KillWait`` (30 s by default); it sends
``SIGUSR1`` that many seconds before the walltime when asked (``sbatch --signal=B:USR1@SECONDS``, which
``dagrl submit`` asks for). A second signal aborts at once, keeping the last periodic checkpoint; so does
an iteration still running ``checkpoint.stop_wait_s`` after the first, so that a slow iteration never
runs into the ``SIGKILL``.

Only the main thread can install signal handlers: elsewhere (a notebook's helper thread) the run stops
on its stop condition alone.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("dagrl")

__all__ = ["Aborted", "StopRequest", "stop_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class Aborted(KeyboardInterrupt):
    """A second stop signal, or an iteration that outlived ``checkpoint.stop_wait_s`` after the first:
    the run ends without its final checkpoint (the last periodic one is kept)."""

    def __init__(self, signum: int, why: str):
        self.signum, self.why = signum, why
        super().__init__(why)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopRequest:
    """Whether, and by which signal, the run was asked to stop; the driver asks it between iterations.

    >>> r = StopRequest()
    >>> r.is_set(), r.exit_code
    (False, 0)
    >>> r.request(signal.SIGTERM); r.is_set(), r.name, r.exit_code
    (True, 'SIGTERM', 143)
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.at: float | None = None
        self.finished = threading.Event()
        """Set once the iterations are over (the checkpoint is next): the abort timer stands down."""
        self.overdue = False
        """The iteration in flight outlived the wait: the next handler call aborts."""

    def is_set(self) -> bool:
        return self.event.is_set()

    def request(self, signum: int) -> None:
        if not self.event.is_set():
            self.signum, self.at = int(signum), time.monotonic()
            self.event.set()

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 0 if self.signum is None else 128 + self.signum


@contextlib.contextmanager
def stop_signals(wait_s: float = 20.0, request: StopRequest | None = None) -> Iterator[StopRequest]:
    """Inside it, a stop signal sets the :class:`StopRequest` it yields; a second one, or the first
    followed by ``wait_s`` seconds without :attr:`StopRequest.finished` being set, raises
    :class:`Aborted` in the main thread. The previous handlers come back on exit."""
    request = request or StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def abort_when_overdue() -> None:
        if not request.finished.wait(wait_s):
            request.overdue = True
            _thread.interrupt_main(request.signum or signal.SIGINT)  # runs handler() in the main thread

    def handler(signum: int, frame: Any) -> None:
        if request.is_set():
            if request.overdue:
                raise Aborted(request.signum or signum, f"the iteration in flight outlived stop_wait_s ({wait_s:g} s)")
            raise Aborted(signum, f"{signal.Signals(signum).name} again")
        request.request(signum)
        what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        log.warning("%s: stopping after this iteration, then a checkpoint (again to abort)", what)
        threading.Thread(target=abort_when_overdue, name="dagrl-stop-wait", daemon=True).start()

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield request
    finally:
        request.finished.set()
        for s, h in previous.items():
            signal.signal(s, h)
