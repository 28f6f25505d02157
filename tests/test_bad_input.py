"""A corpus of malformed and hostile inputs: each is one line on stderr naming what and where,
exit code 2, no traceback, no run directory left behind and no process started.

Cases are ``(id, argv after "dagrl run", words the line must hold)``; ``{g}`` is the graph file,
``{tmp}`` the test's directory. Graph keys come through ``--set`` (validated like the file itself).
"""

from __future__ import annotations

import gymnasium as gym
import pytest

from dagrl.app.cli import main
from tests.helpers import descendants

SYNC = "graphs/ppo-cartpole-sync.yaml"
ASYNC = "graphs/ppo-cartpole-async.yaml"


def s(*pairs: str) -> list[str]:
    return [x for p in pairs for x in ("--set", p)]


GRAPH_CASES = [
    # elastic samplers
    ("max-replicas-under-sync", s("roles.sampler.max_replicas=8"), ["roles.sampler.max_replicas", "async only"]),
    (
        "max-replicas-learner",
        s("policy.max_staleness=2", "roles.learner.max_replicas=2"),
        ["roles.learner.max_replicas", "many replicas"],
    ),
    (
        "max-replicas-below",
        s("policy.max_staleness=2", "roles.sampler.max_replicas=1"),
        ["roles.sampler.max_replicas", "below"],
    ),
    # stop
    ("stop-window-zero", s("stop.window=0"), ["stop", "window", "0"]),
    ("stop-window-negative", s("stop.window=-3"), ["stop", "window", "-3"]),
    ("stop-window-text", s("stop.window=abc"), ["stop.window", "abc"]),
    ("stop-env-steps-negative", s("stop.env_steps=-5"), ["stop", "env_steps", "-5"]),
    ("stop-iterations-zero", s("stop.iterations=0"), ["stop", "iterations", "0"]),
    ("stop-iterations-fraction", s("stop.iterations=1.5"), ["stop.iterations", "1.5"]),
    ("stop-wall-negative", s("stop.wall_time_s=-1"), ["stop", "wall_time_s", "-1"]),
    ("stop-mean-return-text", s("stop.mean_return=abc"), ["stop.mean_return", "abc"]),
    ("stop-mean-return-nan", s("stop.mean_return=.nan"), ["stop", "mean_return", "nan"]),
    ("stop-unknown-key", s("stop.after=3"), ["stop.after", "unknown key"]),
    ("stop-never", s("stop=null"), ["stop"]),
    # checkpoint
    ("checkpoint-every-negative", s("checkpoint.every=-1"), ["checkpoint", "every", "-1"]),
    ("checkpoint-keep-negative", s("checkpoint.keep=-1"), ["checkpoint", "keep", "-1"]),
    ("checkpoint-keep-zero", s("checkpoint.keep=0"), ["checkpoint", "keep", "0"]),
    ("checkpoint-every-text", s("checkpoint.every=often"), ["checkpoint.every", "often"]),
    # roles
    ("replicas-zero", s("roles.sampler.replicas=0"), ["roles.sampler", "replicas", "0"]),
    ("replicas-negative", s("roles.sampler.replicas=-2"), ["roles.sampler", "replicas", "-2"]),
    ("replicas-text", s("roles.sampler.replicas=many"), ["roles.sampler.replicas", "many"]),
    ("replicas-fraction", s("roles.sampler.replicas=2.5"), ["roles.sampler.replicas", "2.5"]),
    ("replicas-runaway", s("roles.sampler.replicas=10000"), ["roles.sampler.replicas", "10000"]),
    ("envs-zero", s("roles.sampler.envs=0"), ["roles.sampler", "envs", "0"]),
    ("envs-text", s("roles.sampler.envs=four"), ["roles.sampler.envs", "four"]),
    ("envs-runaway", s("roles.sampler.envs=1000000"), ["roles.sampler", "envs", "1000000"]),
    ("resources-negative", s("roles.sampler.resources.CPU=-1"), ["roles.sampler", "CPU", "-1"]),
    ("resources-text", s("roles.sampler.resources.CPU=one"), ["roles.sampler.resources.CPU", "one"]),
    ("resources-unknown", s("roles.sampler.resources.TPU=1"), ["roles.sampler", "TPU"]),
    ("resources-too-many-cpus", s("roles.sampler.resources.CPU=512"), ["roles.sampler", "CPU", "512"]),
    ("memory-text", s("roles.sampler.memory=lots"), ["roles.sampler", "memory", "lots"]),
    ("codec-unknown", s("roles.sampler.codec=lz5"), ["roles.sampler", "codec", "lz5", "blosc-zstd"]),
    ("vector-unknown", s("roles.sampler.vector=fibers"), ["roles.sampler", "vector", "fibers"]),
    ("role-unknown", s("roles.critic.replicas=1"), ["roles.critic", "no such role"]),
    ("role-key-unknown", s("roles.sampler.cores=2"), ["roles.sampler.cores", "unknown key"]),
    ("learner-replicated", s("roles.learner.replicas=2"), ["roles.learner.replicas", "2"]),
    ("roles-scalar", s("roles.sampler=3"), ["roles.sampler", "3"]),
    # hyperparameters
    ("hp-unknown", s("hyperparameters.lrr=0.1"), ["hyperparameters.lrr", "unknown key"]),
    ("hp-lr-text", s("hyperparameters.lr=fast"), ["hyperparameters.lr", "fast"]),
    ("hp-lr-negative", s("hyperparameters.lr=-0.1"), ["hyperparameters", "lr", "-0.1"]),
    ("hp-epochs-fraction", s("hyperparameters.update_epochs=2.5"), ["hyperparameters.update_epochs", "2.5"]),
    ("hp-epochs-zero", s("hyperparameters.update_epochs=0"), ["hyperparameters", "update_epochs", "0"]),
    ("hp-num-steps-zero", s("hyperparameters.num_steps=0"), ["hyperparameters", "num_steps", "0"]),
    ("hp-minibatch-zero", s("hyperparameters.minibatch_size=0"), ["hyperparameters", "minibatch_size", "0"]),
    ("hp-gamma-above-one", s("hyperparameters.gamma=1.5"), ["hyperparameters", "gamma", "1.5"]),
    ("hp-hidden-zero", s("hyperparameters.hidden=0"), ["hyperparameters", "hidden", "0"]),
    ("hp-clip-text", s("hyperparameters.clip_coef=wide"), ["hyperparameters.clip_coef", "wide"]),
    ("hp-scalar", s("hyperparameters=3"), ["hyperparameters", "3"]),
    # env
    ("env-unknown", s("env.id=NoSuchEnv-v0"), ["env.id", "NoSuchEnv-v0"]),
    ("env-module-missing", s("env.id=nomodule_xyz:Env-v0"), ["env.id", "nomodule_xyz"]),
    ("env-kwarg-unknown", s("env.kwargs.colour=red"), ["env.kwargs", "colour"]),
    ("env-costly-bad-cost", s("env.id=dagrl.envs:CostlyCartPole-v0", "env.kwargs.cost=spin"), ["env", "spin"]),
    ("env-namespace-not-imported", s("env.id=ALE/Pong-v5"), ["env.id", "ALE/Pong-v5", "'ale_py:ALE/Pong-v5'"]),
    # ({{ }}: argv is str.format-ted with {tmp})
    ("env-wrapper-module-missing", s("env.wrappers=[nomodule_xyz.Wrap]"), ["env.wrappers[0]", "nomodule_xyz"]),
    ("env-wrapper-name-unknown", s("env.wrappers=[gymnasium.wrappers.Nope]"), ["env.wrappers[0]", "'Nope'"]),
    ("env-wrapper-not-callable", s("env.wrappers=[numpy.pi]"), ["env.wrappers[0]", "numpy.pi", "not a wrapper"]),
    (
        "env-wrapper-kwarg-unknown",
        s("env.wrappers=[gymnasium.wrappers.RecordEpisodeStatistics, {{gymnasium.wrappers.TimeLimit: {{steps: 5}}}}]"),
        ["env.wrappers[1]", "TimeLimit", "steps=5"],
    ),
    ("env-wrapper-two-keys", s("env.wrappers=[{{a.B: {{}}, c.D: {{}}}}]"), ["env.wrappers[0]", "a mapping of one"]),
    ("env-wrapper-kwargs-scalar", s("env.wrappers=[{{gymnasium.wrappers.TimeLimit: 5}}]"), ["env.wrappers[0]", "5"]),
    ("env-wrappers-scalar", s("env.wrappers=gymnasium.wrappers.TimeLimit"), ["env.wrappers", "expected a list"]),
    (
        "env-wrappers-on-envpool",
        s("roles.sampler.vector=envpool", "env.wrappers=[gymnasium.wrappers.RecordEpisodeStatistics]"),
        ["roles.sampler.vector", "envpool", "env.wrappers"],
    ),
    # policy
    ("policy-unknown", s("policy=warp"), ["policy", "warp"]),
    ("policy-apex-for-ppo", s("policy=apex"), ["policy", "on-policy"]),
    ("policy-option-unknown", s("policy.max_stale=1"), ["policy.max_stale", "unknown key"]),
    ("policy-staleness-negative", ["--set", "policy.max_staleness=-1"], ["policy", "max_staleness", "-1"]),
    ("policy-in-flight-zero", ["--set", "policy.in_flight=0"], ["policy", "in_flight", "0"]),
    ("policy-rollouts-zero", ["--set", "policy.rollouts_per_update=0"], ["policy", "rollouts_per_update", "0"]),
    # top level
    ("seed-text", s("seed=abc"), ["seed", "abc"]),
    ("seed-fraction", s("seed=1.5"), ["seed", "1.5"]),
    ("seed-negative", s("seed=-1"), ["seed", "-1"]),
    ("top-unknown", s("sede=3"), ["sede", "unknown key"]),
    ("algorithm-unknown", s("algorithm=nope"), ["algorithm", "nope"]),
    ("torch-threads-zero", s("torch_threads=0"), ["torch_threads", "0"]),
    ("gpu-fallback-text", s("gpu_fallback=maybe"), ["gpu_fallback", "maybe"]),
    ("runs-dir-unwritable", s("runs_dir=/proc/dagrl-runs"), ["/proc/dagrl-runs"]),
    ("name-with-slash", s("name=a/b"), ["name", "a/b"]),
    # the --set syntax itself
    ("set-without-equals", ["--set", "stop.iterations"], ["--set", "stop.iterations", "KEY=VALUE"]),
    ("set-empty-key", ["--set", "=3"], ["--set", "=3"]),
    ("set-bad-yaml", ["--set", "stop.iterations=[1"], ["stop.iterations", "[1"]),
    ("set-through-scalar", s("seed.value=3"), ["--set", "seed.value=3", "not a mapping"]),
]

