"""Supervision on a real LocalCluster with real signals: killed, crashing, hung and NaN roles."""

from __future__ import annotations

import copy
import os
import signal
import threading
import time

import numpy as np
import pytest

from dagrl.app.driver import Trainer
from dagrl.app.graphs import load_graph, resolve_graph
from dagrl.app.progress import Progress
from dagrl.app.training import write_actors
from dagrl.core.schema import apply_overrides
from dagrl.policies import build_policy
from dagrl.replay import ReplayStore
from dagrl.runtime import shm
from dagrl.runtime.checkpoint import load_checkpoint
from dagrl.runtime.host import run_fragment
from dagrl.runtime.hosts import Start, close_all, start_actors, start_one
from dagrl.runtime.rundir import RunDir
from dagrl.runtime.supervisor import TrainingError
from dagrl.runtime.workers import workers as live_workers
from tests.faulty import SCHEMA, value_of
from tests.helpers import wait_for


def faulty(overrides: list[str]):
    """The graph of tests/faulty.py's algorithm: 2 samplers -> 1 replay shard -> learner."""
    return resolve_graph(apply_overrides(copy.deepcopy(FAULTY), overrides), "faulty")


FAULTY = {
    "algorithm": "tests.faulty",
    "env": {"id": "CartPole-v1"},
    "roles": {"sampler": {"replicas": 2}, "replay": {"replicas": 1}, "learner": {}},
}


def four_workers(client) -> None:
    """One role per worker: wait for a worker killed by the previous test to come back.

    A nanny that could not bring its worker back (seen on a loaded 2-core machine, after a restart;
    a restart takes 3-10 s there) is closed and replaced by a new worker after 30 s, so one lost nanny
    costs one test half a minute, not every later one. Closed, not left beside its stand-in: were it to
    bring its worker back later, a fifth worker would host no role, and a replaced role would go there.
    """
    from distributed.exceptions import WorkerStartTimeoutError

    try:
        client.wait_for_workers(4, timeout=30)
    except WorkerStartTimeoutError:
        lc = client.cluster
        running = {w["name"] for w in live_workers(client).values() if w["status"] == "running"}
        for name in set(lc.worker_spec) - running:  # as the supervisor's respawn: a new name, a new nanny
            lc.worker_spec[f"{name}-new"] = lc.worker_spec.pop(name)
        lc.sync(lc._correct_state)  # closes the old nannies and starts the new ones
        client.wait_for_workers(4, timeout=60)


class Run:
    """A training run in a background thread, with the trainer reachable for killing its roles."""

    def __init__(self, graph, client, tmp_path):
        four_workers(client)
        self.rundir = RunDir.create(tmp_path, graph.name)
        self.policy = build_policy(graph, client, run_dir=self.rundir.path)
        self.trainer = Trainer(graph, self.policy, self.rundir, progress=Progress(enabled=False))
        self.trainer.after_restart.append(lambda: write_actors(self.policy, self.rundir))  # as dagrl.train
        self.summary = self.error = None
        self.killed_pids: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.summary = self.trainer.run()
        except BaseException as err:
            self.error = err
        finally:
            self.policy.close()

    def wait_iteration(self, n: int, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while self.trainer.counters.iteration < n:
            assert self.thread.is_alive(), f"run ended early: {self.error}"
            assert time.monotonic() < end, f"iteration {n} not reached"
            time.sleep(0.05)

    def kill(self, role: str, index: int = 0) -> int:
        """SIGKILL the worker process hosting ``role[index]``; return its pid (also kept in ``killed_pids``)."""
        pid = self.policy.hosts[role][index].heartbeat().result()["pid"]
        os.kill(pid, signal.SIGKILL)
        self.killed_pids.append(pid)
        return pid

    def killed(self, role: str, at: int, index: int = 0) -> dict:
        """Kill ``role[index]``'s worker once iteration ``at`` is done; the run's summary when it ends."""
        self.wait_iteration(at)
        self.kill(role, index)
        return self.finish()

    def finish(self, timeout: float = 280) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run did not finish"
        if self.error is not None:
            raise self.error
        return self.summary

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in self.rundir.read_events() if kind is None or e["event"] == kind]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("graph_file", "threshold"),
    [("ppo-cartpole-sync.yaml", 475), ("ppo-cartpole-async.yaml", 475), ("dqn-cartpole-apex.yaml", 195)],
)
def test_killed_sampler_is_replaced_and_the_run_reaches_its_threshold(cluster, tmp_path, graph_file, threshold):
    graph = load_graph(f"graphs/{graph_file}", [f"stop.mean_return={threshold}"])
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("sampler", 5, 1)
    killed = run.killed_pids[0]
    assert summary["stop_reason"] == "mean_return", summary
    restarts = run.events("restart")
    assert [(e["role"], e["index"], e["kind"]) for e in restarts] == [("sampler", 1, "lost")]
    # actors.json, written by the training loop after the restart (this harness writes it at no other time)
    now = {(a["role"], a["index"]): a["pid"] for a in run.rundir.read_json("actors.json")}
    assert now[("sampler", 1)] != killed and now[("sampler", 0)] != killed
    assert restarts[0]["new_worker"] and restarts[0]["replace_s"] < 30
    rows = run.rundir.read_metrics()
    before = [r["env_steps"] for r in rows if r["iteration"] <= 5]
    assert restarts[0]["env_steps"] >= before[-1]  # the replacement's schedules go on from the run's count
    assert rows[-1]["sup/restarts/sampler"] == 1.0
    at = summary["stopped_at"]  # reached after the kill (a round submitted ahead may finish after it)
    assert at["iteration"] > 5 and at["mean_return"] >= threshold, at


