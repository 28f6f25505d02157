"""Same-host shared memory for large arrays: the wire format, the fallbacks, leaks, and a real run."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from distributed.protocol import deserialize, serialize

from dagrl.app.graphs import load_graph
from dagrl.policies import build_policy
from dagrl.runtime import shm
from tests.helpers import tmpfs

SAME_HOST = {"sender": {"address": "tcp://127.0.0.1:4001"}, "recipient": {"address": "tcp://127.0.0.1:4002"}}
OTHER_HOST = {"sender": {"address": "tcp://10.0.0.1:4001"}, "recipient": {"address": "tcp://10.0.0.2:4002"}}


@dataclass
class Rollout:
    obs: np.ndarray
    rewards: np.ndarray
    env_steps: int


def rollout() -> Rollout:
    rng = np.random.default_rng(0)
    return Rollout(rng.integers(0, 255, (64, 8, 4, 84, 84), dtype=np.uint8), rng.normal(size=(64, 8)), 512)


def segments() -> set[str]:
    return {n for n in os.listdir(shm.DIR) if n.startswith(shm.PREFIX)}


def frame_bytes(frames) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def test_a_same_host_transfer_sends_slot_offsets_and_the_slot_is_reused():
    value, before = rollout(), segments()
    header, frames = serialize(shm.wrap(value), context=SAME_HOST)
    (slot,) = segments() - before  # the 14 MB of observations went to one slot
    assert frame_bytes(frames) < 10_000  # only names, the small arrays and the dataclass travel
    out = deserialize(header, frames)
    assert type(out) is Rollout and out.env_steps == 512
    np.testing.assert_array_equal(out.obs, value.obs)
    np.testing.assert_array_equal(out.rewards, value.rewards)
    assert out.obs.flags.writeable  # torch.as_tensor takes it without a copy or a warning
    again = rollout()
    again.obs[0] = 7
    out2 = deserialize(*serialize(shm.wrap(again), context=SAME_HOST))
    assert len(segments() - before) == 2  # the first receiver still holds its arrays: a second slot
    np.testing.assert_array_equal(out2.obs, again.obs)
    np.testing.assert_array_equal(out.obs, value.obs)  # not overwritten by the second transfer
    del out, out2
    gc.collect()
    out3 = deserialize(*serialize(shm.wrap(value), context=SAME_HOST))
    assert len(segments() - before) == 2 and slot in segments()  # freed slots are reused
    np.testing.assert_array_equal(out3.obs, value.obs)
    del out3
    shm.sweep(own=True)
    assert segments() == before


def test_slots_still_being_read_send_frames_instead():
    value = rollout()
    pending = [serialize(shm.wrap(value), context=SAME_HOST) for _ in range(shm.MAX_SLOTS)]
    header, frames = serialize(shm.wrap(value), context=SAME_HOST)  # every slot busy: frames
    assert frame_bytes(frames) >= value.obs.nbytes
    for h, f in [*pending, (header, frames)]:
        np.testing.assert_array_equal(deserialize(h, f).obs, value.obs)
    gc.collect()
    shm.sweep(own=True)


def test_across_hosts_and_to_disk_the_arrays_travel_as_frames():
    value, before = rollout(), segments()
    for context in (OTHER_HOST, None):  # None: Dask spilling to disk
        header, frames = serialize(shm.wrap(value), context=context)
        assert segments() == before and frame_bytes(frames) >= value.obs.nbytes
        np.testing.assert_array_equal(deserialize(header, frames).obs, value.obs)


def test_a_full_dev_shm_falls_back_to_frames(tmp_path, monkeypatch):
    with tmpfs(tmp_path / "shm", "4m") as small:
        monkeypatch.setattr(shm, "DIR", str(small))
        header, frames = serialize(shm.wrap(rollout()), context=SAME_HOST)
        assert os.listdir(small) == [] and frame_bytes(frames) >= 64 * 8 * 4 * 84 * 84
        assert deserialize(header, frames).obs.shape == (64, 8, 4, 84, 84)


def test_small_outputs_are_not_wrapped():
    metrics = {"losses/value": 1.0, "w": np.zeros(10)}
    assert shm.wrap(metrics) is metrics
    assert isinstance(shm.wrap(rollout()), shm.Shared)
    assert shm.unwrap([shm.wrap(rollout()), 3])[1] == 3


def test_segments_of_a_killed_sender_are_swept():
    """A worker killed between writing a segment and its receiver reading it leaves the segment;
    the sweep a run ends with removes it (its creator is gone), and nothing else."""
    code = (
        "import os, signal, numpy as np\n"
        "from distributed.protocol import serialize\n"
        "from dagrl.runtime import shm\n"
        f"serialize(shm.wrap({{'obs': np.ones((2, 1 << 20), np.uint8)}}), context={SAME_HOST!r})\n"
        "print(os.getpid(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    before = segments()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd())
    assert proc.returncode == -9, proc.stderr
    pid = proc.stdout.strip()
    left = {n for n in segments() - before if n.startswith(f"{shm.PREFIX}{pid}-")}
    assert len(left) == 1  # the sender died with its segment unread
    assert shm.sweep() >= 1
    assert not left & segments()


def test_a_cluster_run_moves_image_rollouts_through_shared_memory_and_computes_the_same(client):
    """Image rollouts (1.8 MB of observations each) reach the learner through /dev/shm (slots, or the
    mailbox of ``sync``): the learner
    computes exactly what it computes when the same rollouts come over sockets, and no segment is
    left behind."""
    over = ["hyperparameters.num_steps=64", "roles.sampler.envs=4"]

    def run(shared: bool) -> tuple[list[dict], int]:
        graph = load_graph("graphs/ppo-brighthalf.yaml", [*over, f"shared_memory={str(shared).lower()}"])
        sent = lambda: sum(client.run(_shared_bytes).values())  # noqa: E731
        start = sent()
        policy = build_policy(graph, client)
        try:
            metrics = [policy.step().metrics for _ in range(3)]
        finally:
            policy.close()
        return metrics, sent() - start

    with_shm, shm_bytes = run(True)
    without, no_shm_bytes = run(False)
    assert shm_bytes >= 3 * 2 * 64 * 4 * 84 * 84  # every rollout's observations, 2 samplers x 3 iterations
    assert no_shm_bytes == 0
    assert with_shm == without
    assert not segments()


def _shared_bytes() -> int:
    """Bytes this process sent through /dev/shm: slots, and ``sync``'s mailbox (which carries the
    rollouts where the learner's worker is on the samplers' host)."""
    from dagrl.runtime import mailbox

    return shm.STATS["shm_bytes"] + mailbox.STATS["bytes"]


@pytest.mark.skipif(not os.path.isdir(shm.DIR), reason="no /dev/shm")
def test_sweep_leaves_slots_of_live_processes_until_their_run_ends():
    value = {"obs": np.ones((2, 1 << 20), np.uint8)}
    deserialize(*serialize(shm.wrap(value), context=SAME_HOST))
    mine = {n for n in segments() if n.startswith(f"{shm.PREFIX}{os.getpid()}-")}
    assert mine
    shm.sweep()  # this process is alive: its slot stays
    assert mine <= segments()
    shm.sweep(own=True)  # the run ended
    assert not mine & segments()


@pytest.mark.skipif(not os.path.isdir(shm.DIR), reason="no /dev/shm")
def test_a_runs_start_removes_what_killed_runs_left_in_shared_memory_on_its_workers(client):
    """A run SIGKILLed leaves its segments and mailbox files in /dev/shm (its close never ran): the next
    run's start removes them, on the driver's machine and on every worker's, and keeps a live process's."""
    from dagrl.runtime import mailbox

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = dead.stdout.strip()
    segment = os.path.join(shm.DIR, f"{shm.PREFIX}{pid}-leftover")
    box = os.path.join(mailbox.DIR, f"{mailbox.PREFIX}leftover{pid}")
    live = os.path.join(shm.DIR, f"{shm.PREFIX}{os.getpid()}-live")
    os.makedirs(box, mode=0o700)
    for path in (segment, os.path.join(box, f"p-{pid}"), os.path.join(box, "value"), live):
        open(path, "wb").close()
    try:
        policy = build_policy(load_graph("graphs/ppo-cartpole-sync.yaml", ["stop.iterations=1"]), client)
        try:
            assert not os.path.exists(segment) and not os.path.exists(box)  # before any iteration or close
            assert os.path.exists(live)
        finally:
            policy.close()
    finally:
        for path in (live, segment):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
