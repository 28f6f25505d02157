"""``dagrl tune``: the cost model without Dask, candidate graphs that keep the batch, and the command
end to end on a real LocalCluster (measure, verify by real runs, write a graph that loads)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dagrl.app.cli import main
from dagrl.app.graphs import load_graph, resolve_graph
from dagrl.app.tune.measure import Measurements
from dagrl.app.tune.model import (
    Candidate,
    Costs,
    LearnStep,
    Shape,
    candidates,
    predict,
    rank,
    round_period,
    staleness,
)
from dagrl.app.tune.tuner import (
    Result,
    Tuning,
    candidate_data,
    choose_vector,
    nearest,
    shape_of,
    vector_backends,
    with_vector,
)
from dagrl.core.schema import read_yaml

PPO = Shape(onpolicy=True, sampler="sampler", length_key="num_steps", length=32, round_steps=512,
            policies=("single", "sync", "async"), step_bytes=40, round_hops=3)  # fmt: skip


def costs(**changes) -> Costs:
    base = dict(step_fixed_s=4e-4, step_per_env_s=1e-5, env_cpu=1.0, env_share=0.3, round_s=0.05,
                round_overlap_s=0.05, hop_s=0.005, peer_bytes_s=5e8, cores=2, task_cpu_s=0.005,
                call_s=0.002)  # fmt: skip
    return Costs(**{**base, **changes})


def test_every_candidate_keeps_the_batch():
    found = candidates(PPO, max_samplers=16)
    assert {c.policy for c in found} == {"single", "sync", "async"}
    for c in found:
        per_update = c.envs * c.length * (c.samplers if c.policy in ("single", "sync") else c.collects_per_round)
        assert per_update == 512 and c.length == 32, c
    off = Shape(onpolicy=False, sampler="sampler", length_key="steps", length=8, round_steps=16,
                policies=("single", "sync", "apex", "split-learner"), step_bytes=40)  # fmt: skip
    for c in candidates(off, max_samplers=4):
        assert c.envs * c.length * c.collects_per_round == 16, c


def test_ranking_is_deterministic_and_follows_the_costs():
    cheap = rank(PPO, costs(), max_samplers=8)
    assert cheap == rank(PPO, costs(), max_samplers=8)
    assert cheap[0][0].policy == "async"  # CartPole-like, two cores: collects overlap the learner's rounds
    lossy = rank(PPO, costs(calibration=0.6), max_samplers=8)  # a real run reached 0.6 of the prediction
    assert lossy[0][0].policy == "single"  # then one process, which loses nothing to that, wins
    # a simulator that sleeps 2 ms per env step: many samplers overlap their waits, the learner is cheap
    slow = rank(PPO, costs(step_per_env_s=2e-3, env_cpu=0.0, env_share=0.99), max_samplers=8)
    best, p = slow[0]
    assert best.policy == "async" and best.samplers >= 4, best
    assert p.steps_s > 3 * predict(slow[-1][0], PPO, costs(step_per_env_s=2e-3, env_cpu=0.0, env_share=0.99)).steps_s
    single = next(p for c, p in slow if c.policy == "single")
    assert p.steps_s > 3 * single.steps_s
    # the same simulator burning its core instead: two cores cap what samplers add
    busy = rank(PPO, costs(step_per_env_s=2e-3, env_cpu=1.0, env_share=0.99), max_samplers=8)
    assert busy[0][1].steps_s < 0.6 * p.steps_s


@pytest.mark.parametrize("name", ["ppo-cartpole", "ppo-cartpole-sync", "sac-pendulum-apex", "dqn-cartpole-apex"])
def test_candidate_graphs_are_valid_and_keep_the_round(graphs_dir, name):
    path = f"{graphs_dir}/{name}.yaml"
    graph = load_graph(path)
    shape = shape_of(graph)
    data = read_yaml(path)
    for c, _ in rank(shape, costs(), max_samplers=4)[:12]:
        tuned = resolve_graph(candidate_data(data, shape, c), path)
        assert tuned.spec.policy == c.policy
        assert shape_of(tuned).round_steps == shape.round_steps, c


def synthetic() -> dict:
    probe = {"iterations": 10, "env_steps": 2560, "wall_s": 1.0}
    return Measurements(
        fragments=[
            {**probe, "envs": 1, "length": 32, "busy": {"sampler": {"round_s": 0.016, "step_s": 5e-4},
                                                        "learner": {"round_s": 0.004}}},
            {**probe, "envs": 8, "length": 32, "busy": {"sampler": {"round_s": 0.019, "step_s": 6e-4},
                                                        "learner": {"round_s": 0.06}}},
        ],
        env=[{"envs": 8, "steps": 1000, "step_s": 1.5e-4, "cpu_share": 0.98}],
        cluster={"cores": 2, "hosts": 1, "workers": 3, "gpus": 0, "hop_s": 0.012, "task_cpu_s": 0.012,
                 "peer_bytes_s": 8e8},
    ).to_dict()  # fmt: skip


def test_among_equally_fast_settings_the_one_nearest_the_graph_as_written_wins():
    """Within 10 % of the fastest, the data's shape (envs at once, collect length) decides; beyond, speed."""
    hand = Candidate("apex", 2, 1, 8, 2)
    wide = Candidate("single", 1, 16, 1, 1)  # 16 envs at once, 1 step each: a different data stream
    same = Candidate("single", 1, 2, 8, 1)  # the graph's 2 envs x 8 steps, in one process
    assert nearest([(wide, 176.0), (same, 170.0)], hand) == same
    assert nearest([(wide, 176.0), (same, 150.0)], hand) == wide  # 15 % slower: speed wins
    assert nearest([(wide, 176.0), (same, 170.0)], None) == wide
    tuning = Tuning(PPO, Measurements.from_dict(synthetic()), [], hand=hand)
    tuning.verified = [Result(wide, None, 174.0), Result(same, None, 165.0), Result(hand, None, 87.0)]
    assert tuning.chosen.candidate == same
    tuning.verified[1].achieved = None  # a run too short to tell is never chosen
    assert tuning.chosen.candidate == wide


