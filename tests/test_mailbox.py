"""The same-host mailbox for ``sync``'s weights: postings, wake-ups, aborts, errors, leftovers, when the
executor uses it, and a real run that takes its weights from it and computes what it computed without."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.core.distribution import mail_edges
from dagrl.core.fragment import load_algorithm
from dagrl.policies import build_policy
from dagrl.runtime import mailbox
from dagrl.runtime.executor import mail_readers


@pytest.fixture
def box():
    name = f"{mailbox.PREFIX}{uuid.uuid4().hex[:16]}"
    yield name
    mailbox.sweep(own=True)
    assert not os.path.exists(os.path.join(mailbox.DIR, name))


def ticket(box: str, seq: int, timeout_s: float = 30.0) -> mailbox.Ticket:
    return mailbox.Ticket(box, seq, "publish-learner-0-abc", timeout_s)


def in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as err:
            out["error"] = err
        out["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_waiting_take_is_woken_by_the_posting_not_by_its_poll(box, monkeypatch):
    monkeypatch.setattr(mailbox, "POLL_S", 30.0)  # only the FIFO can wake it in time
    weights = {"w": np.arange(10, dtype=np.float32), "b": np.ones(3)}
    t, out = in_thread(lambda: mailbox.take(ticket(box, 1)))
    time.sleep(0.3)
    assert t.is_alive()  # nothing posted yet
    posted = time.monotonic()
    mailbox.post(box, 1, weights, producer="p")
    t.join(5)
    assert not t.is_alive() and out["at"] - posted < 1.0
    assert out["value"].keys() == weights.keys()
    assert all(np.array_equal(out["value"][k], weights[k]) for k in weights)


def test_arrays_arrive_as_writable_views_of_the_posting_and_outlive_its_removal(box):
    rollout = {"obs": np.random.default_rng(0).integers(0, 255, (64, 4, 84, 84), dtype=np.uint8), "n": 7}
    mailbox.post(box, 1, rollout, producer="p")
    got = mailbox.take(ticket(box, 1))
    assert got["n"] == 7 and np.array_equal(got["obs"], rollout["obs"]) and got["obs"].dtype == np.uint8
    assert not got["obs"].flags.owndata  # a view of the mapped file: no copy on the reader's side
    mailbox.post(box, 2, "next", producer="p")  # removes posting 1's file; the mapping stays valid
    assert not os.path.exists(os.path.join(mailbox.DIR, box, "v-1"))
    got["obs"][0] = 0  # writable, copy on write: the producer's bytes are not touched
    assert got["obs"][0].max() == 0 and rollout["obs"][0].max() > 0


def test_a_box_is_this_users_alone_and_one_others_can_write_into_is_refused(box):
    """Postings are unpickled: a box is made mode 0700, and one found open to others (made by another
    user who guessed or saw its name first) is refused rather than read."""
    mailbox.post(box, 1, "weights", producer="p")
    assert os.stat(os.path.join(mailbox.DIR, box)).st_mode & 0o777 == 0o700
    planted = f"{mailbox.PREFIX}{uuid.uuid4().hex[:16]}"
    os.mkdir(os.path.join(mailbox.DIR, planted))
    os.chmod(os.path.join(mailbox.DIR, planted), 0o777)
    try:
        with pytest.raises(PermissionError, match="mode 777"):
            mailbox.post(planted, 1, "weights", producer="p")
        assert os.listdir(os.path.join(mailbox.DIR, planted)) == []
    finally:
        os.rmdir(os.path.join(mailbox.DIR, planted))


def test_a_posting_is_replaced_by_its_own_producers_next_one_not_by_another_replica_in_the_process(box):
    """Under ``dp-learners`` a learner replica may share its worker process with a sampler: the sampler's
    rollout posted after the learner's weights must leave those weights for the sampler that reads them."""
    mailbox.post(box, 1, "learner-1 weights", producer="learner-1:publish")
    mailbox.post(box, 2, "sampler-0 rollout", producer="sampler-0:collect")
    assert mailbox.take(ticket(box, 1)) == "learner-1 weights"
    mailbox.post(box, 3, "learner-1 next weights", producer="learner-1:publish")
    assert not os.path.exists(os.path.join(mailbox.DIR, box, "v-1"))  # the same producer's older posting goes
    assert mailbox.take(ticket(box, 2)) == "sampler-0 rollout"


def test_without_room_on_dev_shm_the_waiter_is_told_to_fetch_through_dask(box, monkeypatch):
    monkeypatch.setattr(mailbox, "room", lambda nbytes: False)
    mailbox.post(box, 1, np.zeros(10), producer="p")
    with pytest.raises(mailbox.NotPosted):
        mailbox.take(ticket(box, 1))


