"""Observation spaces beyond a float ``Box``: states, tuples, dicts and integer vectors.

Every algorithm's networks take a float vector or a ``uint8`` image; :func:`dagrl.envs.vector.vector_observations`
makes one of what the env gives, for the graph's spaces and every sampler's envs alike. Action spaces an
algorithm cannot act in are refused before anything starts (``tests/test_bad_input.py``).
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.envs.vector import make_vector, vector_observations
from dagrl.spaces.images import is_image
from tests.helpers import train


class Fixed(gym.Env):
    """An env that only shows an observation space (and one sample of it)."""

    def __init__(self, space: gym.Space):
        self.observation_space, self.action_space = space, gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {}


def test_states_become_one_hot_vectors():
    env = vector_observations(gym.make("FrozenLake-v1", is_slippery=False))
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (16,), np.float32)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.tolist() == [1.0] + [0.0] * 15  # state 0, the top-left corner
    obs, *_ = env.step(2)  # right: state 1
    assert np.flatnonzero(obs).tolist() == [1] and obs.sum() == 1


def test_tuples_and_dicts_are_concatenated():
    envs = make_vector("Blackjack-v1", 3, "sync")  # (player's sum 32, dealer's card 11, usable ace 2)
    assert envs.single_observation_space.shape == (45,) and envs.single_observation_space.dtype == np.float32
    obs, _ = envs.reset(seed=1)
    assert obs.shape == (3, 45) and (obs.sum(axis=1) == 3).all()
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "mode": gym.spaces.Discrete(3)})
    env = vector_observations(Fixed(space))
    assert env.observation_space.shape == (5,)
    raw, _ = Fixed(space).reset(seed=5)
    assert np.array_equal(env.reset(seed=5)[0], gym.spaces.flatten(space, raw).astype(np.float32))


def test_integer_vectors_become_float_and_images_and_float_vectors_stay():
    ram = vector_observations(Fixed(gym.spaces.Box(0, 255, (128,), np.uint8)))
    assert ram.observation_space.dtype == np.float32
    obs, _ = ram.reset(seed=3)
    assert obs.dtype == np.float32 and obs.max() > 1  # the console's bytes, not scaled
    for space in (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Box(-1, 1, (17,), np.float64)):
        env = Fixed(space)
        assert vector_observations(env) is env


def test_channels_last_images_turn_channels_first_and_small_ones_become_vectors():
    rgb = gym.spaces.Box(0, 255, (96, 96, 3), np.uint8)  # CarRacing's screen
    env = vector_observations(Fixed(rgb))
    assert env.observation_space.shape == (3, 96, 96) and is_image(env.observation_space)
    raw, _ = Fixed(rgb).reset(seed=4)
    assert np.array_equal(env.reset(seed=4)[0], raw.transpose(2, 0, 1))
    small = vector_observations(Fixed(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)))  # under the CNN's 36 pixels
    assert small.observation_space.dtype == np.float32 and not is_image(small.observation_space)


@pytest.mark.parametrize(
    ("shape", "turn"),
    [
        ((3, 40, 40, 3), lambda raw: raw.transpose(0, 3, 1, 2)),  # FrameStackObservation of an RGB screen
        ((2, 3, 40, 40), lambda raw: raw),  # stacked channels-first frames
    ],
    ids=["frames-channels-last", "frames-channels-first"],
)
def test_stacked_frames_fold_into_the_channels_of_one_image(shape, turn):
    """Before, a 4-D ``uint8`` observation was no image: flattened to ``float32`` and given an MLP."""
    stack, channels = shape[0], (shape[3] if shape[3] <= 4 else shape[1])
    env = vector_observations(Fixed(gym.spaces.Box(0, 255, shape, np.uint8)))
    assert env.observation_space.shape == (stack * channels, 40, 40) and is_image(env.observation_space)
    raw, _ = Fixed(gym.spaces.Box(0, 255, shape, np.uint8)).reset(seed=6)
    obs = env.reset(seed=6)[0]
    assert obs.dtype == np.uint8 and obs.flags.c_contiguous
    for frame in range(stack):  # the oldest frame's channels first, each frame's in its own order
        np.testing.assert_array_equal(obs[frame * channels : (frame + 1) * channels], turn(raw)[frame])


def test_a_dict_of_stacked_frames_packs_them_as_one_image():
    """gymnasium's ``FrameStackObservation`` of a ``Dict`` stacks each entry: ``pixels`` ``(3, H, W, 1)``
    and ``state`` ``(3, 1)``. The pixels become one 3-channel image of the packed vector, the states 3 values."""
    import torch

    import dagrl.envs  # noqa: F401  (registers BrightHalfFlip-v0)
    from dagrl.algos.common.actor_critic import ActorCritic
    from dagrl.spaces.mixed import MixedBox, unpack

    def stacked():
        return gym.wrappers.FrameStackObservation(gym.make("BrightHalfFlip-v0", size=36), 3)

    env, raw = vector_observations(stacked()), stacked()
    space = env.observation_space
    assert isinstance(space, MixedBox) and [(p.key, p.image, p.size) for p in space.parts] == [
        ("pixels", (3, 36, 36), 3 * 36 * 36),
        ("state", None, 3),
    ]
    env.reset(seed=2), raw.reset(seed=2)
    for _ in range(3):  # the stack full of real frames
        obs, shown = env.step(1)[0], raw.step(1)[0]
    parts = unpack(space, obs)
    np.testing.assert_array_equal(parts["pixels"], shown["pixels"][..., 0])  # frame t-2, t-1, t as channels
    np.testing.assert_array_equal(parts["state"], shown["state"][:, 0])
    net = ActorCritic(space, gym.spaces.Discrete(2), hidden=16)
    (cnn,) = net.trunk.cnns.values()
    assert cnn.convs[0].in_channels == 3
    dist, value = net.dist_value(torch.as_tensor(np.stack([obs, obs])))
    assert dist.probs.shape == (2, 2) and torch.isfinite(value).all()


def test_a_space_that_is_no_vector_is_refused_with_its_name():
    with pytest.raises(ValueError, match="Sequence"):
        vector_observations(Fixed(gym.spaces.Sequence(gym.spaces.Discrete(3))))


@pytest.mark.parametrize("seed", [1, 2])
def test_dqn_learns_frozenlake_from_one_hot_states(graphs_dir, tmp_path, seed):
    """The deterministic 4x4 lake: a uniform policy reaches the goal in ~1.5 % of episodes, the learnt
    one in 19 of the last 20 or more (seeds 1-5 all did, in 10-11k env steps)."""
    summary, _ = train(
        f"{graphs_dir}/dqn-cartpole-single.yaml",
        tmp_path,
        [
            "env.id=FrozenLake-v1",
            "env.kwargs.is_slippery=false",
            "stop.mean_return=0.95",
            "stop.env_steps=30000",
            f"seed={seed}",
        ],
    )
    assert summary["stop_reason"] == "mean_return", summary
    assert summary["stopped_at"]["mean_return"] >= 0.95


def test_dqn_trains_on_tuple_observations_through_replay_on_a_cluster(client, graphs_dir, tmp_path):
    """Blackjack's (sum, card, ace) tuples as 45 floats: samplers -> replay shard -> learner under ``apex``."""
    overrides = ["env.id=Blackjack-v1", "hyperparameters.learning_starts=500", "stop.env_steps=3000"]
    graph = load_graph(f"{graphs_dir}/dqn-cartpole-apex.yaml", overrides)
    assert graph.observation_space.shape == (45,)
    summary, rundir = train(f"{graphs_dir}/dqn-cartpole-apex.yaml", tmp_path, overrides, client)
    assert summary["stop_reason"] == "env_steps" and summary["episodes"] > 500, summary
    rows = rundir.read_metrics()
    assert any(np.isfinite(r.get("losses/td", np.nan)) for r in rows)  # the learner trained on them


