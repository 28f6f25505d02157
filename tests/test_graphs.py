"""Every shipped graph file validates (algorithm, env, policy, roles, hyperparameters)."""

from __future__ import annotations

import pathlib

import pytest

from dagrl.graph import load_graph

GRAPHS = sorted((pathlib.Path(__file__).resolve().parent.parent / "graphs").glob("*.yaml"))
NEEDS = {"sac-halfcheetah.yaml": "mujoco"}  # optional env packages


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.name)
def test_shipped_graph_validates(path):
    if path.name in NEEDS:
        pytest.importorskip(NEEDS[path.name])
    graph = load_graph(path)
    assert graph.name == path.stem
    assert set(graph.spec.roles) == set(graph.algorithm.roles)


def test_every_algorithm_has_a_graph():
    algos = {load_graph(p).spec.algorithm for p in GRAPHS if p.name not in NEEDS}
    assert algos == {"ppo", "dqn", "sac", "td3", "impala"}