def test_a_take_answers_its_own_posting_only(box, monkeypatch):
    monkeypatch.setattr(mailbox, "POLL_S", 0.05)
    mailbox.post(box, 1, "first", producer="p")
    assert mailbox.take(ticket(box, 1)) == "first"
    t, out = in_thread(lambda: mailbox.take(ticket(box, 2)))
    time.sleep(0.2)
    assert t.is_alive()  # posting 1 is there, 2 is not
    mailbox.post(box, 2, "second", producer="p")
    t.join(5)
    assert out["value"] == "second"


def test_a_producer_error_reaches_the_waiters_naming_the_producer(box):
    t, out = in_thread(lambda: mailbox.take(ticket(box, 4)))
    time.sleep(0.1)
    mailbox.post_error(box, 4, ValueError("bad weights"), producer="p")
    t.join(5)
    err = out["error"]
    assert isinstance(err, mailbox.Upstream) and err.producer == "publish-learner-0-abc"
    assert "ValueError: bad weights" in str(err)


def test_an_abort_ends_the_waits_up_to_its_sequence_number_only(box, monkeypatch):
    monkeypatch.setattr(mailbox, "POLL_S", 30.0)
    t3, out3 = in_thread(lambda: mailbox.take(ticket(box, 3)))
    t4, out4 = in_thread(lambda: mailbox.take(ticket(box, 4)))
    time.sleep(0.2)
    mailbox.abort(box, 3)
    t3.join(5)
    assert isinstance(out3["error"], mailbox.Aborted)
    time.sleep(0.2)
    assert t4.is_alive()  # a later iteration's wait goes on
    mailbox.abort(box, 2)  # an older abort arriving late changes nothing
    mailbox.post(box, 4, "w4", producer="p")
    t4.join(5)
    assert out4["value"] == "w4"


def test_a_wait_gives_up_after_its_timeout(box):
    start = time.monotonic()
    with pytest.raises(mailbox.Late, match="publish-learner-0-abc") as late:
        mailbox.take(ticket(box, 1, timeout_s=0.3))
    assert late.value.producer == "publish-learner-0-abc"  # the executor blames it, if it still runs
    assert time.monotonic() - start < 5


