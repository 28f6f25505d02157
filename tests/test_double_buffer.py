"""Double-buffered samplers (:mod:`dagrl.envs.double_buffer`): a sampler's envs in two groups, one
stepping while the other's actions are picked, recording what stepping them all at once records."""

from __future__ import annotations

import logging
import threading

import gymnasium as gym
import numpy as np
import pytest

from dagrl.algos import ppo
from dagrl.algos.common import actor_critic
from dagrl.app.graphs import load_graph
from dagrl.core.context import EnvError, RoleContext
from dagrl.core.schema import ConfigError
from dagrl.envs.double_buffer import Trial, double_buffers, env_groups
from dagrl.envs.vector import make_vector
from dagrl.runtime.inference import Batcher, BatchServer, InferenceClient
from tests.helpers import train


@pytest.mark.parametrize("vector", ["threads", "auto"])
def test_rows_step_alone_exactly_as_sync_steps_them_all(vector):
    """Each half stepped on its own (threads, or in turn while ``auto`` probes): every observation,
    reward, end flag and final observation equal SyncVectorEnv's for the same seeds and actions."""
    sync, rows = make_vector("CartPole-v1", 6, "sync"), make_vector("CartPole-v1", 6, vector)
    assert rows.can_step_rows
    a, _ = sync.reset(seed=3)
    b, _ = rows.reset(seed=3)
    np.testing.assert_array_equal(a, b)
    rng, ended = np.random.default_rng(0), 0
    for _ in range(300):
        actions = rng.integers(0, 2, 6)
        whole = sync.step(actions)
        sent = [rows.send_rows(g, actions[g]) for g in env_groups(6)]  # both halves out at once
        for g, part in zip(env_groups(6), (rows.receive_rows(s) for s in sent), strict=True):
            for x, y in zip(whole[:4], part[:4], strict=True):
                np.testing.assert_array_equal(x[g], y)
            for i in np.flatnonzero(whole[4].get("_final_obs", np.zeros(6, bool))[g]):
                assert part[4]["_final_obs"][i]
                np.testing.assert_array_equal(whole[4]["final_obs"][g][i], part[4]["final_obs"][i])
                ended += 1
    assert ended > 30
    np.testing.assert_array_equal(sync.step(np.ones(6, np.int64))[0], rows.step(np.ones(6, np.int64))[0])
    sync.close()
    rows.close()


def _sampler(double_buffer: str, vector: str = "threads", env_id: str = "CartPole-v1", **kwargs):
    ctx = RoleContext(
        "sampler", 0, 1, seed=5, env_id=env_id, num_envs=5, vector=vector, double_buffer=double_buffer, **kwargs
    )
    return ctx, actor_critic.sampler(ctx, ppo.Config(num_steps=48))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_double_buffered_collect_records_what_stepping_all_envs_at_once_does(env_id):
    """Same seed, same weights: the groups' draws come in the order all envs' would, so the rollouts
    (observations, actions, log-probs, rewards with their time-limit tails, ends, episodes) are equal,
    to the rounding of a forward over fewer rows."""
    out = {}
    for mode in ("off", "on"):
        ctx, state = _sampler(mode, env_id=env_id)
        assert double_buffers(state.envs, state.acting) == (mode == "on")
        weights = {k: v.numpy() for k, v in state.agent.state_dict().items()}
        out[mode] = [actor_critic.collect(state, weights) for _ in range(5)]  # 240 steps: Pendulum's limit cuts
        out[mode].append(state.obs)
        ctx.close()
    for a, b in zip(out["off"][:-1], out["on"][:-1], strict=True):
        for name in ("obs", "actions", "logprobs", "rewards", "dones", "last_obs"):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(np.sort(a.episodes.returns), np.sort(b.episodes.returns), rtol=1e-4)
    np.testing.assert_allclose(out["off"][-1], out["on"][-1], rtol=1e-4, atol=1e-5)
    assert sum(r.dones.sum() for r in out["on"][:-1]) > 0


def test_auto_tries_it_only_where_envs_wait_or_the_actions_come_from_elsewhere():
    ctx, state = _sampler("auto", vector="auto")
    assert not double_buffers(state.envs, state.acting)  # CartPole computes: in turn, nothing overlaps
    assert double_buffers(state.envs, InferenceClient("sampler[0]"))  # the answer is out while a group steps
    assert not double_buffers(state.envs, InferenceClient("sampler[0]"), "off")
    ctx.close()
    ctx, state = _sampler("auto", vector="threads")
    assert double_buffers(state.envs, state.acting)
    ctx.close()
    ctx, state = _sampler("auto", vector="sync")  # gymnasium's own: steps all its envs at once
    assert not double_buffers(state.envs, state.acting, "on")
    ctx.close()


@pytest.mark.parametrize(("on_s", "off_s", "chosen"), [(0.8, 1.0, True), (0.93, 1.0, False), (1.3, 1.0, False)])
def test_auto_keeps_the_faster_way_after_timing_both(on_s, off_s, chosen, dagrl_log):
    trial, ways = Trial(), []
    with dagrl_log.at_level(logging.INFO, logger="dagrl"):
        for _ in range(Trial.WARMUP + 2 * Trial.EACH + 3):
            way = trial.next()
            ways.append(way)
            trial.took(way, on_s if way else off_s, "sampler[2]")
    tried = ways[Trial.WARMUP : Trial.WARMUP + 2 * Trial.EACH]
    assert not ways[0] and tried.count(True) == tried.count(False) == Trial.EACH
    assert ways[-3:] == [chosen] * 3
    assert "sampler[2]: double_buffer: auto: a collect took" in dagrl_log.text


