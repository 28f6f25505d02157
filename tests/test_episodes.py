"""The stop window after a reset of all envs: a sampler's episodes count only once each of its envs
has ended one (``dagrl/envs/episodes.py``), through a resume and through Dask."""

from __future__ import annotations

import collections

import gymnasium as gym
import numpy as np
import pytest

import dagrl
from dagrl.app.graphs import load_graph
from dagrl.envs.episodes import EpisodeTracker
from dagrl.runtime.checkpoint import load_checkpoint
from dagrl.runtime.rundir import RunDir


def random_cartpole(num_envs: int, steps: int, seed: int):
    """Yield ``(reward, done)`` of a CartPole vector env under random actions (return == length)."""
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    for _ in range(steps):
        _, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())
        yield reward, terminated | truncated
    envs.close()


def test_the_tracker_counts_episodes_from_the_step_after_every_env_ended_one():
    tracker, per_env, first_end = EpisodeTracker(6), collections.defaultdict(list), {}
    ret, length = np.zeros(6), np.zeros(6, int)
    ends = []  # (step, env) in the order the tracker sees them
    for t, (reward, done) in enumerate(random_cartpole(6, 300, seed=3)):
        tracker.step(reward, done)
        ret += reward
        length += 1
        for i in np.flatnonzero(done):
            per_env[i].append((ret[i], length[i]))
            first_end.setdefault(i, t)
            ends.append((t, i))
        ret[done], length[done] = 0.0, 0
    episodes = tracker.take()
    settled_at = max(first_end.values())
    assert len(first_end) == 6 and len(episodes) == len(ends) > 12
    np.testing.assert_array_equal(episodes.in_window, [t > settled_at for t, _ in ends])
    seen = collections.Counter()
    for k, (_, i) in enumerate(ends):  # returns and lengths are each env's own, in the order they ended
        assert (episodes.returns[k], episodes.lengths[k]) == per_env[i][seen[i]]
        seen[i] += 1
    assert len(tracker.take()) == 0  # taken once


def test_a_window_of_the_first_episodes_to_end_is_biased_and_the_counted_one_is_not():
    """CartPole's return is its length, so the first episodes to end after a reset are the lowest.
    32 envs, window 16, 12 resets: the window of every episode holds the shortest first episodes
    (0.65 of the steady state's mean over 40 resets), the counted one is near the steady state
    (0.96 over 40 resets)."""
    window, firsts, steady = 16, {"every": [], "counted": []}, []
    for seed in range(12):
        tracker, full = EpisodeTracker(32), {"every": [], "counted": []}
        for t, (reward, done) in enumerate(random_cartpole(32, 600, seed=seed)):
            tracker.step(reward, done)
            ep = tracker.take()
            if t >= 300:  # the envs' phases have long spread: every episode is a fair one
                steady.extend(ep.returns.tolist())
            for name, part in (("every", ep.returns), ("counted", ep.window_returns())):
                full[name].extend(part.tolist())
        for name in firsts:
            assert len(full[name]) >= window
            firsts[name].append(np.mean(full[name][:window]))
    truth = float(np.mean(steady))
    every, counted = np.mean(firsts["every"]) / truth, np.mean(firsts["counted"]) / truth
    assert every < 0.75, every
    assert 0.88 < counted < 1.08, counted


@pytest.mark.parametrize("policy", ["single", "sync", "async"])
def test_a_resumed_run_keeps_its_window_until_each_sampler_has_ended_an_episode_per_env(
    policy, client, graphs_dir, tmp_path
):
    """Where samplers start fresh envs on a resume (a streaming policy), the checkpoint's window stands until
    each sampler has ended an episode per env; where their trackers come back with their envs (``single``,
    ``sync``: exact resume) every episode counts at once, as in the run that never stopped."""
    over = ["roles.sampler.replicas=2", "roles.sampler.envs=4", "stop.mean_return=null", f"runs_dir={tmp_path}"]
    first = load_graph(f"{graphs_dir}/ppo-cartpole-{policy}.yaml", [*over, "stop.iterations=5", "checkpoint.every=5"])
    summary = dagrl.train(first, client)
    rundir = RunDir(summary["run_dir"])
    ckpt = load_checkpoint(rundir.path)
    assert ckpt["counters"]["iteration"] == 5 and len(ckpt["recent"]) == 20

    seen = []
    graph = load_graph(f"{graphs_dir}/ppo-cartpole-{policy}.yaml", [*over, "stop.iterations=10"])
    dagrl.train(graph, client, rundir=rundir, resume=ckpt, listeners=[lambda row, res: seen.append((row, res))])
    assert [row["iteration"] for row, _ in seen] == [6, 7, 8, 9, 10]

    expected = collections.deque(ckpt["recent"], maxlen=20)
    for row, res in seen:
        expected.extend(res.episodes.window_returns().tolist())
        assert row["charts/episode_return_mean"] == pytest.approx(np.mean(expected))
    episodes = [res.episodes for _, res in seen]
    sources = np.concatenate([res.sources for _, res in seen])
    mask = np.concatenate([e.in_window for e in episodes])
    if policy != "async":
        assert mask.all()
        return
    assert mask.any() and not mask.all()
    for s in (0, 1):  # per sampler: at least one episode per env before it counts, then every one
        own = mask[sources == s]
        if not own.any():  # an env of this sampler is still in its first episode: none of it counts yet
            continue
        cut = int(np.argmax(own))
        assert cut >= 4 and own[cut:].all() and not own[:cut].any(), own
