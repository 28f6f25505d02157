"""``@evaluation``: an evaluator role started only when the graph asks, its metrics in the rows."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.app.graphs import load_graph, resolve_graph
from dagrl.core.schema import ConfigError
from dagrl.policies import build_policy
from dagrl.runtime.checkpoint import load_checkpoint
from tests.helpers import train


@pytest.mark.slow
def test_ppo_evaluates_greedily_every_n_iterations(tmp_path):
    summary, rundir = train("graphs/ppo-cartpole-single.yaml", tmp_path, ["evaluate.every=5"])
    assert summary["stop_reason"] == "mean_return"
    rows = rundir.read_metrics()
    evaluated = [r["iteration"] for r in rows if "eval/return_mean" in r]
    assert evaluated == [i for i in range(5, len(rows) + 1, 5)]
    assert max(r["eval/return_mean"] for r in rows if "eval/return_mean" in r) >= 400  # greedy, once solved


def test_evaluator_is_started_only_when_evaluation_is_on():
    off = load_graph("graphs/ppo-cartpole-single.yaml")
    on = load_graph("graphs/ppo-cartpole-single.yaml", ["evaluate.every=3"])
    assert "evaluator" not in off.active_roles and off.n_actors == 2
    assert "evaluator" in on.active_roles and on.n_actors == 3
    policy = build_policy(off)
    try:
        assert set(policy.hosts) == {"sampler", "learner"}
    finally:
        policy.close()


def test_evaluation_needs_an_algorithm_that_defines_one():
    data = {"algorithm": "tests.replay_algo", "env": {"id": "CartPole-v1"}, "evaluate": {"every": 5}}
    with pytest.raises(ConfigError, match=r"^mine: evaluate\.every: 5: algorithm tests.replay_algo has no @evaluation"):
        resolve_graph(data, "mine")


@pytest.mark.parametrize("graph_file", ["dqn-cartpole-single", "sac-pendulum-single", "td3-pendulum-single"])
def test_every_algorithm_evaluates(tmp_path, graph_file):
    overrides = ["evaluate.every=2", "stop.iterations=2", "stop.mean_return=null", "hyperparameters.eval_episodes=2"]
    _, rundir = train(f"graphs/{graph_file}.yaml", tmp_path, overrides)
    rows = rundir.read_metrics()
    assert "eval/return_mean" not in rows[0]
    assert np.isfinite(rows[1]["eval/return_mean"]) and rows[1]["eval/return_std"] >= 0


TRAINING_KEYS = ("charts/episode_return", "losses/policy", "losses/value", "losses/approx_kl", "env_steps")


def test_concurrent_evaluation_leaves_training_bit_identical_and_lags_behind_it(tmp_path):
    common = ["stop.iterations=24", "stop.mean_return=null", "hyperparameters.eval_episodes=100"]
    _, plain = train("graphs/ppo-cartpole-single.yaml", tmp_path / "plain", common)
    summary, beside = train(
        "graphs/ppo-cartpole-single.yaml",
        tmp_path / "beside",
        [*common, "evaluate.every=4", "evaluate.concurrent=true"],
    )
    rows, reference = beside.read_metrics(), plain.read_metrics()
    for row, ref in zip(rows, reference, strict=True):  # the evaluator never touches training state
        assert {k: row.get(k) for k in TRAINING_KEYS} == {k: ref.get(k) for k in TRAINING_KEYS}
    evaluated = [(r["iteration"], r["eval/iteration"]) for r in rows if "eval/iteration" in r]
    assert len(evaluated) >= 2
    assert all(of % 4 == 0 and of <= at for at, of in evaluated)
    assert any(of < at for at, of in evaluated)  # training went on while an evaluation ran
    assert [of for _, of in evaluated] == sorted({of for _, of in evaluated})  # each at most once, in order
    started = 24 // 4 - int(rows[-1]["eval/skipped"])
    assert len(evaluated) + ("eval" in summary) == started  # every started evaluation is reported once
    if "eval" in summary:
        assert summary["eval"]["eval/iteration"] > evaluated[-1][1]


def test_concurrent_evaluation_on_a_cluster(client, tmp_path):
    overrides = [
        "stop.iterations=16", "stop.mean_return=null", "evaluate.every=2", "evaluate.concurrent=true",
        "hyperparameters.eval_episodes=20",
    ]  # fmt: skip
    summary, rundir = train("graphs/ppo-cartpole-sync.yaml", tmp_path, overrides, client=client)
    rows = rundir.read_metrics()
    assert [r["iteration"] for r in rows] == list(range(1, 17))
    evaluated = [r for r in rows if "eval/iteration" in r]
    assert len(evaluated) >= 2
    assert all(np.isfinite(r["eval/return_mean"]) and r["eval/iteration"] <= r["iteration"] for r in evaluated)


@pytest.mark.parametrize("concurrent", [False, True])
def test_a_run_stops_when_an_evaluation_reaches_eval_return(tmp_path, concurrent):
    overrides = [
        "evaluate.every=2", f"evaluate.concurrent={str(concurrent).lower()}", "hyperparameters.eval_episodes=5",
        "stop.mean_return=null", "stop.eval_return=150", "stop.iterations=80",
    ]  # fmt: skip
    summary, rundir = train("graphs/ppo-cartpole-single.yaml", tmp_path, overrides)
    rows = rundir.read_metrics()
    evals = [r["eval/return_mean"] for r in rows if "eval/return_mean" in r]
    assert summary["stop_reason"] == "eval_return" and summary["iterations"] < 80
    assert evals[-1] >= 150 and all(e < 150 for e in evals[:-1]) and len(evals) >= 2
    assert "eval/return_mean" in rows[-1] and summary["eval_return"] == evals[-1]  # stopped with that row
    if not concurrent:
        assert rows[-1]["iteration"] % 2 == 0
    assert load_checkpoint(rundir.path)["last_eval"] == evals[-1]  # a resume knows it


def test_eval_return_needs_evaluations():
    data = {"algorithm": "ppo", "env": {"id": "CartPole-v1"}, "stop": {"eval_return": 400}}
    with pytest.raises(ConfigError, match=r"^mine: stop\.eval_return: 400: needs evaluations \(set evaluate\.every\)"):
        resolve_graph(data, "mine")
