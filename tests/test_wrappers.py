"""``env.wrappers``: gymnasium wrappers named in a graph reach every env dagrl makes, in order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.envs.vector import make_vector
from tests.helpers import train, user_module

REWARDS = """
import gymnasium as gym


class Scale(gym.RewardWrapper):
    def __init__(self, env, factor):
        super().__init__(env)
        self.factor = factor

    def reward(self, reward):
        return reward * self.factor


class Shift(gym.RewardWrapper):
    def __init__(self, env, by=1.0):
        super().__init__(env)
        self.by = by

    def reward(self, reward):
        return reward + self.by
"""


@pytest.mark.parametrize("vector", ["sync", "async", "threads"])
def test_wrappers_wrap_in_the_order_given_the_first_innermost(tmp_path, monkeypatch, vector):
    mod = user_module(tmp_path, monkeypatch, "my_rewards", REWARDS)
    for wrappers, reward in [
        ([(f"{mod}:Scale", {"factor": 2.0}), (f"{mod}.Shift", {})], 3.0),  # CartPole's 1 * 2 + 1
        ([(f"{mod}.Shift", {"by": 1.0}), (f"{mod}:Scale", {"factor": 2.0})], 4.0),  # (1 + 1) * 2
    ]:
        envs = make_vector("CartPole-v1", 2, vector, wrappers)
        try:
            envs.reset(seed=0)
            rewards = envs.step(np.zeros(2, dtype=np.int64))[1]
        finally:
            envs.close()
        np.testing.assert_array_equal(rewards, [reward, reward])


def test_the_graph_sees_the_wrapped_spaces():
    wrappers = ["env.wrappers=[{gymnasium.wrappers.FrameStackObservation: {stack_size: 3}}]"]
    g = load_graph("graphs/ppo-cartpole-sync.yaml", wrappers)
    assert g.observation_space.shape == (3, 4)  # what the learner's network is built for
    assert g.to_dict()["env"]["wrappers"] == [{"gymnasium.wrappers.FrameStackObservation": {"stack_size": 3}}]


def test_wrappers_reach_samplers_evaluators_and_dagrl_eval_on_a_cluster(client, tmp_path, capsys):
    from dagrl.app.cli import main

    wrappers = (  # CartPole pays 1 a step and lasts 8 steps at least: unwrapped, every return is >= 8
        "env.wrappers=[{gymnasium.wrappers.TimeLimit: {max_episode_steps: 12}},"
        " {gymnasium.wrappers.ClipReward: {max_reward: 0.5}},"
        " {gymnasium.wrappers.FrameStackObservation: {stack_size: 2}}]"
    )
    summary, rundir = train(
        "graphs/ppo-cartpole-sync.yaml", tmp_path,
        [wrappers, "stop.iterations=4", "stop.mean_return=null", "evaluate.every=2"], client,
    )  # fmt: skip
    assert summary["iterations"] == 4
    rows = rundir.read_metrics()
    lengths = [r["charts/episode_length"] for r in rows if "charts/episode_length" in r]
    assert lengths and max(lengths) <= 12, lengths  # untrained CartPole lasts ~20 steps unwrapped
    returns = [r["charts/episode_return"] for r in rows if "charts/episode_return" in r]
    assert returns and max(returns) <= 6, returns  # 0.5 a step for at most 12 steps
    evals = [r["eval/return_mean"] for r in rows if "eval/return_mean" in r]
    assert evals and max(evals) <= 6, evals
    capsys.readouterr()
    assert main(["eval", str(rundir.path), "--episodes", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(result["lengths"]) == 3 and max(result["lengths"]) <= 12 and max(result["returns"]) <= 6, result
