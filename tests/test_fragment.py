"""Fragments are plain functions; tracing the iteration gives roles, nodes and edges."""

from __future__ import annotations

import pytest

from dagrl.core.fragment import fragment, iteration, load_algorithm, trace
from tests.helpers import user_module


def test_fragment_called_with_state_is_a_plain_function():
    @fragment(role="learner")
    def double(state, x):
        return state * x

    assert double(3, 4) == 12
    assert double.role == "learner" and double.name == "double"


def test_trace_records_calls_and_edges():
    @fragment(role="learner")
    def publish(state):
        raise AssertionError("must not run while tracing")

    @fragment(role="sampler")
    def collect(state, w):
        raise AssertionError

    @fragment(role="learner")
    def update(state, r):
        raise AssertionError

    g = trace(lambda: update(collect(publish())))
    assert [n.name for n in g.nodes] == ["publish", "collect", "update"]
    assert [(e.src.name, e.dst.name) for e in g.edges] == [("publish", "collect"), ("collect", "update")]
    assert g.output is g.nodes[-1]
    assert g.roles() == ["learner", "sampler"]


def test_ppo_algorithm_is_found_by_its_decorators():
    algo = load_algorithm("ppo")
    assert set(algo.roles) == {"sampler", "learner", "inference", "evaluator"}
    assert algo.roles["sampler"].many and not algo.roles["learner"].many
    assert [n.name for n in algo.graph.nodes] == ["publish", "collect", "update"]
    assert [n.name for n in algo.eval_graph.nodes] == ["publish", "evaluate"]
    assert algo.eval_only_roles == {"evaluator"}


def test_user_algorithm_by_module_path(tmp_path, monkeypatch):
    user_module(
        tmp_path,
        monkeypatch,
        "my_algo",
        "from dataclasses import dataclass\n"
        "from dagrl import Manifest, fragment, role, iteration\n"
        "@dataclass\nclass Config:\n    k: int = 1\n"
        "@role('worker')\ndef worker(ctx, cfg):\n    return 0\n"
        "@fragment(role='worker')\ndef work(state):\n    return 1\n"
        "@iteration\ndef it():\n    return work()\n"
        "ALGORITHM = Manifest(config=Config, roles=[worker], iteration=it)\n",
    )
    algo = load_algorithm("my_algo")
    assert algo.fragments["work"].role == "worker"


def test_fragment_without_role_factory_is_refused(tmp_path, monkeypatch):
    user_module(
        tmp_path,
        monkeypatch,
        "bad_algo",
        "from dataclasses import dataclass\n"
        "from dagrl import Manifest, fragment, iteration\n"
        "@dataclass\nclass Config:\n    pass\n"
        "@fragment(role='ghost')\ndef haunt(state):\n    return 1\n"
        "@iteration\ndef it():\n    return haunt()\n"
        "ALGORITHM = Manifest(config=Config, roles=[], iteration=it)\n",
    )
    with pytest.raises(TypeError, match="ghost"):
        load_algorithm("bad_algo")


def test_iteration_must_return_a_fragment_output():
    @iteration
    def it():
        return 42

    with pytest.raises(TypeError, match="must return"):
        trace(it)


def test_recovery_is_declared_apart_from_replication():
    from dagrl.algos import ppo
    from dagrl.core.fragment import role

    algo = load_algorithm("ppo")
    assert {r: (d.many, d.recover) for r, d in algo.roles.items()} == {
        "sampler": (True, "replace"),
        "learner": (False, "rollback"),
        "inference": (False, "replace"),
        "evaluator": (False, "replace"),
    }
    assert role("learner", recover="replace")(lambda ctx, cfg: None).__dagrl_role__.recover == "replace"
    with pytest.raises(ValueError, match="role learner: recover must be one of replace, rollback, got 'reopen'"):
        role("learner", recover="reopen")
    assert ppo.learner.__dagrl_role__.recover == "rollback"
