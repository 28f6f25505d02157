"""Resume that cannot be broken: a corrupt newest checkpoint, a resume whose overrides do not fit,
metrics after going back to an older checkpoint."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch

from dagrl.app.cli import main
from dagrl.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from dagrl.runtime.rundir import RunDir
from tests.helpers import tmpfs

BASE = ["--set", "checkpoint.every=2", "--set", "checkpoint.keep=5", "--set", "stop.mean_return=null", "--quiet"]


def payload(i: int) -> dict:
    return {"counters": {"iteration": i}, "roles": {}}


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("dagrl"), "propagate", True)  # `dagrl run` in earlier tests turns it off
    run = RunDir(tmp_path)
    for i in (2, 4, 6):
        save_checkpoint(run, i, payload(i), keep=5)
    newest = run.checkpoint_path(6)
    newest.write_bytes(newest.read_bytes()[:100])  # cut short, as by a full disk or a killed copy
    with caplog.at_level(logging.WARNING, logger="dagrl"):
        data = load_checkpoint(tmp_path)
    assert data["counters"]["iteration"] == 4 and data["path"].endswith("ckpt-00000004.pt")
    assert "ckpt-00000006.pt: unreadable checkpoint" in caplog.text


def test_no_readable_checkpoint_is_one_error_naming_each_file(tmp_path):
    run = RunDir(tmp_path)
    save_checkpoint(run, 1, payload(1))
    torch.save({"format": 99}, run.checkpoint_path(2))
    run.checkpoint_path(1).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert "ckpt-00000002.pt: checkpoint format 99" in str(err.value)
    assert "ckpt-00000001.pt: unreadable" in str(err.value)


def test_truncate_metrics_drops_rows_after_the_iteration(tmp_path):
    run = RunDir(tmp_path)
    for i in range(1, 6):
        run.log({"iteration": i, "env_steps": 10 * i})
    assert run.truncate_metrics(3) == 2
    assert [r["iteration"] for r in run.read_metrics()] == [1, 2, 3]
    assert run.truncate_metrics(3) == 0


def test_resume_from_an_older_checkpoint_redoes_iterations_without_repeating_rows(tmp_path, graphs_dir):
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    assert main(["run", graph, "--set", f"runs_dir={tmp_path}", "--set", "stop.iterations=5", *BASE]) == 0
    (path,) = list(tmp_path.iterdir())
    run = RunDir(path)
    assert [int(p.stem[5:]) for p in run.list_checkpoints()] == [0, 2, 4, 5]
    newest = run.list_checkpoints()[-1]
    newest.write_bytes(newest.read_bytes()[:64])  # iteration 5's checkpoint is lost: resume goes back to 4
    assert main(["run", "--resume", str(path), "--set", "stop.iterations=7", *BASE]) == 0
    rows = run.read_metrics()
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps)
    at_checkpoint = next(r["env_steps"] for r in rows if r["iteration"] == 4)
    actors = json.loads((path / "actors.json").read_text())
    assert {a["started_at_env_steps"] for a in actors} == {at_checkpoint}  # schedules go on from there


def test_resume_with_overrides_that_do_not_fit_changes_nothing(tmp_path, graphs_dir, capsys):
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    assert main(["run", graph, "--set", f"runs_dir={tmp_path}", "--set", "stop.iterations=2", *BASE]) == 0
    (path,) = list(tmp_path.iterdir())
    config = (path / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["run", "--resume", str(path), "--set", "hyperparameters.hidden=32", *BASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("dagrl: error: --resume: checkpoint ckpt-00000002.pt does not fit graph")
    assert "role learner" in err[0] and "size mismatch" in err[0]
    assert "(changed: hyperparameters.hidden 64 -> 32)" in err[0]
    assert (path / "config.yaml").read_text() == config
    assert main(["run", "--resume", str(path), "--set", "stop.iterations=3", *BASE]) == 0
    assert [r["iteration"] for r in RunDir(path).read_metrics()] == [1, 2, 3]
    (change,) = [e for e in RunDir(path).read_events() if e["event"] == "config_change"]
    assert change["iteration"] == 2 and change["changes"] == {"stop.iterations": [2, 3]}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("hyperparameters.n_step=3", "discount: float32[]"),  # rows that would carry a field the store lacks
        ("hyperparameters.buffer_size=1000", "stored capacity is 50000, asked for 1000"),
    ],
)
def test_a_resume_that_changes_what_replay_stores_changes_nothing(tmp_path, graphs_dir, capsys, change, says):
    graph = f"{graphs_dir}/dqn-cartpole-single.yaml"
    assert main(["run", graph, "--set", f"runs_dir={tmp_path}", "--set", "stop.iterations=2", *BASE]) == 0
    (path,) = list(tmp_path.iterdir())
    before = {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(["run", "--resume", str(path), "--set", change, "--set", "stop.iterations=3", *BASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "role replay[0]" in err[0] and says in err[0], err
    assert {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} == before  # not a byte written
    assert main(["run", "--resume", str(path), "--set", "stop.iterations=3", *BASE]) == 0


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "3M") as disk:
        yield disk


def fill(disk, leave: int) -> None:
    """Fill ``disk`` until ``leave`` bytes are free."""
    import os

    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave))


def test_a_full_disk_fails_the_checkpoint_write_cleanly(small_disk):
    run = RunDir(small_disk / "run")
    run.path.mkdir()
    big = {"counters": {"iteration": 1}, "roles": {"learner": [{"w": torch.zeros(100_000)}]}}  # ~400 kB
    save_checkpoint(run, 1, big)
    fill(small_disk, 100_000)
    from dagrl.runtime.checkpoint import CheckpointWriteError

    with pytest.raises(CheckpointWriteError, match="ckpt-00000002.pt: cannot write checkpoint"):
        save_checkpoint(run, 2, {**big, "counters": {"iteration": 2}})
    assert [p.name for p in run.checkpoints.iterdir()] == ["ckpt-00000001.pt"]  # no .tmp left
    assert load_checkpoint(run.path)["counters"]["iteration"] == 1


def test_a_run_that_reached_its_stop_exits_0_when_only_the_curve_does_not_fit(small_disk, graphs_dir, capsys):
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    fill(small_disk, 600_000)  # checkpoints (~50-130 kB each, 2 kept) fit; curve.html (bokeh inline, > 1 MB) does not
    over = ["--set", f"runs_dir={small_disk}", "--set", "stop.iterations=2", "--set", "checkpoint.keep=2"]
    assert main(["run", graph, *over, *BASE]) == 0
    (path,) = [p for p in small_disk.iterdir() if p.is_dir()]
    wait_for_curve_writer(path)  # `dagrl run` writes the curve from a process of its own, after it exits
    assert not (path / "curve.html").exists() and not (path / ".curve.html.tmp").exists()
    assert load_checkpoint(path)["counters"]["iteration"] == 2


def wait_for_curve_writer(run: Path, timeout_s: float = 120.0) -> None:
    import psutil

    def writing() -> bool:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "dagrl.runtime.rundir" in cmd and str(run) in cmd:
                return True
        return False

    deadline = time.monotonic() + timeout_s
    while writing() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not writing(), "the curve writer is still running"


WRITER = """
import sys, torch
from dagrl.runtime.checkpoint import save_checkpoint
from dagrl.runtime.rundir import RunDir
run, start = RunDir(sys.argv[1]), int(sys.argv[2])
for i in range(start, start + 10_000):
    w = torch.full((500_000,), float(i))
    save_checkpoint(run, i, {"counters": {"iteration": i}, "roles": {"learner": [{"w": w}]}})
    print(i, flush=True)
