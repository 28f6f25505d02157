"""IMPALA: V-trace targets against hand-checkable cases, and learning under ``async`` on a cluster."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dagrl.algos.common.rollouts import gae
from dagrl.algos.impala import vtrace
from tests.helpers import train


def _case(seed: int = 0, T: int = 12, N: int = 3):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    dones = (rng.random((T, N)) < 0.2).astype(np.float32)
    last = rng.normal(size=N).astype(np.float32)
    return rewards, values, dones, last


def test_on_policy_vtrace_is_the_lambda_return():
    """All ratios 1: v_s - V(x_s) is GAE's advantage for the same lambda, episode ends included."""
    rewards, values, dones, last = _case()
    for lam in (1.0, 0.9):
        targets, adv = vtrace(
            torch.zeros(rewards.shape), *map(torch.from_numpy, (rewards, dones, values, last)), 0.97, lam
        )
        expected = gae(rewards, values, dones, last, 0.97, lam)
        np.testing.assert_allclose(targets.numpy() - values, expected, rtol=1e-5, atol=1e-5)
        next_targets = np.concatenate([targets.numpy()[1:], last[None]])
        np.testing.assert_allclose(adv.numpy(), rewards + 0.97 * (1 - dones) * next_targets - values, atol=1e-5)


def test_ratios_are_truncated_at_rho_bar_and_c_bar():
    rewards, values, dones, last = _case(1)
    args = [*map(torch.from_numpy, (rewards, dones, values, last)), 0.9]
    big = torch.full(rewards.shape, 3.0)  # pi/mu = e^3, far above the bars
    on_policy = vtrace(torch.zeros(rewards.shape), *args)
    clipped = vtrace(big, *args, rho_bar=1.0, c_bar=1.0)
    for a, b in zip(on_policy, clipped, strict=True):
        torch.testing.assert_close(a, b)
    half = vtrace(torch.full(rewards.shape, np.log(0.5)), *args)  # below the bars: weights apply
    td = rewards + 0.9 * (1 - dones) * np.concatenate([values[1:], last[None]]) - values
    np.testing.assert_allclose(half[0].numpy()[-1] - values[-1], 0.5 * td[-1], atol=1e-5)


def test_target_kl_stops_a_batchs_steps_once_the_policy_moved_that_far(tmp_path):
    """With ``target_kl`` tiny, each batch gets its first gradient step only; without, all of them."""
    steps = {}
    for kl in ("null", "1.0e-12"):
        overrides = ["policy=single", "stop.iterations=6", "hyperparameters.update_epochs=4"]
        overrides.append(f"hyperparameters.target_kl={kl}")
        _, rundir = train("graphs/impala-cartpole.yaml", tmp_path / kl, overrides)
        rows = rundir.read_metrics()
        steps[kl] = {r["losses/steps"] for r in rows}
        assert all(r["perf/frames"] == r["losses/steps"] * 8 * 32 for r in rows)
    assert steps == {"null": {4.0}, "1.0e-12": {1.0}}


def test_kl_adaptive_lr_follows_each_batchs_move_within_its_bounds(tmp_path):
    """A tiny KL target shrinks the rate every batch (down to lr / 100), a huge one grows it (up to
    lr x 10, or x ``kl_adaptive_lr_max``); without one the rate stays ``lr``."""
    lrs = {}
    for target in ("null", "1.0e-12", "10.0 max 10", "10.0 max 3"):
        kl, _, most = target.partition(" max ")
        overrides = ["policy=single", "stop.iterations=14", f"hyperparameters.kl_adaptive_lr={kl}"]
        overrides += [f"hyperparameters.kl_adaptive_lr_max={most}"] if most else []
        _, rundir = train("graphs/impala-cartpole.yaml", tmp_path / target.replace(" ", "-"), overrides)
        lrs[target] = [r["losses/lr"] for r in rundir.read_metrics()]
    np.testing.assert_allclose(lrs["null"], 5e-4)
    np.testing.assert_allclose(lrs["1.0e-12"][:3], [5e-4 / 1.5, 5e-4 / 1.5**2, 5e-4 / 1.5**3])
    np.testing.assert_allclose(lrs["1.0e-12"][-1], 5e-6)
    np.testing.assert_allclose(lrs["10.0 max 10"][:2], [5e-4 * 1.5, 5e-4 * 1.5**2])
    np.testing.assert_allclose(lrs["10.0 max 10"][-1], 5e-3)
    np.testing.assert_allclose(lrs["10.0 max 3"][:3], [5e-4 * 1.5, 5e-4 * 1.5**2, 1.5e-3])


@pytest.mark.slow
def test_impala_learns_cartpole_under_async(client, tmp_path):
    summary, rundir = train("graphs/impala-cartpole.yaml", tmp_path, client=client)
    assert summary["stop_reason"] == "mean_return", summary
    rows = rundir.read_metrics()
    assert max(r["perf/staleness"] for r in rows) > 0  # it did learn from stale rollouts
    assert any(r["losses/rho_clipfrac"] > 0 for r in rows)


def _learn_from_the_first_weights(vtrace: bool, updates: int = 100, seed: int = 0) -> tuple[np.ndarray, float]:
    """IMPALA's update on rollouts all collected with the learner's initial (near-uniform) weights: staleness
    as high as it goes. The learner's policy at LaterPayoff's first step, and its greedy return."""
    from dagrl.algos import impala, ppo
    from dagrl.core.context import RoleContext

    env_id = "dagrl.envs:LaterPayoff-v0"
    cfg = impala.Config(vtrace=vtrace, num_steps=8, eval_episodes=8)
    sampler = ppo.sampler(RoleContext("sampler", 0, 1, seed=seed, env_id=env_id, num_envs=8), cfg)
    learner = impala.learner(RoleContext("learner", 0, 1, seed=seed + 1, env_id=env_id).with_spaces(), cfg)
    evaluator = ppo.evaluator(RoleContext("evaluator", 0, 1, seed=seed + 2, env_id=env_id), cfg)
    first = ppo.publish(learner)
    for _ in range(updates):
        impala.update(learner, [ppo.collect(sampler, first)])
    with torch.no_grad():
        dist, _ = learner.agent.dist_value(torch.tensor([[1.0, 0.0]]))
    ppo.evaluate(evaluator, ppo.publish(learner))
    return dist.probs[0].numpy(), float(np.mean(evaluator.last_returns))


def test_vtrace_beats_uncorrected_updates_when_every_rollout_is_stale():
    """LaterPayoff pays 1 for going on to its second step, 0.5 for stopping at the first; the stale
    policy, acting uniformly, earns 0.25 at the second. V-trace values the second step by the learner's
    own policy and goes on; the same update with every ratio taken as 1 values it by the stale policy's
    data and stops."""
    for seed in (0, 1):
        corrected, corrected_return = _learn_from_the_first_weights(True, seed=seed)
        plain, plain_return = _learn_from_the_first_weights(False, seed=seed)
        assert corrected.argmax() == 0 and corrected_return == 1.0, (seed, corrected)
        assert plain.argmax() != 0 and plain_return == 0.5, (seed, plain)