def test_ppo_acts_on_an_atari_consoles_ram(graphs_dir, tmp_path):
    pytest.importorskip("ale_py")
    summary, _ = train(
        f"{graphs_dir}/ppo-cartpole-single.yaml",
        tmp_path,
        ["env.id=ale_py:ALE/Pong-v5", "env.kwargs.obs_type=ram", "stop.env_steps=512", "roles.sampler.envs=2"],
    )
    assert summary["env_steps"] >= 512 and summary["iterations"] >= 8


RESIZED_AND_STACKED = (  # ResizeObservation's shape must be a tuple, which YAML cannot write: the list is passed as one
    "env.wrappers=[{gymnasium.wrappers.ResizeObservation: {shape: [64, 64]}},"
    " {gymnasium.wrappers.FrameStackObservation: {stack_size: 2}}]"
)


@pytest.mark.parametrize(
    ("wrappers", "shape"),
    [([], (3, 210, 160)), ([RESIZED_AND_STACKED], (6, 64, 64))],
    ids=["screen", "resized-and-stacked"],
)
def test_ppo_acts_on_an_atari_games_rgb_screen_through_the_cnn(graphs_dir, tmp_path, wrappers, shape):
    """ALE's own (210, 160, 3) frames, no preprocessing: channels first, the Nature CNN over 210 x 160; resized
    to 64 x 64 and 2 stacked from the graph's ``env.wrappers``, ``(2, 64, 64, 3)``: one image of 6 channels."""
    pytest.importorskip("ale_py")
    overrides = [
        "env.id=ale_py:ALE/Pong-v5",
        *wrappers,
        "roles.sampler.envs=2",
        "hyperparameters.num_steps=16",
        "hyperparameters.update_epochs=1",
        "hyperparameters.minibatch_size=32",
        "stop.env_steps=64",
    ]
    graph = load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", overrides)
    assert graph.observation_space.shape == shape and is_image(graph.observation_space)
    if wrappers:  # the run's config keeps the list as written
        assert graph.to_dict()["env"]["wrappers"][0] == {"gymnasium.wrappers.ResizeObservation": {"shape": [64, 64]}}
    summary, rundir = train(f"{graphs_dir}/ppo-cartpole-single.yaml", tmp_path, overrides)
    assert summary["iterations"] == 2 and np.isfinite(rundir.read_metrics()[-1]["losses/value"])