"""


def test_a_writer_killed_at_any_moment_leaves_an_intact_checkpoint(tmp_path):
    """SIGKILL a process writing 2 MB checkpoints back to back, at 8 different moments."""
    import random
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(0)
    start = 1
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(start)], stdout=subprocess.PIPE)
        assert proc.stdout.readline()  # at least one checkpoint done, then kill mid-stream
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        data = load_checkpoint(tmp_path)
        i = data["counters"]["iteration"]
        assert bool((data["roles"]["learner"][0]["w"] == float(i)).all())
        assert i >= start
        start = i + 1
    assert len(RunDir(tmp_path).list_checkpoints()) <= 4  # keep=3, plus one when killed between rename and prune


def test_a_run_still_going_is_not_resumed_twice(tmp_path, graphs_dir, capsys):
    """A second ``dagrl run`` into a live run's directory is refused before it writes there; once the
    first process is gone (here SIGKILLed), the directory is free again."""
    import signal
    import subprocess
    import sys

    from tests.helpers import wait_for

    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    assert main(["run", graph, "--set", f"runs_dir={tmp_path}", "--set", "stop.iterations=2", *BASE]) == 0
    (path,) = list(tmp_path.iterdir())
    going = ["--set", "stop.iterations=100000", "--set", "stop.wall_time_s=120"]
    first = subprocess.Popen([sys.executable, "-m", "dagrl", "run", "--resume", str(path), *going, *BASE])
    try:
        lock = path / ".lock"
        wait_for(lambda: lock.exists() and lock.read_text() == str(first.pid), 60, "the first run to hold its dir")
        wait_for(lambda: len(RunDir(path).read_metrics()) > 2, 60, "the first run to train")
        config = (path / "config.yaml").read_text()
        capsys.readouterr()
        for option in (["--resume", str(path)], [graph, "--run-dir", str(path)]):
            assert main(["run", *option, "--set", "stop.iterations=3", *BASE]) == 2
            err = capsys.readouterr().err.strip()
            assert err == f"dagrl: error: {option[-2]}: {path} is in use by another dagrl process (pid {first.pid})"
        assert (path / "config.yaml").read_text() == config  # the refused runs wrote nothing
        assert first.poll() is None, "the first run was disturbed"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert main(["run", "--resume", str(path), "--set", "stop.iterations=3", *BASE]) == 0


def test_a_torn_last_metrics_line_is_dropped_with_one_warning_and_the_run_resumes(tmp_path, graphs_dir, capsys):
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    assert main(["run", graph, "--set", f"runs_dir={tmp_path}", "--set", "stop.iterations=3", *BASE]) == 0
    (path,) = list(tmp_path.iterdir())
    with (path / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 4, "env_steps": 10')  # a crash in the middle of a row
    capsys.readouterr()
    assert main(["run", "--resume", str(path), "--set", "stop.iterations=5", *BASE]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dagrl: {path / 'metrics.jsonl'}: last line torn (a crash while it was written): dropped"]
    assert [r["iteration"] for r in RunDir(path).read_metrics()] == [1, 2, 3, 4, 5]


def test_a_damaged_metrics_line_refuses_the_resume_before_anything_is_written(tmp_path, graphs_dir, capsys):
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    assert main(["run", graph, "--set", f"runs_dir={tmp_path}", "--set", "stop.iterations=5", *BASE]) == 0
    (path,) = list(tmp_path.iterdir())
    for lost in RunDir(path).list_checkpoints()[-2:]:  # iterations 4 and 5: the resume goes back to 2
        lost.unlink()
    lines = (path / "metrics.jsonl").read_text().splitlines()
    lines[3] = lines[3][:20]  # iteration 4's row, which the resume drops: not the last, no crash does that
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    before = {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(["run", "--resume", str(path), "--set", "stop.iterations=6", *BASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metrics.jsonl: byte" in err[0] and "not a JSON row" in err[0], err
    assert {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} == before


def test_rollback_and_status_read_the_tail_of_the_metrics_not_the_whole_file(tmp_path):
    """A long run's metrics are not read whole: a first line no parser accepts is never reached."""
    run = RunDir(tmp_path)
    rows = "".join(json.dumps({"iteration": i, "env_steps": 64 * i}) + "\n" for i in range(1, 200_001))
    run.metrics_path.write_text("not json\n" + rows)
    assert run.last_metrics()["iteration"] == 200_000
    assert run.truncate_metrics(199_990) == 10
    assert run.last_metrics()["iteration"] == 199_990
    assert run.metrics_path.read_bytes().endswith(b'"env_steps": 12799360}\n')