def test_among_equally_fast_and_equally_near_settings_the_freshest_data_wins():
    """SAC Pendulum (seed 1): ``split-learner`` 1 x 2 x 8 needed 10,000 env steps to its target, ``single``
    1 x 2 x 8 7,008: the actor there never trails the critic. Equally fast, the fresher one wins."""
    hand = Candidate("apex", 2, 1, 8, 2)
    split, one = Candidate("split-learner", 1, 2, 8, 1), Candidate("single", 1, 2, 8, 1)
    assert staleness(one) == 0 < staleness(Candidate("apex", 1, 2, 8, 1)) < staleness(split)
    assert staleness(Candidate("async", 8, 4, 32, 2)) > staleness(Candidate("async", 2, 4, 32, 2))
    assert nearest([(split, 167.0), (one, 155.0)], hand) == one
    assert nearest([(split, 167.0), (one, 140.0)], hand) == split  # 16 % slower: speed wins
    wide = Candidate("single", 1, 16, 1, 1)
    assert nearest([(split, 167.0), (wide, 165.0)], hand) == split  # the data's shape still comes first


def test_a_calibration_run_scales_distributed_predictions_only():
    plain = Measurements.from_dict(synthetic())
    calibrated = Measurements.from_dict({**synthetic(), "calibration": {"candidate": "x", "predicted": 2000.0,
                                                                        "achieved": 3000.0}})  # fmt: skip
    a, b = plain.costs("sampler", ["learner"]), calibrated.costs("sampler", ["learner"])
    assert b.calibration == 1.5 and a.calibration == 1.0
    before, after = dict(rank(PPO, a, 4)), dict(rank(PPO, b, 4))
    for c in before:
        ratio = after[c].steps_s / before[c].steps_s
        assert ratio == pytest.approx(1.0 if c.policy == "single" else 1.5), c


