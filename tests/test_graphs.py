"""Every shipped graph file validates (algorithm, env, policy, roles, hyperparameters)."""

from __future__ import annotations

import pathlib

import pytest

from dagrl.app.graphs import load_graph

GRAPHS = sorted((pathlib.Path(__file__).resolve().parent.parent / "graphs").glob("*.yaml"))
NEEDS = {"halfcheetah": "mujoco", "hopper": "mujoco", "atari": "ale_py", "spread": "mpe2"}  # extras the env needs


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.name)
def test_shipped_graph_validates(path):
    for word, module in NEEDS.items():
        if word in path.name:
            pytest.importorskip(module)
    graph = load_graph(path)
    assert graph.name == path.stem
    assert set(graph.spec.roles) == set(graph.algorithm.roles)


def test_every_algorithm_has_a_graph():
    algos = {load_graph(p).spec.algorithm for p in GRAPHS if not any(word in p.name for word in NEEDS)}
    assert algos == {"ppo", "ppo_lstm", "dqn", "sac", "td3", "impala", "impala_lstm", "r2d2"}
    with_extras = {load_graph(p).spec.algorithm for p in GRAPHS if "spread" in p.name}
    assert with_extras == {"mappo", "ippo"}
