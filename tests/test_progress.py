"""The progress line: fits 80 columns, and log records and warnings go above it, not into it."""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings

import pytest

from dagrl.app.progress import Progress, format_row

BIG = {
    "iteration": 99999,
    "env_steps": 123_456_789,
    "episodes": 999_999,
    "time_s": 86399.9,
    "charts/episode_return_mean": -12345.6,
    "perf/sample_hz": 1.5e6,
    "perf/update_hz": 250_000.0,
}


@pytest.fixture
def dask_logger():
    """The "distributed" logger as distributed sets it up in a process of its own (pytest replaces it)."""
    logger = logging.getLogger("distributed")
    saved = list(logger.handlers), logger.propagate
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    logger.handlers[:], logger.propagate = [handler], False
    yield logger
    logger.handlers[:], logger.propagate = saved


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_fits_80_columns_even_with_large_numbers():
    assert len(format_row(BIG)) < 80
    assert len(format_row({**BIG, "charts/episode_return_mean": None})) < 80


def test_dask_log_records_and_warnings_print_above_the_line(dask_logger):
    term = Terminal()
    logger = dask_logger
    before = list(logger.handlers)
    progress = Progress(stream=term)
    progress.update({**BIG, "iteration": 1})
    logger.warning("Worker process still alive after 4.0 seconds, killing")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = warnings.showwarning  # catch_warnings restores it; progress wraps it meanwhile
        progress.close()
        progress = Progress(stream=term)
        progress.update({**BIG, "iteration": 2})
        warnings.warn("Creating scratch directories is taking a surprisingly long time", UserWarning, stacklevel=1)
        progress.close()
    out = term.getvalue()
    lines = out.split("\n")
    record = next(i for i, line in enumerate(lines) if "still alive" in line)
    shown = lines[record].rsplit("\r\x1b[K", 1)[1]  # what the terminal shows: the line cleared, then the record
    assert shown.endswith("distributed - WARNING - Worker process still alive after 4.0 seconds, killing")
    assert lines[record + 1].startswith("it     1 ")  # and the progress line drawn again below it
    shown = [line.rsplit("\r\x1b[K", 1)[1] for line in lines if "\r\x1b[K" in line]
    assert any("UserWarning: Creating scratch" in line for line in shown)
    assert logger.handlers == before


def test_workers_sharing_the_terminal_write_their_stderr_to_a_file(tmp_path):
    """What a local worker does when the driver draws the line on a terminal (runtime/preload.py)."""
    import subprocess

    code = (
        "import logging, os, sys, warnings, distributed\n"  # distributed's handler exists before the preload
        "from dagrl.runtime import preload\n"
        "preload.dask_setup(None)\n"
        "logging.getLogger('distributed').warning('Event loop was unresponsive in Worker for 3.1s')\n"
        "warnings.warn('a gymnasium warning')\n"
        "os.system('echo from-a-child-process >&2')\n"
        "print(os.getpid())\n"
    )
    env = {**os.environ, "DAGRL_WORKER_LOGS": str(tmp_path / "logs")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    text = (tmp_path / "logs" / f"worker-{out.stdout.strip()}.log").read_text()
    for line in ("distributed - WARNING - Event loop was unresponsive", "UserWarning: a gymnasium warning"):
        assert line in text, text
    assert "from-a-child-process" in text


def test_a_notebook_gets_tqdms_bar_by_default_and_a_terminal_nothing(monkeypatch, capsys):
    from dagrl.app import progress

    monkeypatch.setattr(progress, "in_notebook", lambda: False)
    assert isinstance(progress.progress_display(None, "run", 1000), progress.Progress)
    assert not progress.progress_display(None, "run", 1000).enabled
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    bar = progress.progress_display(None, "ppo-cartpole", 1000)
    assert isinstance(bar, progress.NotebookProgress)
    bar.update({"iteration": 3, "env_steps": 768, "episodes": 40, "time_s": 1.0, "charts/episode_return_mean": 21.5})
    assert bar.bar.n == 768 and bar.bar.total == 1000 and "ret 21.5" in str(bar.bar)
    bar.close()
    assert not isinstance(progress.progress_display(False, "run", 1000), progress.NotebookProgress)
