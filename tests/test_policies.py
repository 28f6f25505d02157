"""Distributed policies against the single-process reference, on a real LocalCluster."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.core.graph import RoleSpec
from dagrl.policies import build_policy
from dagrl.runtime.placement import PlacementError, place, place_one

LOSSES = ["losses/policy", "losses/value", "losses/approx_kl", "losses/clipfrac"]


def first_iterations(graph, client, n=3):
    policy = build_policy(graph, client)
    try:
        return [policy.step() for _ in range(n)]
    finally:
        policy.close()


@pytest.mark.parametrize(
    ("samplers", "env"), [(1, "CartPole-v1"), (2, "CartPole-v1"), (2, "dagrl.envs:Combination-v0")]
)  # Combination: MultiDiscrete actions, a categorical head per entry
def test_sync_reproduces_single_exactly(client, graphs_dir, samplers, env):
    over = [f"roles.sampler.replicas={samplers}", "roles.sampler.envs=4", f"env.id={env}"]
    single = first_iterations(load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", over), None)
    sync = first_iterations(load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", over), client)
    for a, b in zip(single, sync, strict=True):
        assert a.env_steps == b.env_steps == samplers * 4 * 32
        np.testing.assert_array_equal(a.episodes.returns, b.episodes.returns)
        for key in LOSSES:
            assert a.metrics[key] == b.metrics[key], key


def train(graph, client, root, listener=None):
    """Train ``graph`` through the driver; the policy's submissions ahead are counted."""
    from dagrl.app.driver import Trainer
    from dagrl.app.progress import Progress
    from dagrl.runtime.rundir import RunDir

    policy = build_policy(graph, client)
    ahead, submit = [], policy.submit_graph
    policy.submit_graph = lambda g, previous=None, **kw: ahead.append(previous is not None) or submit(g, previous, **kw)
    rundir = RunDir.create(root, graph.name)
    trainer = Trainer(graph, policy, rundir, progress=Progress(enabled=False))
    if listener is not None:
        trainer.listeners.append(lambda row, res: listener(trainer, row))
    try:
        summary = trainer.run()
        assert not policy.pending
    finally:
        policy.close()
    return summary, rundir, sum(ahead)


def test_sync_running_ahead_computes_what_single_does(client, graphs_dir, tmp_path):
    """Through the driver, ``sync`` submits iteration k+1 with k (not across a checkpoint or the
    last iteration): the metrics of every iteration and the learner at each checkpoint are single's."""
    from dagrl.runtime.checkpoint import load_checkpoint

    over = ["roles.sampler.replicas=2", "roles.sampler.envs=4", "stop.iterations=7", "stop.mean_return=null"]
    over += ["checkpoint.every=3", "checkpoint.keep=5"]
    runs = {}
    for policy in ("single", "sync"):
        graph = load_graph(f"{graphs_dir}/ppo-cartpole-{policy}.yaml", over)
        runs[policy] = train(graph, client if policy == "sync" else None, tmp_path / policy)
    (s1, d1, ahead1), (s2, d2, ahead2) = runs["single"], runs["sync"]
    assert ahead1 == 0 and ahead2 == 3  # 3, 5, 6 submitted while 2, 4, 5 ran (1: steps unknown; 3, 6: checkpoints)
    assert s1["iterations"] == s2["iterations"] == 7
    rows1, rows2 = d1.read_metrics(), d2.read_metrics()
    assert [r["env_steps"] for r in rows1] == [r["env_steps"] for r in rows2]
    for a, b in zip(rows1, rows2, strict=True):
        assert [a[k] for k in LOSSES] == [b[k] for k in LOSSES]
    for it in (3, 6):
        w1 = load_checkpoint(d1.checkpoint_path(it))["roles"]["learner"][0]
        w2 = load_checkpoint(d2.checkpoint_path(it))["roles"]["learner"][0]
        for key, value in w1["agent"].items():
            assert value.equal(w2["agent"][key]), (it, key)


