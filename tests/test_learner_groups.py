"""Learner groups under the streams: ``roles.learner.replicas: K`` with ``async`` and ``apex``, on a real
LocalCluster (each learner replica a worker process of its own, averaging gradients with gloo)."""

from __future__ import annotations

import pytest

from dagrl.app.graphs import load_graph
from dagrl.core.schema import ConfigError
from dagrl.runtime.checkpoint import load_checkpoint
from dagrl.runtime.groups import ReplicasDiverged
from tests.test_supervision import Run


def test_two_ppo_learners_share_each_round_and_stay_equal_after_every_round(cluster, tmp_path):
    """A checkpoint every iteration compares the replicas' digests after every round (the stream rests at
    each); both learn (the group's frames are twice one replica's) and the checkpoint holds one state."""
    graph = load_graph(
        "graphs/ppo-cartpole-async.yaml",
        ["roles.learner.replicas=2", "stop.iterations=8", "stop.mean_return=null", "checkpoint.every=1"],
    )
    run = Run(graph, cluster, tmp_path)
    summary = run.finish()
    assert summary["iterations"] == 8, summary
    rows = run.rundir.read_metrics()
    # each round: 2 rollouts, one per replica (4 envs x 32 steps = 128 rows), 20 epochs of one minibatch each
    assert {r["perf/rollouts_per_update"] for r in rows} == {2.0}
    assert {r["perf/frames"] for r in rows} == {20 * 128 * 2}
    assert all(0.0 < r["learners/0/busy"] <= 1.0 and 0.0 < r["learners/1/busy"] <= 1.0 for r in rows)
    ckpt = load_checkpoint(run.rundir.path)
    assert len(ckpt["roles"]["learner"]) == 1
    assert ckpt["roles"]["learner"][0]["updates"] == 8


@pytest.mark.parametrize(
    "path, overrides",
    [
        ("graphs/mappo-spread.yaml", ["roles.sampler.envs=8"]),
        ("graphs/ppo-lstm-cartpole-novel.yaml", ["policy=async"]),
        ("graphs/impala-lstm-cartpole-novel.yaml", []),
        (
            "graphs/r2d2-cartpole-novel.yaml",
            ["roles.replay.replicas=2", "hyperparameters.learning_starts=8", "hyperparameters.batch_size=8"],
        ),
    ],
    ids=["mappo", "ppo-lstm", "impala-lstm", "r2d2-apex"],
)
def test_multi_agent_and_recurrent_learners_run_as_groups(cluster, tmp_path, path, overrides):
    """MAPPO's central critic and the recurrent learners (under async, and R2D2 under apex) as two
    replicas: the replicas are compared at each of the checkpoints, one an iteration."""
    graph = load_graph(path, [*overrides, "roles.learner.replicas=2", "stop.iterations=6", "stop.mean_return=null",
                              "checkpoint.every=1"])  # fmt: skip
    run = Run(graph, cluster, tmp_path)
    summary = run.finish()
    assert summary["iterations"] == 6, summary
    rows = run.rundir.read_metrics()
    learnt = [r for r in rows if r.get("perf/frames", 0) > 0]
    assert learnt, rows  # the replicas learnt, and were compared at each checkpoint after
    assert all(r["learners/0/busy"] > 0 and r["learners/1/busy"] > 0 for r in learnt)
    assert len(load_checkpoint(run.rundir.path)["roles"]["learner"]) == 1


def test_an_algorithm_that_does_not_average_its_gradients_is_stopped_after_the_first_round(cluster, tmp_path):
    graph = load_graph(
        "graphs/ppo-cartpole-async.yaml",
        ["algorithm=tests.unaveraged", "roles.learner.replicas=2", "stop.iterations=4", "stop.mean_return=null"],
    )
    run = Run(graph, cluster, tmp_path)
    run.thread.join(timeout=180)
    assert isinstance(run.error, ReplicasDiverged), run.error
    assert "after the first round" in str(run.error) and "async" in str(run.error)


