"""Dask worker preload, run in every dagrl worker (LocalCluster and SLURM jobs).

A terminal's Ctrl-C is for the driver, which then checkpoints and shuts down. Ctrl-C sends SIGINT
to the whole foreground process group, worker processes included; if they died
with it, the learner's state would be gone before the driver could write its final checkpoint.
Workers ignore SIGINT; their nanny still stops them (SIGTERM) when the driver closes the cluster.

When the driver draws its live progress line on a terminal that its local workers share, it sets
``DAGRL_WORKER_LOGS``: each worker then writes its stderr (Dask's log records, warnings, env output)
to ``<that directory>/worker-<pid>.log`` instead of over the line.

A closing worker moves every object it holds into the garbage collector's permanent generation
(``gc.freeze``): the process is about to exit, and the collections of its shutdown otherwise walk
torch's and the role's objects once more. Closing a LocalCluster of three workers that had imported
torch took 1.15 s without it and 0.19 s with it (BENCHMARKS.md, start and stop cost).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import threading
from pathlib import Path
from typing import Any

LOGS_ENV = "DAGRL_WORKER_LOGS"


def stderr_to_file(directory: str | Path) -> Path:
    """Point this process's stderr (file descriptor 2, so Python's and C's writes alike) at a file."""
    path = Path(directory) / f"worker-{os.getpid()}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    return path


def dask_setup(worker: Any) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Samplers with ``vector: async`` run each env in a subprocess. Dask starts workers as daemonic
    # processes, which multiprocessing forbids to have children; the env subprocesses are daemonic
    # themselves and end with the worker, so this process may start them.
    multiprocessing.current_process().daemon = False
    if os.environ.get(LOGS_ENV):
        stderr_to_file(os.environ[LOGS_ENV])
    if not os.environ.get("DAGRL_DEBUG"):
        logging.getLogger("distributed.worker").addFilter(_no_task_errors)
    logging.getLogger("distributed.worker").addFilter(_no_closing_heartbeat(worker))


def _no_task_errors(record: logging.LogRecord) -> bool:
    """Drop Dask's "Compute Failed" record (a task's exception and traceback, each time): the driver
    hears of every failed fragment and says it in one line naming role, worker and error, the failure
    kept in ``events.jsonl``; ``dagrl --debug`` keeps Dask's records."""
    return not str(record.msg).startswith("Compute Failed")


def _no_closing_heartbeat(worker: Any) -> Any:
    """Drop the heartbeat failure a closing worker logs (a traceback of some 30 lines) when the scheduler
    has already closed its end of the heartbeat's connection: a race of Dask's shutdown, not a fault.
    A running worker's failure (its scheduler gone) is still logged."""
    from distributed.core import Status

    def keep(record: logging.LogRecord) -> bool:
        closing = worker.status in (Status.closing, Status.closing_gracefully, Status.closed)
        return not (closing and str(record.msg).startswith("Failed to communicate with scheduler during heartbeat"))

    return keep


def dask_teardown(worker: Any) -> None:
    gc.freeze()
