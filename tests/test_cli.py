"""``dagrl run`` end to end: run directory, resume, attaching to a scheduler, ``dagrl graph``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from dagrl.app.cli import main
from dagrl.runtime.checkpoint import load_checkpoint
from dagrl.runtime.rundir import RunDir
from dagrl.runtime.workers import workers as live_workers


def only_run(root):
    (path,) = [p for p in root.iterdir() if p.is_dir()]
    return RunDir(path)


def run_single(root, *settings: str) -> int:
    """``dagrl run`` of PPO on CartPole in one process, its run under ``root``, with ``--set`` each of ``settings``."""
    args = ["run", "graphs/ppo-cartpole-single.yaml", "--quiet"]
    for item in (f"runs_dir={root}", *settings):
        args += ["--set", item]
    return main(args)


def test_run_resume_continues_counters(tmp_path, graphs_dir, capsys):
    base = ["--set", f"runs_dir={tmp_path}", "--set", "checkpoint.every=1", "--set", "stop.mean_return=null", "--quiet"]
    assert main(["run", f"{graphs_dir}/ppo-cartpole-single.yaml", "--set", "stop.iterations=3", *base]) == 0
    rundir = only_run(tmp_path)
    first = rundir.read_metrics()
    assert [r["iteration"] for r in first] == [1, 2, 3]
    assert load_checkpoint(rundir.path)["roles"]["learner"][0]["updates"] == 3

    assert main(["run", "--resume", str(rundir.path), "--set", "stop.iterations=6", *base]) == 0
    rows = rundir.read_metrics()
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps) and steps[3] == steps[2] + 256
    ckpt = load_checkpoint(rundir.path)
    assert ckpt["counters"]["iteration"] == 6
    assert ckpt["roles"]["learner"][0]["updates"] == 6  # the optimiser went on, not restarted
    assert len(rundir.list_checkpoints()) == 3  # checkpoint.keep


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("algorithm: ppo\n")
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "no checkpoints" in capsys.readouterr().err


def test_run_attaches_to_a_running_scheduler(client, tmp_path, graphs_dir):
    code = main(
        [
            "run",
            f"{graphs_dir}/ppo-cartpole-sync.yaml",
            "--scheduler",
            client.scheduler.address,
            "--set",
            f"runs_dir={tmp_path}",
            "--set",
            "stop.iterations=3",
            "--quiet",
        ]
    )
    assert code == 0
    rundir = only_run(tmp_path)
    assert len(rundir.read_metrics()) == 3
    assert json.loads((rundir.path / "summary.json").read_text())["stop_reason"] == "iterations"
    assert len(live_workers(client)) == 3  # the cluster we attached to is left running


def test_run_directory_holds_config_metrics_checkpoints_and_plot(tmp_path):
    assert run_single(tmp_path, "stop.iterations=4", "hyperparameters.lr=5e-4") == 0
    rundir = only_run(tmp_path)
    config = yaml.safe_load(rundir.config_path.read_text())
    assert config["hyperparameters"]["lr"] == 5e-4 and config["hyperparameters"]["update_epochs"] == 20
    row = rundir.read_metrics()[-1]
    for key in ("env_steps", "episodes", "perf/sample_hz", "perf/update_hz", "losses/policy", "losses/value"):
        assert key in row
    curve = rundir.path / "curve.html"  # written by a process of its own after the command returns
    deadline = time.monotonic() + 120
    while not curve.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "<html" in curve.read_text().lower()
    assert rundir.list_checkpoints()


def test_graph_command_prints_roles_and_edges(graphs_dir, tmp_path, capsys):
    dot = tmp_path / "g.dot"
    assert main(["graph", f"{graphs_dir}/ppo-cartpole-async.yaml", "--dot", str(dot)]) == 0
    out = capsys.readouterr().out
    assert "sampler    x2" in out and "learner    x1" in out
    assert "collect    @sampler    <- publish (stream, broadcast, staleness <= 2)" in out
    assert "update     @learner    <- collect (stream, 2 per update)" in out
    assert dot.read_text().count("->") == 2
    assert "hyperparameters (* as the graph sets them" in out
    assert "  * update_epochs = 20\n" in out and "    vf_coef = 0.5\n" in out  # the graph's, a default


def test_graph_command_shows_a_learner_group_sharing_the_stream(graphs_dir, capsys):
    assert main(["graph", f"{graphs_dir}/ppo-cartpole-async.yaml", "--set", "roles.learner.replicas=2"]) == 0
    assert "update     @learner    <- collect (stream, 2 per update, shared by 2 learners)" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_gpu_learner_falls_back_to_cpu_with_one_log_line(tmp_path, capsys):
    assert run_single(tmp_path, "roles.learner.resources={GPU: 1}", "stop.iterations=1") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "falling back to CPU" in line]
    assert len(lines) == 1 and "learner[0]" in lines[0]


def test_graph_tasks_draws_one_iteration_as_dask_tasks(tmp_path, capsys):
    from dagrl.app.cli import main

    out = tmp_path / "tasks.dot"
    assert main(["graph", "graphs/ppo-cartpole-sync.yaml", "--tasks", str(out)]) == 0
    dot = out.read_text()
    for edge in [
        '"publish-learner-0" -> "collect-sampler-0"',
        '"publish-learner-0" -> "collect-sampler-1"',
        '"collect-sampler-0" -> "update-learner-0"',
        '"collect-sampler-1" -> "update-learner-0"',
    ]:
        assert edge in dot
    assert dot.count("->") == 4 and 'label="worker of sampler[1]"' in dot


CORRIDOR = '''
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right along 6 cells to a reward of 1; the cell and the time as a Dict observation."""

    observation_space = gym.spaces.Dict({"cell": gym.spaces.Discrete(6), "t": gym.spaces.Box(0, 1, (1,))})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell, self.t = 0, 0
        return self.obs(), {}

    def obs(self):
        return {"cell": self.cell, "t": np.array([self.t / 50], np.float32)}

    def step(self, action):
        self.cell, self.t = max(0, self.cell + (1 if action == 1 else -1)), self.t + 1
        return self.obs(), float(self.cell == 5), self.cell == 5, self.t >= 50, {}