def test_another_process_waits_and_is_woken(box, monkeypatch):
    code = (
        "import sys, time; from dagrl.runtime import mailbox; mailbox.POLL_S = 30.0; "
        f"t = mailbox.Ticket({box!r}, 7, 'p', 60.0); print(mailbox.take(t), flush=True); mailbox.sweep(own=True)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not any(n.startswith("w-") for n in _names(box)):  # its FIFO: it is waiting
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    mailbox.post(box, 7, "seven", producer="p")
    out, _ = proc.communicate(timeout=10)
    assert out.strip() == "seven"


def _names(box: str) -> list[str]:
    try:
        return os.listdir(os.path.join(mailbox.DIR, box))
    except FileNotFoundError:
        return []


def test_sweep_removes_boxes_whose_processes_are_gone_and_keeps_live_ones(box):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    other = f"{mailbox.PREFIX}{uuid.uuid4().hex[:16]}"
    os.makedirs(os.path.join(mailbox.DIR, other))
    open(os.path.join(mailbox.DIR, other, f"p-{dead.stdout.strip()}"), "wb").close()
    open(os.path.join(mailbox.DIR, other, "value"), "wb").close()
    mailbox.post(box, 1, "mine", producer="p")  # this process's marker: live
    assert mailbox.sweep() >= 1
    assert not os.path.exists(os.path.join(mailbox.DIR, other))
    assert os.path.exists(os.path.join(mailbox.DIR, box))  # the fixture's sweep(own=True) removes it


def test_cancelling_a_posting_ends_the_wait_on_the_readers_worker(client, box):
    """What the executor does when an iteration fails: its postings are aborted on the workers whose
    tasks wait for them, so those tasks end (their workers' threads are free for the redone iteration)."""
    from dagrl.runtime.executor import Executor, Mail

    address = sorted(client.scheduler_info()["workers"])[0]
    waiting = client.submit(mailbox.take, ticket(box, 9), workers=[address], pure=False)
    time.sleep(0.5)
    assert not waiting.done()
    Executor(client)._abort([Mail(box, 8, frozenset([address])), Mail(box, 9, frozenset([address]))])
    with pytest.raises(mailbox.Aborted):
        waiting.result(timeout=10)
    client.run(mailbox.sweep, True, workers=[address])


def test_a_driver_on_another_host_aborts_through_the_readers_without_waiting_for_a_dead_one(client, box, monkeypatch):
    """Where the driver does not see the box, the readers' workers abort it; one of them dead (a
    killed learner, a reader of the rollouts) would hold the scheduler's broadcast for the connect
    timeout (30 s), which the driver must not wait out before redoing the iteration."""
    from dagrl.runtime.executor import Executor, Mail

    monkeypatch.setattr(mailbox, "exists", lambda box: False)  # in this process only: the driver's
    address = sorted(client.scheduler_info()["workers"])[0]
    waiting = client.submit(mailbox.take, ticket(box, 3), workers=[address], pure=False)
    time.sleep(0.5)
    assert not waiting.done()
    dead = "tcp://127.0.0.1:9"  # the discard port: nothing listens
    t0 = time.monotonic()
    Executor(client)._abort([Mail(box, 3, frozenset([address, dead]))])
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(mailbox.Aborted):
        waiting.result(timeout=10)
    client.run(mailbox.sweep, True, workers=[address])


def test_mail_edges_are_weights_out_and_rollouts_in_and_not_what_replay_shards_wait_for():
    def named(algo):
        names = {n.id: n.name for n in algo.graph.nodes}
        return {(names[a], names[b]): tuple(names[i] for i in ids) for (a, b), ids in mail_edges(algo).items()}

    # the learner's update waits in its mailbox only after its publish: a collect needs those weights
    assert named(load_algorithm("ppo")) == {("publish", "collect"): (), ("collect", "update"): ("publish",)}
    # not update -> reprioritize: a shard's add and sample, which the update waits for, come first there
    assert named(load_algorithm("dqn")) == {("publish", "collect"): (), ("sample", "update"): ("publish",)}


def test_mail_readers_are_same_host_workers_hosting_nothing_else():
    def h(address):
        return SimpleNamespace(address=address)

    learner, s0, s1 = h("tcp://10.0.0.1:4001"), h("tcp://10.0.0.1:4002"), h("tcp://10.0.0.1:4003")
    far, shared, evaluator = h("tcp://10.0.0.2:4001"), h("tcp://10.0.0.1:4005"), h("tcp://10.0.0.1:4005")
    hosts = {"learner": [learner], "sampler": [s0, s1, far, shared], "evaluator": [evaluator]}
    readers = mail_readers(learner, hosts["sampler"], hosts)
    assert readers == {s0.address, s1.address}  # not another host's, not a worker shared with the evaluator
    assert mail_readers(learner, [h(learner.address)], {"learner": [learner]}) == frozenset()  # its own worker
    assert mail_readers(h("inproc://x/1"), [s0], hosts) == frozenset()


def test_sync_takes_its_weights_from_the_mailbox_and_computes_what_it_computes_without(tmp_path, graphs_dir):
    """One worker per role on a LocalCluster: both samplers wait for each iteration's weights in the
    mailbox, the learner for their rollouts; the learner ends where it ends with the mailbox off (and
    so where ``single`` ends); no file of the mailbox is left after the run."""
    over = ["roles.sampler.replicas=2"]
    learned, moved, waited = _on_and_off(tmp_path, f"{graphs_dir}/ppo-cartpole-sync.yaml", over, workers=3)
    (learner,) = moved[True]["learner"]  # weights out to each sampler, rollouts in from each: 6 iterations (7 if ahead)
    assert learner["posted"] >= 6 and learner["taken"] >= 2 * 6, moved
    assert all(m["taken"] >= 6 and m["posted"] >= 6 for m in moved[True]["sampler"]), moved
    assert all(set(m.values()) == {0} for ms in moved[False].values() for m in ms), moved
    # the dashboard's Fine Performance Metrics tell the wait from the work: collect and update waited
    # in the mailbox and read from it (metrics reach the scheduler with the workers' heartbeats)
    assert {"collect-sampler", "update-learner"} <= {p for p, a in waited if a == "mailbox-wait"}, waited
    assert {"collect-sampler", "update-learner"} <= {p for p, a in waited if a == "mailbox-read"}, waited
    assert all(waited[k] > 0 for k in waited)
    assert learned[True].keys() == learned[False].keys()
    assert all(learned[True][k].equal(learned[False][k]) for k in learned[True])


def test_dp_learner_replicas_take_their_own_samplers_rollouts_from_the_mailbox(tmp_path, graphs_dir):
    """``dp-learners``, 2 replicas and 4 samplers: sampler i takes replica i % 2's weights from the
    mailbox, and replica k the rollouts of samplers i % 2 == k; replica 0 ends where it ends with
    the mailbox off (the replicas' equality is checked by the policy at the first iteration)."""
    over = ["roles.sampler.replicas=4", "roles.sampler.resources.CPU=0"]
    learned, moved, _ = _on_and_off(tmp_path, f"{graphs_dir}/ppo-cartpole-dp.yaml", over, workers=6)
    for m in moved[True]["learner"]:  # its weights to 2 samplers, their 2 rollouts in: 6 iterations
        assert m["posted"] >= 6 and m["taken"] >= 2 * 6, moved
    assert all(m["taken"] >= 6 and m["posted"] >= 6 for m in moved[True]["sampler"]), moved
    assert all(set(m.values()) == {0} for ms in moved[False].values() for m in ms), moved
    assert learned[True].keys() == learned[False].keys()
    assert all(learned[True][k].equal(learned[False][k]) for k in learned[True])


def _on_and_off(tmp_path, path: str, over: list[str], workers: int) -> tuple[dict, dict, dict]:
    """Six iterations of graph ``path`` with the mailbox on, then off, on one LocalCluster of a worker
    per role replica: learner replica 0's weights, the mailbox counts that moved on each worker
    (``{on: {role: [per replica]}}``), and the mailbox time metered by the run with it."""
    from distributed import Client, LocalCluster

    from dagrl.app.driver import Trainer
    from dagrl.app.progress import Progress
    from dagrl.runtime.rundir import RunDir

    def stats():
        return mailbox.STATS.copy()

    boxes = set(_boxes())
    over = ["stop.iterations=6", "stop.mean_return=null", "checkpoint.every=0", *over]
    learned, moved, waited = {}, {}, {}
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0", host="127.0.0.1"
        ) as lc,
        Client(lc) as client,
    ):
        for on in (True, False):
            graph = load_graph(path, [*over, f"policy.mailbox={str(on).lower()}"])
            before = client.run(stats)
            policy = build_policy(graph, client)
            rundir = RunDir.create(tmp_path / str(on), graph.name)
            try:
                Trainer(graph, policy, rundir, progress=Progress(enabled=False)).run()
                learned[on] = {k: v.clone() for k, v in policy.state_dict()["learner"][0]["agent"].items()}
                where = {role: [h.address for h in policy.hosts[role]] for role in ("sampler", "learner")}
                if on:
                    waited = _metered(client)
            finally:
                policy.close()
            after = client.run(stats)
            moved[on] = {
                role: [{k: after[a][k] - before[a][k] for k in after[a]} for a in addresses]
                for role, addresses in where.items()
            }
    assert set(_boxes()) <= boxes  # the run's box went with the run
    return learned, moved, waited


