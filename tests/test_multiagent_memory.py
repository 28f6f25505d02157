"""MAPPO's recurrent policies (``gru``): the learner unrolls what the samplers acted with, memory pays
where a cue is shown once, and a run with them evaluates and exports."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import dagrl.envs  # noqa: F401  (registers dagrl.envs:PettingZoo-v0)
from dagrl.algos.common import multiagent
from dagrl.core.context import RoleContext
from dagrl.core.schema import ConfigError
from dagrl.envs.agents import PettingZooGame
from tests.helpers import train

RELAY = "tests.agent_games:Relay"


def _rollouts(cfg: multiagent.Config, game: str, n: int) -> tuple[multiagent.SamplerState, list]:
    ctx = RoleContext("sampler", 0, 1, seed=0, env_id="dagrl.envs:PettingZoo-v0", num_envs=3)
    ctx.env_kwargs = {"env": game}
    state = multiagent.sampler(ctx, cfg)
    weights = {k: v.numpy() for k, v in state.agent.state_dict().items()}
    return state, [multiagent.collect.fn(state, weights) for _ in range(n)]


def test_the_learner_unrolls_the_policies_the_samplers_acted_with():
    """Relay (two groups of different spaces, agents joining and leaving; 5-step games) in rollouts of 3
    steps, so that rollouts start mid-game: unrolled from each rollout's stored state, the policies give
    the log-probs the sampler acted with, for every agent in the game."""
    cfg = multiagent.Config(num_steps=3, gru=8, hidden=16)
    state, rollouts = _rollouts(cfg, RELAY, 4)
    net = state.agent
    assert np.abs(rollouts[1].memory).max() > 0  # the second rollout starts mid-game, with a memory
    assert rollouts[1].starts[:2].sum() == 0 and rollouts[1].starts[2].all()  # games of 5 steps
    for r in rollouts:
        q = multiagent._sequences(r, net, cfg, "cpu")
        keep = q["active"]
        with torch.no_grad():
            dist, _ = net.unroll(q["obs"], q["agent"], q["starts"], q["memory"], keep)
        torch.testing.assert_close(dist.log_prob(q["actions"][keep]), q["logprobs"][keep], rtol=0, atol=1e-5)
    # without the stored state the second rollout's first steps come out otherwise
    q = multiagent._sequences(rollouts[1], net, cfg, "cpu")
    with torch.no_grad():
        dist, _ = net.unroll(q["obs"], q["agent"], q["starts"], torch.zeros_like(q["memory"]), q["active"])
    assert not torch.allclose(dist.log_prob(q["actions"][q["active"]]), q["logprobs"][q["active"]], atol=1e-4)


def test_feed_forward_policies_carry_no_memory():
    state, (r,) = _rollouts(multiagent.Config(num_steps=3), RELAY, 1)
    assert state.agent.gru == 0 and r.memory.shape == (3, 3, 0)


def test_a_gru_width_below_zero_is_refused(tmp_path):
    from dagrl.app.graphs import load_graph

    path = tmp_path / "g.yaml"
    path.write_text(GRAPH % ("mappo", RELAY, 1, "gru: -1"))
    with pytest.raises(ConfigError, match="gru"):
        load_graph(str(path))


GRAPH = """
algorithm: %s
env: {id: "%s", api: pettingzoo}
policy: single
seed: %d
roles: {sampler: {replicas: 1, envs: 16}, learner: {replicas: 1}}
hyperparameters: {num_steps: 8, minibatch_size: 128, %s}
stop: {env_steps: 20000, mean_return: 3.6, window: 50}
"""


@pytest.mark.slow
def test_a_gru_policy_remembers_a_cue_shown_once(tmp_path):
    """Recall: a cue shown at a game's first step names the action that scores on each of its 4 steps.
    Without memory the best return is 2.5 (the first step, then guesses); a GRU policy passes 3.6."""
    runs = {}
    for name, gru in (("gru", "gru: 32"), ("mlp", "gru: 0")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(GRAPH % ("mappo", "tests.agent_games:Recall", 1, gru))
        runs[name] = train(str(path), tmp_path / name)
    summary, _ = runs["gru"]
    assert summary["stop_reason"] == "mean_return", summary
    summary, rundir = runs["mlp"]
    assert summary["stop_reason"] == "env_steps"
    late = [r["charts/episode_return"] for r in rundir.read_metrics()[-20:] if "charts/episode_return" in r]
    assert 2.0 < np.mean(late) < 2.8, late


def test_a_gru_run_evaluates_and_exports_with_its_state(tmp_path, capsys):
    """``dagrl eval`` carries the GRU states through each game; ``dagrl export`` (whole game and one group)
    writes a policy that takes the states beside the rows and returns them after the step."""
    from dagrl.app.cli import main

    runs = tmp_path / "runs"
    path = tmp_path / "g.yaml"
    path.write_text(GRAPH % ("mappo", RELAY, 1, "gru: 8"))
    overrides = ["stop.iterations=3", "stop.mean_return=null", f"runs_dir={runs}", "checkpoint.every=3"]
    assert main(["run", str(path), "--quiet", *[f"--set={o}" for o in overrides]]) == 0
    (run,) = list(runs.iterdir())
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == [5] * 4

    for group, shape in ((None, (3, 8)), ("runner", (2, 8))):
        out = tmp_path / f"{group}.pt2"
        assert main(["export", str(run), "--out", str(out), *(["--group", group] if group else [])]) == 0
        policy = torch.export.load(str(out)).module()
        rows = torch.as_tensor(PettingZooGame(RELAY).reset(seed=0)[0])[None].repeat(2, 1, 1)
        rows = rows[:, :2] if group else rows  # the runners' rows
        actions, h = policy(rows, torch.zeros(2, *shape))
        assert actions.shape == (2, shape[0]) and h.shape == (2, *shape) and h.abs().max() > 0