@pytest.mark.parametrize("user_subscribes", ["before", "after"])
def test_under_sync_a_killed_workers_call_fails_when_the_scheduler_removes_it_not_at_the_next_poll(
    cluster, tmp_path, user_subscribes
):
    """A call to an actor whose worker was SIGKILLed never fails by itself (Dask waits for the actor's
    task to come back); the scheduler's ``remove-worker`` event ends it, long before ``poll_s``. The
    user's own handler of the scheduler's ``"all"`` events, subscribed on the same client before or
    after the run starts, keeps hearing them (Dask keeps one handler per topic and client)."""
    heard = []

    def mine(event):
        heard.append(event[1])

    overrides = ["stop.iterations=7", "stop.mean_return=null", "supervision.poll_s=120"]
    if user_subscribes == "before":
        cluster.subscribe_topic("all", mine)
    try:
        run = Run(load_graph("graphs/ppo-cartpole-sync.yaml", overrides), cluster, tmp_path)
        if user_subscribes == "after":
            cluster.subscribe_topic("all", mine)
        run.wait_iteration(3)
        killed_at, address = time.time(), run.policy.hosts["sampler"][1].address
        run.kill("sampler", 1)
        summary = run.finish()
        assert summary["stop_reason"] == "iterations", summary
        restarts = run.events("restart")
        assert [(e["role"], e["index"], e["kind"]) for e in restarts] == [("sampler", 1, "lost")]
        noticed = restarts[0]["time"] - killed_at
        assert noticed < 30, f"noticed {noticed:.1f} s after the kill: at a poll (120 s), not at the event"

        def left():  # the user's handler runs on the client's event loop
            return any(m.get("action") == "remove-worker" and m.get("worker") == address for m in heard)

        wait_for(left, 10, f"the user's handler to hear {address} leave", every=0.05)
    finally:
        cluster.unsubscribe_topic("all")


@pytest.mark.slow
def test_a_worker_whose_nanny_is_gone_is_started_afresh_and_the_run_finishes(cluster, tmp_path):
    """Every worker hosts a role, so a replacement has nowhere free to go until a new worker starts."""
    graph = load_graph(
        "graphs/ppo-cartpole-sync.yaml",
        ["roles.sampler.replicas=3", "stop.iterations=25", "supervision.respawn_after_s=2"],
    )
    run = Run(graph, cluster, tmp_path)
    run.wait_iteration(3)
    lc = cluster.cluster
    address = run.policy.hosts["sampler"][1].address
    name = live_workers(cluster)[address]["name"]
    before = set(live_workers(cluster))
    lc.sync(lc.workers[name].close)  # the nanny and its worker: nothing will bring this one back
    summary = run.finish()
    assert summary["iterations"] == 25
    [restart] = run.events("restart")
    assert (restart["role"], restart["index"], restart["kind"]) == ("sampler", 1, "lost")
    assert restart["new_worker"] not in before  # a fresh worker, not one shared with another role
    assert name not in lc.worker_spec and f"{name}-r1" in lc.worker_spec
    assert len(live_workers(cluster)) == 4


