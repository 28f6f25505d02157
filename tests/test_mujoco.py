"""Running normalisation and MuJoCo: the statistics' arithmetic, their trip from the learner to the
samplers and into checkpoints, and smoke runs of the MuJoCo graphs on a real LocalCluster (identical
statistics over data-parallel learners: ``test_dataparallel.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dagrl.algos import ppo
from dagrl.algos.common import actor_critic
from dagrl.core.context import RoleContext
from dagrl.nn.networks import RunningNorm
from tests.helpers import train


def test_running_norm_merged_in_batches_equals_the_whole_stream():
    rng = np.random.default_rng(0)
    data = rng.normal(loc=[3.0, -7.0, 0.0], scale=[0.5, 20.0, 1e-2], size=(1000, 3))
    norm = RunningNorm((3,))
    for chunk in np.array_split(data, [1, 17, 400, 401]):  # uneven, one single row
        norm.update(torch.from_numpy(chunk))
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-8)
    assert float(norm.count) == 1000
    z = norm(torch.from_numpy(data)).numpy()
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-8)
    np.testing.assert_allclose(z.std(0), 1.0, rtol=1e-4)


def test_moments_reduced_over_replicas_count_every_replica():
    norm = RunningNorm((2,))
    norm.update(torch.ones(5, 2), reduce=lambda m: m * 3)  # three replicas with the same batch
    assert float(norm.count) == 15
    np.testing.assert_allclose(norm.mean.numpy(), [1.0, 1.0])


def _roles(cfg: ppo.Config, env_id: str = "Pendulum-v1"):
    s_ctx = RoleContext("sampler", 0, 1, seed=0, env_id=env_id, num_envs=2)
    sampler = ppo.sampler(s_ctx, cfg)
    learner = ppo.learner(RoleContext("learner", 0, 1, 0, env_id).with_spaces(), cfg)
    return sampler, learner


def test_statistics_fold_after_the_update_and_reach_samplers_with_the_weights():
    cfg = ppo.Config(num_steps=64, update_epochs=1, minibatch_size=64, norm_obs=True, norm_reward=True)
    sampler, learner = _roles(cfg)
    weights = ppo.publish(learner)
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count", "return_norm.var"} <= weights.keys()
    rollout = ppo.collect(sampler, weights)
    assert rollout.disc_returns.shape == (64, 2)
    ppo.update(learner, [rollout])
    agent = learner.agent
    assert float(agent.obs_norm.count) == 128  # every observation of the batch, once
    np.testing.assert_allclose(agent.obs_norm.mean.numpy(), rollout.obs.reshape(128, -1).mean(0), rtol=1e-5)
    np.testing.assert_allclose(agent.return_norm.var.numpy(), rollout.disc_returns.var(), rtol=1e-4)
    assert agent.reward_scale() != 1.0
    ppo.collect(sampler, ppo.publish(learner))  # the next rollout acts on the new statistics
    for key in ("obs_norm.mean", "obs_norm.var", "return_norm.var"):
        assert torch.equal(sampler.agent.state_dict()[key], agent.state_dict()[key]), key
    restored = ppo.learner(learner.ctx, cfg)
    restored.load_state_dict(learner.state_dict())  # the checkpoint keeps them
    assert torch.equal(restored.agent.obs_norm.var, agent.obs_norm.var)


def test_norm_obs_is_refused_for_images():
    from gymnasium.spaces import Box, Discrete

    with pytest.raises(ValueError, match="norm_obs"):
        actor_critic.ActorCritic(Box(0, 255, (4, 84, 84), np.uint8), Discrete(2), 64, norm_obs=True)


@pytest.mark.parametrize(
    ("graph_file", "overrides"),
    [
        ("graphs/ppo-hopper-async.yaml", ["hyperparameters.num_steps=256", "evaluate.every=2"]),
        (  # 64-unit networks: the graph's own path, at a quarter of the 256-unit update cost
            "graphs/td3-halfcheetah-apex.yaml",
            ["hyperparameters.learning_starts=1000", "hyperparameters.hidden=64", "evaluate.every=100"],
        ),
        (
            "graphs/sac-halfcheetah.yaml",
            ["hyperparameters.learning_starts=1000", "hyperparameters.hidden=64", "roles.sampler.replicas=2"]
            + ["evaluate.every=5"],
        ),
    ],
    ids=["ppo-hopper-async", "td3-halfcheetah-apex", "sac-halfcheetah-split"],
)
def test_mujoco_graphs_run_on_a_local_cluster(client, tmp_path, graph_file, overrides):
    pytest.importorskip("mujoco")
    summary, rundir = train(graph_file, tmp_path, ["stop.env_steps=3000", *overrides], client=client)
    assert summary["stop_reason"] == "env_steps" and summary["env_steps"] >= 3000
    rows = rundir.read_metrics()
    updates = [r for r in rows if r.get("perf/frames", 0) > 0]
    assert updates, "the learners never updated"
    for row in updates:
        assert all(np.isfinite(v) for k, v in row.items() if k.startswith("losses/")), row
    assert any("eval/return_mean" in r for r in rows) or "eval" in summary


def test_norm_obs_on_an_image_env_is_refused_before_a_cluster_starts():
    from dagrl.app.graphs import load_graph
    from dagrl.core.schema import ConfigError

    with pytest.raises(ConfigError, match=r"ppo-brighthalf.yaml: hyperparameters: norm_obs.*BrightHalf"):
        load_graph("graphs/ppo-brighthalf.yaml", ["hyperparameters.norm_obs=true"])


def test_mujoco_warnings_go_to_the_log_once_not_to_stdout_or_the_working_directory(tmp_path):
    """MuJoCo prints its warnings to stdout and appends them to MUJOCO_LOG.TXT in the working directory;
    gymnasium's -v5 models raise a deprecation warning with every env made under MuJoCo 4."""
    import subprocess
    import sys

    code = (
        "import logging\n"
        "from dagrl.core.context import RoleContext\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "for _ in range(3):\n"
        "    envs = RoleContext('sampler', 0, 1, seed=0, env_id='HalfCheetah-v5', num_envs=2).make_envs()\n"
        "    envs.reset(seed=0)\n"
        "    envs.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stdout
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    logged = [line for line in done.stderr.splitlines() if "MuJoCo: " in line]
    assert len(logged) <= 1, logged  # each distinct warning once (none from a MuJoCo without it)
