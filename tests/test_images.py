"""Image observations: the Nature CNN chosen from the space, uint8 kept end to end, a task learnt."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import dagrl.envs  # noqa: F401  (registers BrightHalf-v0)
from dagrl.algos.common import actor_critic
from dagrl.algos.common.actor_critic import ActorCritic
from dagrl.app.graphs import load_graph
from dagrl.nn.encoders import NatureCNN
from dagrl.policies import build_policy
from dagrl.runtime.checkpoint import load_checkpoint
from dagrl.spaces.images import is_image
from tests.helpers import train


def test_the_encoder_follows_the_observation_space():
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    vector = gym.spaces.Box(-1, 1, (4,), np.float32)
    assert is_image(image) and not is_image(vector)
    assert not is_image(gym.spaces.Box(0, 1, (4, 84, 84), np.float32))  # float "images" are just arrays
    net = ActorCritic(image, gym.spaces.Discrete(6), hidden=64)
    assert isinstance(net.trunk, NatureCNN)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    dist, value = net.dist_value(obs)
    assert dist.probs.shape == (3, 6) and value.shape == (3,)
    torch.testing.assert_close(value, net.value(obs))
    flat = ActorCritic(vector, gym.spaces.Discrete(2), hidden=64)
    assert not any(isinstance(m, torch.nn.Conv2d) for m in flat.modules())
    assert "critic.0.weight" in flat.state_dict()  # vector checkpoints keep their keys


def test_every_algorithm_takes_impalas_cnn_for_images():
    """``cnn: impala`` gives each algorithm's networks IMPALA's residual encoder (actor, critics, Q,
    recurrent trunks, a Dict's images), and they run forward; the default stays the Nature CNN."""
    from dagrl.algos import dqn, impala, ppo, ppo_lstm, r2d2, sac, td3
    from dagrl.nn.encoders import ImpalaCNN, MixedEncoder
    from dagrl.nn.networks import TwinQ
    from dagrl.spaces.mixed import mixed_space

    image = gym.spaces.Box(0, 255, (2, 36, 36), np.uint8)
    discrete, box = gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)
    obs = torch.randint(0, 256, (5, 2, 36, 36), dtype=torch.uint8)
    nets = {
        "ppo": actor_critic._agent(image, discrete, ppo.Config(cnn="impala")),
        "impala": actor_critic._agent(image, discrete, impala.Config(cnn="impala")),
        "ppo_lstm": ppo_lstm.RecurrentActorCritic(image, discrete, ppo_lstm.Config(cnn="impala", minibatch_size=256)),
        "dqn": dqn.q_network(image, discrete, 32, cnn="impala"),
        "r2d2": r2d2.RecurrentQ(image, discrete, r2d2.Config(cnn="impala")),
        "sac": sac.Policy(image, box, 32, "impala"),
        "td3": td3.Policy(image, box, 32, "impala"),
        "twin-q": TwinQ(image, box, 32, "impala"),
    }
    for name, net in nets.items():
        assert any(isinstance(m, ImpalaCNN) for m in net.modules()), name
        assert not any(isinstance(m, NatureCNN) for m in net.modules()), name
    assert nets["dqn"](obs).shape == (5, 3)
    assert nets["ppo"].value(obs).shape == (5,)
    assert nets["sac"](obs)[0].shape == nets["td3"](obs).shape == (5, 2)
    mixed = mixed_space(gym.spaces.Dict({"cam": image, "speed": gym.spaces.Box(-1, 1, (2,))}))
    enc = MixedEncoder(mixed, "impala")
    assert enc(torch.zeros(3, mixed.shape[0], dtype=torch.uint8)).shape == (3, 256 + 2)
    assert isinstance(actor_critic._agent(image, discrete, ppo.Config()).trunk, NatureCNN)


