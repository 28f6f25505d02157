"""`dagrl bench learning --jobs`: runs in processes of their own, read back into one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_parallel_runs_each_reach_their_budget_and_land_in_one_table(tmp_path):
    out = tmp_path / "learning"
    cmd = [sys.executable, "-m", "dagrl", "bench", "learning", "--graphs", "ppo-cartpole-single:1000",
           "--seeds", "1", "2", "--jobs", "2", "--final-eval", "3", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "DAGRL_BENCH_RESULTS": str(tmp_path / "results")}  # not the checkout's results
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sorted(r["seed"] for r in runs) == [1, 2]
    assert all(r["env_steps"] >= 1000 for r in runs)
    assert runs[0]["final_return"] != runs[1]["final_return"]  # two seeds, two runs
    for r in runs:  # 3 greedy episodes with each run's final checkpoint, kept in its run directory
        (kept,) = (out / f"ppo-cartpole-single-s{r['seed']}" / "eval").glob("ckpt-*.json")
        returns = json.loads(kept.read_text())["returns"]
        assert len(returns) == 3 and r["final_eval"] == sum(returns) / 3 and r["final_eval_episodes"] == 3
    for seed in (1, 2):  # each ran in its own process, its output in its own log
        assert "env steps" in (out / f"ppo-cartpole-single-s{seed}.log").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)  # finished runs are read back
    assert again.returncode == 0 and "started" not in again.stdout
    assert json.loads((out / "results.json").read_text())["runs"] == runs  # the evaluations too
    assert (tmp_path / "results" / "learning.json").exists()
