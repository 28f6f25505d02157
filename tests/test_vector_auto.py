"""``vector: auto``, the default: envs stepped in turn, moved onto threads of their own once they are
seen to wait, and in either case stepping exactly as gymnasium's SyncVectorEnv."""

from __future__ import annotations

import multiprocessing as mp
import threading

import gymnasium as gym
import numpy as np
import pytest

import dagrl.envs  # noqa: F401 (registers CostlyCartPole-v0)
from dagrl.app.graphs import load_graph
from dagrl.envs.vector import AutoVectorEnv, make_vector
from tests.helpers import dagrl_log, train

COSTLY = "dagrl.envs:CostlyCartPole-v0"


class Closing(gym.Wrapper):
    """Records the threads that step it and whether it was closed."""

    def __init__(self, env):
        super().__init__(env)
        self.threads: set[str] = set()
        self.closed = False

    def step(self, action):
        self.threads.add(threading.current_thread().name)
        return self.env.step(action)

    def close(self):
        self.closed = True
        return self.env.close()


def steps_equal(a, b) -> int:
    """Asserts two step results equal (final observations included); how many episodes ended."""
    for x, y in zip(a[:4], b[:4], strict=True):
        np.testing.assert_array_equal(x, y)
    assert sorted(a[4]) == sorted(b[4])
    if "final_obs" not in a[4]:
        return 0
    ended = np.flatnonzero(a[4]["_final_obs"])
    for i in ended:
        np.testing.assert_array_equal(a[4]["final_obs"][i], b[4]["final_obs"][i])
    return len(ended)


def test_envs_that_wait_move_onto_threads_and_step_as_sync_does_before_and_after():
    sync = make_vector(COSTLY, 4, "sync", step_ms=1.0, cost="sleep")
    auto = AutoVectorEnv([lambda: Closing(gym.make(COSTLY, step_ms=1.0, cost="sleep")) for _ in range(4)])
    np.testing.assert_array_equal(sync.reset(seed=3)[0], auto.reset(seed=3)[0])
    rng = np.random.default_rng(0)
    ended = 0
    with dagrl_log() as log:
        for i in range(120):
            actions = rng.integers(0, 2, 4)
            ended += steps_equal(sync.step(actions), auto.step(actions))
            if i == AutoVectorEnv.SKIP + AutoVectorEnv.PROBE - 2:
                assert auto.backend == "sync"
        mask = np.array([True, False, True, False])
        np.testing.assert_array_equal(
            sync.reset(seed=5, options={"reset_mask": mask})[0], auto.reset(seed=5, options={"reset_mask": mask})[0]
        )
        ended += steps_equal(sync.step(np.zeros(4, np.int64)), auto.step(np.zeros(4, np.int64)))
    assert auto.backend == "threads"
    assert ended > 5  # episode ends on both sides of the move
    assert any("waited" in m and "thread of its own" in m for m in log), log
    threads = [env.threads for env in auto.envs]
    assert all(threading.current_thread().name in names and len(names) == 2 for names in threads), threads
    auto.close()
    sync.close()
    assert all(env.closed for env in auto.envs)


def hog(seconds: float) -> None:
    import time

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("env", ["CartPole-v1", "busy"])
def test_envs_that_compute_stay_in_turn_even_while_other_processes_take_the_cores(env):
    """Other processes stretch a computing env's wall time (they take its core), but it never gave the
    core up itself: it stays in turn, where a thread hand-off would only cost."""
    hogs = [mp.get_context("spawn").Process(target=hog, args=(30.0,), daemon=True) for _ in range(3)]
    for p in hogs:
        p.start()
    try:
        for _ in range(3):
            kwargs = {"step_ms": 0.3, "cost": "busy"} if env == "busy" else {}
            auto = make_vector(COSTLY if env == "busy" else env, 4, "auto", **kwargs)
            auto.reset(seed=0)
            for _ in range(AutoVectorEnv.SKIP + AutoVectorEnv.PROBE + 4):
                auto.step(auto.action_space.sample())
            assert auto.backend == "sync"
            auto.close()
    finally:
        for p in hogs:
            p.kill()


def test_one_env_has_nothing_to_overlap_and_stays_in_turn():
    auto = make_vector(COSTLY, 1, "auto", step_ms=1.0, cost="sleep")
    auto.reset(seed=0)
    for _ in range(AutoVectorEnv.SKIP + AutoVectorEnv.PROBE + 4):
        auto.step(auto.action_space.sample())
    assert auto.backend == "sync"
    auto.close()


def test_auto_is_every_graphs_default_and_a_run_on_waiting_envs_moves_them(tmp_path):
    graph = load_graph("graphs/ppo-cartpole-single.yaml")
    assert graph.role("sampler").vector == "auto"
    overrides = ["policy=single", "stop.iterations=2", "stop.mean_return=null", "env.kwargs.step_ms=0.5"]
    with dagrl_log() as log:
        summary, rundir = train("graphs/ppo-costly-cartpole.yaml", tmp_path, overrides)
    assert summary["iterations"] == 2
    assert any("CostlyCartPole-v0 waited" in m for m in log), log
    sampler = next(a for a in rundir.read_json("actors.json") if a["role"] == "sampler")
    assert sampler["vector"] == ["threads"]
    assert any(m.startswith("sampler: ") and m.endswith("; envs on threads in 4 of 4") for m in log), log
