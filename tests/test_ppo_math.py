"""Numeric checks of PPO's pieces: GAE by hand, rollout shapes, time-limit bootstrapping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dagrl.algos import ppo
from dagrl.algos.common import actor_critic
from dagrl.core.context import RoleContext


def test_gae_matches_hand_computation():
    rewards = np.array([[1.0], [1.0], [1.0]])
    values = np.array([[0.5], [0.6], [0.7]])
    dones = np.array([[0.0], [1.0], [0.0]])
    adv = ppo.gae(rewards, values, dones, np.array([0.8]), gamma=0.9, lam=0.5)
    # t=2: 1 + .9*.8 - .7 = 1.02;  t=1 (episode ends): 1 - .6 = .4;  t=0: (1 + .9*.6 - .5) + .9*.5*.4 = 1.22
    np.testing.assert_allclose(adv[:, 0], [1.22, 0.4, 1.02])


def test_gae_with_lambda_one_is_the_discounted_return_minus_value():
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    last = rng.normal(size=2)
    adv = ppo.gae(rewards, values, np.zeros((6, 2)), last, gamma=0.9, lam=1.0)
    ret = last.copy()
    for t in reversed(range(6)):
        ret = rewards[t] + 0.9 * ret
        np.testing.assert_allclose(adv[t] + values[t], ret)


def _sampler(num_envs=3, **env_kwargs):
    ctx = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", env_kwargs=env_kwargs, num_envs=num_envs)
    return ppo.sampler(ctx, ppo.Config(num_steps=16))


def _learner_context(sampler):
    """A learner's context with the spaces of ``sampler``'s envs."""
    envs = sampler.envs
    return RoleContext(
        "learner",
        0,
        1,
        0,
        "CartPole-v1",
        observation_space=envs.single_observation_space,
        action_space=envs.single_action_space,
    )


def test_collect_shapes_and_episode_accounting():
    state = _sampler()
    learner = ppo.learner(
        RoleContext(
            "learner",
            0,
            1,
            0,
            "CartPole-v1",
            observation_space=state.envs.single_observation_space,
            action_space=state.envs.single_action_space,
        ),
        ppo.Config(num_steps=16),
    )
    r = ppo.collect(state, ppo.publish(learner))
    assert r.obs.shape == (16, 3, 4) and r.actions.shape == (16, 3) and r.logprobs.shape == (16, 3)
    assert r.env_steps == 48
    assert int(r.dones.sum()) == len(r.episodes)
    assert np.all(r.logprobs <= 0)


def test_time_limit_truncation_is_bootstrapped_with_the_critic():
    state = _sampler(num_envs=4, max_episode_steps=5)
    for p in state.agent.critic[-1].parameters():
        torch.nn.init.zeros_(p)
    state.agent.critic[-1].bias.data.fill_(10.0)  # V(s) = 10 everywhere
    weights = {k: v.detach().numpy().copy() for k, v in state.agent.state_dict().items()}
    r = ppo.collect(state, weights)
    truncated = (r.dones == 1) & np.isclose(r.rewards, 1 + state.cfg.gamma * 10)
    plain = np.isclose(r.rewards, 1.0)
    assert truncated.sum() > 0, "episodes of 5 steps must be cut by the time limit"
    assert np.all(truncated | plain)
    assert np.all(r.episodes.lengths <= 5)


def test_update_moves_the_policy_toward_positive_advantages():
    state = _sampler(num_envs=4)
    ctx = _learner_context(state)
    learner = ppo.learner(ctx, ppo.Config(num_steps=16, update_epochs=10, minibatch_size=64))
    r = ppo.collect(state, ppo.publish(learner))
    m = ppo.update(learner, [r])
    # The first step's surrogate is -mean(normalised advantage) = 0; each later step should lower it.
    assert m["losses/policy"] < -1e-3
    assert m["losses/approx_kl"] > 0
    assert 0 < m["perf/frames"] == 10 * 64
    assert learner.updates == 1


def test_decoupled_clips_around_the_proximal_policy_and_weights_by_it():
    """Decoupled PPO by hand: with the proximal log-probs equal to the behaviour's it is PPO's loss; with
    the ratio to the proximal policy 1, each advantage is weighted by proximal / behaviour probability."""
    from dagrl.algos.common.epochs import clipped_loss

    cfg = ppo.Config(norm_adv=False, ent_coef=0.0, vf_coef=0.0, clip_coef=0.2)
    dist = torch.distributions.Categorical(logits=torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.5, 0.5]]))
    actions = torch.tensor([1, 0, 1])
    new = dist.log_prob(actions)
    behaviour = new + torch.tensor([0.3, -0.4, 0.0])  # collected by older weights
    adv, zeros = torch.tensor([1.0, -2.0, 0.5]), torch.zeros(3)
    plain, _ = clipped_loss(cfg, dist, zeros, actions, behaviour, adv, zeros)
    same, _ = clipped_loss(cfg, dist, zeros, actions, behaviour, adv, zeros, prox=behaviour)
    assert torch.equal(plain, same)
    loss, parts = clipped_loss(cfg, dist, zeros, actions, behaviour, adv, zeros, prox=new)
    weights = torch.exp(new - behaviour)
    torch.testing.assert_close(loss, -(weights * adv).mean())
    assert parts["clipfrac"] == 0  # PPO against the behaviour clips the first two samples
    _, ppo_parts = clipped_loss(cfg, dist, zeros, actions, behaviour, adv, zeros)
    assert ppo_parts["clipfrac"] > 0.5


def test_decoupled_is_ppo_on_fresh_rollouts_and_measures_the_lag_on_stale_ones():
    """A rollout of the learner's own weights: the same update with and without ``decoupled`` (no lag,
    ``losses/stale_kl`` 0). After the learner moves on, the same rollout is stale: the lag is measured."""
    state = _sampler(num_envs=4)
    ctx = _learner_context(state)
    make = lambda **kw: ppo.learner(ctx, ppo.Config(num_steps=16, update_epochs=4, minibatch_size=32, **kw))  # noqa: E731
    plain, decoupled = make(), make(decoupled=True)
    r = ppo.collect(state, ppo.publish(plain))
    m_plain, m_dec = ppo.update(plain, [r]), ppo.update(decoupled, [r])
    assert "losses/stale_kl" not in m_plain and abs(m_dec["losses/stale_kl"]) < 1e-6
    for (name, a), b in zip(plain.agent.state_dict().items(), decoupled.agent.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    stale = ppo.update(decoupled, [r])  # r is one version old now
    assert stale["losses/stale_kl"] > 1e-4


@pytest.mark.parametrize("bad", [{"num_steps": 0}, {"gamma": 1.5}])
def test_config_checks_its_values(bad):
    with pytest.raises(ValueError):
        ppo.Config(**bad)


@pytest.mark.parametrize("space", ["discrete", "continuous"])
def test_the_samplers_lean_draw_is_the_distributions_own(space):
    """``ActorCritic.sample`` skips ``torch.distributions`` for speed: the same actions from the same
    generator, and log-probs equal bit for bit to the learner's ``dist(obs).log_prob`` (the ratio of
    PPO's first epoch is exactly 1)."""
    import gymnasium as gym

    obs_space = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    act_space = gym.spaces.Discrete(4) if space == "discrete" else gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    agent = actor_critic.ActorCritic(obs_space, act_space, hidden=16, norm_obs=True)
    if agent.log_std is not None:
        agent.log_std.data = torch.tensor([-0.5, 0.0, 0.7])
    obs = torch.randn(64, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        action, logp = agent.sample(obs, torch.Generator().manual_seed(7))
        dist = agent.dist(obs)
        gen = torch.Generator().manual_seed(7)
        if space == "discrete":
            expected = torch.multinomial(dist.logits.exp(), 1, generator=gen).squeeze(-1)
        else:
            base = dist.base_dist
            expected = base.loc + base.scale * torch.randn(base.loc.shape, generator=gen)
        assert torch.equal(action, expected)
        assert torch.equal(logp, dist.log_prob(action))


def test_anneal_lr_falls_linearly_over_stop_env_steps_and_resumes_where_it_was(tmp_path):
    """8 batches of 256 env steps in a budget of 2,048: the k-th batch trains at lr x (1 - k / 8). A
    resumed run goes on from the checkpoint's clock, not from the full rate."""
    from dagrl.app.cli import main
    from dagrl.runtime.rundir import RunDir

    args = ["--set", f"runs_dir={tmp_path}", "--set", "hyperparameters.anneal_lr=true", "--quiet"]
    args += ["--set", "stop.env_steps=2048", "--set", "stop.mean_return=null", "--set", "checkpoint.every=4"]
    assert main(["run", "graphs/ppo-cartpole-single.yaml", "--set", "stop.iterations=4", *args]) == 0
    (path,) = list(tmp_path.iterdir())
    assert main(["run", "--resume", str(path), "--set", "stop.iterations=20", "--quiet"]) == 0
    rows = RunDir(path).read_metrics()
    assert [r["env_steps"] for r in rows] == [256 * k for k in range(1, 9)]
    np.testing.assert_allclose([r["losses/lr"] for r in rows], [1e-3 * (1 - k / 8) for k in range(8)])


def test_anneal_lr_needs_stop_env_steps():
    from dagrl.app.graphs import load_graph
    from dagrl.core.schema import ConfigError

    with pytest.raises(ConfigError, match=r"hyperparameters: anneal_lr: .*stop\.env_steps"):
        load_graph("graphs/ppo-cartpole-single.yaml", ["hyperparameters.anneal_lr=true", "stop.env_steps=null"])


def test_the_learners_categorical_is_torchs():
    """The lean ``Categorical`` the learners build per minibatch gives torch's log-probs, entropies and
    gradients (to rounding), also where a logit is -inf (an action that cannot be taken)."""
    from dagrl.algos.common.distributions import Categorical

    logits = torch.randn(32, 5, generator=torch.Generator().manual_seed(3))
    logits[0, 2] = -float("inf")
    action = torch.randint(0, 5, (32,), generator=torch.Generator().manual_seed(4))
    action[0] = 1
    ours, theirs = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    lean, torchs = Categorical(ours), torch.distributions.Categorical(logits=theirs)
    torch.testing.assert_close(lean.log_prob(action), torchs.log_prob(action))
    torch.testing.assert_close(lean.entropy(), torchs.entropy())
    torch.testing.assert_close(lean.probs, torchs.probs)
    (lean.log_prob(action).sum() + lean.entropy().sum()).backward()
    (torchs.log_prob(action).sum() + torchs.entropy().sum()).backward()
    torch.testing.assert_close(ours.grad, theirs.grad)


def test_multi_categorical_is_the_product_of_its_heads():
    """Log-prob and entropy of a MultiDiscrete policy are the sums over its heads' categoricals, and
    the sampler's log-prob of its own draw is what the learner computes for it, bit for bit."""
    import gymnasium as gym

    from dagrl.algos.common.actor_critic import ActorCritic
    from dagrl.algos.common.distributions import MultiCategorical

    torch.manual_seed(0)
    logits, heads = torch.randn(6, 9), [2, 3, 4]
    dist = MultiCategorical(logits, heads)
    action = torch.stack([torch.randint(0, n, (6,)) for n in heads], -1)
    cats = [torch.distributions.Categorical(logits=h) for h in logits.split(heads, -1)]
    torch.testing.assert_close(dist.log_prob(action), sum(c.log_prob(action[:, i]) for i, c in enumerate(cats)))
    torch.testing.assert_close(dist.entropy(), sum(c.entropy() for c in cats))
    for space in (gym.spaces.MultiDiscrete([2, 3, 4]), gym.spaces.MultiBinary(3)):
        agent = ActorCritic(gym.spaces.Box(-1, 1, (5,)), space, 16)
        obs = torch.randn(7, 5)
        sampled, logp = agent.sample(obs, torch.Generator().manual_seed(1))
        assert sampled.shape == (7, 3)
        assert torch.equal(agent.dist(obs).log_prob(sampled), logp)
        assert agent.greedy(obs).shape == sampled.shape and agent.log_std is None


@pytest.mark.parametrize("binary", [False, True])
def test_ppo_learns_to_choose_several_things_at_once(graphs_dir, tmp_path, binary):
    """``Combination-v0``: guessing earns 8 / choices an episode (2 of MultiDiscrete([4, 4, 4]), 4 of
    MultiBinary(3)); the learnt policy matches every entry."""
    from tests.helpers import train

    summary, _ = train(
        f"{graphs_dir}/ppo-cartpole-single.yaml",
        tmp_path,
        ["env.id=dagrl.envs:Combination-v0", f"env.kwargs.binary={str(binary).lower()}", "stop.mean_return=7.8",
         "stop.env_steps=40000"],
    )  # fmt: skip
    assert summary["stop_reason"] == "mean_return", summary
