"""Small helpers shared by tests."""

from __future__ import annotations

from typing import Any

from dagrl.graph import load_graph
from dagrl.policies import build_policy
from dagrl.runtime.driver import Trainer
from dagrl.runtime.progress import Progress
from dagrl.runtime.rundir import RunDir


def train(graph_file: str, tmp_path: Any, overrides: list[str] = (), client: Any = None) -> tuple[dict, RunDir]:
    """Train a graph to its stop condition and return the summary and run directory."""
    graph = load_graph(graph_file, [*overrides, f"runs_dir={tmp_path}"])
    rundir = RunDir.create(tmp_path, graph.name)
    policy = build_policy(graph, client, run_dir=rundir.path)
    try:
        summary = Trainer(graph, policy, rundir, progress=Progress(enabled=False)).run()
    finally:
        policy.close()
    return summary, rundir


def user_module(tmp_path: Any, monkeypatch: Any, name: str, source: str) -> str:
    """Write ``source`` as importable module ``name`` (a user's own algorithm file)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name
