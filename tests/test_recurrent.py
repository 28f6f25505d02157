"""``ppo_lstm``: PPO whose policy carries an LSTM state from step to step (dagrl/algos/ppo_lstm.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dagrl.algos import ppo_lstm
from dagrl.app.graphs import load_graph
from dagrl.core.context import RoleContext
from dagrl.core.schema import ConfigError
from dagrl.policies import build_policy
from tests.helpers import train

GRAPH = "graphs/ppo-lstm-blink.yaml"
NOVEL = "graphs/ppo-lstm-cartpole-novel.yaml"
IMPALA_NOVEL = "graphs/impala-lstm-cartpole-novel.yaml"
BLINK = {"size": 36, "blink": True}
LOSSES = ["losses/policy", "losses/value", "losses/entropy", "losses/approx_kl"]


def roles(cfg: ppo_lstm.Config, envs: int = 3):
    ctx = RoleContext("sampler", 0, 1, 1, "dagrl.envs:BrightHalf-v0", BLINK, num_envs=envs)
    sampler = ppo_lstm.sampler(ctx, cfg)
    learner = ppo_lstm.learner(RoleContext("learner", 0, 1, 1, ctx.env_id, BLINK).with_spaces(), cfg)
    return sampler, learner


def test_the_learner_unrolls_the_lstm_to_the_log_probs_the_sampler_acted_with():
    """A rollout that begins mid-episode (its envs' LSTM state carried from the rollout before) and holds
    episode starts (12-step rollouts of 16-step episodes): unrolled from the state it carries, zeroed at
    the starts, the learner's network gives the sampler's log-probs; from a zero state it does not."""
    cfg = ppo_lstm.Config(num_steps=12, minibatch_size=24, update_epochs=1)
    sampler, learner = roles(cfg)
    weights = ppo_lstm.publish.fn(learner)
    first, second = ppo_lstm.collect.fn(sampler, weights), ppo_lstm.collect.fn(sampler, weights)
    assert first.starts[0].all() and not second.starts[0].any() and second.starts[4].all()
    assert np.abs(second.state[0]).max() > 0  # the carried state is not the initial one

    def logprobs(rollout, state):
        agent = learner.agent
        with torch.no_grad():
            out, _ = agent.unroll(torch.as_tensor(rollout.obs), state, torch.as_tensor(rollout.starts))
            return agent.heads.dist(out.reshape(-1, out.shape[-1])).log_prob(
                torch.as_tensor(rollout.actions).reshape(-1)
            )

    carried = tuple(torch.as_tensor(s).unsqueeze(0) for s in second.state)
    np.testing.assert_allclose(logprobs(second, carried), second.logprobs.reshape(-1), atol=1e-5)
    zero = learner.agent.initial(3)
    assert not np.allclose(logprobs(second, zero)[:12], second.logprobs[:4].reshape(-1), atol=1e-5)

    metrics = ppo_lstm.update.fn(learner, [first, second])
    assert metrics["perf/frames"] == 2 * 3 * 12  # one epoch: every env sequence once, 2 a minibatch


def test_decoupled_unrolls_the_proximal_policy_from_each_sequences_state():
    """``decoupled``: the learner's log-probs before its update, each env sequence unrolled from the state
    it carries, a minibatch of sequences at a time, are the sampler's on its own weights' rollouts (no
    lag) and differ once the learner has moved on."""
    cfg = ppo_lstm.Config(num_steps=12, minibatch_size=24, update_epochs=2, decoupled=True)
    sampler, learner = roles(cfg)
    weights = ppo_lstm.publish.fn(learner)
    first, second = ppo_lstm.collect.fn(sampler, weights), ppo_lstm.collect.fn(sampler, weights)
    assert ppo_lstm.update.fn(learner, [first, second])["losses/stale_kl"] < 1e-9
    assert ppo_lstm.update.fn(learner, [first, second])["losses/stale_kl"] > 1e-5


def test_burn_in_rebuilds_the_stored_state_and_moves_it_to_the_learners_weights():
    """With ``burn_in: 6`` each rollout carries its sampler's 6 steps before it. Unrolled with the weights
    that collected them, from the state stored before them, they give the state the sampler stored for
    the rollout; with other weights, the state those weights reach (not the stored one)."""
    cfg = ppo_lstm.Config(num_steps=12, minibatch_size=24, update_epochs=1, burn_in=6)
    sampler, learner = roles(cfg)
    weights = ppo_lstm.publish.fn(learner)
    first, second = ppo_lstm.collect.fn(sampler, weights), ppo_lstm.collect.fn(sampler, weights)
    assert not first.prefix.starts.any() and not first.prefix.obs.any()  # nothing before the first
    np.testing.assert_array_equal(second.prefix.obs, first.obs[6:])
    assert not second.starts[0].any()  # mid-episode: the state before it matters
    rebuilt = ppo_lstm.Sequences.of([second], "cpu", learner.agent).state
    for i in range(2):
        assert np.abs(second.state[i]).max() > 0.05
        np.testing.assert_allclose(rebuilt[i][0].numpy(), second.state[i], atol=1e-5)

    with torch.no_grad():
        for p in learner.agent.core.parameters():
            p.add_(0.3 * torch.randn_like(p))
        before = tuple(torch.as_tensor(s).unsqueeze(0) for s in second.prefix.state)
        prefix = second.prefix
        _, expected = learner.agent.unroll(torch.as_tensor(prefix.obs), before, torch.as_tensor(prefix.starts))
    moved = ppo_lstm.Sequences.of([second], "cpu", learner.agent).state
    for i in range(2):
        torch.testing.assert_close(moved[i], expected[i])
        assert not np.allclose(moved[i][0].numpy(), second.state[i], atol=1e-2)
    assert ppo_lstm.update.fn(learner, [first, second])["perf/frames"] == 2 * 3 * 12


def test_burn_in_longer_than_a_rollout_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"hyperparameters.*burn_in 40 > num_steps 16") as err:
        load_graph(GRAPH, ["hyperparameters.burn_in=40"])
    assert GRAPH in str(err.value)


def test_an_episode_a_time_limit_cuts_is_bootstrapped_from_the_state_it_reached():
    """As PPO's samplers do (``rollouts.Steps``): the last reward of a cut episode gets gamma x the critic's
    value of its final observation, here a constant 10 from the LSTM state the episode reached."""
    cfg = ppo_lstm.Config(num_steps=16, minibatch_size=16)
    ctx = RoleContext("sampler", 0, 1, 0, "CartPole-v1", {"max_episode_steps": 5}, num_envs=4)
    state = ppo_lstm.sampler(ctx, cfg)
    critic = state.agent.heads.critic[-1]
    torch.nn.init.zeros_(critic.weight)
    critic.bias.data.fill_(10.0)
    weights = {k: v.detach().numpy().copy() for k, v in state.agent.state_dict().items()}
    r = ppo_lstm.collect.fn(state, weights)
    cut = (r.dones == 1) & np.isclose(r.rewards, 1 + cfg.gamma * 10)
    assert cut.sum() > 0, "episodes of 5 steps must be cut by the time limit"
    assert np.all(cut | np.isclose(r.rewards, 1.0))
    np.testing.assert_array_equal(r.starts[1:], r.dones[:-1])  # an episode starts after each end
    np.testing.assert_array_equal(r.last_start, r.dones[-1])


def test_minibatches_hold_whole_sequences_and_the_graph_says_so_before_a_cluster_starts():
    with pytest.raises(ConfigError, match=r"hyperparameters.*minibatch_size 8 < num_steps 16") as err:
        load_graph(GRAPH, ["hyperparameters.minibatch_size=8"])
    assert GRAPH in str(err.value)


@pytest.mark.parametrize("graph_file", [GRAPH, IMPALA_NOVEL], ids=["ppo_lstm", "impala_lstm"])
def test_a_recurrent_algorithm_on_a_cluster_runs_exactly_as_in_one_process(client, graph_file):
    def first(policy_name, client, n=4):
        policy = build_policy(load_graph(graph_file, [f"policy={policy_name}"]), client)
        try:
            return [policy.step() for _ in range(n)]
        finally:
            policy.close()

    single, sync = first("single", None), first("sync", client)
    for a, b in zip(single, sync, strict=True):
        np.testing.assert_array_equal(a.episodes.returns, b.episodes.returns)
        assert [a.metrics[k] for k in LOSSES] == [b.metrics[k] for k in LOSSES]
    assert single[0].metrics["losses/value"] != single[-1].metrics["losses/value"]  # it trains


def test_ppo_lstm_learner_replicas_stay_identical_under_dp_learners(client):
    """Each replica unrolls its share of the env sequences; their gradients are averaged (the policy
    compares the replicas' weights after every update and stops the run with ``ReplicasDiverged``)."""
    graph = load_graph(GRAPH, ["policy=dp-learners", "roles.learner.replicas=2"])
    policy = build_policy(graph, client)
    try:
        steps = [policy.step() for _ in range(3)]
    finally:
        policy.close()
    assert [s.env_steps for s in steps] == [2 * 4 * 16] * 3


@pytest.mark.slow
def test_ppo_lstm_learns_from_one_frame_what_feed_forward_ppo_needs_two_for(client, tmp_path, capsys):
    """One frame earns 12 of 16 on average (``test_images``: feed-forward PPO stays at 12-12.9); the LSTM
    reaches 15 (seeds 1-4: 15-18 iterations, ~2k env steps). ``dagrl eval`` plays it greedily with its
    state carried; ``dagrl export`` writes it as a function of the observations and the state."""
    from dagrl.app.cli import main

    summary, rundir = train(GRAPH, tmp_path, client=client)
    assert summary["stop_reason"] == "mean_return" and summary["stopped_at"]["mean_return"] >= 15, summary
    capsys.readouterr()
    assert main(["eval", str(rundir.path), "--episodes", "8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert np.mean(result["returns"]) >= 14, result["returns"]  # a greedy policy without its state earns ~12
    assert main(["export", str(rundir.path), "--out", str(tmp_path / "lstm.pt2")]) == 0
    policy = torch.export.load(str(tmp_path / "lstm.pt2")).module()
    frames = torch.randint(0, 256, (5, 1, 36, 36), dtype=torch.uint8)
    actions, h, c = policy(frames, torch.zeros(5, 128), torch.zeros(5, 128))
    assert actions.shape == (5,) and h.shape == c.shape == (5, 128) and h.abs().max() > 0


@pytest.mark.slow
def test_ppo_lstm_balances_cartpole_without_its_velocities(tmp_path):
    """Seeds 1-5 reached 475 after 49k, 99k, 21k, 81k and 57k env steps (rl-zoo's RecurrentPPO budget for
    CartPoleNoVel is 100k); feed-forward PPO on the same graph stays near 41 at 100k (BENCHMARKS.md)."""
    space = load_graph(NOVEL).observation_space
    assert space.shape == (2,)  # the cart's position and the pole's angle
    summary, _ = train(NOVEL, tmp_path, ["policy=single", "seed=3"])
    assert summary["stop_reason"] == "mean_return" and summary["stopped_at"]["mean_return"] >= 475, summary


@pytest.mark.slow
def test_ppo_lstm_learns_under_central_inference_its_states_travelling_with_the_observations(client, tmp_path):
    """The inference role keeps no state: each sampler sends its envs' LSTM states with their observations
    and gets the states after the step back (seed 1: 15 in 17-18 iterations over four runs, against 16
    with the samplers' own networks)."""
    summary, rundir = train(GRAPH, tmp_path, ["policy=central-inference"], client=client)
    assert summary["stop_reason"] == "mean_return" and summary["stopped_at"]["mean_return"] >= 15, summary
    rows = rundir.read_metrics()
    assert all(r["inference/batch_rows"] > 0 for r in rows)  # every step was answered by the inference role


IMPALA_BLINK = [  # graphs/impala-cartpole.yaml's policy and step sizes on the one-frame task
    "algorithm=impala_lstm",
    "policy={name: async, max_staleness: 8, rollouts_per_update: 2, in_flight: 2}",
    "hyperparameters={num_steps: 16, gamma: 0.0, lr: 5.0e-4, update_epochs: 2, ent_coef: 0.01, lstm: 128}",
]


@pytest.mark.slow
def test_impala_lstm_learns_under_async_what_one_frame_does_not_show(client, tmp_path):
    """IMPALA's V-trace learner on ppo_lstm's samplers, stale rollouts unrolled from their stored states:
    15 of 16 in ~5k env steps (seeds 1, 2: 41 and 40 iterations, ~5 s); feed-forward IMPALA with the
    same settings stays at 11.8 after 15k. On CartPole without velocities,
    graphs/impala-lstm-cartpole-novel.yaml reached 475 in 131k-218k env steps (BENCHMARKS.md)."""
    summary, _ = train(GRAPH, tmp_path, IMPALA_BLINK, client=client)
    assert summary["stop_reason"] == "mean_return" and summary["stopped_at"]["mean_return"] >= 15, summary
