"""``tensorboard: true``: every metrics row as TensorBoard scalars at its env steps, read back with
TensorBoard's own reader; steps redone after a rollback or a resume shown once."""

from __future__ import annotations

import pytest

from dagrl.app.cli import main
from dagrl.app.graphs import load_graph
from dagrl.app.tensorboard import TensorBoardLog
from dagrl.core.schema import ConfigError
from dagrl.runtime.rundir import RunDir

pytest.importorskip("tensorboard")


def scalars(directory) -> dict[str, dict[int, float]]:
    """Tag -> {step: value}, as TensorBoard shows them (later events of a step win, purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_a_run_writes_each_metrics_row_as_scalars_at_its_env_steps(tmp_path, graphs_dir):
    runs = tmp_path / "runs"
    args = ["tensorboard=true", "stop.iterations=3", "stop.mean_return=null", f"runs_dir={runs}"]
    assert main(["run", f"{graphs_dir}/ppo-cartpole-single.yaml", "--quiet", *[f"--set={a}" for a in args]]) == 0
    (run,) = runs.iterdir()
    rows = RunDir(run).read_metrics()
    shown = scalars(run / "tensorboard")
    steps = [r["env_steps"] for r in rows]
    assert len(rows) == 3 and sorted(shown["losses/approx_kl"]) == steps
    for row in rows:
        for key in ("losses/approx_kl", "losses/value", "episodes", "time_s"):
            assert shown[key][row["env_steps"]] == pytest.approx(row[key], rel=1e-6), key
    assert "iteration" not in shown and "env_steps" not in shown  # the axes, not measurements


def test_steps_redone_after_a_rollback_or_a_resume_are_shown_once(tmp_path):
    board = TensorBoardLog(tmp_path)
    for step, loss in ((100, 1.0), (200, 2.0), (300, 3.0)):
        board.on_row({"iteration": step // 100, "env_steps": step, "losses/loss": loss})
    board.on_row({"iteration": 2, "env_steps": 200, "losses/loss": 20.0})  # rolled back to iteration 1
    board.close()
    assert scalars(tmp_path)["losses/loss"] == {100: 1.0, 200: 20.0}

    resumed = TensorBoardLog(tmp_path, resumed_at=100)  # a checkpoint at 100 env steps
    resumed.on_row({"iteration": 2, "env_steps": 200, "losses/loss": 200.0, "eval/skipped": True})
    resumed.close()
    assert scalars(tmp_path) == {"losses/loss": {100: 1.0, 200: 200.0}}  # flags are not scalars


def test_tensorboard_without_the_package_is_refused_before_anything_starts(graphs_dir, monkeypatch):
    import dagrl.app.graphs

    monkeypatch.setattr(dagrl.app.graphs, "tensorboard_available", lambda: False)
    wanted = r"ppo-cartpole-single.yaml: tensorboard: .*pip install 'dagrl\[tensorboard\]'"
    with pytest.raises(ConfigError, match=wanted):
        load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", ["tensorboard=true"])
