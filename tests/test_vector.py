"""``vector: envpool``: EnvPool behind gymnasium's same-step autoreset, checked before a run starts."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.core.schema import ConfigError
from dagrl.envs.vector import EnvPoolVector
from dagrl.runtime.hosts import role_context
from tests.helpers import train


def test_every_step_acts_in_every_env_and_an_ended_episode_shows_its_last_observation():
    """EnvPool alone spends the step after an episode's end on the reset (reward 0, action ignored);
    behind EnvPoolVector that step never happens: CartPole pays 1 on every step of every env."""
    envs = EnvPoolVector("CartPole-v1", 8, seed=3)
    obs, _ = envs.reset()
    ended = 0
    for _ in range(300):
        obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
        assert (reward == 1).all()
        for i in np.flatnonzero(terminated | truncated):
            last = info["final_obs"][i]
            assert abs(last[0]) > 2.4 or abs(last[2]) > 0.2094 or truncated[i]  # CartPole's end: out of bounds
            assert np.abs(obs[i]).max() <= 0.05  # the next episode's first observation
            ended += 1
    assert ended > 50
    envs.close()


def test_observations_are_copies_that_survive_later_steps():
    envs = EnvPoolVector("CartPole-v1", 2, seed=0)
    first, _ = envs.reset()
    kept = first.copy()
    for _ in range(5):
        envs.step(np.zeros(2, np.int64))
    np.testing.assert_array_equal(first, kept)
    envs.close()


def test_atari_preset_maps_to_envpool_with_the_same_preprocessing():
    graph = load_graph("graphs/ppo-atari.yaml", ["roles.sampler.vector=envpool"])
    envs = EnvPoolVector("dagrl.envs:Atari-v0", 2, seed=0, game="Pong")
    obs, _ = envs.reset()
    assert obs.dtype == np.uint8 and obs.shape == (2, *graph.observation_space.shape) == (2, 4, 84, 84)
    _, reward, *_ = envs.step(np.zeros(2, np.int64))
    assert set(np.unique(reward)) <= {-1.0, 0.0, 1.0}  # clipped as the gymnasium preset clips
    envs.close()


@pytest.mark.slow
def test_ppo_solves_cartpole_on_envpool_samplers_on_a_cluster(client, tmp_path):
    overrides = ["roles.sampler.vector=envpool", "stop.env_steps=150000"]
    summary, _ = train("graphs/ppo-cartpole-sync.yaml", tmp_path, overrides, client)
    assert summary["stop_reason"] == "mean_return", summary


def test_envpool_refusals_name_the_key_before_anything_starts(monkeypatch):
    with pytest.raises(ConfigError, match=r"roles\.sampler\.vector: envpool: EnvPool has no task 'dagrl\.envs:Cost"):
        load_graph("graphs/ppo-costly-cartpole.yaml", ["roles.sampler.vector=envpool"])
    with pytest.raises(ConfigError, match=r"env\.kwargs: .*EnvPool has no counterpart for: full_action_space"):
        load_graph("graphs/ppo-atari.yaml", ["roles.sampler.vector=envpool", "env.kwargs.full_action_space=true"])
    monkeypatch.setitem(sys.modules, "envpool", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"roles\.sampler\.vector: envpool: EnvPool is not installed"):
        load_graph("graphs/ppo-cartpole-single.yaml", ["roles.sampler.vector=envpool"])


def test_off_policy_rows_keep_the_graphs_dtypes_on_envpool(tmp_path):
    """EnvPool's Pendulum acts in float64; the replay schema follows the graph's float32 actions."""
    overrides = ["roles.sampler.vector=envpool", "stop.iterations=20", "stop.mean_return=null"]
    summary, rundir = train("graphs/sac-pendulum-single.yaml", tmp_path, overrides)
    assert summary["iterations"] == 20 and summary["env_steps"] == 20 * 16
    assert rundir.read_metrics()[-1]["env_steps"] == 320


def test_dagrl_graph_shows_the_backend():
    from dagrl.app.inspect import describe

    shown = describe(load_graph("graphs/ppo-cartpole-single.yaml", ["roles.sampler.vector=envpool"]))
    assert "collect  [vector envpool]" in shown
    threads = ["roles.sampler.vector=envpool", "roles.sampler.vector_threads=2"]
    assert "collect  [vector envpool, 2 threads]" in describe(load_graph("graphs/ppo-cartpole-single.yaml", threads))
    assert "[vector" not in describe(load_graph("graphs/ppo-cartpole-single.yaml"))  # auto, the default
    in_turn = load_graph("graphs/ppo-cartpole-single.yaml", ["roles.sampler.vector=sync"])
    assert "collect  [vector sync]" in describe(in_turn)


def test_a_replicas_envpool_gets_the_thread_count_its_graph_asks_for():
    """EnvPool's default is a thread per core of the host, too many where several samplers share it."""
    graph = load_graph(
        "graphs/ppo-cartpole-single.yaml", ["roles.sampler.vector=envpool", "roles.sampler.vector_threads=2"]
    )
    ctx = role_context(graph, "sampler", 0)
    assert (ctx.vector, ctx.vector_threads) == ("envpool", 2)
    envs = ctx.make_envs()
    assert envs._envs.pool.config["num_threads"] == 2
    envs.close()
    with pytest.raises(ConfigError, match=r"roles\.sampler: vector_threads applies to vector: envpool only"):
        load_graph("graphs/ppo-cartpole-single.yaml", ["roles.sampler.vector_threads=2"])
    with pytest.raises(ConfigError, match=r"roles\.sampler: vector_threads must be >= 0, got -1"):
        load_graph(
            "graphs/ppo-cartpole-single.yaml", ["roles.sampler.vector=envpool", "roles.sampler.vector_threads=-1"]
        )
