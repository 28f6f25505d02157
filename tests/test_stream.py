"""``async``'s stream: samplers push to the learner's hub, the learner pulls; the driver only watches.

The hub alone (no cluster): what a round takes, what waits, what is refused. On a real LocalCluster:
no scheduler task and no rollout bytes on the driver per rollout, and a learner that is lost or raises
is rolled back without any rollout made with its old weights reaching the restored one.
"""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.policies import build_policy
from dagrl.runtime.report import Report
from dagrl.runtime.stream import STOP, Go, Hub, Learned, Moved, Refused


def _hub(**kw) -> Hub:
    opts = {"samplers": 2, "budget": 2, "capacity": 2, "max_staleness": 1, **kw}
    hub = Hub(f"test-{id(opts)}", 0, 0, **opts)
    hub.publish(0, {0: ["w0"]})
    return hub


def _round(hub: Hub) -> None:
    hub.learned(0, Learned(0, {}, [], [], 0, 0.0, 0.0, hub.version), {0: [f"w{hub.version + 1}"]})


def test_a_round_takes_what_arrived_up_to_its_budget_once_allowed():
    async def main():
        hub = _hub(budget=2, capacity=4)
        for i in range(3):
            assert await hub.put(i % 2, 0, 0, i, Report(env_steps=4)) == Go(0)
        assert hub.allowed == 0 and hub.queue  # nothing taken before the driver allows a round
        hub.allowed = 1
        got = hub.take(0)
        assert [a.value for a in got.arrivals] == [0, 1] and not got.stale
        _round(hub)
        got = await asyncio.to_thread(_take_allowed, hub)
        assert [a.value for a in got.arrivals] == [2]  # one is enough: the learner does not wait for a full budget
        status = await hub.drain(2, 0.0, 0.0)
        assert [r.index for r in status.rounds] == [1] and status.arrived == 3

    asyncio.run(main())


def _take_allowed(hub: Hub):
    with hub.cond:
        hub.allowed = 2
    return hub.take(0)


def test_a_learner_groups_round_takes_a_multiple_of_its_replicas():
    """Two learner replicas: a budget of 3 and a least of 1 become 2 and 2, and three arrived rollouts give a
    round of two (the third waits for the next)."""

    async def main():
        hub = _hub(samplers=3, budget=3, capacity=6, least=1, group=2)
        assert (hub.budget, hub.least) == (2, 2)
        for i in range(3):
            await hub.put(i, 0, 0, i, Report(env_steps=4))
        hub.allowed = 1
        assert [a.value for a in hub.take(0).arrivals] == [0, 1]
        assert [a.value for a in hub.queue] == [2]
        await hub.resize(5, 6, 5, group=4)
        assert (hub.budget, hub.least, hub.group) == (4, 4, 4)

    asyncio.run(main())


def test_a_round_that_failed_on_a_lost_learner_replica_hands_its_rollouts_back_first_in_line():
    """The group's round broke (a replica lost mid all-reduce): its rollouts are the next round's, ahead of
    those that arrived meanwhile, and the stale ones it dropped still have their reports counted."""

    async def main():
        hub = _hub(samplers=3, budget=2, capacity=6, least=1, max_staleness=1)
        await hub.put(0, 0, 0, "old", Report(env_steps=4))
        hub.publish(2, {0: ["w2"]})
        for i in range(2):
            await hub.put(i + 1, 0, 2, f"a{i}", Report(env_steps=4))
        hub.allowed = 1
        got = hub.take(0)
        assert [a.value for a in got.arrivals] == ["a0", "a1"] and [a.value for a in got.stale] == ["old"]
        await hub.put(0, 0, 2, "later", Report(env_steps=4))
        hub.requeue(got.arrivals, got.stale)
        again = hub.take(0)
        assert [a.value for a in again.arrivals] == ["a0", "a1"] and [a.value for a in again.stale] == ["old"]
        assert [a.value for a in hub.queue] == ["later"] and hub.dropped == 1

    asyncio.run(main())


def test_stale_rollouts_are_dropped_and_counted():
    async def main():
        hub = _hub(max_staleness=1, capacity=4)
        await hub.put(0, 0, 0, "old", Report(env_steps=4))
        hub.publish(2, {0: ["w2"]})  # two versions later
        await hub.put(1, 0, 2, "fresh", Report(env_steps=4))
        hub.allowed = 1
        got = hub.take(0)
        assert [a.value for a in got.stale] == ["old"] and [a.value for a in got.arrivals] == ["fresh"]
        assert hub.dropped == 1

    asyncio.run(main())