def test_an_unknown_cnn_is_refused_before_any_cluster_starts():
    from dagrl.core.schema import ConfigError

    with pytest.raises(ConfigError, match=r"hyperparameters\.cnn.*'nature' or 'impala'.*'resnet'"):
        load_graph("graphs/ppo-brighthalf.yaml", ["hyperparameters.cnn=resnet"])


STACK_2 = "env.wrappers=[{gymnasium.wrappers.FrameStackObservation: {stack_size: 2}}]"


@pytest.mark.parametrize(
    ("graph_file", "overrides", "obs_shape"),
    [
        ("graphs/ppo-brighthalf.yaml", [], (16, 4, 1, 84, 84)),
        ("graphs/ppo-atari.yaml", ["hyperparameters.num_steps=64"], (64, 4, 4, 84, 84)),  # Pong, 4 frames
        ("graphs/ppo-lstm-atari.yaml", ["hyperparameters.num_steps=64"], (64, 4, 1, 84, 84)),  # 1 frame, an LSTM
        ("graphs/ppo-brighthalf-flip.yaml", [], (16, 4, 4 + 36 * 36)),  # a Dict: the state's 4 bytes, pixels
        ("graphs/ppo-brighthalf-flip.yaml", [STACK_2], (16, 4, 2 * 4 + 2 * 36 * 36)),  # each entry 2 frames
    ],
    ids=["brighthalf", "atari-pong", "atari-pong-lstm", "dict-image", "dict-stacked-frames"],
)
def test_uint8_observations_cross_dask_as_uint8(client, graph_file, overrides, obs_shape):
    """Samplers, Dask transfer and the learner's update on uint8 images (the Atari preset: ale-py)."""
    if "atari" in graph_file:
        pytest.importorskip("ale_py")
    graph = load_graph(graph_file, overrides)
    policy = build_policy(graph, client)
    try:
        nodes = graph.algorithm.graph.nodes  # publish, collect, update
        calls = policy.executor.run_nodes(nodes, policy.hosts, graph.algorithm.roles)
        (metrics,) = policy.executor.wait(calls[nodes[2].id][:1])
        assert metrics["perf/frames"] > 0
        rollout = calls[nodes[1].id][0].future.result()  # fetched here only to look at it
        assert rollout.obs.dtype == np.uint8 and rollout.obs.shape == obs_shape
        assert rollout.obs.max() > rollout.obs.min()  # real frames, not an empty buffer
        assert rollout.last_obs.dtype == np.uint8
        from dask.sizeof import sizeof

        assert sizeof(rollout) < 1.2 * rollout.obs.nbytes  # Dask counts (and sends) bytes, not floats
    finally:
        policy.close()


@pytest.mark.slow
def test_ppo_with_the_cnn_learns_which_half_is_bright(client, tmp_path):
    summary, rundir = train("graphs/ppo-brighthalf.yaml", tmp_path, client=client)
    assert summary["stop_reason"] == "mean_return", summary  # 15 of 16; guessing earns 8
    means = [r["charts/episode_return_mean"] for r in rundir.read_metrics()]
    assert next(m for m in means if m is not None) < 12  # the window's first mean: still near guessing


@pytest.mark.slow
def test_ppo_with_impalas_cnn_learns_which_half_is_bright(client, tmp_path):
    """The graph as written under ``sync`` on the cluster, with IMPALA's encoder on 36 x 36 images:
    samplers and learner build it from the graph, and it learns (15 in 9 iterations, seed 1)."""
    summary, rundir = train(
        "graphs/ppo-brighthalf.yaml", tmp_path, ["env.kwargs.size=36", "hyperparameters.cnn=impala"], client=client
    )
    assert summary["stop_reason"] == "mean_return", summary
    newest = max(rundir.path.glob("checkpoints/ckpt-*.pt"))
    agent = load_checkpoint(newest)["roles"]["learner"][0]["agent"]
    assert "trunk.convs.2.conv0.weight" in agent  # the first stack's first residual block


