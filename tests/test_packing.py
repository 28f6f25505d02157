"""More samplers than cores on dagrl's own LocalCluster: run as many as the cores, stepping the envs asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import dagrl
import dagrl.clusters.local
from dagrl.app.graphs import load_graph
from dagrl.app.packing import packed_samplers
from dagrl.clusters.spec import LocalClusterSpec, load_cluster
from tests.helpers import dagrl_log


def shape(graph) -> tuple[int, int]:
    role = graph.role("sampler")
    return role.replicas, role.envs


@pytest.mark.parametrize(
    ("replicas", "envs", "cores", "packed"),
    [(8, 4, 2, (2, 16)), (6, 4, 4, (3, 8)), (7, 4, 2, (1, 28)), (2, 4, 2, (2, 4)), (1, 4, 1, (1, 4))],
)
def test_samplers_beyond_the_cores_become_as_many_as_the_cores_stepping_every_env(
    graphs_dir, replicas, envs, cores, packed
):
    graph = load_graph(
        f"{graphs_dir}/ppo-cartpole-async.yaml", [f"roles.sampler.replicas={replicas}", f"roles.sampler.envs={envs}"]
    )
    assert shape(packed_samplers(graph, cores)) == packed


def test_options_counted_in_rollouts_or_collects_keep_the_env_steps_per_update(graphs_dir):
    written = load_graph(
        f"{graphs_dir}/ppo-cartpole-async.yaml",
        ["roles.sampler.replicas=8", "policy.rollouts_per_update=6", "policy.min_rollouts_per_update=2"],
    )  # fmt: skip
    options = packed_samplers(written, 2).policy_options
    assert (options.rollouts_per_update, options.min_rollouts_per_update) == (2, 1)  # 6 of 4 envs, 2 of 16: 24, 32
    apex = load_graph(f"{graphs_dir}/dqn-cartpole-apex.yaml", ["roles.sampler.replicas=4", "policy.update_ratio=0.25"])
    packed = packed_samplers(apex, 2)
    assert shape(packed) == (2, 4) and packed.policy_options.update_ratio == 0.5  # a round per 512 env steps either way
    default = packed_samplers(load_graph(f"{graphs_dir}/dqn-cartpole-apex.yaml", ["roles.sampler.replicas=4"]), 2)
    assert default.policy_options.update_ratio is None  # its default, one round per collect of each sampler


def test_elastic_samplers_and_envs_past_a_backends_limit_are_left_or_split_as_they_fit(graphs_dir):
    elastic = load_graph(
        f"{graphs_dir}/ppo-cartpole-async.yaml", ["roles.sampler.replicas=4", "roles.sampler.max_replicas=8"]
    )
    assert packed_samplers(elastic, 2) is elastic
    many = load_graph(
        f"{graphs_dir}/ppo-cartpole-async.yaml",
        ["roles.sampler.replicas=8", "roles.sampler.envs=64", "roles.sampler.vector=async"],
    )  # fmt: skip
    assert shape(packed_samplers(many, 1)) == (2, 256)  # async starts a process per env: at most 256 a sampler


def test_a_run_on_the_embedded_cluster_packs_its_samplers_and_keeps_the_graph_as_written(
    graphs_dir, tmp_path, monkeypatch
):
    """4 samplers of 2 envs on a machine of 2 cores: 2 samplers of 4 on 3 workers; the run directory's config
    is the graph as written (a resume packs it again), and the shipped cluster file packs."""
    monkeypatch.setattr(dagrl.clusters.local, "usable_cores", lambda: 2)
    graph = load_graph(
        f"{graphs_dir}/ppo-cartpole-async.yaml",
        ["roles.sampler.replicas=4", "roles.sampler.envs=2", "stop.iterations=3", f"runs_dir={tmp_path}"],
    )  # fmt: skip
    with dagrl_log() as messages:
        summary = dagrl.train(graph, cluster=LocalClusterSpec(dashboard_address=":0"))
    run = Path(summary["run_dir"])
    actors = json.loads((run / "actors.json").read_text())
    samplers = [a for a in actors if a["role"] == "sampler"]
    assert [a["envs"] for a in samplers] == [4, 4] and len({a["address"] for a in actors}) == 3, actors
    assert summary["iterations"] == 3
    assert any("4 replicas of 2 envs on 2 cores run as 2 of 4" in m for m in messages), messages
    written = yaml.safe_load((run / "config.yaml").read_text())
    assert (written["roles"]["sampler"]["replicas"], written["roles"]["sampler"]["envs"]) == (4, 2)
    spec = load_cluster(Path(__file__).parents[1] / "clusters" / "local.yaml")
    assert spec.pack_samplers is True
