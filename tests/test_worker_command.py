"""`dagrl worker`: a hand-started Dask worker set up as dagrl's own clusters set theirs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from dagrl.clusters.worker import worker_command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def what_a_worker_sees() -> dict:
    import os

    import dask

    return {
        "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "profile": dask.config.get("distributed.worker.profile.enabled"),
        "preloaded": "dagrl.runtime.preload" in sys.modules,
    }


@pytest.fixture
def scheduler():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--dashboard-address", ":0", "--no-show"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    yield f"tcp://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(30)


def start(cmd: list[str], scheduler: str):
    from distributed import Client

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = Client(scheduler, timeout=30)
    try:
        client.wait_for_workers(1, timeout=60)
        return client.run(what_a_worker_sees), proc
    finally:
        client.close()


@pytest.mark.parametrize("command", ["dagrl worker", "dask worker"])
def test_a_hand_started_worker_runs_as_dagrls_own_do(command, scheduler):
    """Started with `dask worker`, the worker keeps Dask's trim threshold and profiler (what the check
    can tell apart); with `dagrl worker` it has neither, and dagrl's preload ran in it."""
    if command == "dagrl worker":
        cmd = [sys.executable, "-m", "dagrl", "worker", scheduler, "--nthreads", "1"]
    else:
        cmd = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--nthreads", "1"]
    seen, proc = start(cmd, scheduler)
    try:
        (worker,) = seen.values()
        if command == "dagrl worker":
            assert worker == {"trim": None, "profile": False, "preloaded": True}
        else:
            assert worker["trim"] is not None and worker["profile"] is True and not worker["preloaded"]
    finally:
        proc.terminate()
        proc.wait(30)
        time.sleep(0.2)


def test_the_worker_command_adds_gpus_to_the_resources_asked_for():
    cmd, env = worker_command(["tcp://h:1", "--resources", "CPU=2"], gpus=1)
    assert cmd[cmd.index("--resources") + 1] == "CPU=2,GPU=1" and "MALLOC_TRIM_THRESHOLD_" not in env
    cmd, _ = worker_command(["tcp://h:1", "--resources", "GPU=4"], gpus=1)
    assert cmd[cmd.index("--resources") + 1] == "GPU=4"


def test_a_closing_workers_heartbeat_race_is_not_logged_and_a_running_workers_failure_is():
    """Dask's shutdown race (the scheduler closes the heartbeat's connection as the worker closes) would
    print a traceback under a run that ended well; the same failure of a running worker is news."""
    import logging
    from types import SimpleNamespace

    from distributed.core import Status

    from dagrl.runtime.preload import _no_closing_heartbeat

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, msg, None, None)

    worker = SimpleNamespace(status=Status.running)
    keep = _no_closing_heartbeat(worker)
    heartbeat = record("Failed to communicate with scheduler during heartbeat.")
    assert keep(heartbeat)
    worker.status = Status.closing
    assert not keep(heartbeat)
    assert keep(record("Heartbeat to scheduler failed"))