def test_a_full_hub_holds_the_sampler_before_its_next_collect_and_frees_it_when_the_learner_takes():
    async def main():
        hub = _hub(budget=1, capacity=1)
        put = asyncio.ensure_future(hub.put(0, 0, 0, "a", Report(env_steps=4)))
        await asyncio.sleep(0.05)
        assert not put.done() and hub.seats[0].blocked  # its rollout delivered, the sampler waits to collect
        hub.allowed = 1
        await asyncio.to_thread(hub.take, 0)
        assert await asyncio.wait_for(put, 2.0) == Go(0)
        assert not hub.seats[0].blocked

    asyncio.run(main())


def test_a_retired_hub_refuses_and_redirects_and_a_new_generation_refuses_old_weights():
    async def main():
        hub = _hub(capacity=4)
        await hub.put(0, 0, 0, "a", Report(env_steps=4))
        assert await hub.retire("tcp://new", "hub-key", 1) == 1  # the waiting rollout is dropped
        assert not hub.queue
        assert await hub.put(1, 0, 0, "b", Report(env_steps=4)) == Moved("tcp://new", "hub-key", 1)
        assert hub.refused == 2
        new = Hub("test-new", 1, 5, samplers=2, budget=2, capacity=2, max_staleness=1)
        assert await new.put(0, 0, 3, "c", Report(env_steps=4)) == Refused(1)
        assert not new.queue and new.refused == 1

    asyncio.run(main())


def _new_keys(client) -> set[str]:
    return set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)))


def test_async_runs_no_task_per_rollout_and_sends_the_driver_reports_only(client, graphs_dir):
    """Once the loops run, a round costs the scheduler nothing (no task is created) and the driver
    receives the rounds' metrics and reports, far smaller than the rollouts the learner received."""
    over = ["roles.sampler.envs=16", "hyperparameters.num_steps=128"]
    graph = load_graph(f"{graphs_dir}/ppo-cartpole-async.yaml", over)
    policy = build_policy(graph, client)
    seen = []
    take = policy.watch._take_status
    policy.watch._take_status = lambda s: (seen.append(len(pickle.dumps(s))), take(s))
    try:
        policy.step()  # starts the hub and the loops (tasks, once)
        before = _new_keys(client)
        results = [policy.step() for _ in range(12)]
        after = _new_keys(client)
        arrived = policy.watch.status.arrived
    finally:
        policy.close()
    assert after - before == set(), sorted(after - before)
    assert all(r.env_steps > 0 and np.isfinite(r.metrics["losses/value"]) for r in results)
    per_rollout = 16 * graph.config.num_steps
    counted = sum(r.env_steps for r in results)
    assert counted == sum(r.metrics["perf/rollouts_per_update"] for r in results) * per_rollout
    rollout_bytes = arrived * per_rollout * 4 * 4  # the float32 observations alone
    assert sum(seen) < rollout_bytes / 20, (sum(seen), rollout_bytes)


def _after_rollback(run, iterations: int):
    summary = run.finish()
    assert summary["stop_reason"] == "iterations" and summary["iterations"] == iterations
    (rollback,) = run.events("rollback")
    rows = run.rundir.read_metrics()
    assert [r["iteration"] for r in rows] == list(range(1, iterations + 1))
    after = [r for r in rows if r["iteration"] > rollback["to_iteration"]]
    start = run.policy.watch.starts[1]
    assert start > max(r["stream/version"] for r in rows if r["iteration"] <= rollback["to_iteration"])
    # the restored learner trained only on rollouts made with its own weights
    assert min(r["stream/oldest_version"] for r in after) >= start, [r["stream/oldest_version"] for r in after]
    return rows, after


@pytest.mark.slow
def test_killed_learner_under_async_rolls_back_onto_a_new_hub(cluster, tmp_path):
    from tests.test_supervision import Run

    graph = load_graph("graphs/ppo-cartpole-async.yaml", ["checkpoint.every=5", "stop.iterations=30"])
    run = Run(graph, cluster, tmp_path)
    run.wait_iteration(12)
    run.kill("learner")
    _after_rollback(run, 30)
    assert [(e["role"], e["kind"]) for e in run.events("restart")] == [("learner", "lost")]


