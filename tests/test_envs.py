"""Vector-env modes of a sampler and the costly CartPole used by the scaling benchmark."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from dagrl.graph import load_graph
from tests.helpers import descendants, train
from tests.test_policies import LOSSES, first_iterations

COSTLY = "dagrl.envs:CostlyCartPole-v0"


def test_async_vector_envs_give_the_same_iterations_as_sync(graphs_dir):
    over = ["roles.sampler.envs=3", "hyperparameters.num_steps=16"]
    sync = first_iterations(load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", over), None)
    subproc = first_iterations(
        load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", [*over, "roles.sampler.vector=async"]), None
    )
    for a, b in zip(sync, subproc, strict=True):
        assert a.env_steps == b.env_steps == 3 * 16
        np.testing.assert_array_equal(a.episodes.returns, b.episodes.returns)
        for key in LOSSES:
            assert a.metrics[key] == b.metrics[key], key


def test_async_vector_sampler_runs_on_dagrls_cluster_and_leaves_no_process(tmp_path):
    """Dask workers are daemonic processes; dagrl's worker preload lets samplers start env subprocesses."""
    before = set(descendants())
    summary, _ = train(
        "graphs/ppo-costly-cartpole.yaml", tmp_path,
        ["roles.sampler.replicas=2", "roles.sampler.vector=async", "env.kwargs.step_ms=0.2", "stop.iterations=4"],
    )  # fmt: skip
    assert summary["iterations"] == 4 and summary["env_steps"] >= 4 * 4 * 32
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and set(descendants()) - before:
        time.sleep(0.2)
    assert not set(descendants()) - before


@pytest.mark.parametrize("cost", ["sleep", "busy"])
def test_costly_cartpole_spends_its_step_cost(cost):
    env = gym.make(COSTLY, step_ms=5.0, cost=cost)
    env.reset(seed=0)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i in range(20):
        if env.step(i % 2)[2]:  # alternate pushes: the pole stays up for all 20 steps
            env.reset()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert wall >= 20 * 0.005
    assert (cpu >= 0.8 * 20 * 0.005) if cost == "busy" else (cpu < 0.5 * wall)


def test_costly_cartpole_rejects_unknown_cost():
    with pytest.raises(ValueError, match="cost must be one of sleep, busy"):
        gym.make(COSTLY, cost="spin")
