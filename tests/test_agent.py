"""``dagrl.load``: a run in Python acts as SB3's ``predict`` does, plays what ``dagrl eval`` plays, and its
ONNX export picks the same actions in onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest

import dagrl
from dagrl.app.cli import main
from dagrl.app.evaluate import eval_graph
from dagrl.core.schema import ConfigError
from dagrl.runtime.hosts import role_seed
from tests.helpers import train


def play(agent: dagrl.Agent, env, seed: int, episodes: int, **predict) -> tuple[list[float], list[np.ndarray]]:
    """Whole episodes of ``env`` by ``agent.predict`` (one env, seeded once, then reset unseeded, as the
    evaluator plays): the returns and every observation acted on."""
    returns, seen, (obs, _) = [], [], env.reset(seed=seed)
    state, start = None, True
    while len(returns) < episodes:
        total, done = 0.0, False
        while not done:
            seen.append(obs)
            action, state = agent.predict(obs, state, np.array([start]), **predict)
            obs, reward, terminated, truncated, _ = env.step(action if action.shape else action.item())
            total, done, start = total + float(reward), terminated or truncated, False
        returns.append(total)
        obs, _ = env.reset()
        start = True
    return returns, seen


def evaluator_seed(run) -> int:
    """The reset seed of the evaluator's first call with one env."""
    return role_seed(eval_graph(run, 1, None, [], False), "evaluator", 0) + 10_000


@pytest.mark.slow
def test_a_trained_cartpole_loads_plays_400_with_predict_and_onnx_picks_the_same_actions(tmp_path, capsys):
    """The README's path: train PPO on CartPole, load the run, 10 greedy episodes by ``predict``, the ONNX
    file in onnxruntime acting as ``predict`` on every observation met."""
    summary, rundir = train("graphs/ppo-cartpole-single.yaml", tmp_path, ["stop.wall_time_s=300"])
    assert summary["stop_reason"] == "mean_return", summary
    agent = dagrl.load(rundir.path)
    assert agent.iteration == summary["iterations"] and agent.algorithm == "ppo"
    returns, seen = play(agent, agent.make_env(), seed=0, episodes=10)
    assert np.mean(returns) >= 400, returns

    assert main(["export", str(rundir.path), "--format", "onnx", "--out", str(tmp_path / "policy.onnx")]) == 0
    assert "policy.onnx" in capsys.readouterr().out
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"))
    info = json.loads(session.get_modelmeta().custom_metadata_map["dagrl.json"])
    assert info["env"]["id"] == "CartPole-v1"
    obs = np.stack(seen)
    (onnx_actions,) = session.run(None, {"obs": obs})
    np.testing.assert_array_equal(onnx_actions, agent.predict(obs)[0])


@pytest.mark.parametrize(
    ("graph_file", "overrides"),
    [
        ("graphs/ppo-cartpole-single.yaml", ["stop.iterations=3"]),
        ("graphs/dqn-cartpole-single.yaml", ["stop.iterations=4", "hyperparameters.learning_starts=128"]),
        ("graphs/sac-pendulum-single.yaml", ["stop.iterations=4", "hyperparameters.learning_starts=64"]),
    ],
    ids=["ppo", "dqn", "sac"],
)
def test_predict_plays_the_episodes_dagrl_eval_plays_one_or_a_batch(tmp_path, graph_file, overrides):
    _, rundir = train(graph_file, tmp_path, [*overrides, "stop.mean_return=null"])
    agent = dagrl.load(rundir.path)
    expected = agent.evaluate(episodes=3)
    env = agent.make_env()
    returns, seen = play(agent, env, evaluator_seed(rundir.path), episodes=3)
    np.testing.assert_allclose(returns, expected.returns, rtol=1e-5)
    one, state = agent.predict(seen[0])
    batch, _ = agent.predict(np.stack(seen[:5]))
    assert state is None and one.shape == env.action_space.shape and len(batch) == 5
    np.testing.assert_allclose(batch[0], one, rtol=1e-6)
    assert env.action_space.contains(np.asarray(agent.predict(seen[1], deterministic=False)[0], env.action_space.dtype))
    with pytest.raises(ValueError, match=r"observation of shape \(7,\)"):
        agent.predict(np.zeros(7))