def test_a_sampler_on_waiting_envs_settles_on_a_way_and_keeps_collecting():
    """Envs that sleep 2 ms a step on threads: auto tries both ways, then keeps one; every collect
    records all steps either way."""
    ctx, state = _sampler("auto", vector="threads", env_id="dagrl.envs:CostlyCartPole-v0", env_kwargs={"step_ms": 2.0})
    weights = {k: v.numpy() for k, v in state.agent.state_dict().items()}
    for i in range(Trial.WARMUP + 2 * Trial.EACH + 1):
        assert i == Trial.WARMUP + 2 * Trial.EACH or ctx.double_buffered() == [None]  # still timing both ways
        rollout = actor_critic.collect(state, weights)
        assert rollout.env_steps == 48 * 5 and (rollout.obs != 0).any(axis=-1).all()
    assert ctx.double_buffered() == [state.envs.double_buffer_trial.chosen] != [None]  # what actors.json says
    ctx.close()
    ctx, _ = _sampler("auto", vector="sync")
    assert ctx.double_buffered() == [False]
    ctx.close()


class Halving:
    """An acting object for the inference role: PPO's own, recording the rows of each forward."""

    def __init__(self, acting):
        self.acting, self.rows = acting, []

    def __call__(self, obs):
        self.rows.append(len(obs))
        return self.acting(obs)


def test_through_the_inference_role_each_groups_request_is_out_while_the_other_steps():
    """A real batch server answers a sampler's two groups in the order asked; the rollout is the one
    the sampler's own network would have made with the same draws."""
    ctx, local = _sampler("off")
    weights = {k: v.numpy() for k, v in local.agent.state_dict().items()}
    expected = actor_critic.collect(local, weights)
    ctx.close()
    ctx, state = _sampler("on")
    forward = Halving(state.acting)
    server = BatchServer(Batcher(forward, threading.RLock(), expected=1, max_wait_s=0.0))
    client = InferenceClient("sampler[0]", timeout_s=10.0)
    client.attach(server.endpoint)
    state.acting = client
    try:
        got = actor_critic.collect(state, weights)
    finally:
        server.close()
        ctx.close()
    assert set(forward.rows) == {2, 3}  # a group's rows per forward, never all 5
    assert len(forward.rows) == 2 * 48
    np.testing.assert_array_equal(expected.actions, got.actions)
    np.testing.assert_allclose(expected.logprobs, got.logprobs, rtol=1e-6)
    np.testing.assert_array_equal(expected.obs, got.obs)


def test_an_inference_client_answers_several_requests_in_the_order_asked():
    server = BatchServer(Batcher(lambda obs: (obs * 2,), threading.RLock(), expected=1, max_wait_s=0.0))
    client = InferenceClient("sampler[0]", timeout_s=10.0)
    client.attach(server.endpoint)
    try:
        for i in range(3):
            client.send(np.full((2, 1), i, np.float32))
        answers = [client.receive()[0][0, 0] for _ in range(3)]
        with pytest.raises(RuntimeError, match="nothing was asked"):
            client.receive()
    finally:
        server.close()
    assert answers == [0.0, 2.0, 4.0]


def test_a_non_finite_value_names_the_env_of_its_group():
    class Bad(gym.Wrapper):
        def step(self, action):
            obs, *rest = self.env.step(action)
            return obs * np.nan, *rest

    ctx = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", num_envs=4, vector="auto")  # in turn
    envs = ctx.make_envs()
    envs._envs.envs[3] = Bad(envs._envs.envs[3])  # the last env of the second group
    envs.reset(seed=0)
    envs.receive_rows(envs.send_rows(slice(0, 2), np.zeros(2, np.int64)))
    with pytest.raises(EnvError, match=r"non-finite observation .* at step 1 of sampler\[0\] \(env 3,"):
        envs.receive_rows(envs.send_rows(slice(2, 4), np.zeros(2, np.int64)))
    ctx.close()


def test_graphs_take_double_buffer_as_yaml_writes_it_and_refuse_what_cannot_be():
    graph = "graphs/ppo-cartpole-single.yaml"
    assert load_graph(graph).spec.roles["sampler"].double_buffer == "auto"
    assert load_graph(graph, ["roles.sampler.double_buffer=off"]).spec.roles["sampler"].double_buffer == "off"
    assert load_graph(graph, ["roles.sampler.double_buffer=true"]).spec.roles["sampler"].double_buffer == "on"
    with pytest.raises(ConfigError, match="double_buffer must be auto, true .on. or false .off., got 'twice'"):
        load_graph(graph, ["roles.sampler.double_buffer=twice"])
    with pytest.raises(ConfigError, match="double_buffer: on needs vector: auto or threads") as err:
        load_graph(graph, ["roles.sampler.double_buffer=on", "roles.sampler.vector=sync"])
    assert "roles.sampler" in str(err.value)


def test_ppo_learns_cartpole_with_its_samplers_double_buffered(tmp_path):
    overrides = ["roles.sampler.vector=threads", "roles.sampler.double_buffer=on"]
    summary, _ = train("graphs/ppo-cartpole-single.yaml", tmp_path, overrides)
    assert summary["stop_reason"] == "mean_return", summary
