"""``dagrl export``: the greedy policy, as a ``torch.export`` file, plays what ``dagrl eval`` plays with torch alone."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from dagrl.app.cli import main
from dagrl.app.evaluate import eval_graph, evaluate_checkpoint
from dagrl.runtime.hosts import role_seed
from tests.helpers import train

PLAY = """
import json, sys
import gymnasium as gym
import torch

path, seed, episodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = {"dagrl.json": ""}
policy = torch.export.load(path, extra_files=extra).module()
info = json.loads(extra["dagrl.json"])
env = gym.make(info["env"]["id"], **info["env"]["kwargs"])
returns, (obs, _) = [], env.reset(seed=seed)
while len(returns) < episodes:  # as dagrl's evaluator: one env, seeded once, then reset unseeded
    total, done = 0.0, False
    while not done:
        action = policy(torch.as_tensor(obs)[None])[0].numpy()
        obs, reward, terminated, truncated, _ = env.step(action if action.shape else action.item())
        total, done = total + float(reward), terminated or truncated
    returns.append(total)
    obs, _ = env.reset()
print(json.dumps({"returns": returns, "dagrl_imported": "dagrl" in sys.modules, "info": info}))
"""


@pytest.mark.parametrize(
    ("graph_file", "overrides"),
    [
        ("graphs/ppo-cartpole-single.yaml", ["hyperparameters.norm_obs=true", "stop.iterations=4"]),
        ("graphs/dqn-cartpole-single.yaml", ["stop.iterations=8", "hyperparameters.learning_starts=256"]),
        ("graphs/sac-pendulum-single.yaml", ["stop.iterations=12", "hyperparameters.learning_starts=64"]),
    ],
    ids=["ppo-norm-obs", "dqn", "sac"],
)
def test_the_exported_policy_plays_the_episodes_dagrl_eval_plays(
    tmp_path, capsys, caplog, monkeypatch, graph_file, overrides
):
    summary, rundir = train(graph_file, tmp_path, [*overrides, "stop.mean_return=null"])
    out = tmp_path / "policy.pt2"
    caplog.clear()
    for name in ("torch", "torch.export"):  # torch logs to handlers of its own only
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
    assert main(["export", str(rundir.path), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not list(tmp_path.glob("*.tmp"))
    one_env = ["roles.evaluator.envs=1"]
    expected = evaluate_checkpoint(rundir.path, episodes=3, overrides=one_env)
    graph = eval_graph(rundir.path, 3, None, one_env, False)
    seed = role_seed(graph, "evaluator", 0) + 10_000  # the evaluator's first call's reset seed
    played = subprocess.run(
        [sys.executable, "-c", PLAY, str(out), str(seed), "3"], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(played.stdout.strip().splitlines()[-1])
    assert not result["dagrl_imported"]  # torch and the env alone
    np.testing.assert_allclose(result["returns"], expected.returns, rtol=1e-5)
    assert result["info"]["iteration"] == summary["iterations"]


def test_an_image_policy_takes_uint8_frames_and_a_missing_run_is_one_line(tmp_path, capsys):
    _, rundir = train("graphs/ppo-brighthalf.yaml", tmp_path, ["stop.iterations=2", "stop.mean_return=null"])
    assert main(["export", str(rundir.path)]) == 0
    (path,) = (rundir.path / "export").glob("*.pt2")
    policy = torch.export.load(path).module()
    frames = torch.randint(0, 256, (8, 1, 84, 84), dtype=torch.uint8)  # the env's own frames
    actions = policy(frames)
    assert actions.shape == (8,) and actions.dtype == torch.int64
    assert torch.equal(actions[:1], policy(frames[:1]))
    capsys.readouterr()
    assert main(["export", str(tmp_path / "nope")]) == 2
    assert "dagrl export: RUN: " in (err := capsys.readouterr().err) and "nope does not exist" in err


def test_a_policy_over_a_dict_holding_an_image_takes_the_packed_vector(tmp_path):
    """What ``dagrl.envs.vector.make_env`` gives for the Dict (``dagrl.spaces.mixed``) is what the export takes."""
    import dagrl.envs  # noqa: F401  (registers BrightHalfFlip-v0)
    from dagrl.envs.vector import make_env

    overrides = [
        "stop.iterations=2",
        "stop.mean_return=null",
        "hyperparameters.norm_obs=true",
    ]  # the state's norm inside
    _, rundir = train("graphs/ppo-brighthalf-flip.yaml", tmp_path, overrides)
    assert main(["export", str(rundir.path)]) == 0
    (path,) = (rundir.path / "export").glob("*.pt2")
    policy = torch.export.load(path).module()
    env = make_env("BrightHalfFlip-v0", size=36)
    obs = np.stack([env.reset(seed=s)[0] for s in range(5)])
    actions = policy(torch.as_tensor(obs))
    assert actions.shape == (5,) and actions.dtype == torch.int64


def test_a_recurrent_policy_is_exported_with_its_state_and_plays_what_dagrl_eval_plays(tmp_path, capsys):
    """``ppo_lstm``: the file takes the observations and the LSTM state, and returns the actions and the
    state after them; played with the state zeroed at each episode's start, it earns what ``dagrl eval``
    does, episode for episode."""
    from dagrl.envs.vector import make_env
    from dagrl.envs.wrappers import parse

    graph_file = "graphs/ppo-lstm-cartpole-novel.yaml"
    _, rundir = train(graph_file, tmp_path, ["policy=single", "stop.iterations=12", "stop.mean_return=null"])
    out = tmp_path / "lstm.pt2"
    assert main(["export", str(rundir.path), "--out", str(out)]) == 0
    assert "state (64,), state (64,) in" in capsys.readouterr().out
    extra = {"dagrl.json": ""}
    policy = torch.export.load(str(out), extra_files=extra).module()
    info = json.loads(extra["dagrl.json"])
    assert info["state"] == [{"shape": [64], "dtype": "float32"}] * 2

    one_env = ["roles.evaluator.envs=1"]
    expected = evaluate_checkpoint(rundir.path, episodes=3, overrides=one_env)
    graph = eval_graph(rundir.path, 3, None, one_env, False)
    env = make_env(info["env"]["id"], parse(info["env"]["wrappers"]), **info["env"]["kwargs"])

    def play(carry: bool) -> list[float]:
        returns, (obs, _) = [], env.reset(seed=role_seed(graph, "evaluator", 0) + 10_000)
        while len(returns) < 3:  # as the evaluator: one env, seeded once, then reset unseeded
            total, done, state = 0.0, False, [torch.zeros(1, 64), torch.zeros(1, 64)]
            while not done:
                action, *after = policy(torch.as_tensor(obs)[None], *state)
                state = after if carry else state
                obs, reward, terminated, truncated, _ = env.step(action[0].item())
                total, done = total + float(reward), terminated or truncated
            returns.append(total)
            obs, _ = env.reset()
        return returns

    returns = play(carry=True)
    np.testing.assert_allclose(returns, expected.returns, rtol=1e-5)  # 59, 72 and 45 (seed 1, 12 iterations)
    assert play(carry=False) != returns  # the state it returns is what it acts on