def test_killed_learner_rolls_back_to_the_checkpoint_and_finishes(cluster, tmp_path):
    graph = load_graph("graphs/ppo-cartpole-sync.yaml", ["checkpoint.every=4", "stop.iterations=14"])
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("learner", 10)
    assert summary["stop_reason"] == "iterations" and summary["iterations"] == 14
    (rollback,) = run.events("rollback")
    assert rollback["to_iteration"] in (8, 12) and rollback["iterations_lost"] >= 1
    rows = run.rundir.read_metrics()
    # the redone iterations replace the discarded rows: no iteration twice, env steps never going back
    assert [r["iteration"] for r in rows] == list(range(1, 15))
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps)
    assert load_checkpoint(run.rundir.path)["counters"]["iteration"] == 14


def test_killed_learner_under_apex_rolls_back_onto_a_new_hub(cluster, tmp_path):
    """The learner's worker holds the stream's hub: the kill loses both; the run rolls back, the samplers'
    loops restart on the restored learner's hub, and every iteration is counted once."""
    graph = faulty(["policy=apex", "checkpoint.every=5", "stop.iterations=30", f"roles.replay.path={tmp_path / 'r'}"])
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("learner", 12)
    assert summary["stop_reason"] == "iterations" and summary["iterations"] == 30
    (rollback,) = run.events("rollback")
    assert rollback["role"] == "learner" and rollback["to_iteration"] in (10, 15)
    assert [r["iteration"] for r in run.rundir.read_metrics()] == list(range(1, 31))


def test_killed_replay_reopens_with_every_flushed_row(cluster, tmp_path):
    graph = faulty(
        ["policy=apex", "checkpoint.every=5", "stop.iterations=24", f"roles.replay.path={tmp_path / 'replay'}"],
    )
    run = Run(graph, cluster, tmp_path)
    run.wait_iteration(12)  # the checkpoint of iteration 10 flushed the store
    flushed = load_checkpoint(run.rundir.path)["roles"]["replay"][0]["durable_rows"]
    run.kill("replay")
    run.finish()
    assert [(e["role"], e["kind"]) for e in run.events("restart")] == [("replay", "lost")]
    store = ReplayStore(SCHEMA, 200_000, 40_000, tmp_path / "replay" / "0", chunk_rows=64)
    assert len(store) >= flushed > 0
    rows = store.read(np.arange(flushed))
    np.testing.assert_array_equal(rows["value"], value_of(rows["source"], rows["seq"]))  # not damaged
    for source in (0, 1):  # and none missing: each sampler's rows up to the flush are there, in order
        seq = rows["seq"][rows["source"] == source]
        np.testing.assert_array_equal(seq, np.arange(len(seq)))
    store.close()


def test_a_shard_stores_each_samplers_rollouts_in_the_order_collected(cluster, tmp_path):
    """Two samplers, two calls in flight each, stream into one shard (``apex``): each sampler's rows
    sit in the store in the order the sampler produced them, none twice, none skipped. (Dask starts
    tasks that wait for the same fetched input in an arbitrary order; the stream orders them.)"""
    four_workers(cluster)
    graph = faulty(["policy=apex", f"roles.replay.path={tmp_path / 'replay'}"])
    policy = build_policy(graph, cluster, run_dir=tmp_path)
    try:
        for _ in range(40):
            policy.step()
    finally:
        policy.close()
    store = ReplayStore(SCHEMA, 200_000, 40_000, tmp_path / "replay" / "0", chunk_rows=64)
    rows = store.read(np.arange(len(store)))
    store.close()
    for source in (0, 1):
        seq = rows["seq"][rows["source"] == source]
        assert len(seq) >= 64 * 10
        assert seq.tolist() == list(range(len(seq))), f"sampler {source}: rollouts stored as {seq[::64] // 64}"


def sampler_restarted_once(cluster, tmp_path, env: str, policy: str = "sync") -> dict:
    """The restart event of a PPO run on ``env`` under ``policy``, which ran its 8 iterations after
    restarting one sampler, and nothing else."""
    graph = load_graph(f"graphs/ppo-cartpole-{policy}.yaml", [f"env.id={env}", "stop.iterations=8"])
    run = Run(graph, cluster, tmp_path)
    assert run.finish()["iterations"] == 8
    (event,) = run.events("restart")
    assert event["role"] == "sampler" and event["kind"] == "raised"
    assert "the pole fell off the cart" in event["reason"]
    return event