gym.register("Corridor-v0", entry_point=Corridor)
'''


def test_the_dagrl_command_finds_an_env_module_in_its_working_directory(tmp_path, graphs_dir):
    """The console script (unlike ``python -m``) has no working directory on its path; a user's env
    module beside them is imported by the driver and by the embedded cluster's workers."""
    (tmp_path / "corridor_envs.py").write_text(CORRIDOR)
    dagrl = os.path.join(os.path.dirname(sys.executable), "dagrl")
    sets = ["env.id=corridor_envs:Corridor-v0", "stop.mean_return=0.99", "stop.env_steps=20000", "runs_dir=runs"]
    argv = [dagrl, "run", f"{graphs_dir}/ppo-cartpole-sync.yaml", "--quiet"]
    done = subprocess.run(
        [*argv, *[x for s in sets for x in ("--set", s)]], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())
    assert summary["stop_reason"] == "mean_return", summary  # learnt, on the cluster's workers


def test_dagrl_logs_to_stderr_as_it_is_now_not_as_it_was(monkeypatch):
    """``main`` sets the log handler once per call; a later run in the same process (tests, a notebook)
    under another stderr logs there, not to the stream of the call that made the handler."""
    import io
    import logging

    from dagrl.app.cli import _setup_logging

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    _setup_logging(quiet=True)
    first.close()  # as a test's capture is closed when it ends
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("dagrl").warning("sampler[1] restarted")
    assert second.getvalue() == "dagrl: sampler[1] restarted\n"


def test_a_listing_whose_reader_has_gone_exits_quietly():
    """``dagrl graphs | head -1``: the pipe closes under the listing, which exits 141 with nothing on stderr."""
    import os
    import sys

    r, w = os.pipe()
    os.close(r)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dagrl", "graphs"], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(w)
    assert (done.returncode, done.stderr) == (141, "")
