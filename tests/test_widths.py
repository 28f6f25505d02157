"""``hidden`` as each layer's width (rl-zoo's ``net_arch``), for every algorithm's networks; one width
still means two layers of it, as the graphs and the checkpoints written before had them."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.core.schema import ConfigError
from dagrl.runtime.checkpoint import load_checkpoint
from tests.helpers import train

QUICK = ["policy=single", "stop.iterations=2", "stop.mean_return=null", "checkpoint.every=1",
         "evaluate.every=0"]  # fmt: skip

GRAPHS = {
    "ppo-cartpole-single": [],
    "impala-cartpole": [],
    "ppo-lstm-cartpole-novel": [],
    "mappo-spread-single": [],
    "dqn-cartpole-single": ["hyperparameters.learning_starts=16", "hyperparameters.batch_size=8"],
    "sac-pendulum-single": ["hyperparameters.learning_starts=16", "hyperparameters.batch_size=8"],
    "td3-pendulum-single": ["hyperparameters.learning_starts=16", "hyperparameters.batch_size=8"],
}


def weight_shapes(tree, out: list | None = None) -> list[tuple[int, ...]]:
    """Every 2-D array's shape in a checkpoint's tree (the linear layers' weights, out x in)."""
    out = [] if out is None else out
    if isinstance(tree, dict):
        for v in tree.values():
            weight_shapes(v, out)
    elif isinstance(tree, list | tuple):
        for v in tree:
            weight_shapes(v, out)
    elif hasattr(tree, "shape") and len(tree.shape) == 2:
        out.append(tuple(tree.shape))
    return out


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_each_algorithm_builds_the_layers_hidden_names(name, tmp_path):
    """``hidden: [24, 12]``: the learner's networks hold a 24 x n_in layer then a 12 x 24 one; no two
    layers of one width remain (the default's ``64 x 64`` or ``128 x 128``)."""
    summary, rundir = train(f"graphs/{name}.yaml", tmp_path, [*QUICK, *GRAPHS[name], "hyperparameters.hidden=[24, 12]"])
    assert summary["iterations"] == 2, summary
    shapes = weight_shapes(load_checkpoint(rundir.path)["roles"])
    assert (12, 24) in shapes, shapes
    assert any(s[0] == 24 for s in shapes) and not any(s[0] == s[1] and s[0] in (64, 128) for s in shapes)
    assert all(s[1] == 12 for s in shapes if s[0] not in (12, 24) and s[1] in (12, 24)), shapes  # heads on 12


def test_one_width_keeps_two_layers_of_it(tmp_path):
    summary, rundir = train("graphs/ppo-cartpole-single.yaml", tmp_path, [*QUICK, "hyperparameters.hidden=20"])
    shapes = weight_shapes(load_checkpoint(rundir.path)["roles"])
    assert shapes.count((20, 20)) >= 2 and (20, 4) in shapes, shapes


@pytest.mark.parametrize(
    ("value", "words"),
    [("[]", ["hidden", "at least one width"]), ("[64, 0]", ["hidden", ">= 1", "[64, 0]"]),
     ("[64, x]", ["hidden", "expected int or a list"])],
)  # fmt: skip
def test_bad_widths_are_named(value, words, tmp_path):
    with pytest.raises(ConfigError) as err:
        train("graphs/ppo-cartpole-single.yaml", tmp_path, [*QUICK, f"hyperparameters.hidden={value}"])
    assert all(w in str(err.value) for w in words), str(err.value)
    assert np.char.count(str(err.value), "\n") == 0