@pytest.mark.slow
def test_ppo_learns_from_a_stack_of_frames_what_one_frame_does_not_show(client, tmp_path):
    """BrightHalf with ``blink``: every other image is noise only, its step asking for the half shown
    before. One frame earns 12 of 16 on average (this graph unstacked: 12.15 after 10k env steps, 12.85 at
    best); gymnasium's ``FrameStackObservation`` of 2 gives ``(2, 1, 36, 36)``, folded into 2 channels of
    one image for the CNN (``dagrl/spaces/images.py``), and 15 is reached (in 12 iterations, seed 1)."""
    overrides = ["env.kwargs.size=36", "env.kwargs.blink=true", STACK_2, "stop.env_steps=15000"]
    space = load_graph("graphs/ppo-brighthalf.yaml", overrides).observation_space
    assert space.shape == (2, 36, 36) and is_image(space)  # before: a float32 (2, 1, 36, 36) for an MLP
    summary, _ = train("graphs/ppo-brighthalf.yaml", tmp_path, overrides, client=client)
    assert summary["stop_reason"] == "mean_return", summary


@pytest.mark.slow
def test_dqn_with_the_cnn_learns_from_a_uint8_replay(tmp_path):
    graph = load_graph("graphs/dqn-brighthalf.yaml", [f"runs_dir={tmp_path}"])
    policy = build_policy(graph, run_dir=tmp_path)
    try:
        from dagrl.algos.dqn import q_network

        assert isinstance(q_network(graph.observation_space, graph.action_space, 64)[0], NatureCNN)
        for _ in range(5):
            policy.step()
        store = policy.hosts["replay"][0].target.state.store
        assert store.schema["obs"].dtype == np.uint8 and store.schema["next_obs"].dtype == np.uint8
        assert store.sample(8).data["obs"].dtype == np.uint8
    finally:
        policy.close()
    summary, _ = train("graphs/dqn-brighthalf.yaml", tmp_path)
    assert summary["stop_reason"] == "mean_return", summary  # 14 of 16


