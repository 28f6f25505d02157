"""Stop signals end a run cleanly (:mod:`dagrl.app.signals`): Ctrl-C, SIGTERM (SLURM's walltime, scancel,
preemption) and SIGUSR1 (SLURM's warning before walltime) finish the iteration, checkpoint it, write the
summary, stop every process and exit with 128 + the signal; a second one, or an iteration that outlives
``checkpoint.stop_wait_s``, aborts on the last periodic checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dagrl.runtime.checkpoint import load_checkpoint
from dagrl.runtime.rundir import RunDir
from tests.helpers import wait_for

SLOW_ENV = [
    "--set", "env.id=dagrl.envs:CostlyCartPole-v0", "--set", "env.kwargs={step_ms: 20}",
    "--set", "roles.sampler.vector=sync",
]  # fmt: skip
"""PPO's 256 env steps an iteration at 20 ms a step, in turn: an iteration of 5 s, long enough to signal into."""


def start(tmp_path: Path, graph: str, *settings: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dagrl", "run", f"graphs/{graph}.yaml", "--quiet", "--set", f"runs_dir={tmp_path}"]
    cmd += ["--set", "stop.mean_return=null", "--set", "stop.iterations=100000", *settings]
    return subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_dir(tmp_path: Path) -> RunDir | None:
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    return RunDir(runs[0]) if runs else None


def iterations(tmp_path: Path, proc: subprocess.Popen) -> int:
    assert proc.poll() is None, proc.stdout.read()
    run = run_dir(tmp_path)
    return len(run.read_metrics()) if run is not None else 0


def finish(proc: subprocess.Popen, timeout: float = 90) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(
    ("graph", "signum", "to_group"),
    [
        ("ppo-cartpole-single", signal.SIGTERM, False),  # checkpoint.every 50: all of it was at risk
        ("ppo-cartpole-single", signal.SIGUSR1, False),
        ("ppo-cartpole-sync", signal.SIGTERM, False),
        ("ppo-cartpole-sync", signal.SIGINT, True),  # a terminal's Ctrl-C reaches the workers too
    ],
)
def test_a_stop_signal_checkpoints_the_last_iteration_and_stops_every_process(tmp_path, graph, signum, to_group):
    proc = start(tmp_path, graph)
    wait_for(lambda: iterations(tmp_path, proc) >= 3, 120, "three iterations")
    children = psutil.Process(proc.pid).children(recursive=True)
    (os.killpg if to_group else os.kill)(proc.pid, signum)
    out = finish(proc)
    assert proc.returncode == 128 + signum, out
    name = signal.Signals(signum).name
    assert f"stopped by {name} at iteration" in out, out
    assert "Traceback" not in out and "leaked" not in out, out
    run = run_dir(tmp_path)
    summary = json.loads((run.path / "summary.json").read_text())
    assert (summary["stop_reason"], summary["signal"]) == ("interrupted", name)
    ckpt = load_checkpoint(run.path)
    assert ckpt["counters"]["iteration"] == summary["iterations"] == run.read_metrics()[-1]["iteration"] >= 3
    assert ckpt["roles"]["learner"][0]["updates"] == summary["iterations"]
    time.sleep(1)
    assert not alive(children), [p.cmdline() for p in alive(children)]


def test_a_second_signal_aborts_the_iteration_and_keeps_the_periodic_checkpoint(tmp_path):
    proc = start(tmp_path, "ppo-cartpole-single", *SLOW_ENV, "--set", "checkpoint.every=1")
    wait_for(lambda: iterations(tmp_path, proc) >= 1, 120, "an iteration")
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == 143, out
    assert time.monotonic() - t0 < 15, "the second signal did not abort the iteration"
    assert "aborted (SIGTERM again); the last periodic checkpoint is kept" in out, out
    run = run_dir(tmp_path)
    assert not (run.path / "summary.json").exists()
    assert load_checkpoint(run.path)["counters"]["iteration"] == run.read_metrics()[-1]["iteration"]


def test_an_iteration_that_outlives_stop_wait_s_is_abandoned(tmp_path):
    proc = start(tmp_path, "ppo-cartpole-single", *SLOW_ENV, "--set", "checkpoint.stop_wait_s=1")
    wait_for(lambda: iterations(tmp_path, proc) >= 1, 120, "an iteration")
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == 143, out
    assert time.monotonic() - t0 < 4.5, "an iteration takes 5 s: it was waited for"
    assert "aborted (the iteration in flight outlived stop_wait_s (1 s))" in out, out


def test_a_signal_while_the_cluster_starts_stops_the_run_before_its_first_iteration(tmp_path):
    proc = start(tmp_path, "ppo-cartpole-sync")
    run = wait_for(lambda: run_dir(tmp_path), 60, "the run directory")
    wait_for(lambda: (run.path / ".lock").exists(), 60, "the run to begin")
    time.sleep(0.5)  # inside train(): the handlers are in place, the cluster is starting
    assert not run.read_metrics(), "the cluster started too fast to signal into"
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == 143, out
    assert "Traceback" not in out, out
    assert json.loads((run.path / "summary.json").read_text())["iterations"] == 0