def test_run_dir_into_a_run_continues_it_and_never_restarts_at_iteration_1(tmp_path, graphs_dir, capsys):
    """The SLURM driver job's command, run again after a requeue: the run goes on from its newest good
    checkpoint (here iteration 4, the job killed before iteration 5's checkpoint)."""
    graph, run = f"{graphs_dir}/ppo-cartpole-single.yaml", tmp_path / "run"
    run.mkdir()
    args = ["run", graph, "--run-dir", str(run), "--set", "stop.iterations=5", *BASE]
    assert main(args) == 0
    RunDir(run).list_checkpoints()[-1].unlink()
    capsys.readouterr()
    assert main([*args[:-1]]) == 0  # the same command, not quiet
    assert f"{run} holds a run: continuing it from iteration 4" in capsys.readouterr().err
    rows = RunDir(run).read_metrics()
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5]
    (resume,) = [e for e in RunDir(run).read_events() if e["event"] == "resume"]
    assert (resume["iteration"], resume["checkpoint"]) == (4, "ckpt-00000004.pt")


def test_run_dir_into_a_run_of_another_graph_is_refused_in_one_line(tmp_path, graphs_dir, capsys):
    run = tmp_path / "run"
    run.mkdir()
    args = ["run", f"{graphs_dir}/ppo-cartpole-single.yaml", "--run-dir", str(run), "--set", "stop.iterations=2"]
    assert main([*args, *BASE]) == 0
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main([*args, "--set", "hyperparameters.lr=3e-4", *BASE]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == (
        f"dagrl: error: --run-dir: {run} holds a run of another graph (changed: hyperparameters.lr 0.001 -> "
        f"0.0003); continue it with --resume {run}, or give a directory of its own"
    )
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


class _RunsCode:
    """A pickled object that runs a command when it is unpickled: what a crafted checkpoint carries."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line_naming_it(tmp_path, graphs_dir, capsys):
    """Checkpoints are read with ``weights_only``: one crafted as the newest of a run is refused outright
    (not skipped for an older one) by ``--resume`` and ``dagrl eval``, and its code never runs."""
    run, marker = tmp_path / "run", tmp_path / "ran"
    run.mkdir()
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    assert main(["run", graph, "--run-dir", str(run), "--set", "stop.iterations=2", *BASE]) == 0
    good = load_checkpoint(run)
    assert isinstance(good["roles"], dict)  # the real ones read back under weights_only
    crafted = RunDir(run).checkpoint_path(3)
    torch.save({"format": 1, "counters": {"iteration": 3}, "roles": {"learner": [_RunsCode(marker)]}}, crafted)
    capsys.readouterr()
    for command in (["run", "--resume", str(run), "--quiet"], ["eval", str(run), "--episodes", "1"]):
        assert main(command) == 2, command
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert f"{crafted}: refused: loading it would call posix.system" in err, err
    assert not marker.exists(), "the checkpoint's code ran"


def test_a_run_of_an_env_outside_dagrl_says_so_and_its_snapshots_load(tmp_path, graphs_dir, capsys):
    """A run's config.yaml naming a module outside dagrl is announced before it is imported; the
    checkpoint's snapshot of that module's env then loads (its classes allowed as imported env code)."""
    run = tmp_path / "run"
    run.mkdir()
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    env = ["--set", "env.id=tests.faulty:KillsItsWorkerOnce-v0"]
    assert main(["run", graph, "--run-dir", str(run), "--set", "stop.iterations=2", *env, *BASE]) == 0
    sampler = load_checkpoint(run)["roles"]["sampler"][0]
    assert sampler["fields"]["envs"]["__dagrl_envs__"]["envs"][0].unwrapped.__class__.__name__ == "KillsItsWorkerOnce"
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "1"]) == 0
    assert f"{run / 'config.yaml'} imports code from outside dagrl: tests.faulty" in capsys.readouterr().err