CLUSTER_CASES = [
    ("cluster-missing", "", ["{tmp}/missing.yaml", "cannot read file"], "missing.yaml"),
    ("cluster-kind-unknown", "kind: k8s\n", ["kind", "k8s"], "c.yaml"),
    ("cluster-workers-negative", "kind: local\nworkers: -1\n", ["workers", "-1"], "c.yaml"),
    ("cluster-workers-text", "kind: local\nworkers: many\n", ["workers", "many"], "c.yaml"),
    ("cluster-threads-zero", "kind: local\nthreads_per_worker: 0\n", ["threads_per_worker", "0"], "c.yaml"),
    ("cluster-memory-text", "kind: local\nmemory_per_worker: lots\n", ["memory_per_worker", "lots"], "c.yaml"),
    ("cluster-memory-too-small", "kind: local\nmemory_per_worker: 150MB\n", ["memory_per_worker", "150MB"], "c.yaml"),
    ("cluster-unknown-key", "kind: local\nworkerz: 2\n", ["workerz", "unknown key"], "c.yaml"),
    ("cluster-not-mapping", "- local\n", ["c.yaml"], "c.yaml"),
    ("cluster-bad-yaml", "kind: [local\n", ["malformed YAML"], "c.yaml"),
    ("cluster-gpu-workers-negative", "kind: local\ngpu_workers: -1\n", ["gpu_workers", "-1"], "c.yaml"),
    ("cluster-scheduler-no-address", "kind: scheduler\n", ["address"], "c.yaml"),
]

