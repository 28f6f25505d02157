"""``dagrl eval``: a run's checkpoint plays greedy episodes, outside any cluster, with the numbers the
run's own evaluations report; optionally one MP4 per episode."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dagrl.app.cli import main
from dagrl.app.graphs import load_graph
from dagrl.app.training import train
from dagrl.runtime.rundir import RunDir


def one_run(tmp_path):
    (path,) = list(tmp_path.iterdir())
    return path


def test_eval_reproduces_the_runs_own_evaluation_of_the_same_weights(tmp_path, graphs_dir, capsys):
    runs = tmp_path / "runs"
    args = ["stop.iterations=6", "stop.mean_return=null", "checkpoint.every=6", "evaluate.every=6"]
    args += ["hyperparameters.eval_episodes=5", f"runs_dir={runs}"]
    assert main(["run", f"{graphs_dir}/ppo-cartpole-single.yaml", "--quiet", *[f"--set={a}" for a in args]]) == 0
    run = one_run(runs)
    (row,) = [r for r in RunDir(run).read_metrics() if "eval/return_mean" in r]
    assert row["iteration"] == 6

    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # the run evaluated iteration 6's weights with its first evaluation: the same seeds, the same episodes
    assert result["iteration"] == 6 and len(result["returns"]) == 5
    assert result["return_mean"] == pytest.approx(row["eval/return_mean"])
    assert result["return_std"] == pytest.approx(row["eval/return_std"])
    assert result["returns"] == [float(n) for n in result["lengths"]]  # CartPole: +1 a step
    written = json.loads((run / "eval" / "ckpt-00000006-seed1.json").read_text())
    assert written["returns"] == result["returns"]

    # another seed plays other episodes; an older checkpoint file is named directly
    assert main(["eval", str(run), "--episodes", "5", "--seed", "7", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert other["seed"] == 7 and other["returns"] != result["returns"]
    assert main(["eval", str(run / "checkpoints" / "ckpt-00000000.pt"), "--episodes", "3", "--json"]) == 0
    untrained = json.loads(capsys.readouterr().out)
    assert untrained["iteration"] == 0 and untrained["env_steps"] == 0 and len(untrained["returns"]) == 3


def test_a_data_parallel_run_is_evaluated_with_one_learner(tmp_path, graphs_dir, capsys):
    """dp-learners keep identical replicas: the evaluation builds one (``single`` refuses two)."""
    import yaml

    runs = tmp_path / "runs"
    args = ["stop.iterations=2", "stop.mean_return=null", f"runs_dir={runs}"]
    assert main(["run", f"{graphs_dir}/ppo-cartpole-single.yaml", "--quiet", *[f"--set={a}" for a in args]]) == 0
    run = one_run(runs)
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "3", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["policy"], config["roles"]["learner"]["replicas"] = {"name": "dp-learners"}, 2
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["eval", str(run), "--episodes", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["returns"] == alone["returns"]


def test_eval_of_a_checkpoint_written_on_a_cluster(client, tmp_path, graphs_dir):
    """SAC with the critic and actor on their own roles, trained on the LocalCluster; evaluated here."""
    from dagrl.app.evaluate import evaluate_checkpoint

    g = load_graph(
        f"{graphs_dir}/sac-pendulum-split.yaml",
        ["stop.iterations=3", "stop.mean_return=null", "checkpoint.every=3", f"runs_dir={tmp_path}"],
    )
    summary = train(g, client)
    result = evaluate_checkpoint(summary["run_dir"], episodes=2)
    assert result.iteration == 3 and result.env_id == "Pendulum-v1"
    assert result.lengths == [200, 200] and all(-2000 < r < 0 for r in result.returns)


def test_eval_records_one_video_per_episode(tmp_path, graphs_dir, capsys):
    from moviepy import VideoFileClip

    runs = tmp_path / "runs"
    args = ["policy=single", "stop.iterations=1", "stop.mean_return=null", f"runs_dir={runs}"]
    assert main(["run", f"{graphs_dir}/ppo-brighthalf.yaml", "--quiet", *[f"--set={a}" for a in args]]) == 0
    capsys.readouterr()
    videos = tmp_path / "videos"
    assert main(["eval", str(one_run(runs)), "--episodes", "2", "--video", str(videos), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [p.split("/")[-1] for p in result["videos"]] == [
        "ckpt-00000001-episode-0.mp4",
        "ckpt-00000001-episode-1.mp4",
    ]
    assert sorted(p.name for p in videos.iterdir()) == ["ckpt-00000001-episode-0.mp4", "ckpt-00000001-episode-1.mp4"]
    for path, length in zip(result["videos"], result["lengths"], strict=True):
        with VideoFileClip(path) as clip:
            frames = sum(1 for _ in clip.iter_frames())
            assert tuple(clip.size) == (84, 84)
        assert frames == length + 1  # the reset's image and one per step, the last one included


@pytest.mark.parametrize(
    "argv, says",
    [
        (["eval", "/nonexistent/run"], "RUN: /nonexistent/run does not exist"),
        (["eval", "{tmp}"], "is not a dagrl run directory (no config.yaml)"),
        (["eval", "{run}", "--episodes", "0"], "--episodes: must be >= 1, got 0"),
        (["eval", "{run}", "--set", "hyperparameters.hidden=16"], "learner: checkpoint does not load"),
        (["eval", "{run}", "--set", "hyperparameters.nope=1"], "nope"),
        (["eval", "{tmp}/missing-ckpt-run"], "no checkpoints in"),
    ],
)
def test_bad_eval_input_is_one_line_and_exit_2(argv, says, tmp_path, graphs_dir, capsys):
    runs = tmp_path / "runs"
    args = ["stop.iterations=1", "stop.mean_return=null", f"runs_dir={runs}"]
    assert main(["run", f"{graphs_dir}/ppo-cartpole-single.yaml", "--quiet", *[f"--set={a}" for a in args]]) == 0
    empty = tmp_path / "missing-ckpt-run"
    empty.mkdir()
    (empty / "config.yaml").write_text((one_run(runs) / "config.yaml").read_text())
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path, run=one_run(runs)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dagrl: error:") and len(err.splitlines()) == 1 and says in err, err


def test_eval_records_a_mujoco_video_without_a_display(tmp_path, graphs_dir):
    """MuJoCo's default renderer (GLFW) needs a display; with none and no MUJOCO_GL, eval picks EGL."""
    pytest.importorskip("mujoco")
    from tests.debian import EGL, ensure_libraries

    ensure_libraries(*EGL)
    runs = tmp_path / "runs"
    args = ["stop.env_steps=64", "hyperparameters.num_steps=64", "stop.mean_return=null", f"runs_dir={runs}"]
    assert main(["run", f"{graphs_dir}/ppo-hopper-single.yaml", "--quiet", *[f"--set={a}" for a in args]]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")}
    videos = tmp_path / "videos"
    cmd = [sys.executable, "-m", "dagrl", "eval", str(one_run(runs)), "--episodes", "1", "--video", str(videos)]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (video,) = json.loads(done.stdout)["videos"]
    from moviepy import VideoFileClip

    with VideoFileClip(video) as clip:
        frames = [f for f in clip.iter_frames()]
    assert len(frames) >= 2 and max(float(f.std()) for f in frames) > 1.0  # a rendered scene, not a blank
