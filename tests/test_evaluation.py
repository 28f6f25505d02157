"""``@evaluation``: an evaluator role started only when the graph asks, its metrics in the rows."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.graph import load_graph, resolve_graph
from dagrl.policies import build_policy
from dagrl.schema import ConfigError
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
