"""``vector: threads``: each env stepped in a thread of its own, equal to gymnasium's SyncVectorEnv."""

from __future__ import annotations

import gc
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from dagrl.envs.vector import ThreadVectorEnv, make_vector
from tests.helpers import train


def test_threads_step_exactly_as_sync_does_across_episode_ends():
    """Same seeds and actions: every observation, reward, end flag and final observation equal."""
    sync = make_vector("CartPole-v1", 6, "sync")
    threads = make_vector("CartPole-v1", 6, "threads")
    assert isinstance(threads, ThreadVectorEnv)
    a, _ = sync.reset(seed=7)
    b, _ = threads.reset(seed=7)
    np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(400):
        actions = rng.integers(0, 2, 6)
        got_a, got_b = sync.step(actions), threads.step(actions)
        for x, y in zip(got_a[:4], got_b[:4], strict=True):
            np.testing.assert_array_equal(x, y)
        info_a, info_b = got_a[4], got_b[4]
        assert sorted(info_a) == sorted(info_b)
        if "final_obs" in info_a:
            np.testing.assert_array_equal(info_a["_final_obs"], info_b["_final_obs"])
            for i in np.flatnonzero(info_a["_final_obs"]):
                np.testing.assert_array_equal(info_a["final_obs"][i], info_b["final_obs"][i])
                ended += 1
    assert ended > 50
    sync.close()
    threads.close()


class Waiting(gym.Wrapper):
    """An env whose step waits (a remote simulator), recording how many of its kind step at once."""

    lock = threading.Lock()
    now = most = 0

    def step(self, action):
        with Waiting.lock:
            Waiting.now += 1
            Waiting.most = max(Waiting.most, Waiting.now)
        time.sleep(0.02)
        with Waiting.lock:
            Waiting.now -= 1
        return self.env.step(action)


def test_envs_that_wait_do_so_at_the_same_time():
    envs = ThreadVectorEnv([lambda: Waiting(gym.make("CartPole-v1")) for _ in range(4)])
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(np.zeros(4, np.int64))
    envs.close()
    assert Waiting.most == 4


def test_a_graph_trains_on_thread_vector_samplers(tmp_path):
    overrides = ["roles.sampler.vector=threads", "stop.iterations=3", "stop.mean_return=null"]
    summary, rundir = train("graphs/ppo-cartpole-single.yaml", tmp_path, overrides)
    assert summary["iterations"] == 3
    assert rundir.read_metrics()[-1]["env_steps"] == summary["env_steps"] > 0


class Recording(gym.Wrapper):
    """Records the thread of each call, its making and closing included; fails the step it is told to."""

    def __init__(self, env, fail_at=None):
        super().__init__(env)
        self.threads: set[str] = {threading.current_thread().name}
        self.steps, self.fail_at = 0, fail_at
        self.closed = False

    def close(self):
        self.threads.add(threading.current_thread().name)
        self.closed = True
        return self.env.close()

    def reset(self, **kwargs):
        self.threads.add(threading.current_thread().name)
        return self.env.reset(**kwargs)

    def step(self, action):
        self.threads.add(threading.current_thread().name)
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError(f"simulator lost at step {self.steps}")
        return self.env.step(action)


def test_each_env_keeps_one_thread_and_its_error_reaches_the_caller():
    """A simulator bound to the thread that drives it sees only that one; an env's exception is raised
    in the caller, and the others' threads still serve the next call and end at close."""
    envs = ThreadVectorEnv(
        [lambda i=i: Recording(gym.make("CartPole-v1"), fail_at=30 if i == 2 else None) for i in range(4)]
    )
    envs.reset(seed=0)
    for _ in range(29):
        envs.step(np.zeros(4, np.int64))
    with pytest.raises(RuntimeError, match="simulator lost at step 30"):
        envs.step(np.zeros(4, np.int64))
    envs.step(np.zeros(4, np.int64))  # the env that failed is past its failing step
    envs.reset(seed=1, options={"reset_mask": np.array([False, True, False, True])})
    threads = [env.threads for env in envs.envs]
    envs.close()
    assert all(env.closed for env in envs.envs)
    assert all(len(names) == 1 for names in threads), threads
    assert threading.current_thread().name not in set().union(*threads)
    assert len(set().union(*threads)) == 4
    assert not [t for t in envs.threads.threads if t.is_alive()]


def test_a_vector_env_dropped_unclosed_closes_its_envs_and_ends_its_threads():
    envs = ThreadVectorEnv([lambda: Recording(gym.make("CartPole-v1")) for _ in range(3)])
    envs.reset(seed=0)
    threads, made = list(envs.threads.threads), list(envs.envs)
    del envs
    gc.collect()
    for thread in threads:
        thread.join(timeout=10)
    assert not [t for t in threads if t.is_alive()]
    assert all(env.closed for env in made)


def test_a_masked_reset_equals_sync_and_resets_only_the_masked_envs():
    sync = make_vector("CartPole-v1", 4, "sync")
    threads = make_vector("CartPole-v1", 4, "threads")
    for envs in (sync, threads):
        envs.reset(seed=3)
        for _ in range(5):
            envs.step(np.ones(4, np.int64))
    mask = np.array([True, False, False, True])
    a, info_a = sync.reset(seed=[10, 11, 12, 13], options={"reset_mask": mask.copy()})
    b, info_b = threads.reset(seed=[10, 11, 12, 13], options={"reset_mask": mask.copy()})
    np.testing.assert_array_equal(a, b)
    assert sorted(info_a) == sorted(info_b)
    np.testing.assert_array_equal(a[0], make_vector("CartPole-v1", 1, "sync").reset(seed=10)[0][0])
    for x, y in zip(sync.step(np.zeros(4, np.int64))[:4], threads.step(np.zeros(4, np.int64))[:4], strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="reset_mask"):
        threads.reset(options={"reset_mask": np.zeros(4, np.bool_)})
    sync.close()
    threads.close()


def test_an_env_that_fails_to_make_is_raised_and_the_made_ones_are_closed():
    made: list[Recording] = []

    def make(i):
        if i == 2:
            raise OSError("no simulator licence on this host")
        made.append(Recording(gym.make("CartPole-v1")))
        return made[-1]

    before = threading.active_count()
    with pytest.raises(OSError, match="no simulator licence"):
        ThreadVectorEnv([lambda i=i: make(i) for i in range(4)])
    assert len(made) == 3 and all(env.closed for env in made)
    assert all(len(env.threads) == 1 for env in made)
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before