OTHER_CASES = [
    ("graph-missing", ["{tmp}/nope.yaml"], ["{tmp}/nope.yaml", "cannot read file"]),
    ("graph-is-directory", ["{tmp}"], ["{tmp}"]),
    ("no-graph", [], ["GRAPH"]),
    ("resume-missing", ["--resume", "{tmp}/nope"], ["--resume", "{tmp}/nope"]),
    ("resume-not-a-run", ["--resume", "{tmp}"], ["--resume", "not a dagrl run directory"]),
    ("run-dir-missing", [SYNC, "--run-dir", "{tmp}/nope"], ["--run-dir", "does not exist"]),
    ("scheduler-unreachable", [SYNC, "--scheduler", "tcp://127.0.0.1:1", "--quiet"], ["tcp://127.0.0.1:1"]),
    ("scheduler-not-an-address", [SYNC, "--scheduler", "not an address"], ["not an address"]),
    (
        "dqn-continuous-actions",
        ["graphs/dqn-cartpole-apex.yaml", "--set", "env.id=Pendulum-v1"],
        ["env.id", "Pendulum-v1", "Box(-2.0, 2.0, (1,), float32)", "dqn acts in Discrete spaces"],
    ),
    (
        "sac-discrete-actions",
        ["graphs/sac-pendulum-apex.yaml", "--set", "env.id=CartPole-v1"],
        ["env.id", "CartPole-v1", "Discrete(2)", "sac acts in Box spaces"],
    ),
    (
        "sac-augment-shift-on-vectors",
        ["graphs/sac-pendulum-apex.yaml", "--set", "hyperparameters.augment_shift=4"],
        ["hyperparameters", "augment_shift: 4", "uint8 [C, H, W] images", "Pendulum-v1"],
    ),
    (
        "td3-augment-shift-on-vectors",
        ["graphs/td3-pendulum-single.yaml", "--set", "hyperparameters.augment_shift=2"],
        ["hyperparameters", "augment_shift: 2", "uint8 [C, H, W] images", "Pendulum-v1"],
    ),
    (
        "sac-share-encoder-on-vectors",
        ["graphs/sac-pendulum-single.yaml", "--set", "hyperparameters.share_encoder=true"],
        ["hyperparameters", "share_encoder: true is for image observations", "Pendulum-v1"],
    ),
    (
        "td3-share-encoder-on-vectors",
        ["graphs/td3-pendulum-apex.yaml", "--set", "hyperparameters.share_encoder=true"],
        ["hyperparameters", "share_encoder: true is for image observations", "Pendulum-v1"],
    ),
    (
        "sac-augment-shift-negative",
        ["graphs/sac-brighthalf.yaml", "--set", "hyperparameters.augment_shift=-1"],
        ["augment_shift", "-1"],
    ),
]