@pytest.mark.parametrize("policy", ["sync", "async"])
def test_env_error_in_step_names_env_and_sampler_and_the_sampler_is_restarted(cluster, tmp_path, faults, policy):
    event = sampler_restarted_once(cluster, tmp_path, "tests.faulty:StepFailsOnce-v0", policy)
    assert "env tests.faulty:StepFailsOnce-v0 raised in step() on sampler[" in event["reason"]
    assert "faulty.py" in event["traceback"] and "raise ValueError" in event["traceback"]


def test_a_replacement_that_fails_to_start_is_listed_and_the_next_one_runs(cluster, tmp_path, faults):
    """The restart event keeps the failure that caused it; the failed start is listed after it."""
    event = sampler_restarted_once(cluster, tmp_path, "tests.faulty:StartFailsOnce-v0")
    (failed,) = event["failed_starts"]
    assert "licence server busy" in failed
    assert event["new_worker"] and event["replace_s"] > 0


def test_crash_loop_stops_the_run_naming_role_worker_and_exception(cluster, tmp_path):
    graph = load_graph(
        "graphs/ppo-cartpole-sync.yaml",
        ["env.id=tests.faulty:CrashLoop-v0", "stop.iterations=200", "checkpoint.every=1", "supervision.max_restarts=2"],
    )
    run = Run(graph, cluster, tmp_path)
    with pytest.raises(TrainingError) as err:
        run.finish()
    text = str(err.value)
    assert text.startswith("crash loop: sampler[")
    assert "tcp://127.0.0.1:" in text and "failed 3 times" in text and "simulator licence expired" in text
    assert "last good checkpoint kept" in text
    assert load_checkpoint(run.rundir.path)["counters"]["iteration"] >= 1


def test_hung_sampler_is_treated_as_dead(cluster, tmp_path, faults):
    graph = faulty(["policy=sync", "stop.iterations=12", "hyperparameters.hang_at=4", "supervision.hang_timeout_s=3"])
    run = Run(graph, cluster, tmp_path)
    summary = run.finish()
    assert summary["iterations"] == 12
    kinds = {(e["role"], e["kind"]) for e in run.events("restart")}
    assert ("sampler", "hung") in kinds


def test_a_role_closed_while_its_env_hangs_leaves_the_workers_actor_thread_free(cluster, faults, dagrl_log):
    """A run that ends while a sampler's env hangs (before supervision calls it hung) does not wait for
    it, nor does a checkpoint (it holds no snapshot of a sampler inside its env). The host refuses new fragments, the
    close returns, and the worker's one actor thread, which every actor there shares, stays free:
    another actor on that worker answers. The hung fragment closes the state when it returns."""
    four_workers(cluster)
    graph = faulty(["hyperparameters.hang_at=1"])
    hosts = start_actors(cluster, graph, roles=["sampler"])["sampler"]
    hung = hosts[0]
    neighbour = start_one(cluster, graph, "sampler", 2, hung.address, Start())  # e.g. a kept cluster's next run
    release = os.path.join(faults, "release-hung")
    stuck = cluster.submit(
        run_fragment, hung.host_id, "collect", np.zeros(4, np.float32), workers=[hung.address], pure=False
    )
    try:
        deadline = time.monotonic() + 30
        while hung.heartbeat().result()["running"] != "collect":
            assert time.monotonic() < deadline, "the sampler's collect did not start"
            time.sleep(0.05)
        assert hung.state_dict().result(timeout=5) is None  # a checkpoint does not wait for a hung sampler
        t0 = time.monotonic()
        close_all(hosts, wait_s=2.0)
        assert time.monotonic() - t0 < 5
        closed = [os.path.exists(os.path.join(faults, f"closed-sampler-{i}")) for i in range(2)]
        assert closed == [False, True]  # sampler 1 closed at once; sampler 0 is inside its env
        [said] = [r.getMessage() for r in dagrl_log.records if "still running a fragment" in r.getMessage()]
        assert said.startswith("sampler[0]") and f"restart_workers([{hung.address!r}])" in said  # what frees it
        assert neighbour.info().result(timeout=15)["index"] == 2  # the worker's actor thread answers
        open(release, "w").close()
        assert stuck.result(timeout=30).env_steps == graph.config.rows  # the env returned
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(faults, "closed-sampler-0")):
            assert time.monotonic() < deadline, "the hung sampler's state was not closed after its env returned"
            time.sleep(0.05)
    finally:  # whatever failed: free the worker's thread for the tests after this one
        open(release, "w").close()
        close_all([neighbour, *hosts], wait_s=5.0)


