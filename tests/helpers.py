"""Small helpers shared by tests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import dagrl
from dagrl.graph import load_graph
from dagrl.runtime.rundir import RunDir


def train(graph_file: str, tmp_path: Any, overrides: list[str] = (), client: Any = None) -> tuple[dict, RunDir]:
    """Train a graph to its stop condition (through ``dagrl.train``); the summary and run directory."""
    graph = load_graph(graph_file, [*overrides, f"runs_dir={tmp_path}"])
    summary = dagrl.train(graph, client)
    return summary, RunDir(summary["run_dir"])


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