def check(tmp_path, capsys, argv: list[str], words: list[str]) -> None:
    runs = tmp_path / "runs"
    fill = {"tmp": str(tmp_path)}
    argv = [a.format(**fill) for a in argv]
    before = set(descendants())
    code = main(["run", "--set", f"runs_dir={runs}", *argv] if argv and "--resume" not in argv else ["run", *argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("dagrl: error: ")
    for word in words:
        assert word.format(**fill) in lines[0], (word, lines[0])
    assert "Traceback" not in err
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
    started = [line for pid, line in descendants().items() if pid not in before]
    assert not started, started  # no worker, nanny or env process


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in GRAPH_CASES], ids=[c[0] for c in GRAPH_CASES])
def test_bad_graph_value(tmp_path, capsys, monkeypatch, argv, words):
    for env_id in [k for k in gym.registry if k.startswith("ALE/")]:  # an earlier test may have imported ale_py
        monkeypatch.delitem(gym.registry, env_id)
    graph = ASYNC if any(a.startswith("policy.") and "max_stale=" not in a for a in argv) else SYNC
    check(tmp_path, capsys, [graph, *argv], words)


@pytest.mark.parametrize(("text", "words", "name"), [c[1:] for c in CLUSTER_CASES], ids=[c[0] for c in CLUSTER_CASES])
def test_bad_cluster_file(tmp_path, capsys, text, words, name):
    path = tmp_path / name
    if text:
        path.write_text(text)
    check(tmp_path, capsys, [SYNC, "--cluster", str(path)], [w.replace("c.yaml", str(path)) for w in words])


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in OTHER_CASES], ids=[c[0] for c in OTHER_CASES])
def test_bad_command_line(tmp_path, capsys, argv, words):
    check(tmp_path, capsys, argv, words)