def test_a_dict_holding_an_image_is_laid_out_for_a_cnn_and_the_rest(graphs_dir):
    """``pixels`` (channels last) and ``state``: one ``uint8`` vector, the image a byte a pixel and the state's
    ``float32`` as its bytes, which the encoder cuts apart again: a CNN for the image, the state as it was."""
    import torch

    import dagrl.envs  # noqa: F401  (registers BrightHalfFlip-v0)
    from dagrl.algos.common.actor_critic import ActorCritic
    from dagrl.algos.dqn import q_network
    from dagrl.nn.encoders import MixedEncoder, NatureCNN
    from dagrl.spaces.mixed import MixedBox

    raw = gym.make("BrightHalfFlip-v0", size=36)
    env = vector_observations(gym.make("BrightHalfFlip-v0", size=36))
    space = env.observation_space
    assert isinstance(space, MixedBox) and space.shape == (4 + 36 * 36,) and space.dtype == np.uint8
    obs, _ = env.reset(seed=4)
    shown, _ = raw.reset(seed=4)
    assert obs.dtype == np.uint8 and space.contains(obs)
    pixels, state = space.parts
    image = obs[pixels.start : pixels.stop].reshape(pixels.image)
    assert np.array_equal(image, np.moveaxis(shown["pixels"], -1, 0))  # turned channels first, values kept
    assert obs[state.start : state.stop].view(np.float32)[0] == shown["state"][0] != 0
    assert pickle.loads(pickle.dumps(space)) == space  # as Dask sends it to every worker
    sample = space.sample()
    assert np.isfinite(sample[: state.stop].view(np.float32)).all()
    graph = load_graph(f"{graphs_dir}/ppo-brighthalf-flip.yaml")
    assert graph.observation_space == space
    for net in (ActorCritic(space, graph.action_space, 64).trunk, q_network(space, graph.action_space, 64)[0]):
        assert isinstance(net, MixedEncoder) and isinstance(net.cnns["pixels"], NatureCNN)
        batch = torch.as_tensor(np.stack([obs, sample]))
        features = net(batch)
        assert features.shape == (2, 512 + 1)
        assert torch.equal(net(batch.float()), features)  # an algorithm's .float() copy reads the same
    trunk = ActorCritic(space, graph.action_space, 64).trunk
    assert trunk(torch.as_tensor(obs[None]))[0, -1] == shown["state"][0]  # the state's value, bit for bit