def test_load_slowdown_follows_the_windows_measured():
    """A collect's slowdown with k samplers: none for one, the measured windows, the line between them
    and past the last along its last segment; a file of the one-window env probe still reads."""
    c = costs(load=((2, 1.2), (4, 1.6), (8, 2.0)))
    assert [c.slowdown(k) for k in (1, 2, 3, 4, 6, 8, 16)] == pytest.approx([1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.8])
    assert costs().slowdown(8) == 1.0 and costs(load=((2, 1.5),)).slowdown(5) == pytest.approx(3.0)
    assert costs(load=((2, 1.0), (4, 0.9))).slowdown(16) == 1.0  # never faster than alone
    eight = Candidate("async", 8, 1, 32, 8)  # 8 collects at once: each twice as long as alone
    assert predict(eight, PPO, c).collect_s == pytest.approx(2.0 * predict(eight, PPO, costs()).collect_s)

    alone = 5e-4 + (6e-4 - 5e-4) / 7 * (4 - 1)  # the fragment probes' line at the load probe's 4 envs
    m = Measurements.from_dict({**synthetic(), "loaded": {"envs": 4, "points": [{"samplers": 2, "step_s": 2 * alone}]}})
    ((k, slower),) = m.costs("sampler", ["learner"]).load
    assert k == 2 and slower == pytest.approx(2.0)
    old = {"samplers": 2, "envs": 8, "step_s": 3e-4, "cpu_share": 1.0}  # env steps alone vs 1.5e-4 unloaded
    ((k, slower),) = Measurements.from_dict({**synthetic(), "loaded": old}).costs("sampler", []).load
    assert k == 2 and slower == pytest.approx(2.0)


def test_a_streaming_rounds_time_is_its_critical_path(graphs_dir):
    """The learner loop calls a round's fragments one after another, a direct call each; under
    split-learner the slow role's updates back to back hide the other's. No task or driver in between."""
    shape = shape_of(load_graph(f"{graphs_dir}/td3-halfcheetah-apex.yaml"))
    assert [s.key for s in shape.learn] == ["replay.sample", "critic.update_critic", "actor.update_actor"]
    assert shape.learn[2].inputs == (0,) and shape.learn[2].delayed == (1,)
    work = {"replay.sample": 0.001, "critic.update_critic": 0.08, "actor.update_actor": 0.02}
    c = costs(hop_s=0.5, call_s=0.01, fragment_s=work)  # a task's round trip is no longer on the path
    chain = round_period(shape, c, delayed=False)  # sample -> critic -> actor, then the next round
    assert chain == pytest.approx(0.001 + 0.08 + 0.02 + 3 * 0.01)
    assert round_period(shape, c, delayed=True) == pytest.approx(0.001 + 0.08 + 2 * 0.01)  # critic-bound
    split, apex = Candidate("split-learner", 1, 2, 8, 1), Candidate("apex", 1, 2, 8, 1)
    assert predict(split, shape, c).round_s == pytest.approx(0.001 + 0.08 + 2 * 0.01)
    assert predict(apex, shape, c).round_s == pytest.approx(chain)
    dqn = shape_of(load_graph(f"{graphs_dir}/dqn-cartpole-apex.yaml"))  # sample -> update -> reprioritize
    work = costs(call_s=0.01, fragment_s={"replay.sample": 0.001, "learner.update": 0.05, "replay.reprioritize": 0.001})
    assert round_period(dqn, work, delayed=False) == pytest.approx(0.052 + 3 * 0.01)
    ppo = replace(PPO, learn=(LearnStep("learner.update", "learner"),))
    two = Candidate("async", 2, 8, 32, 2)  # the rollouts were pushed while the round before ran
    got = predict(two, ppo, costs(call_s=0.002, fragment_s={"learner.update": 0.05})).round_s
    assert got == pytest.approx(0.05 + 0.002)
    assert got == pytest.approx(predict(two, PPO, costs(call_s=0.002)).round_s)  # unprobed: the same


def test_the_models_streaming_policies_are_the_engines():
    from dagrl.app.tune.model import OFFPOLICY, ONPOLICY
    from dagrl.core.distribution import POLICY_TRAITS
    from dagrl.policies import POLICIES
    from dagrl.policies.lockstep import Lockstep

    loops = {name for name, cls in POLICIES.items() if not issubclass(cls, Lockstep)}  # not sync's iterations
    streams = {name for name, kind in POLICY_TRAITS.items() if kind.streams}
    assert streams == loops
    assert set(ONPOLICY + OFFPOLICY) == {name for name, kind in POLICY_TRAITS.items() if kind.cost}