def test_a_graph_field_given_without_set_is_pointed_to_set(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", SYNC, "hyperparameters.lr=3e-4"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "unrecognized arguments: hyperparameters.lr=3e-4" in err
    assert "--set hyperparameters.lr=3e-4" in err


def test_the_corpus_is_large():
    assert len(GRAPH_CASES) + len(CLUSTER_CASES) + len(OTHER_CASES) >= 80


def alias_bomb(levels: int = 12, fan: int = 12) -> str:
    """A "billion laughs" graph: each level a list of ``fan`` aliases of the one before, so ``hidden``
    stands for 12^12 strings when written out."""
    lines = ["algorithm: ppo", "env: {id: CartPole-v1}", "policy: sync", "hyperparameters:"]
    lines.append("  hidden: &l0 [" + ", ".join(['"lol"'] * fan) + "]")
    for i in range(1, levels):
        lines.append(f"  x{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan) + "]")
    return "\n".join(lines).replace("hidden: &l0", "x0: &l0").replace(f"  x{levels - 1}:", "  hidden:") + "\n"


FILE_CASES = [
    ("not-utf8", b"\xff\xfe\x00algorithm: ppo\n", ["not UTF-8 text", "byte 0"]),
    ("duplicate-key", b"algorithm: ppo\nenv: {id: CartPole-v1}\nseed: 1\nseed: 2\n", ["seed", "given twice", "line 3"]),
    ("duplicate-nested-key", b"algorithm: ppo\nenv: {id: CartPole-v1, id: Pendulum-v1}\n", ["'id' given twice"]),
    ("alias-bomb", alias_bomb().encode(), ["more than 100 aliases"]),
    ("empty-name", b"name: ''\nalgorithm: ppo\nenv: {id: CartPole-v1}\n", ["name", "empty"]),
    ("int-too-large", b"algorithm: ppo\nenv: {id: CartPole-v1}\nseed: 99999999999999999999999\n", ["seed", "64-bit"]),
    (
        "value-huge",
        b"algorithm: ppo\nenv: {id: CartPole-v1}\nhyperparameters: {lr: " + b"9" * 5000 + b"}\n",
        ["malformed YAML", "5000 digits"],
    ),
]


@pytest.mark.parametrize(("text", "words"), [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_a_hostile_graph_file_is_one_bounded_line(tmp_path, capsys, text, words):
    """Not UTF-8, a key given twice, aliases that expand to gigabytes, a value of 5,000 digits: one line of
    at most 300 characters, naming the file and what is wrong, and nothing started."""
    graph = tmp_path / "g.yaml"
    graph.write_bytes(text)
    check(tmp_path, capsys, [str(graph)], [str(graph), *words])


def test_every_error_line_is_bounded(tmp_path, capsys):
    graph = tmp_path / "g.yaml"
    graph.write_text("algorithm: ppo\nenv: {id: CartPole-v1}\nhyperparameters: {hidden: [" + "1, " * 5000 + "1]}\n")
    assert main(["run", str(graph), "--set", f"runs_dir={tmp_path}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert len(line) <= 300 + len("dagrl: error: ") and "hidden" in line, line


def test_a_dashboard_address_that_does_not_resolve_is_refused_before_the_cluster(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("kind: local\ndashboard_address: no-such-host.invalid:8787\n")
    check(tmp_path, capsys, [SYNC, "--cluster", str(cluster)], ["dashboard_address", "does not resolve"])


@pytest.mark.parametrize(
    ("path", "words"),
    [("{tmp}/afile/replay", ["is a file, not a folder"]), ("/proc/dagrl-replay", ["cannot write in /proc"])],
    ids=["under-a-file", "unwritable"],
)
def test_a_replay_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, path, words):
    (tmp_path / "afile").write_text("not a folder")
    argv = ["graphs/dqn-cartpole-apex.yaml", "--set", f"roles.replay.path={path}"]
    check(tmp_path, capsys, argv, ["roles.replay.path", *words])


@pytest.mark.parametrize(
    ("graph", "width"),
    [("graphs/ppo-cartpole-sync.yaml", "hidden"), ("graphs/ppo-lstm-cartpole-novel.yaml", "lstm"),
     ("graphs/sac-pendulum-apex.yaml", "hidden"), ("graphs/dqn-cartpole-apex.yaml", "hidden")],
)  # fmt: skip
def test_a_network_too_large_for_this_machine_is_refused_before_it_is_built(tmp_path, capsys, graph, width):
    check(tmp_path, capsys, [graph, "--set", f"hyperparameters.{width}=100000000"], [width, "100000000", "PiB"])