def test_a_publish_that_raises_under_sync_is_the_learners_failure_not_the_samplers(cluster, tmp_path, faults):
    """Under ``sync`` the samplers wait for the weights in a mailbox, already running: when ``publish``
    raises, they hear it from the mailbox, maybe before the driver hears it from Dask. The learner is
    still the one that failed (rolled back), no sampler is replaced, and nothing waits on for weights
    that will not come (the run finishes)."""
    graph = faulty(["policy=sync", "checkpoint.every=2", "stop.iterations=12", "hyperparameters.publish_fails_at=7"])
    run = Run(graph, cluster, tmp_path)
    summary = run.finish(timeout=120)
    assert summary["iterations"] == 12
    (rollback,) = run.events("rollback")
    assert rollback["role"] == "learner"
    assert run.events("restart") == [{**e, "role": "learner"} for e in run.events("restart")]  # none of a sampler
    taken = cluster.run(lambda: __import__("dagrl.runtime.mailbox", fromlist=["STATS"]).STATS["taken"])
    assert sum(taken.values()) >= 2 * 10  # the samplers took their weights from the mailbox


def test_nan_weights_stop_the_run_and_keep_the_last_good_checkpoint(cluster, tmp_path):
    graph = faulty(["policy=sync", "checkpoint.every=2", "stop.iterations=20", "hyperparameters.nan_after=7"])
    run = Run(graph, cluster, tmp_path)
    with pytest.raises(TrainingError, match=r"iteration 8: non-finite weights in learner\.0\.w"):
        run.finish()
    ckpt = load_checkpoint(run.rundir.path)
    assert ckpt["counters"]["iteration"] == 6
    assert bool(np.isfinite(ckpt["roles"]["learner"][0]["w"].numpy()).all())


def test_killed_evaluator_is_replaced_without_rolling_back(cluster, tmp_path):
    graph = load_graph(
        "graphs/ppo-cartpole-sync.yaml", ["evaluate.every=3", "stop.iterations=15", "stop.mean_return=null"]
    )
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("evaluator", 4)
    assert summary["iterations"] == 15
    assert [(e["role"], e["kind"]) for e in run.events("restart")] == [("evaluator", "lost")]
    assert not run.events("rollback")
    rows = run.rundir.read_metrics()
    assert [r["iteration"] for r in rows if "eval/return_mean" in r] == [3, 6, 9, 12, 15]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["lockstep", "asynchronous"])
def test_killed_inference_role_is_replaced_and_the_samplers_kept(cluster, tmp_path, asynchronous):
    options = ["policy.asynchronous=true", "policy.rollouts_per_update=2"] if asynchronous else []
    graph = load_graph("graphs/ppo-cartpole-seed.yaml", ["stop.iterations=12", "stop.mean_return=null", *options])
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("inference", 4)
    assert summary["iterations"] == 12
    # the samplers failed to reach it, but it is the inference role that is blamed and replaced
    assert [(e["role"], e["index"], e["kind"]) for e in run.events("restart")] == [("inference", 0, "lost")]
    assert not run.events("rollback")
    rows = run.rundir.read_metrics()
    assert [r["iteration"] for r in rows] == list(range(1, 13))
    # the replacement acts for both samplers (in lockstep: one forward per env step of the iteration;
    # streaming, the rows the driver takes in one look share the forwards counted since the row before)
    last = rows[-3:]
    if asynchronous:
        assert sum(r["inference/forwards"] for r in last) >= 1
        assert all(r["inference/batch_rows"] >= 4 for r in last if r["inference/forwards"])
    else:
        assert all(r["inference/forwards"] >= 32 and r["inference/batch_rows"] >= 4 for r in last)