def _metered(client, timeout_s: float = 10.0) -> dict[tuple[str, str], float]:
    """Seconds of mailbox activity by (task prefix, activity), summed over the cluster so far; waits
    up to ``timeout_s`` for collect's and update's waits and reads (they come with the heartbeats)."""

    def read(dask_scheduler):
        return {
            (k[1], k[2]): v
            for k, v in dask_scheduler.cumulative_worker_metrics.items()
            if len(k) == 4 and k[0] == "execute" and str(k[2]).startswith("mailbox-") and k[3] == "seconds"
        }

    want = {(p, a) for p in ("collect-sampler", "update-learner") for a in ("mailbox-wait", "mailbox-read")}
    deadline = time.monotonic() + timeout_s
    while not want <= (got := client.run_on_scheduler(read)).keys() and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


def _boxes() -> list[str]:
    return [n for n in os.listdir(mailbox.DIR) if n.startswith(mailbox.PREFIX)]


def _pole_falls(delay: float) -> None:
    time.sleep(delay)
    raise ValueError("the pole fell off the cart")


def _heard_of(producer: str) -> None:
    raise mailbox.Upstream(producer, "ValueError: the pole fell off the cart")


def test_a_failure_heard_through_the_mailbox_is_the_producers_own_error_with_its_frames(client):
    """A consumer hears of its producer's error in the mailbox and its task fails first; the failure
    the driver raises is the producer's, with the producer's exception and traceback (what the restart
    event records), not the consumer's report of it."""
    from dagrl.runtime.executor import Call, Executor, Mail
    from dagrl.runtime.supervisor import RoleFailure, remote_traceback

    producer = client.submit(_pole_falls, 0.5, pure=False)
    consumer = client.submit(_heard_of, producer.key, pure=False)
    handles = [SimpleNamespace(role=r, index=0, address="tcp://127.0.0.1:1") for r in ("sampler", "learner")]
    calls = [
        Call(handles[0], "collect", producer, time.perf_counter(), mail=Mail("b", 1, frozenset())),
        Call(handles[1], "update", consumer, time.perf_counter()),
    ]
    with pytest.raises(Exception):  # noqa: B017 - the consumer's error, first
        consumer.result(timeout=10)
    assert producer.status == "pending"
    with pytest.raises(RoleFailure) as failure:
        Executor(client)._raise_errors(calls)
    assert failure.value.handle is handles[0]
    assert isinstance(failure.value.cause, ValueError)
    assert "_pole_falls" in remote_traceback(failure.value.cause)


def test_the_errors_a_consumer_raises_keep_their_producer_through_pickle():
    """They travel from a worker to the driver, which blames their producer."""
    import pickle

    for err in (mailbox.Upstream("sample-replay-0-abc", "boom"), mailbox.Late("sample-replay-0-abc", 3.0)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and back.producer == "sample-replay-0-abc" and str(back) == str(err)