def test_a_stop_the_driver_did_not_foresee_counts_the_iteration_already_submitted(client, graphs_dir, tmp_path):
    """The stop comes after iteration 3 was submitted with iteration 4 behind it: 4 runs, is logged and
    counted, and nothing is left in flight."""
    import dataclasses

    def stop_at_three(trainer, row):
        if row["iteration"] == 3:
            trainer.stop = dataclasses.replace(trainer.stop, iterations=3)

    graph = load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", ["stop.mean_return=null", "checkpoint.every=0"])
    summary, rundir, ahead = train(graph, client, tmp_path, stop_at_three)
    assert ahead == 2  # 3 submitted while 2 ran, 4 while 3 ran
    assert summary["iterations"] == 4 and summary["stop_reason"] == "iterations"
    assert [r["iteration"] for r in rundir.read_metrics()] == [1, 2, 3, 4]
    assert summary["env_steps"] == 4 * 256


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


def test_samplers_go_to_the_learners_hosts_evenly_before_other_hosts():
    """Two GPU learners on hosts n1 and n2, a CPU-only host a3: the samplers fill the learners' hosts'
    free workers, half on each, and only then a3's; with no learner named, a3 (first by address) fills first."""
    workers = {f"tcp://{h}:{p}": {"host": h, "resources": {"GPU": 1} if p == 0 and h != "a3" else {}}
               for h in ("n1", "n2", "a3") for p in range(4)}  # fmt: skip
    roles = {"sampler": RoleSpec(replicas=8), "learner": RoleSpec(replicas=2, resources={"GPU": 1})}
    out = place(roles, workers, near=["learner"])
    assert {out[("learner", i)] for i in range(2)} == {"tcp://n1:0", "tcp://n2:0"}
    hosts = collections.Counter(workers[out[("sampler", i)]]["host"] for i in range(8))
    assert hosts == {"n1": 3, "n2": 3, "a3": 2}
    first = [workers[out[("sampler", i)]]["host"] for i in range(6)]
    assert sorted(first) == ["n1"] * 3 + ["n2"] * 3  # the learners' hosts before a3
    load = {a: 1 for a in workers}  # a lost sampler's replacement: a learner's host among equals
    assert workers[place_one("sampler", RoleSpec(), workers, load, True, near=frozenset({"n2"}))]["host"] == "n2"
    plain = place(roles, workers)  # without near: the least-loaded workers by address
    assert collections.Counter(workers[plain[("sampler", i)]]["host"] for i in range(8))["a3"] == 4


@pytest.mark.parametrize(("graph_file", "vector"), [("ppo-cartpole-single", "sync"), ("ppo-cartpole-sync", "threads")])
def test_every_env_a_run_made_is_closed_when_it_returns(client, graphs_dir, tmp_path, graph_file, vector, dagrl_log):
    """Role states end with the run, on the workers too: each env made (samplers', the evaluator's) is
    closed before ``dagrl.train`` returns, not whenever its actor is collected; nothing fails to close."""
    import dagrl
    from tests.marking import marks

    folder = tmp_path / "marks"
    over = [
        f"env.wrappers=[{{tests.marking.MarksClose: {{folder: {folder}}}}}]", f"roles.sampler.vector={vector}",
        "stop.iterations=2", "stop.mean_return=null", "evaluate.every=1", f"runs_dir={tmp_path}",
    ]  # fmt: skip
    graph = load_graph(f"{graphs_dir}/{graph_file}.yaml", over)
    summary = dagrl.train(graph, client if graph.spec.policy != "single" else None)
    assert summary["iterations"] == 2
    made = marks(folder, "made")
    assert len(made) >= graph.role("sampler").replicas * graph.role("sampler").envs + 1  # + the evaluator's
    assert marks(folder, "closed") == made
    assert not [r.getMessage() for r in dagrl_log.records if "clos" in r.getMessage()]


def test_a_checkpoint_taken_with_another_count_of_samplers_loads(graphs_dir):
    """A checkpoint taken while a run had more samplers (an elastic one, grown since), fewer, or none with
    a state (a streaming policy's) loads into this one, its learner's state whole, its samplers' envs
    fresh."""
    import torch

    from dagrl.runtime.snapshot import KEY

    policy = build_policy(load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml"), None)
    try:
        policy.step()
        sd = policy.state_dict()
        (snap,) = sd["sampler"]
        assert KEY in snap  # under single, a sampler's whole state
        for samplers in ([snap] * 3, [None] * 3, []):
            policy.load_state_dict({**sd, "sampler": samplers})
            after = policy.state_dict()["learner"][0]["agent"]
            assert all(torch.equal(after[k], v) for k, v in sd["learner"][0]["agent"].items())
    finally:
        policy.close()