def test_killed_sampler_leaves_no_shared_memory_segment(cluster, tmp_path):
    """Image rollouts travel through /dev/shm; a sampler killed mid-run leaves nothing there."""
    graph = load_graph(
        "graphs/ppo-brighthalf.yaml",
        ["hyperparameters.num_steps=64", "stop.iterations=8", "stop.mean_return=null", "shared_memory=true"],
    )
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("sampler", 3, 0)
    assert summary["iterations"] == 8
    assert [(e["role"], e["kind"]) for e in run.events("restart")] == [("sampler", "lost")]
    sent = sum(s["shm_bytes"] for s in cluster.run(lambda: dict(shm.STATS)).values())
    assert sent >= 8 * 64 * 4 * 84 * 84  # the rollouts did go through shared memory
    assert not [n for n in os.listdir(shm.DIR) if n.startswith(shm.PREFIX)]


@pytest.mark.parametrize("graph_file", ["ppo-cartpole-sync.yaml", "ppo-cartpole-async.yaml"])
def test_a_worker_lost_while_the_roles_start_does_not_end_the_run(cluster, tmp_path, faults, dagrl_log, graph_file):
    """A sampler's worker SIGKILLed while its actor is being built: the replica starts on another worker
    (here the restarted one) and the run trains to its last iteration."""
    graph = load_graph(
        f"graphs/{graph_file}",
        ["env.id=tests.faulty:KillsItsWorkerOnce-v0", "stop.iterations=4", "stop.mean_return=null"],
    )
    run = Run(graph, cluster, tmp_path)
    summary = run.finish()
    assert summary["iterations"] == 4
    assert os.path.exists(os.path.join(faults, "worker-killed-while-starting")), "no worker was killed"
    moved = [m for m in dagrl_log.messages if "left before the role's actor started; starting it on" in m]
    assert len(moved) == 1 and moved[0].startswith("sampler["), dagrl_log.messages


@pytest.mark.parametrize(("at", "when"), [(1, "first"), (2, "final")])
def test_a_learner_lost_while_a_checkpoint_is_taken_is_replaced_and_the_run_finishes(
    cluster, tmp_path, faults, dagrl_log, at, when
):
    """The learner's worker SIGKILLed inside its ``state_dict``: at the checkpoint of iteration 0 (nothing
    trained yet: a fresh learner takes its place), or at the final checkpoint (the learner rolls back to
    iteration 0's and trains the lost iterations again). Either way the run ends at its last iteration
    with every iteration logged once and a final checkpoint of it."""
    graph = faulty(
        ["policy=sync", "checkpoint.every=100", "stop.iterations=4", f"hyperparameters.killed_at_checkpoint={at}"]
    )
    run = Run(graph, cluster, tmp_path)
    summary = run.finish(timeout=180)
    assert summary["iterations"] == 4
    assert os.path.exists(os.path.join(faults, "worker-killed-at-checkpoint")), "no worker was killed"
    assert [(e["role"], e["kind"]) for e in run.events("restart")] == [("learner", "lost")]
    replaced = [m for m in dagrl_log.messages if "replaced before the first checkpoint" in m]
    if when == "first":
        assert replaced and not run.events("rollback")
    else:
        (rollback,) = run.events("rollback")
        assert (rollback["to_iteration"], rollback["iterations_lost"]) == (0, 4) and not replaced
    assert [r["iteration"] for r in run.rundir.read_metrics()] == [1, 2, 3, 4]
    ckpt = load_checkpoint(run.rundir.path)
    assert ckpt["counters"]["iteration"] == 4 and ckpt["roles"]["learner"][0]["updates"] == 4


def test_a_worker_lost_while_the_run_closes_leaves_the_runs_end_whole(cluster, tmp_path, faults):
    """A sampler's worker SIGKILLed while the run closes its roles (after the final checkpoint): the close
    returns, and the run's summary and last checkpoint stand."""
    four_workers(cluster)
    graph = faulty(["policy=sync", "stop.iterations=3", "hyperparameters.killed_at_close=true"])
    rundir = RunDir.create(tmp_path, graph.name)
    policy = build_policy(graph, cluster, run_dir=rundir.path)
    try:
        summary = Trainer(graph, policy, rundir, progress=Progress(enabled=False)).run()
    finally:
        t0 = time.monotonic()
        policy.close()
    assert time.monotonic() - t0 < 30
    assert os.path.exists(os.path.join(faults, "worker-killed-while-closing")), "no worker was killed"
    assert summary["iterations"] == 3
    assert load_checkpoint(rundir.path)["counters"]["iteration"] == 3
