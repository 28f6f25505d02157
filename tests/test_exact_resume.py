"""Exact resume: a run SIGKILLed at a random iteration and resumed logs, from its checkpoint on, the
metrics the run never stopped logs, bit for bit (timings aside), under ``single`` and ``sync``.

What decides a run's future is in its checkpoints: the learners' weights, optimizers and generators,
the replay store's sampler, and each sampler's and evaluator's whole state, its envs included
(:mod:`dagrl.runtime.snapshot`)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMING = ("time", "_s", "_hz", "perf/")
"""Metrics that measure the machine, not the run: left out of the comparison."""

CASES = {
    "ppo": ("ppo-cartpole-single.yaml", 10, []),
    "dqn": ("dqn-cartpole-single.yaml", 12, []),
    "sac": ("sac-pendulum-single.yaml", 22, ["hyperparameters.learning_starts=32"]),
    "td3": ("td3-pendulum-single.yaml", 22, ["hyperparameters.learning_starts=32"]),
    "r2d2": ("r2d2-cartpole-novel.yaml", 12, ["policy=single", "hyperparameters.learning_starts=64"]),
    "ppo-sync": ("ppo-cartpole-sync.yaml", 8, []),
}


def dagrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "dagrl", *args]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def logged(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(t in k for t in TIMING)}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_run_killed_and_resumed_logs_what_the_run_never_stopped_logs(graphs_dir, tmp_path, case):
    graph, iterations, sets = CASES[case]
    args = [f"{graphs_dir}/{graph}", "--quiet", "--set", "stop.mean_return=null", "--set", "checkpoint.every=1"]
    for s in [f"stop.iterations={iterations}", *sets]:
        args += ["--set", s]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    subprocess.run(dagrl("run", *args, "--run-dir", str(whole)), check=True, capture_output=True, timeout=300)

    at = random.Random().randrange(2, iterations - 2)
    proc = subprocess.Popen(dagrl("run", *args, "--run-dir", str(killed)), stderr=subprocess.DEVNULL)
    metrics, end = killed / "metrics.jsonl", time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= at):
        assert proc.poll() is None and time.monotonic() < end, "the run ended before it was killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    out = subprocess.run(dagrl("run", "--resume", str(killed), "--quiet"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr

    expected, got = rows(whole), rows(killed)
    assert [r["iteration"] for r in got] == list(range(1, iterations + 1))
    resumed = [json.loads(e) for e in (killed / "events.jsonl").read_text().splitlines()]
    (resume,) = [e for e in resumed if e["event"] == "resume"]
    differ = [
        (e["iteration"], key, e[key], g.get(key))
        for e, g in zip(expected, got, strict=True)
        for key in logged(e)
        if logged(e)[key] != g.get(key)
    ]
    assert not differ, f"killed after iteration {at}, resumed from {resume['iteration']}: {differ[:6]}"
    learned = [k for k in logged(expected[-1]) if k.startswith("losses/")]
    assert learned, "no learner metric to compare"