def test_a_dict_holding_an_image_is_stored_in_replay_a_byte_a_pixel(tmp_path):
    """DQN on BrightHalfFlip: the replay's rows are the packed ``uint8`` vector, and the learner's Q reads
    the state back from them bit for bit."""
    from dagrl.nn.encoders import MixedEncoder
    from dagrl.spaces.mixed import unpack

    overrides = ["env.id=dagrl.envs:BrightHalfFlip-v0", "env.kwargs={size: 36}", "hyperparameters.learning_starts=64"]
    graph = load_graph("graphs/dqn-brighthalf.yaml", [*overrides, f"runs_dir={tmp_path}"])
    space = graph.observation_space
    policy = build_policy(graph, run_dir=tmp_path)
    try:
        metrics = [policy.step().metrics for _ in range(3)]  # 3 x 64 env steps: past learning_starts
        assert all(m["perf/frames"] > 0 for m in metrics), metrics
        state = policy.hosts["replay"][0].target.state
        assert state.store.schema["obs"].dtype == np.uint8 and state.store.schema["obs"].shape == space.shape
        rows = state.store.sample(64).data
        assert rows["obs"].dtype == rows["next_obs"].dtype == np.uint8
        flips = np.array([unpack(space, row)["state"][0] for row in rows["obs"]])
        assert set(flips.tolist()) == {-1.0, 1.0}  # the state's float32 values, exactly
        learner = policy.hosts["learner"][0].target.state
        assert isinstance(learner.q[0], MixedEncoder)
        features = learner.q[0](torch.as_tensor(rows["obs"]))
        assert torch.equal(features[:, -1], torch.as_tensor(flips))
    finally:
        policy.close()


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_sac_and_td3_networks_take_a_cnn_trunk_for_images(algo):
    """The actor has a trunk of its own, the twin critics share one; vector checkpoints keep their keys."""
    import importlib

    module = importlib.import_module(f"dagrl.algos.{algo}")
    from dagrl.nn.networks import TwinQ

    image = gym.make("dagrl.envs:BrightHalf-v0", size=36, continuous=True)
    act = image.action_space
    policy, q = module.Policy(image.observation_space, act, 32), TwinQ(image.observation_space, act, 32)
    assert isinstance(policy.trunk, NatureCNN) and isinstance(q.trunk, NatureCNN)
    obs = torch.randint(0, 256, (5, 1, 36, 36), dtype=torch.uint8)
    actions = policy(obs)[0] if algo == "sac" else policy(obs)
    assert actions.shape == (5, 1) and bool((actions.abs() <= 1).all())
    q1, q2 = q(obs, actions)
    assert q1.shape == q2.shape == (5,)
    (q1.sum() + q2.sum()).backward()
    assert q.trunk.convs[0].weight.grad is not None  # the critics' losses train their trunk
    vector = gym.spaces.Box(-1, 1, (3,), np.float32)
    keys = {f"q{i}.{j}.{p}" for i in (1, 2) for j in (0, 2, 4) for p in ("weight", "bias")}
    assert set(TwinQ(vector, act, 32).state_dict()) == keys
    assert not any(k.startswith("trunk") for k in module.Policy(vector, act, 32).state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_sac_and_td3_learn_from_pixels_through_a_uint8_replay(tmp_path, algo):
    """A continuous action from images: which half is bright, told by the action's sign (14 of 16;
    guessing earns 8)."""
    summary, rundir = train(f"graphs/{algo}-brighthalf.yaml", tmp_path)
    assert summary["stop_reason"] == "mean_return", summary
    schema = json.loads((rundir.path / "replay-0" / "meta.json").read_text())["schema"]
    assert np.dtype(schema["obs"]["dtype"]) == np.dtype(schema["next_obs"]["dtype"]) == np.uint8


def test_random_shift_moves_each_image_by_its_own_offset_within_the_pad():
    from dagrl.nn.encoders import random_shift

    images = torch.randint(0, 256, (64, 2, 36, 36), dtype=torch.uint8)
    shifted = random_shift(images, 4, torch.Generator().manual_seed(0))
    assert shifted.dtype == torch.float32 and shifted.shape == images.shape
    padded = torch.nn.functional.pad(images.float(), (4, 4, 4, 4), mode="replicate")
    offsets = []
    for img, out in zip(padded, shifted, strict=True):  # the window of the padded image it was cut from
        found = [(y, x) for y in range(9) for x in range(9) if torch.equal(img[:, y : y + 36, x : x + 36], out)]
        assert len(found) == 1
        offsets.append(found[0])
    assert len(set(offsets)) > 20  # offsets of their own, not one for the batch
    again = random_shift(images, 4, torch.Generator().manual_seed(0))
    assert torch.equal(shifted, again)  # the generator decides


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_an_actor_with_share_encoder_trains_its_head_on_the_critics_cnn(tmp_path, algo):
    overrides = ["hyperparameters.share_encoder=true", f"runs_dir={tmp_path}"]
    graph = load_graph(f"graphs/{algo}-brighthalf.yaml", overrides)
    policy = build_policy(graph, run_dir=tmp_path)
    try:
        actor = policy.hosts["actor"][0].target.state
        trained = {id(p) for group in actor.optimizer.param_groups for p in group["params"]}
        assert trained == {id(p) for p in actor.policy.net.parameters()}  # the head only
        before = {k: v.clone() for k, v in actor.policy.trunk.state_dict().items()}
        metrics = [policy.step().metrics for _ in range(12)]  # 4 envs x 8 steps a call: past learning_starts
        assert any(m.get("perf/frames", 0) > 0 for m in metrics)
        critic = policy.hosts["critic"][0].target.state
        sent = actor.policy.trunk.state_dict()
        assert all(torch.equal(sent[k], v) for k, v in critic.q.trunk.state_dict().items())  # the critic's CNN
        assert not all(torch.equal(sent[k], v) for k, v in before.items())  # which its losses trained
        weights = policy.hosts["actor"][0].call("publish").result().policy  # what samplers act with
        assert all(np.array_equal(weights[f"trunk.{k}"], v.numpy()) for k, v in sent.items())
    finally:
        policy.close()


FLIP = ["env.id=dagrl.envs:BrightHalfFlip-v0", "env.kwargs={size: 36, continuous: true}"]


@pytest.mark.slow
def test_sac_with_share_encoder_learns_from_pixels_under_split_learner(client, tmp_path):
    """Critic and actor on workers of their own: the actor's head learns on the critic's CNN as of the round
    before (split-learner's delayed edge), copied with the critic's weights (7.0k env steps, seed 1)."""
    overrides = ["policy=split-learner", "hyperparameters.share_encoder=true", "stop.wall_time_s=300"]
    summary, rundir = train("graphs/sac-brighthalf.yaml", tmp_path, overrides, client=client)
    assert summary["stop_reason"] == "mean_return", summary
    where = {a["role"]: a["address"] for a in json.loads((rundir.path / "actors.json").read_text())}
    assert where["critic"] != where["actor"]


def test_a_dicts_images_are_shifted_and_its_other_entries_kept():
    from dagrl.nn.encoders import Shift, image_shift
    from dagrl.spaces.mixed import mixed_space, unpack

    space = mixed_space(gym.make("dagrl.envs:BrightHalfFlip-v0", size=36).observation_space)
    shift = image_shift(space, 4)
    assert shift == Shift(4, ((4, 4 + 36 * 36, (1, 36, 36)),))
    space.seed(0)
    batch = torch.as_tensor(np.stack([space.sample() for _ in range(32)]))
    moved = shift(batch, torch.Generator().manual_seed(0))
    assert moved.dtype == torch.uint8 and moved.shape == batch.shape
    assert torch.equal(moved[:, :4], batch[:, :4])  # the state's float32 bytes
    assert sum(not torch.equal(m[4:], b[4:]) for m, b in zip(moved, batch, strict=True)) > 24
    for m, b in zip(moved.numpy()[:4], batch.numpy()[:4], strict=True):  # each image a window of its padded self
        padded = np.pad(unpack(space, b)["pixels"][0], 4, mode="edge")
        img = unpack(space, m)["pixels"][0]
        assert any(np.array_equal(padded[y : y + 36, x : x + 36], img) for y in range(9) for x in range(9))
    assert image_shift(space, 0)(batch, None) is batch


@pytest.mark.parametrize(
    ("graph_file", "env"),
    [("graphs/sac-brighthalf.yaml", []), ("graphs/td3-brighthalf.yaml", []), ("graphs/td3-brighthalf.yaml", FLIP)],
    ids=["sac", "td3", "td3-dict"],
)
def test_gradient_steps_see_shifted_images(tmp_path, graph_file, env):
    """With ``augment_shift`` the same run's first gradient steps see other pixels (other losses) than
    without it, and stay finite; for a Dict, its images are shifted."""

    def losses(shift: int) -> list[dict]:
        overrides = [*env, f"hyperparameters.augment_shift={shift}", f"runs_dir={tmp_path / str(shift)}"]
        graph = load_graph(graph_file, overrides)
        policy = build_policy(graph, run_dir=tmp_path / str(shift))
        try:
            metrics = [policy.step().metrics for _ in range(12)]  # 4 envs x 8 steps a call: past learning_starts
        finally:
            policy.close()
        return [m for m in metrics if m.get("perf/frames", 0) > 0]

    shifted, plain = losses(4), losses(0)
    assert shifted and len(shifted) == len(plain)
    assert all(np.isfinite(m["losses/q"]) and np.isfinite(m["losses/policy"]) for m in shifted)
    assert shifted[0]["losses/q"] != plain[0]["losses/q"]  # the same rows, moved
