"""Distributed policies against the single-process reference, on a real LocalCluster."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.graph import RoleSpec, load_graph
from dagrl.policies import build_policy
from dagrl.runtime.placement import PlacementError, place

LOSSES = ["losses/policy", "losses/value", "losses/approx_kl", "losses/clipfrac"]


def first_iterations(graph, client, n=3):
    policy = build_policy(graph, client)
    try:
        return [policy.step() for _ in range(n)]
    finally:
        policy.close()


@pytest.mark.parametrize("samplers", [1, 2])
def test_sync_reproduces_single_exactly(client, graphs_dir, samplers):
    over = [f"roles.sampler.replicas={samplers}", "roles.sampler.envs=4"]
    single = first_iterations(load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", over), None)
    sync = first_iterations(load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", over), client)
    for a, b in zip(single, sync, strict=True):
        assert a.env_steps == b.env_steps == samplers * 4 * 32
        np.testing.assert_array_equal(a.episodes.returns, b.episodes.returns)
        for key in LOSSES:
            assert a.metrics[key] == b.metrics[key], key


def test_sync_actors_live_on_distinct_worker_processes(client, graphs_dir):
    graph = load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml")
    policy = build_policy(graph, client)
    try:
        actors = policy.actors()
    finally:
        policy.close()
    assert sorted(a["role"] for a in actors) == ["learner", "sampler", "sampler"]
    assert len({a["pid"] for a in actors}) == 3
    assert len({a["address"] for a in actors}) == 3


def test_async_reports_bounded_staleness(client, graphs_dir):
    graph = load_graph(f"{graphs_dir}/ppo-cartpole-async.yaml", ["policy.max_staleness=1"])
    results = first_iterations(graph, client, n=8)
    assert all(r.env_steps > 0 for r in results)
    assert all(0 <= r.metrics["perf/staleness"] <= 1 for r in results)
    assert all(np.isfinite(r.metrics["losses/value"]) for r in results)


def test_placement_prefers_gpu_workers_and_spreads_the_rest():
    workers = {"tcp://a": {"resources": {"GPU": 1}}, "tcp://b": {}, "tcp://c": {}}
    out = place({"sampler": RoleSpec(replicas=2), "learner": RoleSpec(resources={"GPU": 1})}, workers)
    assert out[("learner", 0)] == "tcp://a"
    assert {out[("sampler", 0)], out[("sampler", 1)]} == {"tcp://b", "tcp://c"}


def test_placement_without_gpu_worker():
    workers = {"tcp://b": {"resources": {}}}
    roles = {"learner": RoleSpec(resources={"GPU": 1})}
    assert place(roles, workers) == {("learner", 0): "tcp://b"}  # falls back, host logs it
    with pytest.raises(PlacementError, match="GPU"):
        place(roles, workers, gpu_fallback=False)


def test_placement_checks_cpu_threads_and_custom_resources():
    workers = {"tcp://a": {"nthreads": 1, "resources": {}}, "tcp://b": {"nthreads": 2, "resources": {"SSD": 1}}}
    assert place({"replay": RoleSpec(resources={"SSD": 1})}, workers) == {("replay", 0): "tcp://b"}
    assert place({"sampler": RoleSpec(resources={"CPU": 2})}, workers) == {("sampler", 0): "tcp://b"}
    with pytest.raises(PlacementError, match="TPU"):
        place({"learner": RoleSpec(resources={"TPU": 1})}, workers)


def test_data_parallel_replicas_get_distinct_workers_first_and_on_replacement():
    from dagrl.runtime.placement import place_one

    workers = {f"tcp://{i}": {"resources": {}} for i in range(4)}
    roles = {"sampler": RoleSpec(replicas=2), "replay": RoleSpec(replicas=2), "learner": RoleSpec(replicas=2)}
    out = place(roles, workers)  # 6 actors on 4 workers: the two learners still apart
    assert out[("learner", 0)] != out[("learner", 1)]
    load = {"tcp://0": 1, "tcp://1": 1, "tcp://2": 2, "tcp://3": 2}
    assert place_one("learner", RoleSpec(replicas=2), workers, load, True) == "tcp://0"
    avoid = frozenset({"tcp://0"})  # where the other replica lives
    assert place_one("learner", RoleSpec(replicas=2), workers, load, True, avoid) == "tcp://1"
    assert place_one("learner", RoleSpec(replicas=2), {"tcp://0": {}}, {}, True, avoid) is None
