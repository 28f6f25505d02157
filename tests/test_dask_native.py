"""Fragments run as Dask tasks on their role's worker, and values move worker to worker, not via the driver."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
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


@pytest.mark.parametrize(("graph_file", "over"), [("ppo-cartpole-sync.yaml", ["policy.mailbox=false"])])
def test_fragments_are_tasks_on_their_workers_and_rollouts_skip_the_driver(client, graphs_dir, graph_file, over):
    """Rollouts travel from the samplers' workers to the learner's through Dask (Dask's transfer logs);
    under ``sync`` on one host they go through the mailbox instead (``tests/test_mailbox.py``), so this
    checks Dask's path with it off. ``async`` streams them past the scheduler (``tests/test_stream.py``)."""
    from distributed import get_task_stream

    graph = load_graph(f"{graphs_dir}/{graph_file}", [*BIG, *over])
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


def test_announced_reports_match_the_outputs_they_stand_for(client, graphs_dir):
    """A sampler task logs its output's report as a Dask event: what the driver reads equals the report
    of the rollout that stayed on the worker, and no ``report`` task runs."""
    from distributed import get_task_stream

    from dagrl.runtime.executor import Transport
    from dagrl.runtime.report import report
    from dagrl.runtime.shm import unwrap

    graph = load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", ["roles.sampler.replicas=2", "roles.sampler.envs=4"])
    policy = build_policy(graph, client)
    ex, nodes = policy.executor, graph.algorithm.graph.nodes
    collect = next(n for n in nodes if n.name == "collect")
    roles, publish = graph.algorithm.roles, nodes[0]
    announced_collect = Transport(announce=frozenset({collect.id}))
    try:
        with get_task_stream(client) as ts:
            calls = ex.run_nodes(nodes[:2], policy.hosts, roles, transport=announced_collect)
            announced = calls[collect.id]
            for _ in range(3):  # more rollouts with the same weights: CartPole episodes finish within them
                more = {publish.id: calls[publish.id]}
                announced += ex.run_nodes([collect], policy.hosts, roles, calls=more, transport=announced_collect)[
                    collect.id
                ]
            reports = ex.wait([ex.report(c) for c in announced])
        outputs = [unwrap(v) for v in client.gather([c.future for c in announced])]
    finally:
        policy.close()
    assert {rec["key"].split("-")[0] for rec in ts.data} == {"publish", "collect"}
    assert sum(len(r.episodes) for r in reports) > 0
    for got, out in zip(reports, outputs, strict=True):
        want = report(out)
        assert got.counted and got.env_steps == want.env_steps == 4 * 32
        np.testing.assert_array_equal(got.episodes.returns, want.episodes.returns)
        np.testing.assert_array_equal(got.episodes.lengths, want.episodes.lengths)
        np.testing.assert_array_equal(got.episodes.in_window, want.episodes.in_window)


class _Future:
    """Just enough of a Dask future for :class:`Announced`: a key, a status, an exception."""

    def __init__(self, key, status, error=None):
        self.key, self.status, self.error = key, status, error

    def exception(self):
        return self.error

    def result(self, timeout=None):
        return self.error


class _Client:
    def subscribe_topic(self, topic, handler):
        self.topic, self.handler = topic, handler


def test_an_announced_report_is_the_event_else_a_report_task_else_the_calls_error():
    from dagrl.core.context import Episodes
    from dagrl.runtime.announce import Announced, Announcements
    from dagrl.runtime.report import Report, report_message

    class Rollout:
        env_steps, episodes = 96, Episodes(np.array([3.0, 9.5]), np.array([3, 10]), np.array([False, True]))

    client = _Client()
    board = Announcements(client)
    tasks = []

    def fallback(future):
        tasks.append(future.key)
        return _Future("report-" + future.key, "finished", Report(7))

    client.handler((0.0, {"key": "collect-a", **report_message(Rollout())}))  # the worker's event
    got = Announced(_Future("collect-a", "finished"), board, fallback).result(timeout=1)
    assert got.env_steps == 96 and got.counted and tasks == []
    np.testing.assert_array_equal(got.episodes.returns, [3.0, 9.5])
    np.testing.assert_array_equal(got.episodes.in_window, [False, True])

    lost = Announced(_Future("collect-b", "finished"), board, fallback)
    lost.GRACE_S = 0.2
    with pytest.raises(TimeoutError):  # finished, no event yet: wait for it a while
        lost.result(timeout=0.1)
    assert lost.result(timeout=1).env_steps == 7 and tasks == ["collect-b"]  # then a report task, once

    failed = Announced(_Future("collect-c", "error", ValueError("env exploded")), board, fallback)
    with pytest.raises(ValueError, match="env exploded"):
        failed.result(timeout=1)

    board.forget(["collect-d"])  # cancelled before its task's event came: the event is dropped on arrival
    client.handler((0.0, {"key": "collect-d", **report_message(Rollout())}))
    assert board.got == {} and board.forgotten == set()


def test_a_policy_waits_through_its_own_client_when_another_is_the_default(client, graphs_dir):
    """A notebook may hold two clients, each on its own event loop, the newest being Dask's default:
    a policy built on the first still runs (``distributed.wait`` alone would wait on the other's loop)."""
    from distributed import Client, default_client

    other = Client(client.scheduler.address, set_as_default=False)
    try:
        with other.as_current():  # as `with Client(...)` or the newest client in a notebook would be
            assert default_client() is other and other.loop is not client.loop
            policy = build_policy(load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml"), client)
            try:
                results = [policy.step() for _ in range(2)]
            finally:
                policy.close()
    finally:
        other.close()
    assert [r.env_steps for r in results] == [2 * 4 * 32] * 2
