"""Bad input: one line naming file, key and value, exit code 2, before any cluster starts."""

from __future__ import annotations

import time

import pytest
import torch

from dagrl.app.cli import main
from dagrl.app.graphs import load_graph
from tests.helpers import user_module

GOOD = """\
algorithm: ppo
env: {id: CartPole-v1}
policy: sync
roles:
  sampler: {replicas: 2, envs: 2}
stop: {iterations: 1}
"""


def run_cli(tmp_path, text, capsys, *extra):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    t0 = time.perf_counter()
    code = main(["run", str(path), "--set", f"runs_dir={tmp_path}/runs", *extra])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    return code, err, elapsed, str(path)


CASES = [
    ("env: {id: CartPole-v1}", "env: {id: NoSuchEnv-v0}", "env.id", "NoSuchEnv-v0"),
    ("algorithm: ppo", "algorithm: nope", "algorithm", "nope"),
    ("policy: sync", "policy: warp", "policy", "warp"),
    ("policy: sync", "policy: {name: async, max_stale: 1}", "policy.max_stale", "unknown key"),
    ("policy: sync", "policy: {name: async, max_staleness: -1}", "policy", "max_staleness must be >= 0"),
    ("policy: sync", "policy: {name: sync, max_staleness: 1}", "policy.max_staleness", "unknown key"),
    ("policy: sync", "policy: {max_staleness: 1}", "policy.name", "None"),
    ("policy: sync", "policy: [async]", "policy", "expected"),
    ("policy: sync", "policy: {name: async, max_staleness: 1}\nmax_staleness: 2", "max_staleness", "given twice"),
    ("policy: sync", "policy: apex", "policy", "update directly (an on-policy iteration: use sync or async)"),
    ("policy: sync", "policy: sync\nseed: abc", "seed", "abc"),
    ("policy: sync", "policy: sync\nsede: 3", "sede", "unknown key"),
    ("policy: sync", "policy: sync\nhyperparameters: {lrr: 0.1}", "hyperparameters.lrr", "unknown key"),
    ("policy: sync", "policy: sync\nhyperparameters: {update_epochs: 2.5}", "hyperparameters.update_epochs", "2.5"),
    ("{replicas: 2, envs: 2}", "{replicas: 0, envs: 2}", "roles.sampler", "replicas must be >= 1, got 0"),
    ("roles:", "roles:\n  learner: {replicas: 2}", "roles.learner.replicas", "2"),
    ("roles:", "roles:\n  critic: {replicas: 1}", "roles.critic", "no such role"),
    ("env: {id: CartPole-v1}", "env: {id: CartPole-v1, kwargs: {colour: red}}", "env.kwargs", "colour"),
]


@pytest.mark.parametrize(("old", "new", "key", "value"), CASES)
def test_bad_graph_is_one_clear_line(tmp_path, capsys, old, new, key, value):
    assert old in GOOD
    code, err, elapsed, path = run_cli(tmp_path, GOOD.replace(old, new, 1), capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert path in lines[0] and key in lines[0] and value in lines[0], lines[0]
    assert "Traceback" not in err and "dashboard" not in err
    assert elapsed < 20  # no cluster was started


def test_malformed_yaml_names_the_line(tmp_path, capsys):
    code, err, _, path = run_cli(tmp_path, "algorithm: ppo\nenv: {id: CartPole-v1\n", capsys)
    assert code == 2 and path in err and "malformed YAML" in err and "line" in err


def test_missing_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_bad_override_key(tmp_path, capsys):
    code, err, _, _ = run_cli(tmp_path, GOOD, capsys, "--set", "stop.mean_retrun=5")
    assert code == 2 and "stop.mean_retrun" in err and "unknown key" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_demanded_without_gpu(tmp_path, capsys):
    text = GOOD.replace("roles:\n", "roles:\n  learner: {resources: {GPU: 1}}\n") + "gpu_fallback: false\n"
    code, err, _, path = run_cli(tmp_path, text, capsys)
    assert code == 2 and path in err and "roles.learner.resources.GPU" in err and "no CUDA" in err


def test_bad_cluster_file(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("kind: local\nworkers: -1\n")
    code, err, _, _ = run_cli(tmp_path, GOOD, capsys, "--cluster", str(cluster))
    assert code == 2 and str(cluster) in err and "workers" in err and "-1" in err
    cluster.write_text("kind: k8s\n")
    code, err, _, _ = run_cli(tmp_path, GOOD, capsys, "--cluster", str(cluster))
    assert code == 2 and "kind" in err and "k8s" in err


def test_overrides_are_typed(graphs_dir):
    g = load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", ["hyperparameters.lr=3e-4", "roles.sampler.replicas=3"])
    assert g.config.lr == pytest.approx(3e-4) and isinstance(g.config.lr, float)
    assert g.role("sampler").replicas == 3


def test_async_refuses_an_iteration_it_cannot_stream(tmp_path, monkeypatch, capsys):
    user_module(
        tmp_path,
        monkeypatch,
        "two_streams",
        "from dataclasses import dataclass\n"
        "from dagrl import Manifest, fragment, role, iteration\n"
        "@dataclass\nclass Config:\n    pass\n"
        "@role('sampler', many=True)\ndef sampler(ctx, cfg):\n    return 0\n"
        "@fragment(role='sampler')\ndef a(s):\n    return 1\n"
        "@fragment(role='sampler')\ndef b(s, x):\n    return 1\n"
        "@iteration\ndef it():\n    return b(a())\n"
        "ALGORITHM = Manifest(config=Config, roles=[sampler], iteration=it)\n",
    )
    code, err, _, _ = run_cli(tmp_path, "algorithm: two_streams\nenv: {id: CartPole-v1}\npolicy: async\n", capsys)
    assert code == 2 and "policy" in err and "exactly one fragment" in err


def test_policy_options_nested_flat_and_overridden(graphs_dir):
    nested = load_graph(f"{graphs_dir}/ppo-cartpole-async.yaml")
    assert nested.spec.policy == "async" and nested.policy_options.max_staleness == 2
    assert nested.policy_options.rollouts_per_update == 2
    flat = load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", ["policy=async", "max_staleness=3"])
    assert flat.policy_options.max_staleness == 3  # the earlier top-level key still works
    over = load_graph(f"{graphs_dir}/ppo-cartpole-sync.yaml", ["policy.name=async", "policy.in_flight=1"])
    assert over.policy_options.in_flight == 1
    ignored = load_graph(f"{graphs_dir}/ppo-cartpole-async.yaml", ["policy=sync"])
    assert ignored.spec.policy == "sync" and ignored.to_dict()["policy"] == {"name": "sync", "mailbox": True}
    assert nested.to_dict()["policy"]["max_staleness"] == 2 and "max_staleness" not in nested.to_dict()
