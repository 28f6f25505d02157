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


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.name)
def test_switching_the_policy_of_a_shipped_graph_never_trips_on_the_files_options(path):
    """``--set policy.name=NAME`` (and ``policy=NAME``) keep the options the new policy takes and drop the
    others; what is left to refuse is a policy the algorithm cannot run, or replicas it runs once."""
    from dagrl.core.schema import ConfigError

    for word, module in NEEDS.items():
        if word in path.name:
            pytest.importorskip(module)
    for name in ("single", "sync", "async", "apex", "dp-learners"):
        for override in (f"policy.name={name}", f"policy={name}"):
            try:
                assert load_graph(path, [override]).spec.policy == name
            except ConfigError as err:
                assert "unknown key" not in str(err) and err.key in ("policy", "roles.learner.replicas"), str(err)


def test_a_switched_policy_keeps_what_applies_and_says_what_it_dropped():
    from tests.helpers import dagrl_log

    main = GRAPHS[0].parent / "ppo-cartpole.yaml"  # policy: {name: async, max_staleness: 2, rollouts_per_update: 2}
    assert load_graph(main, ["policy=async"]).policy_options.max_staleness == 2
    with dagrl_log() as said:
        graph = load_graph(main, ["policy.name=sync"])
    assert graph.spec.policy == "sync"
    dropped = "dropped max_staleness, rollouts_per_update, which sync does not take"
    assert said == [f"policy sync (the file's: async): {dropped}"]
    graph = load_graph(main, ["policy=async", "policy.max_staleness=1"])
    assert (graph.policy_options.max_staleness, graph.policy_options.rollouts_per_update) == (1, 2)
