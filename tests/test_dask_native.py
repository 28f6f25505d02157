"""Fragments run as Dask tasks on their role's worker, and values move worker to worker, not via the driver."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.graph import load_graph
from dagrl.policies import build_policy

BIG = ["roles.sampler.envs=32", "hyperparameters.num_steps=128", "hyperparameters.update_epochs=1"]
"""Rollouts of 32 envs x 128 steps: ~100 KB each, far above the driver's metrics and reports."""


def outgoing(client):
    """Every transfer each worker served since the last call: (worker, requester, key, bytes)."""

    def drain(dask_worker):
        log = list(dask_worker.transfer_outgoing_log)
        dask_worker.transfer_outgoing_log.clear()
        return [(e["who"], k, n) for e in log for k, n in e["keys"].items()]

    return [(w, who, k, n) for w, rows in client.run(drain).items() for who, k, n in rows]


@pytest.mark.parametrize("graph_file", ["ppo-cartpole-sync.yaml", "ppo-cartpole-async.yaml"])
def test_fragments_are_tasks_on_their_workers_and_rollouts_skip_the_driver(client, graphs_dir, graph_file):
    from distributed import get_task_stream

    graph = load_graph(f"{graphs_dir}/{graph_file}", BIG)
    policy = build_policy(graph, client)
    try:
        where = {(h.role, h.index): h.address for hs in policy.hosts.values() for h in hs}
        outgoing(client)  # forget the actors' start
        with get_task_stream(client) as ts:
            results = [policy.step() for _ in range(3)]
        transfers = outgoing(client)
    finally:
        policy.close()
    assert all(r.env_steps > 0 for r in results)
    assert all(np.isfinite(r.metrics["losses/value"]) for r in results)

    ran = {}  # task prefix -> workers it ran on
    for rec in ts.data:
        prefix = rec["key"].rsplit("-", 1)[0]  # fragment-role-replica-<uuid>
        ran.setdefault(prefix, set()).add(rec["worker"])
    samplers = {where[("sampler", i)] for i in range(graph.role("sampler").replicas)}
    for i in range(graph.role("sampler").replicas):
        assert ran[f"collect-sampler-{i}"] == {where[("sampler", i)]}
    assert ran["update-learner-0"] == {where[("learner", 0)]}
    assert ran["publish-learner-0"] == {where[("learner", 0)]}

    workers = set(where.values())
    rollout_bytes = sum(n for w, who, k, n in transfers if k.startswith("collect-") and who == where[("learner", 0)])
    to_driver = [(k, n) for w, who, k, n in transfers if who not in workers]
    rollouts_to_driver = sum(n for k, n in to_driver if k.startswith("collect-"))
    sampled = sum(r.env_steps for r in results)
    assert rollout_bytes >= sampled * 4 * 4 * 0.5  # at least the float32 observations reached the learner
    assert all(w in samplers for w, who, k, n in transfers if k.startswith("collect-"))
    assert rollouts_to_driver == 0
    assert sum(n for _, n in to_driver) < rollout_bytes / 20, to_driver  # reports and metrics only


def test_sync_counts_env_steps_without_a_report_task_per_rollout(client, graphs_dir):
    """Under ``sync`` the update's task reports the rollouts it consumed (their env steps and episodes
    reach the driver with the metrics): no ``report`` task runs, and the counts are the same as single's."""
    from distributed import get_task_stream

    over = ["roles.sampler.replicas=2", "roles.sampler.envs=4"]
    single = build_policy(load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", over))
    expected = [single.step() for _ in range(3)]
    policy = build_policy(load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", over), client)
    try:
        with get_task_stream(client) as ts:
            results = [policy.step() for _ in range(3)]
    finally:
        policy.close()
    prefixes = {rec["key"].split("-")[0] for rec in ts.data}
    assert prefixes == {"publish", "collect", "update"}
    for a, b in zip(expected, results, strict=True):
        assert a.env_steps == b.env_steps == 2 * 4 * 32
        np.testing.assert_array_equal(a.episodes.returns, b.episodes.returns)
        np.testing.assert_array_equal(a.sources, b.sources)  # which sampler each episode came from