def test_tune_from_saved_measurements_writes_the_same_graph(tmp_path, graphs_dir, capsys):
    saved = tmp_path / "m.json"
    saved.write_text(json.dumps(synthetic()))
    outs = [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    for out in outs:
        args = ["tune", f"{graphs_dir}/ppo-cartpole.yaml", "--from", str(saved), "--verify", "0", "--out", str(out)]
        assert main([*args, "--quiet"]) == 0

    def body(text: str) -> list[str]:  # all but the command line and the name, which name the file
        return [line for line in text.splitlines() if not line.startswith(("# Tuned by", "name:"))]

    assert body(outs[0].read_text()) == body(outs[1].read_text())
    text = outs[0].read_text()
    assert "# Measured: a sampler's vector step" in text and "256 env steps per learner update" in text
    tuned = load_graph(outs[0])
    assert tuned.spec.policy == "single" and tuned.role("sampler").envs == 8  # batch 256 = 8 envs x 32 steps
    assert tuned.config.update_epochs == load_graph(f"{graphs_dir}/ppo-cartpole.yaml").config.update_epochs


def test_a_clearly_faster_vector_backend_is_chosen_and_written(tmp_path, graphs_dir):
    wall, cpu = {"sync": 1.9e-3, "envpool": 1.2e-3}, {"sync": 1.9e-3, "envpool": 2.0e-3}  # Pong, 4 envs
    assert choose_vector(wall, cpu, "sync", by_cpu=False) == "envpool"  # spare cores: its threads pay
    assert choose_vector(wall, cpu, "sync", by_cpu=True) == "sync"  # every core busy: CPU decides
    assert choose_vector(wall, cpu, "envpool", by_cpu=True) == "envpool"  # within 10 %: the graph's own
    assert choose_vector({"sync": 1.0e-3, "envpool": 0.95e-3}, cpu, "sync", by_cpu=False) == "sync"
    assert choose_vector({"sync": 0.5e-3, "envpool": 1.0e-3}, cpu, "envpool", by_cpu=False) == "sync"
    async_graph = load_graph(f"{graphs_dir}/ppo-cartpole.yaml", ["roles.sampler.vector=async"])
    assert vector_backends(async_graph, "sampler") == ["async"]  # its CPU is in other processes: kept
    assert vector_backends(load_graph(f"{graphs_dir}/ppo-cartpole.yaml"), "sampler") == ["sync", "threads", "envpool"]
    threads = with_vector({"roles": {"sampler": {"vector": "envpool", "vector_threads": 2}}}, "sampler", "sync")
    assert threads["roles"]["sampler"] == {"vector": "sync"}  # vector_threads is EnvPool's only

    saved, out = tmp_path / "m.json", tmp_path / "t.yaml"
    vector = {"envs": 8, "step_s": {"sync": 1.5e-4, "envpool": 0.5e-4}, "cpu_s": {"sync": 1.5e-4, "envpool": 0.9e-4},
              "by": "cpu", "chosen": "envpool"}  # fmt: skip
    saved.write_text(json.dumps({**synthetic(), "vector": vector}))
    args = ["tune", f"{graphs_dir}/ppo-cartpole.yaml", "--from", str(saved), "--verify", "0", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    assert load_graph(out).role("sampler").vector == "envpool"
    text = out.read_text()
    assert "sync 0.150 ms (0.150 ms CPU), envpool 0.050 ms (0.090 ms CPU);" in text
    assert "the probes ran on envpool (chosen by cpu time)" in text
    assert all("envpool" in line for line in text.splitlines() if line.startswith("#  ") and "steps" in line)


def test_tune_refuses_bad_input_before_starting(tmp_path, graphs_dir, capsys):
    bad = tmp_path / "m.json"
    bad.write_text("{}")
    assert main(["tune", f"{graphs_dir}/ppo-cartpole.yaml", "--from", str(bad), "--out", str(tmp_path / "t.yaml")]) == 2
    assert f"{bad}" in capsys.readouterr().err
    assert main(["tune", f"{graphs_dir}/ppo-cartpole.yaml", "--budget-s", "0"]) == 2
    assert "--budget-s" in capsys.readouterr().err
    assert not (tmp_path / "t.yaml").exists()


def test_tune_measures_and_verifies_on_a_real_cluster(client, tmp_path, graphs_dir, capsys):
    out, saved = tmp_path / "tuned.yaml", tmp_path / "m.json"
    args = ["tune", f"{graphs_dir}/ppo-cartpole.yaml", "--scheduler", client.scheduler.address, "--budget-s", "30",
            "--verify", "1", "--out", str(out), "--measurements", str(saved), "--quiet"]  # fmt: skip
    assert main(args) == 0
    m = json.loads(saved.read_text())
    assert m["cluster"]["workers"] == 3 and m["cluster"]["cores"] >= 1 and m["cluster"]["hop_s"] > 0
    assert sorted(p["envs"] for p in m["fragments"]) == [1, 8]
    assert set(m["vector"]["step_s"]) == {"sync", "threads", "envpool"} and min(m["vector"]["step_s"].values()) > 0
    assert min(m["vector"]["cpu_s"].values()) > 0 and m["vector"]["by"] in ("cpu", "wall")
    assert all(p["vector"] == m["vector"]["chosen"] for p in m["env"])  # the probes ran on the chosen one
    assert all(p["busy"]["sampler"]["step_s"] > 0 and p["busy"]["learner"]["round_s"] > 0 for p in m["fragments"])
    assert [p["samplers"] for p in m["loaded"]["points"]] == [2] and m["loaded"]["points"][0]["step_s"] > 0
    report = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in report[1:] if line[:1] == " " or line[:1].isdigit()]
    assert 2 <= len(rows) <= 3  # the best prediction, the graph as written (the calibration run), one process
    assert any("(as written) (calibration run)" in line for line in report)
    assert any(" single: " in line for line in report), report  # the one-process setting, measured too
    assert all(" behind]" in line for line in report if " async: " in line), report  # how stale its data
    for row in rows:
        assert float(row[0]) > 0 and float(row[1]) > 0  # predicted and achieved env steps/s
    tuned = load_graph(out)
    assert tuned.role("sampler").replicas <= 2  # three workers: the learner keeps one
    assert tuned.role("sampler").vector == m["vector"]["chosen"]
    assert "Verified by short real runs" in out.read_text()


def two_backends() -> dict:
    """Probes on ``sync``; a costly env that EnvPool steps dearer alone but far cheaper per added env, and
    a learner quicker than the collects (so the collects decide)."""

    def env(vector: str, envs: int, step_s: float, cpu: float = 1.0) -> dict:
        return {"envs": envs, "steps": 1000, "step_s": step_s, "cpu_s": cpu * step_s, "cpu_share": cpu,
                "vector": vector}  # fmt: skip

    probe = {"iterations": 10, "env_steps": 2560, "wall_s": 1.0}
    sync = [env("sync", 1, 1e-4), env("sync", 16, 16e-4)]
    pool = [env("envpool", 1, 2e-4, 1.0), env("envpool", 16, 3.5e-4, 1.5)]
    return Measurements(
        fragments=[  # a collect: acting (1.5e-4 s at 1 env, 2.5e-4 at 16) plus the env on `sync`
            {**probe, "envs": 1, "length": 32, "busy": {"sampler": {"round_s": 0.01, "step_s": 2.5e-4},
                                                        "learner": {"round_s": 0.004}}},
            {**probe, "envs": 16, "length": 32, "busy": {"sampler": {"round_s": 0.02, "step_s": 18.5e-4},
                                                         "learner": {"round_s": 0.006}}},
        ],
        env=sync,
        cluster={"cores": 2, "hosts": 1, "workers": 3, "gpus": 0, "hop_s": 0.012, "task_cpu_s": 0.012,
                 "peer_bytes_s": 8e8},
        vector={"envs": 8, "step_s": {"sync": 8e-4, "envpool": 2.8e-4}, "cpu_s": {"sync": 8e-4, "envpool": 4.2e-4},
                "by": "wall", "chosen": "sync", "probes": {"sync": sync, "envpool": pool}},
    ).to_dict()  # fmt: skip


def test_a_candidate_on_another_backend_has_its_env_time_swapped_in(tmp_path, graphs_dir):
    m = Measurements.from_dict(two_backends())
    sync, pool = m.costs("sampler", ["learner"]), m.costs("sampler", ["learner"], "envpool")
    assert m.costs("sampler", ["learner"], "sync") == sync  # the probes' own backend: as measured
    step = {n: (c.step_fixed_s + n * c.step_per_env_s) for c in (pool,) for n in (1, 16)}
    assert step[1] == pytest.approx(2.5e-4 - 1e-4 + 2e-4)  # acting as probed, EnvPool's env
    assert step[16] == pytest.approx(18.5e-4 - 16e-4 + 3.5e-4)
    assert pool.env_cpu == 1.5 and sync.env_cpu == 1.0  # EnvPool's threads: more than a core while stepping
    shape = replace(PPO, vector="sync", vectors=("sync", "envpool"))
    ranked = dict(rank(shape, {"sync": sync, "envpool": pool}, max_samplers=4))
    assert {c.vector for c in ranked} == {"sync", "envpool"}
    for c, p in ranked.items():  # the same setting on each backend: EnvPool's collects pay off with envs
        if c.vector == "sync":
            other = ranked[replace(c, vector="envpool")].collect_s
            assert other < p.collect_s if c.envs >= 4 else other > p.collect_s, c
    best = {v: max(p.steps_s for c, p in ranked.items() if c.vector == v) for v in ("sync", "envpool")}
    assert best["envpool"] > 1.1 * best["sync"]
    # equally near the graph as written and within 10 %: its own backend; clearly faster: the other
    hand, same = Candidate("sync", 2, 8, 32, 2), Candidate("sync", 2, 8, 32, 2, "envpool")
    assert nearest([(same, 105.0), (hand, 100.0)], hand) == hand
    assert nearest([(same, 120.0), (hand, 100.0)], hand) == same
    # from saved measurements: the probes ran on sync, the tuned graph steps EnvPool
    saved, out = tmp_path / "m.json", tmp_path / "t.yaml"
    saved.write_text(json.dumps(two_backends()))
    args = ["tune", f"{graphs_dir}/ppo-cartpole.yaml", "--from", str(saved), "--verify", "0", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    tuned = load_graph(out)
    assert tuned.role("sampler").vector == "envpool" and tuned.role("sampler").envs >= 4


def test_a_probe_keeps_the_env_step_budget_an_annealed_learning_rate_ends_at():
    """A graph with ``anneal_lr: true`` needs ``stop.env_steps``; the fragment probe's graph once dropped
    it, and ``dagrl tune`` stopped at its first fragment probe."""
    from dagrl.app.tune.measure import probe_data

    path = "graphs/ppo-lstm-cartpole-novel.yaml"
    data = read_yaml(path)
    assert data["hyperparameters"]["anneal_lr"] is True
    graph = resolve_graph(probe_data(data, "sampler", 2, ("num_steps", 16)), path)
    assert graph.spec.stop.env_steps == data["stop"]["env_steps"] and graph.spec.policy == "single"


def test_on_the_packing_local_cluster_no_candidate_has_more_samplers_than_cores(graphs_dir):
    """dagrl's own LocalCluster runs more samplers than cores as those within (``pack_samplers``): the
    tuner searches what will run; a cluster that runs them as written is searched beyond the cores."""
    from dagrl.app.tune.tuner import tune
    from dagrl.clusters.spec import LocalClusterSpec

    graph = load_graph(f"{graphs_dir}/ppo-cartpole.yaml")
    data = read_yaml(graph.path)

    def most(cluster) -> int:
        m = Measurements.from_dict(synthetic())  # 2 cores
        ranked = tune(graph, data, cluster, n_verify=0, measurements=m, progress=False).ranked
        return max(c.samplers for c, _ in ranked)

    assert most(None) == most(LocalClusterSpec()) == 2
    assert most(LocalClusterSpec(pack_samplers=False)) > 2
