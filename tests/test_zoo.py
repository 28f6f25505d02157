"""``dagrl graph --from-zoo``: the rl-zoo's hyperparameters as a graph dagrl runs, units converted, SB3's
defaults where the zoo gives none, and what has no equivalent named on one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dagrl.app.cli import main
from dagrl.app.graphs import load_graph
from dagrl.app.zoo import convert, policy_kwargs
from dagrl.core.schema import ConfigError
from tests.helpers import train

pytestmark = pytest.mark.skipif(  # not imported: importing rl_zoo3 patches gymnasium's TimeLimit process-wide
    importlib.util.find_spec("rl_zoo3") is None, reason="needs the zoo extra (rl-zoo3)"
)

ROOT = Path(__file__).resolve().parent.parent


def written(tmp_path, capsys, algo: str, env_id: str):
    """The graph ``dagrl graph --from-zoo`` writes, loaded; and what it said on stderr."""
    out = tmp_path / f"{algo}.yaml"
    assert main(["graph", "--from-zoo", algo, env_id, "--out", str(out)]) == 0
    return load_graph(out), capsys.readouterr().err


def test_dqn_acrobot_counts_in_the_zoos_units(tmp_path, capsys):
    """train_freq 4 with gradient_steps -1 is one gradient step per env step; the target copies every 250
    env steps; epsilon decays over 12 % of 100k env steps; SB3's DQN is not double."""
    graph, err = written(tmp_path, capsys, "dqn", "Acrobot-v1")
    c = graph.config
    assert (c.steps, c.gradient_steps, c.target_update_interval, c.exploration_fraction) == (4, 4, 250, 0.12)
    assert (c.lr, c.batch_size, c.buffer_size, c.learning_starts, c.eps_end) == (6.3e-4, 128, 50_000, 0, 0.1)
    assert c.hidden == (256, 256) and c.double is False and c.max_grad_norm == 10
    assert graph.spec.stop.env_steps == 100_000 and graph.role("sampler").envs == 1
    assert err == ""  # every setting carried over


def test_td3_and_sac_pendulum_take_sb3s_defaults_where_the_zoo_is_silent(tmp_path, capsys):
    td3, _ = written(tmp_path, capsys, "td3", "Pendulum-v1")
    c = td3.config
    assert c.hidden == (400, 300) and (c.gamma, c.learning_starts, c.buffer_size) == (0.98, 10_000, 200_000)
    assert (c.steps, c.gradient_steps, c.exploration_noise, c.batch_size, c.tau) == (1, 1, 0.1, 256, 0.005)
    sac, _ = written(tmp_path, capsys, "sac", "Pendulum-v1")
    c = sac.config
    assert (c.policy_lr, c.q_lr, c.alpha, c.hidden) == (1e-3, 1e-3, None, (256, 256))
    assert (c.learning_starts, c.buffer_size, c.gamma) == (100, 1_000_000, 0.99)  # SB3's defaults


def test_ppo_keeps_schedules_activations_and_normalisation_and_names_what_it_cannot(tmp_path, capsys):
    cartpole, err = written(tmp_path, capsys, "ppo", "CartPole-v1")
    c = cartpole.config
    assert (c.lr, c.anneal_lr, c.clip_coef, c.num_steps, c.minibatch_size, c.update_epochs) == (
        1e-3,
        True,
        0.2,
        32,
        256,
        20,
    )
    assert cartpole.role("sampler").envs == 8
    assert err.strip() == "dagrl: no equivalent in dagrl: clip_range='lin_0.2'"
    cheetah, err = written(tmp_path, capsys, "ppo", "HalfCheetah-v4")
    c = cheetah.config
    assert (c.activation, c.log_std_init, c.hidden, c.norm_obs, c.norm_reward) == ("relu", -2.0, (256, 256), True, True)
    (line,) = [x for x in err.splitlines() if "no equivalent" in x]
    assert line == "dagrl: no equivalent in dagrl: policy_kwargs.ortho_init=False"
    text = (tmp_path / "ppo.yaml").read_text()
    assert "# zoo learning_rate: 2.0633e-05" in text and "# No equivalent in dagrl: policy_kwargs.ortho_init" in text


def test_the_converted_dqn_graph_trains(tmp_path, capsys):
    assert main(["graph", "--from-zoo", "dqn", "CartPole-v1", "--out", str(tmp_path / "g.yaml")]) == 0
    summary, rundir = train(str(tmp_path / "g.yaml"), tmp_path, ["stop.iterations=6"])
    assert summary["iterations"] == 6 and summary["env_steps"] == 6 * 256


def test_unknown_algorithms_and_envs_are_named_with_the_closest(capsys):
    with pytest.raises(ConfigError, match="did you mean Acrobot-v1"):
        convert("dqn", "Acrobot-v2")
    with pytest.raises(ConfigError, match="did you mean ppo"):
        convert("ppo2", "CartPole-v1")
    assert main(["graph"]) == 2 and "--from-zoo" in capsys.readouterr().err


def test_policy_kwargs_are_read_without_being_run():
    assert policy_kwargs("dict(net_arch=[dict(pi=[8], vf=[8])], activation_fn=nn.Tanh)") == {
        "net_arch": [{"pi": [8], "vf": [8]}], "activation_fn": "Tanh"}  # fmt: skip
    with pytest.raises(ConfigError, match="policy_kwargs"):
        policy_kwargs("dict(net_arch=__import__('os').system('true'))")


@pytest.mark.parametrize("path", sorted(ROOT.glob("graphs/*-zoo.yaml")), ids=lambda p: p.stem)
def test_the_shipped_zoo_graphs_are_the_converters_output(path):
    """``graphs/*-zoo.yaml`` (the learning benchmark's) are written by ``--from-zoo`` as they stand."""
    algo, env_id = path.read_text().split("--from-zoo ", 1)[1].split("`", 1)[0].split()
    assert convert(algo, env_id).text == path.read_text(), f"rewrite it: dagrl graph --from-zoo {algo} {env_id}"
