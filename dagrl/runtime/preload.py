"""Dask worker preload, run in every dagrl worker (LocalCluster and SLURM jobs).

A terminal's Ctrl-C is for the driver, which then checkpoints and shuts down. Ctrl-C sends SIGINT
to the whole foreground process group, worker processes included; if they died
with it, the learner's state would be gone before the driver could write its final checkpoint.
Workers ignore SIGINT; their nanny still stops them (SIGTERM) when the driver closes the cluster.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from typing import Any


def dask_setup(worker: Any) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Samplers with ``vector: async`` run each env in a subprocess. Dask starts workers as daemonic
    # processes, which multiprocessing forbids to have children; the env subprocesses are daemonic
    # themselves and end with the worker, so this process may start them.
    multiprocessing.current_process().daemon = False
