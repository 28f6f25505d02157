"""Small helpers shared by tests."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed.diagnostics.plugin import WorkerPlugin

import dagrl
from dagrl.app.graphs import load_graph
from dagrl.runtime.rundir import RunDir


def train(graph_file: str, tmp_path: Any, overrides: list[str] = (), client: Any = None) -> tuple[dict, RunDir]:
    """Train a graph to its stop condition (through ``dagrl.train``); the summary and run directory."""
    graph = load_graph(graph_file, [*overrides, f"runs_dir={tmp_path}"])
    summary = dagrl.train(graph, client)
    return summary, RunDir(summary["run_dir"])


def wait_for(predicate: Any, timeout: float, what: str, every: float = 0.25) -> Any:
    """``predicate()``'s first true value, asked every ``every`` s; an ``AssertionError`` naming ``what``
    after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(every)
    return value


@contextlib.contextmanager
def dagrl_log() -> Iterator[list[str]]:
    """The messages the ``dagrl`` logger gives at INFO and above meanwhile (a handler of its own: the
    CLI's tests may have stopped ``dagrl`` propagating to pytest's capture)."""
    import logging

    logger, messages = logging.getLogger("dagrl"), []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def descendants() -> dict[int, list[str]]:
    """This process's descendants by pid, with their command lines, less multiprocessing's resource
    tracker (one per process, kept) and the Debian installs the tests run meanwhile (``tests/debian.py``)."""
    from tests import debian

    found = {}
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            line = proc.cmdline()
            lineage = {proc.pid, *(parent.pid for parent in proc.parents())}
            if "resource_tracker" not in " ".join(line) and not lineage & debian.installing:
                found[proc.pid] = line
    return found


def user_module(tmp_path: Any, monkeypatch: Any, name: str, source: str) -> str:
    """Write ``source`` as importable module ``name`` (a user's own algorithm file)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``1m``, ``3M``) mounted at ``path``: a disk that fills up. Needs root, as CI
    has; elsewhere the test is skipped."""
    path.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


class TaskSpans(WorkerPlugin):
    """Each task's time executing, on its worker's own clock. Dask's task stream shifts a worker's times
    by its estimate of the scheduler's clock offset, re-estimated at each heartbeat, so two tasks of one
    worker may seem to overlap there by whatever the estimate moved between them."""

    name = "dagrl-tests-task-spans"

    def setup(self, worker: Any) -> None:
        self.started: dict[Any, float] = {}
        self.spans: dict[Any, tuple[float, float]] = {}

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            self.started[key] = time.monotonic()
        elif start == "executing" and key in self.started:
            self.spans[key] = (self.started.pop(key), time.monotonic())


@contextlib.contextmanager
def task_spans(client: Any) -> Iterator[Any]:
    """Within: record each task's span on its worker (:class:`TaskSpans`); yields ``spans(address)``,
    the spans of that worker's tasks by key, (start, stop) on that worker's monotonic clock."""
    client.register_plugin(TaskSpans())

    def spans(address: str) -> dict[Any, tuple[float, float]]:
        return client.run(lambda dask_worker: dask_worker.plugins[TaskSpans.name].spans, workers=[address])[address]

    try:
        yield spans
    finally:
        client.unregister_worker_plugin(TaskSpans.name)