def test_a_tuple_holding_an_image_is_packed_as_a_dict_is():
    import torch

    from dagrl.nn.encoders import MixedEncoder
    from dagrl.spaces.mixed import MixedBox, unpack

    space = gym.spaces.Tuple((gym.spaces.Box(0, 255, (40, 40, 3), np.uint8), gym.spaces.Discrete(3)))
    env = vector_observations(Fixed(space))
    packed = env.observation_space
    assert isinstance(packed, MixedBox) and packed.dtype == np.uint8
    assert [(p.key, p.image) for p in packed.parts] == [("0", (3, 40, 40)), ("1", None)]
    obs, _ = env.reset(seed=0)
    space.seed(0)
    shown = space.sample()  # what the reset showed
    parts = unpack(packed, obs)
    assert np.array_equal(parts["0"], np.moveaxis(shown[0], -1, 0))
    assert parts["1"].tolist() == np.eye(3, dtype=np.float32)[shown[1]].tolist()  # one-hot, as flattened
    features = MixedEncoder(packed)(torch.as_tensor(obs[None]))
    assert features.shape == (1, 512 + 3) and features[0, -3:].tolist() == parts["1"].tolist()


def test_norm_obs_standardises_a_dicts_other_entries_and_leaves_its_images_to_the_cnn():
    import torch

    import dagrl.envs  # noqa: F401  (registers BrightHalfFlip-v0)
    from dagrl.algos.common.actor_critic import ActorCritic, Config
    from dagrl.spaces.mixed import mixed_space

    space = vector_observations(gym.make("BrightHalfFlip-v0", size=36)).observation_space
    agent = ActorCritic(space, gym.spaces.Discrete(2), 64, norm_obs=True)
    assert agent.obs_norm.mean.shape == (1,)  # the state's one value, not the 1,300 bytes
    envs = vector_observations(gym.make("BrightHalfFlip-v0", size=36))
    obs = torch.as_tensor(np.stack([envs.reset(seed=s)[0] for s in range(64)]))
    flips = agent.trunk.values(obs)[:, 0]
    assert set(flips.tolist()) == {-1.0, 1.0}
    agent.fold_statistics(obs, [], None)
    assert float(agent.obs_norm.mean[0]) == pytest.approx(float(flips.double().mean()))
    agent.obs_norm.mean.fill_(0.5)
    agent.obs_norm.var.fill_(4.0)
    expected = (flips - 0.5) / 2.0
    assert torch.allclose(agent.features(obs)[:, -1], expected, atol=1e-6)  # the state's feature, standardised
    sd = agent.state_dict()
    assert "obs_norm.mean" in sd and not any(k.startswith("trunk.") and "norm" in k for k in sd)
    Config(norm_obs=True).check_spaces(space, gym.spaces.Discrete(2))
    cameras = mixed_space(
        gym.spaces.Dict(
            {
                "left": gym.spaces.Box(0, 255, (36, 36, 3), np.uint8),
                "right": gym.spaces.Box(0, 255, (36, 36, 3), np.uint8),
            }
        )
    )
    with pytest.raises(ValueError, match="norm_obs: true: .* holds only images"):
        Config(norm_obs=True).check_spaces(cameras, gym.spaces.Discrete(2))


