"""Every notebook runs top to bottom (small budgets) and leaves no process behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from tests.test_slurm import CLUSTER

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def python_processes(marker: str | None = None) -> set[int]:
    """Python processes; with ``marker``, only those whose environment holds it (``NAME=value``): the
    notebook's kernel and whatever it started inherit it, other programs on the machine do not."""
    pids = {p.pid for p in psutil.process_iter(["name"]) if "python" in (p.info["name"] or "")}
    if marker is None:
        return pids
    name, _, value = marker.partition("=")
    mine = set()
    for pid in pids:
        try:
            if psutil.Process(pid).environ().get(name) == value:
                mine.add(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone, or another user's
    return mine


QUICK = {  # per notebook, what the tests set after its parameters cell: small budgets, runs under tmp_path
    "01-quickstart": {"SETTINGS": ["stop.iterations=6", "stop.mean_return=null"]},
    "02-distribution-policies": {"SETTINGS": ["stop.iterations=8", "stop.mean_return=null"]},
    "03-slurm": {"SETTINGS": ["stop.iterations=4", "stop.mean_return=null"]},
    "04-your-own-algorithm": {"ENV_STEPS": 4_000},
}


def with_parameters(nb: nbformat.NotebookNode, values: dict) -> nbformat.NotebookNode:
    """``nb`` with a cell setting ``values`` right after its cell tagged ``parameters`` (as papermill
    injects parameters): the notebook holds what a reader runs, the tests only override it."""
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    source = "\n".join(f"{k} = {v!r}" for k, v in values.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return nb


def run_notebook(name: str, tmp_path: Path, params: dict | None = None, **env: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    runs = str(tmp_path / "runs")
    where = {"WORK": runs} if name.startswith("04") else {"RUNS": runs}
    nb = with_parameters(nb, {**QUICK[name], **where, **(params or {})})
    before = python_processes()
    old = dict(os.environ)
    os.environ.update({"DAGRL_NOTEBOOK_RUNS": runs, **env})  # marks the kernel and what it starts
    try:
        NotebookClient(
            nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    end = time.monotonic() + 20  # workers and the kernel take a moment to exit
    marker = f"DAGRL_NOTEBOOK_RUNS={tmp_path / 'runs'}"
    while (left := python_processes(marker) - before) and time.monotonic() < end:
        time.sleep(0.5)
    leftover = [" ".join(psutil.Process(p).cmdline()[:4]) for p in left if psutil.pid_exists(p)]
    assert not leftover, f"{name} left processes behind: {leftover}"
    return nb


def outputs(nb: nbformat.NotebookNode) -> str:
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text", "") or str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


def test_quickstart(tmp_path):
    nb = run_notebook("01-quickstart", tmp_path)
    text = outputs(nb)
    assert "RL page: http://127.0.0.1:" in text and "/individual-dagrl" in text
    assert "6 iterations" in text
    assert any(o.get("output_type") == "display_data" for c in nb.cells for o in c.get("outputs", []))  # the curve


def test_distribution_policies(tmp_path):
    text = outputs(run_notebook("02-distribution-policies", tmp_path))
    for label in ("single", "sync", "async", "apex (DQN)"):
        assert f"{label} " in text


@pytest.mark.slurm
def test_slurm_notebook_submits_to_a_real_slurm(slurm, tmp_path):
    cluster = tmp_path / "slurm.yaml"
    cluster.write_text(CLUSTER.format(partition="debug"))
    text = outputs(run_notebook("03-slurm", tmp_path, {"CLUSTER": str(cluster)}))
    assert "SLURM controller reachable: True" in text
    assert "(worker job)" in text and "#SBATCH --gres=gpu:1" in text
    assert "COMPLETED" in text and "done (iterations)" in text
    assert not slurm.jobs()


def test_slurm_notebook_skips_without_slurm(tmp_path):
    empty = tmp_path / "slurm.conf"  # sinfo refuses it at once (a missing file: a minute of retries)
    empty.write_text("")
    text = outputs(run_notebook("03-slurm", tmp_path, SLURM_CONF=str(empty)))
    assert "No SLURM here" in text and text.count("skipped: no SLURM controller reachable") == 3
    assert "(worker job)" in text  # the dry run needs no SLURM


def test_your_own_algorithm(tmp_path):
    text = outputs(run_notebook("04-your-own-algorithm", tmp_path))
    assert "RL page: http://127.0.0.1:" in text and "/individual-dagrl" in text
    assert "single: " in text and "async: " in text, text
