"""Runs across hosts emulated with Linux namespaces (``tests/hosts.py``): a scheduler and the driver on a
head host, `dagrl worker` on three others, as a user starts them on a cluster. Algorithms reach their
targets with roles spread over the hosts; shared memory is used only within a host; a host that crashes
or is cut off mid-run has its roles moved, and the run still reaches its target."""

from __future__ import annotations

import json

import pytest

from tests.hosts import QUICK, actors, cluster, python, wait_for

SPREAD = [("host1", "CPU=2"), ("host2", "CPU=2"), ("host3", "CPU=2")]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["async", "sync"])
def test_ppo_reaches_its_target_with_roles_on_three_hosts(policy):
    with cluster(SPREAD) as c:
        summary, run = c.run(f"ppo-cartpole-{policy}", ["roles.sampler.replicas=3", "stop.wall_time_s=180"])
    assert summary["stop_reason"] == "mean_return", summary
    samplers = {a["host"] for a in run.actors if a["role"] == "sampler"}
    assert samplers == {"host1", "host2", "host3"}  # placement spreads them over the least loaded workers


@pytest.mark.slow
def test_dqn_apex_reaches_its_target_with_roles_on_three_hosts():
    with cluster(SPREAD) as c:
        summary, run = c.run("dqn-cartpole-apex", ["stop.wall_time_s=240"], timeout=300)
    assert summary["stop_reason"] == "mean_return", summary
    hosts = {a["host"] for a in run.actors}
    assert len(hosts) >= 2 and "host0" not in hosts, run.actors


SHM_STATS = """
def probe():
    from dagrl.runtime import shm
    return dict(shm.STATS)
"""


def test_shared_memory_only_between_processes_of_one_host():
    """The learner's worker and one sampler's share host1; the other sampler is on host2. Rollouts of
    images (1.8 MB) from host1's sampler cross through /dev/shm; host2's go as frames over TCP."""
    workers = [("host1", "LEARN=1"), ("host1", "SAMPLE=1"), ("host2", "SAMPLE=1")]
    overrides = ["policy=async", "roles.learner.resources={LEARN: 1}", "roles.sampler.resources={SAMPLE: 1}"]
    overrides += ["hyperparameters.num_steps=64"]
    overrides += ["stop.iterations=8", "stop.mean_return=null"]
    with cluster(workers) as c:
        summary, run = c.run("ppo-brighthalf", overrides)
        stats = c.on_workers(SHM_STATS)
    placed = {(a["role"], a["host"]) for a in run.actors}
    assert placed == {("learner", "host1"), ("sampler", "host1"), ("sampler", "host2")}
    assert stats["host1-w1"]["shm_arrays"] > 0 and stats["host1-w1"]["framed_values"] == 0, stats
    assert stats["host2-w2"]["shm_arrays"] == 0 and stats["host2-w2"]["framed_values"] > 0, stats


LEARNER_MAY_MOVE = [("host1", "LEARN=1"), ("host2", "LEARN=1"), ("host3", "SAMPLE=1")]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["crash", "partition"])
def test_a_host_lost_mid_run_has_its_learner_moved_and_the_run_reaches_its_target(fault):
    """Two hosts can hold the learner. The one holding it crashes (every process SIGKILLed) or is cut
    off (its link down) after some rows; the learner restarts on the other from its checkpoint, the
    samplers lost with the host are replaced, and the run reaches its target."""
    overrides = ["roles.learner.resources={LEARN: 1}", "roles.sampler.replicas=2", "checkpoint.every=5"]
    overrides += ["stop.wall_time_s=200", *QUICK]
    with cluster(LEARNER_MAY_MOVE) as c:
        proc = c.start_run("ppo-cartpole-async", overrides)
        wait_for(lambda: c.rows() >= 12, 120, "12 metrics rows before the fault")
        (first,) = [a["host"] for a in actors(c.run_dir()) if a["role"] == "learner"]
        other = {"host1": "host2", "host2": "host1"}[first]
        lost = c.host(first)
        (c.hosts.crash if fault == "crash" else c.hosts.partition)(lost)
        summary, run = c.finish(proc, 300)
        if fault == "partition":
            c.hosts.heal(lost)
    assert summary["stop_reason"] == "mean_return", summary
    assert [a["host"] for a in run.actors if a["role"] == "learner"] == [other], run.actors
    assert first not in {a["host"] for a in run.actors}, run.actors
    assert max(r.get("sup/restarts", 0) for r in run.rows) >= 1


NAMES = """
def probe():
    return 1
"""


@pytest.mark.slow
def test_a_host_back_from_a_partition_is_restarted_and_serves_as_spare_capacity():
    """The learner's host is cut off, its roles are replaced on the others, then its link comes back
    while the run goes on. The scheduler no longer knows its worker, which shuts down with what it ran
    (nothing of it reaches the run: one learner, every iteration once, in order); `dagrl worker` starts
    a fresh one, which joins as a spare worker."""
    overrides = ["roles.learner.resources={LEARN: 1}", "roles.sampler.replicas=2", "checkpoint.every=5"]
    overrides += ["stop.iterations=400", "stop.mean_return=null", "stop.wall_time_s=200", *QUICK]
    with cluster(LEARNER_MAY_MOVE) as c:
        proc = c.start_run("ppo-cartpole-async", overrides)
        wait_for(lambda: c.rows() >= 12, 120, "12 metrics rows before the partition")
        (first,) = [a["host"] for a in actors(c.run_dir()) if a["role"] == "learner"]
        lost = c.host(first)
        c.hosts.partition(lost)
        log = c.shared / "driver.log"
        wait_for(lambda: "restored from the checkpoint" in log.read_text(), 90, "the learner restored elsewhere")
        c.hosts.heal(lost)
        worker_log = next(p for p in c.shared.iterdir() if p.name.startswith(f"{first}-w"))
        wait_for(lambda: "joining again" in worker_log.read_text(), 60, f"{first}'s dagrl worker to start a new one")
        wait_for(lambda: len(c.on_workers(NAMES)) == 3, 60, "three workers again", every=2.0)
        workers = c.on_workers(NAMES)
        mark = c.rows()
        wait_for(lambda: c.rows() >= mark + 5, 60, "5 rows with the host back")
        summary, run = c.finish(proc, 300, stop=True)
    assert summary["stop_reason"] == "interrupted", summary
    assert sorted(workers) == ["host1-w0", "host2-w1", "host3-w2"], workers  # back, as a worker like the others
    assert first not in {a["host"] for a in run.actors}, run.actors  # and nothing of the run on it any more
    iterations = [r["iteration"] for r in run.rows]
    assert iterations == list(range(1, len(iterations) + 1)), "an iteration missing or filed twice"
    steps = [r["env_steps"] for r in run.rows]
    assert steps == sorted(steps)
    assert [e["role"] for e in run.events if e["event"] == "restart"].count("learner") == 1