@pytest.mark.slow
def test_a_learner_that_raises_under_async_is_rolled_back_and_old_rollouts_are_refused(cluster, tmp_path, faults):
    """The learner's worker survives, and so does its hub: retired, it refuses what the samplers made with
    the weights from before the rollback and sends them to the restored learner's hub."""
    from tests.test_supervision import Run

    graph = load_graph(
        "graphs/ppo-cartpole-async.yaml", ["algorithm=tests.faulty_ppo", "checkpoint.every=4", "stop.iterations=24"]
    )
    run = Run(graph, cluster, tmp_path)
    rows, after = _after_rollback(run, 24)
    assert [(e["role"], e["kind"]) for e in run.events("restart")] == [("learner", "raised")]
    assert after[-1]["stream/refused"] >= 1, [r["stream/refused"] for r in after]


def test_a_hung_sampler_loop_under_async_is_replaced_and_the_other_keeps_the_learner_fed(cluster, tmp_path, faults):
    from tests.test_supervision import Run

    graph = load_graph(
        "graphs/ppo-cartpole-async.yaml",
        [
            "env.id=tests.faulty_ppo:HangsOnce-v0",
            "stop.iterations=150",
            "stop.mean_return=1.0e9",
            "supervision.hang_timeout_s=3",
        ],
    )  # the hang comes at the third iteration; 150 outlast the 3 s it takes to call it hung
    run = Run(graph, cluster, tmp_path)
    summary = run.finish()
    assert summary["iterations"] == 150
    assert [(e["role"], e["kind"]) for e in run.events("restart")] == [("sampler", "hung")]


def test_a_replaced_samplers_loop_is_told_to_stop_and_nothing_of_it_is_taken():
    """A sampler's loop on a host cut off and back speaks with its old token after the driver started
    a replacement loop for the same index: the hub takes the new loop's rollouts and ends the old one."""

    async def main():
        hub = _hub(capacity=4)
        await hub.own(0, "old")
        assert await hub.put(0, 0, 0, "a", Report(env_steps=4), "old") == Go(0)
        await hub.own(0, "new")  # the driver replaced sampler 0
        assert await hub.put(0, 0, 0, "late", Report(env_steps=4), "old") is STOP
        assert await hub.begin(0, "old") is STOP
        assert await hub.put(0, 0, 0, "b", Report(env_steps=4), "new") == Go(0)
        assert [a.value for a in hub.queue] == ["a", "b"] and hub.refused == 2

    asyncio.run(main())


def test_split_learner_rounds_update_critic_and_actor_at_once_the_actor_on_the_last_critic():
    """``split-learner`` on the streams: in a round the actor's update takes the critic's weights of the
    round before (its delayed edge), so the two updates run at the same time; the first round, having no
    round before, waits for the critic."""
    import threading
    import time

    from dagrl.core.distribution import delayed_edges, stream_shape
    from dagrl.core.fragment import load_algorithm
    from dagrl.runtime.host import HOSTS
    from dagrl.runtime.loops import Caller

    algo = load_algorithm("sac")
    shape, roles = stream_shape(algo), algo.roles
    spans, seen, lock = {}, {}, threading.Lock()

    class Host:
        def __init__(self, role):
            self.role, self.rounds = role, 0

        def traced(self, name, *args):
            t0 = time.perf_counter()
            if name.startswith("update"):
                time.sleep(0.3)
            with lock:
                self.rounds += name.startswith("update")
                spans.setdefault(name, []).append((t0, time.perf_counter()))
                seen.setdefault(name, []).append(args)
            return f"{name}-{self.rounds}"

    hosts, kept = {}, [Host(role) for role in ("replay", "critic", "actor")]  # HOSTS holds them weakly
    for host in kept:
        HOSTS[f"test-split-{host.role}"] = host
        hosts[host.role] = [(f"test-split-{host.role}", "tcp://nowhere:1")]
    try:
        caller = Caller(hosts)
        caller.delayed = frozenset(delayed_edges(algo))
        given = {a.id: ["outside"] for n in shape.learn for a in n.inputs if hasattr(a, "id") and a not in shape.learn}
        for _ in range(2):
            caller.learn(shape.learn, given, roles)
    finally:
        for role in ("replay", "critic", "actor"):
            HOSTS.pop(f"test-split-{role}")
    (first_critic, second_critic), (first_actor, second_actor) = spans["update_critic"], spans["update_actor"]
    assert first_actor[0] >= first_critic[1]  # round 1: no critic of a round before, it waits
    assert second_actor[0] < second_critic[1] and second_critic[0] < second_actor[1]  # round 2: at once
    assert seen["update_actor"][1][-1] == "update_critic-1"  # round 2's actor: round 1's critic