@pytest.mark.slow
def test_ppo_learns_from_both_the_image_and_the_state_of_a_dict(client, graphs_dir, tmp_path):
    """BrightHalfFlip: the image alone or the state alone earns 8 of 16; 15 needs both."""
    summary, rundir = train(f"{graphs_dir}/ppo-brighthalf-flip.yaml", tmp_path, client=client)
    assert summary["stop_reason"] == "mean_return", summary
    means = [r["charts/episode_return_mean"] for r in rundir.read_metrics()]
    assert next(m for m in means if m is not None) < 10  # the window's first mean: still near guessing


def test_an_env_registered_by_an_import_here_is_made_in_fresh_workers(graphs_dir, tmp_path):
    """``import ale_py`` registers ``ALE/Pong-v5`` in this process only. The run's own LocalCluster starts
    workers that never imported it; they make the env as ``ale_py.env:ALE/Pong-v5``."""
    pytest.importorskip("ale_py")
    import ale_py  # noqa: F401

    overrides = [
        "env.id=ALE/Pong-v5", "env.kwargs.obs_type=ram", "roles.sampler.envs=1", "hyperparameters.num_steps=16",
        "hyperparameters.minibatch_size=16", "stop.iterations=2", "stop.mean_return=null",
    ]  # fmt: skip
    graph = load_graph(f"{graphs_dir}/ppo-cartpole.yaml", overrides)
    assert graph.spec.env.id == "ALE/Pong-v5" and graph.env_id == "ale_py.env:ALE/Pong-v5"
    summary, _ = train(f"{graphs_dir}/ppo-cartpole.yaml", tmp_path, overrides)  # no client: a fresh cluster
    assert summary["iterations"] == 2, summary


def test_an_env_registered_in_main_is_refused_for_workers_and_runs_in_one_process(graphs_dir, tmp_path, monkeypatch):
    """A notebook cell's own env: the driver can make it, Dask's workers (other processes) cannot."""
    from dagrl.core.schema import ConfigError

    class Corridor(Fixed):
        def __init__(self):
            super().__init__(gym.spaces.Box(-1, 1, (3,), np.float32))

        def step(self, action):
            return self.observation_space.sample(), 1.0, True, False, {}

    Corridor.__module__ = "__main__"  # as a class defined in a notebook cell is
    monkeypatch.setitem(gym.registry, "Corridor-v0", gym.envs.registration.EnvSpec("Corridor-v0", Corridor))
    overrides = ["env.id=Corridor-v0", "stop.iterations=1", "stop.mean_return=null", f"runs_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"env\.id: 'Corridor-v0' is registered in __main__ .*'<module>:Corridor-v0'"):
        load_graph(f"{graphs_dir}/ppo-cartpole.yaml", overrides)
    summary, _ = train(f"{graphs_dir}/ppo-cartpole-single.yaml", tmp_path, overrides)
    assert summary["iterations"] == 1


def test_dagrl_graph_says_what_the_networks_take_and_what_the_env_gave(graphs_dir):
    from dagrl.app.inspect import describe

    stacked = ["env.wrappers=[{gymnasium.wrappers.FrameStackObservation: {stack_size: 2}}]"]
    lines = describe(load_graph(f"{graphs_dir}/ppo-brighthalf-flip.yaml", stacked)).splitlines()
    assert lines[1].startswith(
        "observations: uint8 vector of 2600 bytes (pixels image (2, 36, 36), state 2 float32); networks.encoder"
    ), lines[1]
    assert "the env gives Dict('pixels': Box(0, 255, (2, 36, 36, 1), uint8)" in lines[1]
    assert lines[2] == "actions: Discrete(2)"
    lake = describe(load_graph(f"{graphs_dir}/dqn-cartpole-single.yaml", ["env.id=FrozenLake-v1"])).splitlines()
    assert lake[1] == "observations: float32 (16,); networks.encoder: an MLP; the env gives Discrete(16)"
    assert describe(load_graph(f"{graphs_dir}/ppo-brighthalf.yaml")).splitlines()[1] == (
        "observations: uint8 image (1, 84, 84); networks.encoder: a Nature CNN"
    )