@pytest.mark.slow
def test_samplers_are_added_on_workers_that_join_and_dropped_with_workers_that_leave():
    """``max_replicas``: the run starts with one sampler; a host joins mid-run (its `dagrl worker` started
    then) and gets a sampler of its own, which streams from then on. That host then crashes: its sampler
    is dropped, not replaced, and the learner goes on without a rollback. The host boots again and its
    worker joins: the dropped sampler's slot is taken there. The count is in the rows."""
    overrides = ["roles.learner.resources={LEARN: 1}", "roles.sampler.resources={SAMPLE: 1}"]
    overrides += ["roles.sampler.replicas=1", "roles.sampler.max_replicas=3", "stop.iterations=500"]
    overrides += ["stop.mean_return=null", "stop.wall_time_s=240", *QUICK]
    with cluster([("host1", "LEARN=1"), ("host2", "SAMPLE=1")]) as c:
        proc = c.start_run("ppo-cartpole-async", overrides)
        wait_for(lambda: c.rows() >= 10, 120, "10 metrics rows with one sampler")
        joined = c.start_worker("host3", "SAMPLE=1", 2)
        wait_for(lambda: c.last_row().get("samplers/active") == 2, 120, "host3's sampler streaming")
        assert "Registered to:" in joined.read_text()
        c.hosts.crash(c.host("host3"))
        wait_for(lambda: c.last_row().get("samplers/active") == 1, 60, "host3's sampler dropped")
        c.hosts.revive(c.host("host3"))
        c.start_worker("host3", "SAMPLE=1", 3)
        wait_for(lambda: c.last_row().get("samplers/active") == 2, 120, "a sampler on host3's new worker")
        mark = c.rows()
        wait_for(lambda: c.rows() >= mark + 5, 60, "5 rows with both samplers")
        summary, run = c.finish(proc, 300, stop=True)
    assert summary["stop_reason"] == "interrupted", summary
    counts = [int(r["samplers/active"]) for r in run.rows]
    changes = [n for k, n in enumerate(counts) if k == 0 or n != counts[k - 1]]
    assert changes == [1, 2, 1, 2], changes
    assert [(e["event"], e["role"], e["index"], e["kind"]) for e in run.events] == [("drop", "sampler", 1, "lost")]
    iterations = [r["iteration"] for r in run.rows]
    assert iterations == list(range(1, len(iterations) + 1))
    samplers = sorted((a["index"], a["host"]) for a in run.actors if a["role"] == "sampler")
    assert samplers == [(0, "host2"), (1, "host3")], samplers  # slot 1 again, on the new worker


ANSWERS = """
import json, sys, time
from distributed import Client
from dagrl.runtime.workers import answers

async def hold_event_loop():  # run on the worker's event loop: no heartbeat leaves while it sleeps
    time.sleep(4)

with Client({address!r}, timeout=20) as client:
    named = {{w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}}
    address = named[sys.argv[1]]
    if sys.argv[2] == "busy":
        client.run(hold_event_loop, workers=[address], wait=False)
        time.sleep(2.5)
    seen = client.scheduler_info(n_workers=-1)["workers"][address]["last_seen"]
    lag = client.run_on_scheduler(lambda: time.time()) - seen  # the scheduler's clock on both sides
    t0 = time.monotonic()
    print(json.dumps({{"answers": answers(client, address), "s": time.monotonic() - t0, "lag": lag}}))
"""


def test_a_busy_worker_answers_the_connection_probe_and_one_behind_a_partition_does_not():
    """What tells a cut-off host from a busy one before ``unreachable_s``: a worker whose event loop is
    held (its heartbeats late) still has its host's kernel accept a connection; a host whose link is down
    does not, within the probe's second."""
    with cluster([("host1", "CPU=1"), ("host2", "CPU=1")]) as c:
        script = c.shared / "answers.py"
        script.write_text(ANSWERS.format(address=c.address))

        def ask(worker: str, state: str) -> dict:
            log = c.shared / f"answers-{worker}-{state}.log"
            proc = c.hosts.spawn(c.head, python(str(script), worker, state), log)
            assert proc.wait(60) == 0, log.read_text()[-2000:]
            return json.loads(log.read_text().strip().splitlines()[-1])

        busy = ask("host1-w0", "busy")
        c.hosts.partition(c.host("host2"))
        cut = ask("host2-w1", "cut")
        c.hosts.heal(c.host("host2"))
    assert busy["lag"] > 1.5 and busy["answers"] is True and busy["s"] < 0.5, busy  # late, yet answering
    assert cut["answers"] is False and cut["s"] < 2.0, cut