def test_a_round_takes_a_multiple_of_the_group(cluster, tmp_path):
    """``min_rollouts_per_update: 1`` would let a round take one rollout: with two learners it takes two."""
    graph = load_graph(
        "graphs/ppo-cartpole-async.yaml",
        [
            "roles.learner.replicas=2", "policy.rollouts_per_update=3", "policy.min_rollouts_per_update=1",
            "stop.iterations=6", "stop.mean_return=null",
        ],
    )  # fmt: skip
    run = Run(graph, cluster, tmp_path)
    summary = run.finish()
    assert summary["iterations"] == 6
    assert {r["perf/rollouts_per_update"] for r in run.rundir.read_metrics()} == {2.0}


def test_a_lost_learner_replica_is_replaced_without_a_rollback(cluster, tmp_path):
    """Learner replica 1's worker is killed mid-run: a new replica takes replica 0's weights, the group forms
    anew and the iterations go on, none redone; the replicas are equal at the end."""
    graph = load_graph(
        "graphs/ppo-cartpole-async.yaml",
        ["roles.learner.replicas=2", "stop.iterations=16", "stop.mean_return=null", "checkpoint.every=4"],
    )
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("learner", at=4, index=1)
    assert summary["iterations"] == 16, summary
    events = run.policy.supervisor.events
    assert [(e.role, e.index) for e in events] == [("learner", 1)], events
    rows = run.rundir.read_metrics()
    assert [r["iteration"] for r in rows] == list(range(1, 17))  # no rollback: each iteration once
    ckpt = load_checkpoint(run.rundir.path)
    assert ckpt["roles"]["learner"][0]["updates"] == 16


def test_learner_replicas_need_a_shareable_stream(tmp_path):
    with pytest.raises(ConfigError, match=r"roles\.sampler\.replicas.*3: must be a multiple of roles\.learner"):
        load_graph("graphs/ppo-cartpole-async.yaml", ["roles.learner.replicas=2", "roles.sampler.replicas=3"])
    with pytest.raises(ConfigError, match=r"single instance.*policy async, apex, dp-learners"):
        load_graph("graphs/ppo-cartpole-seed.yaml", ["roles.learner.replicas=2"])
    with pytest.raises(ConfigError, match=r"roles\.replay\.replicas.*1: must be a multiple of roles\.learner"):
        load_graph("graphs/dqn-cartpole-apex.yaml", ["roles.learner.replicas=2"])


@pytest.mark.slow
def test_ppo_with_two_learners_under_async_reaches_475(cluster, tmp_path):
    graph = load_graph("graphs/ppo-cartpole-async.yaml", ["roles.learner.replicas=2"])
    run = Run(graph, cluster, tmp_path)
    summary = run.finish(timeout=600)
    assert summary["mean_return"] >= 475, summary


@pytest.mark.slow
def test_impala_with_two_learners_reaches_475(cluster, tmp_path):
    graph = load_graph("graphs/impala-cartpole.yaml", ["roles.learner.replicas=2"])
    summary = Run(graph, cluster, tmp_path).finish(timeout=600)
    assert summary["mean_return"] >= 475, summary


@pytest.mark.slow
def test_dqn_under_apex_with_two_learners_reaches_195(cluster, tmp_path):
    """Two replay shards, one per learner replica (shard m feeds learner m % 2, which reprioritises it)."""
    graph = load_graph("graphs/dqn-cartpole-apex.yaml", ["roles.learner.replicas=2", "roles.replay.replicas=2"])
    run = Run(graph, cluster, tmp_path)
    summary = run.finish(timeout=600)
    assert summary["mean_return"] >= 195, summary
    learnt = [r for r in run.rundir.read_metrics() if r.get("perf/frames", 0) > 0]
    assert learnt and all(r["perf/frames"] % (2 * 64) == 0 for r in learnt)  # both replicas' batches counted