def test_stochastic_actions_sample_the_policy_and_dagrl_eval_says_so(tmp_path, capsys):
    """SAC's stochastic actions are draws around its mean (seeded by ``Agent.seed``); DQN's are
    epsilon-greedy at the schedule's last epsilon; ``dagrl eval --stochastic`` plays them and says so."""
    _, rundir = train(
        "graphs/sac-pendulum-single.yaml", tmp_path / "sac", ["stop.iterations=2", "hyperparameters.learning_starts=64"]
    )
    agent = dagrl.load(rundir.path)
    obs = np.zeros((256, 3), np.float32)
    agent.seed(3)
    draws = agent.predict(obs, deterministic=False)[0]
    agent.seed(3)
    np.testing.assert_array_equal(agent.predict(obs, deterministic=False)[0], draws)
    greedy = agent.predict(obs)[0]
    assert np.ptp(greedy) == 0 and draws.std() > 0.05

    _, rundir = train(
        "graphs/dqn-cartpole-single.yaml",
        tmp_path / "dqn",
        ["stop.iterations=2", "hyperparameters.learning_starts=128", "hyperparameters.eps_end=0.5"],
    )
    agent = dagrl.load(rundir.path)
    obs = np.zeros((2000, 4), np.float32)
    greedy = agent.predict(obs)[0]
    changed = (agent.predict(obs, deterministic=False)[0] != greedy).mean()
    assert 0.15 < changed < 0.35  # half the actions drawn uniformly over 2: a quarter differ

    assert main(["eval", str(rundir.path), "--episodes", "2", "--stochastic"]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1 (stochastic): return" in out and "-stochastic.json" in out


def test_a_recurrent_agent_carries_its_state_and_starts_episodes_from_zeros(tmp_path):
    """``ppo_lstm``: ``predict`` with the state it returned (zeroed by ``episode_start``) plays what
    ``dagrl eval`` plays; dropping the state plays otherwise."""
    overrides = ["policy=single", "stop.iterations=12", "stop.mean_return=null"]
    _, rundir = train("graphs/ppo-lstm-cartpole-novel.yaml", tmp_path, overrides)
    agent = dagrl.load(rundir.path, overrides=["roles.evaluator.envs=1"])
    assert agent.recurrent
    expected = agent.evaluate(episodes=3)
    env = agent.make_env()
    seed = evaluator_seed(rundir.path)
    returns, seen = play(agent, env, seed, episodes=3)
    np.testing.assert_allclose(returns, expected.returns, rtol=1e-5)
    action, state = agent.predict(seen[0])
    assert [s.shape for s in state] == [(64,), (64,)]

    class Forgetful:  # the same agent, handed no state each step
        def predict(self, obs, state, start, **kw):
            return agent.predict(obs, None, None, **kw)

    assert play(Forgetful(), env, seed, episodes=3)[0] != returns

    # the ONNX export of the same policy: observations and state in, actions and the state after out
    assert main(["export", str(rundir.path), "--format", "onnx", "--out", str(tmp_path / "lstm.onnx")]) == 0
    session = onnxruntime.InferenceSession(str(tmp_path / "lstm.onnx"))
    assert [i.name for i in session.get_inputs()] == ["obs", "state0", "state1"]
    obs, state = np.stack(seen[:8]), None
    h = c = np.zeros((8, 64), np.float32)
    for _ in range(3):  # three steps, each from the state the step before left
        want, state = agent.predict(obs, state)
        got, h, c = session.run(None, {"obs": obs, "state0": h, "state1": c})
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(h, state[0], atol=1e-5)


def test_a_multi_agent_run_answers_per_group_and_for_every_agent(tmp_path):
    _, rundir = train("graphs/mappo-spread-single.yaml", tmp_path, ["stop.iterations=1", "stop.mean_return=null"])
    agent = dagrl.load(rundir.path)
    env = agent.make_env()
    obs, _ = env.reset(seed=0)
    everyone, state = agent.predict(obs)
    names = agent.net.names
    groups = {g: obs[agent.net.members(g)] for g in names}
    by_group, _ = agent.predict(groups)
    for g in names:
        np.testing.assert_array_equal(by_group[g], everyone[agent.net.members(g)])
    with pytest.raises(ValueError, match="no such group in this run: nobody"):
        agent.predict({"nobody": obs})


def test_loading_what_is_not_a_run_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="dagrl.load.*does not exist"):
        dagrl.load(tmp_path / "missing")
    assert main(["export", str(tmp_path), "--format", "onnx"]) == 2


@pytest.mark.parametrize(
    ("graph_file", "overrides"),
    [
        ("graphs/td3-pendulum-single.yaml", ["hyperparameters.learning_starts=64"]),
        ("graphs/impala-cartpole.yaml", ["policy=single"]),
        ("graphs/impala-lstm-cartpole-novel.yaml", ["policy=single"]),
        ("graphs/r2d2-cartpole-novel.yaml", ["policy=single"]),
        ("graphs/ppo-brighthalf.yaml", ["policy=single"]),
        ("graphs/ippo-spread-single.yaml", []),
    ],
    ids=["td3", "impala", "impala-lstm", "r2d2", "ppo-images", "ippo"],
)
def test_every_algorithm_loads_as_an_agent_that_acts_in_its_env(tmp_path, graph_file, overrides):
    if "spread" in graph_file:
        pytest.importorskip("mpe2")
    _, rundir = train(graph_file, tmp_path, [*overrides, "stop.iterations=2", "stop.mean_return=null"])
    agent = dagrl.load(rundir.path)
    env = agent.make_env()
    obs, _ = env.reset(seed=0)
    state = None
    for deterministic in (True, False, True):
        action, state = agent.predict(obs, state, deterministic=deterministic)
        assert env.action_space.contains(np.asarray(action, env.action_space.dtype)), action
        obs = env.step(action if np.ndim(action) else action.item())[0]
    assert (state is not None) == agent.recurrent
    batch, _ = agent.predict(np.stack([obs, obs, obs]))
    assert len(batch) == 3
