"""``dagrl sweep``: settings x seeds as trials, each a whole run in one Dask task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from distributed import get_task_stream

from dagrl.app.aggregate import bootstrap_interval, iqm
from dagrl.app.cli import main
from dagrl.app.sweep import markdown, parse_grid, plan, run_sweep, table
from dagrl.core.schema import ConfigError
from dagrl.dashboard import METRICS
from dagrl.runtime.workers import workers as live_workers


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["hyperparameters.lr"], "expected KEY=VALUE1,VALUE2"),
        (["hyperparameters.lr=1e-3,,3e-4"], "empty value"),
        (["seed=1,2"], "--seeds"),
        (["policy=sync,async"], "policy single"),
        (["hyperparameters.lr=1e-3", "hyperparameters.lr=3e-4"], "given twice"),
    ],
)
def test_a_grid_that_cannot_be_one_is_refused_naming_it(items, message):
    with pytest.raises(ConfigError, match=message):
        parse_grid(items)


def test_the_trials_are_every_setting_with_every_seed(graphs_dir):
    base, trials = plan(
        f"{graphs_dir}/ppo-cartpole-sync.yaml",
        ["stop.iterations=2"],
        ["hyperparameters.lr=1e-3,3e-4", "hyperparameters.update_epochs=4,8,10"],
        [1, 2],
    )
    assert base.spec.policy == "sync" and len(trials) == 12
    assert len({(t.setting, t.seed) for t in trials}) == 12 and len({t.dirname for t in trials}) == 12
    first = trials[0]
    assert first.label == "lr=1e-3,update_epochs=4" and first.dirname == "lr-1e-3_update_epochs-4_seed-1"
    assert first.overrides[-2:] == ("seed=1", "policy=single") and "stop.iterations=2" in first.overrides


def test_a_bad_value_in_the_grid_names_key_value_and_trial_before_any_cluster(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(
        ["sweep", "ppo-cartpole-single", "--grid", "hyperparameters.lr=1e-3,fast", "--seeds", "1", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "hyperparameters.lr" in err and "fast" in err and "(in the trial hyperparameters.lr=fast, seed 1)" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool", "gpu"], "--pool: 'gpu' is not a pool of the cluster file (none: not a SLURM cluster file)"),
        (["--workers", "0"], "--workers: must be >= 1, got 0"),
        (["--seeds", "1", "1"], "--seeds: seeds repeat: [1, 1]"),
    ],
)
def test_bad_sweep_options_are_one_line_before_any_cluster(args, message, tmp_path, capsys):
    code = main(["sweep", "ppo-cartpole-single", "--out", str(tmp_path / "sweep"), *args])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


def test_trials_run_as_tasks_on_the_workers_and_the_table_sums_them_per_setting(client, graphs_dir, tmp_path):
    graph = f"{graphs_dir}/ppo-cartpole-sync.yaml"
    sets = ["stop.iterations=3", "checkpoint.every=0", "evaluate.every=3"]
    _, trials = plan(graph, sets, ["hyperparameters.lr=1e-3,3e-3"], [1, 2])
    with get_task_stream(client) as stream:
        rows = run_sweep(client, graph, trials, tmp_path / "sweep", progress=False)
    assert [(r["setting"], r["trials"], r["failed"]) for r in rows] == [("lr=1e-3", 2, 0), ("lr=3e-3", 2, 0)]
    assert all(r["stops"] == {"iterations": 2} for r in rows)
    records = [json.loads(line) for line in (tmp_path / "sweep" / "trials.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["summary"]["iterations"] == 3 for r in records)
    evals = [r["summary"]["eval_return"] for r in records if r["setting"] == "lr=1e-3"]
    assert None not in evals and rows[0]["eval_iqm"] == pytest.approx(np.mean(evals))  # 2 trials: IQM = mean
    returns = {}
    for rec in records:  # each trial's own run directory, with its own setting and seed
        config = yaml.safe_load(Path(rec["run_dir"], "config.yaml").read_text())
        assert config["policy"] == "single" and config["seed"] == rec["seed"]
        assert config["hyperparameters"]["lr"] == float(rec["setting"].split("=")[1])
        metrics = [json.loads(line) for line in Path(rec["run_dir"], "metrics.jsonl").read_text().splitlines()]
        returns[(rec["setting"], rec["seed"])] = [m.get("losses/value") for m in metrics]
    assert returns[("lr=1e-3", 1)] != returns[("lr=1e-3", 2)]  # the seeds are the trials' own
    assert returns[("lr=1e-3", 1)] != returns[("lr=3e-3", 1)]
    workers = set(live_workers(client))
    ran = [t for t in stream.data if t["key"].startswith("trial-lr-")]
    assert len(ran) == 4 and {t["worker"] for t in ran} <= workers  # on the cluster's workers
    assert len({t["worker"] for t in ran}) >= 2  # side by side
    assert json.loads((tmp_path / "sweep" / "results.json").read_text())["rows"] == rows
    # every trial's rows reached the scheduler for the RL page, from the worker that ran it
    published = {}
    for _, msg in client.get_events(METRICS):
        published.setdefault(msg["run"], []).extend(one["row"]["iteration"] for one in msg["rows"])
    for rec in records:
        assert published[Path(rec["run_dir"]).name] == [1, 2, 3], published


def test_a_failing_trial_is_recorded_and_the_others_finish(client, graphs_dir, tmp_path):
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    _, trials = plan(graph, ["stop.iterations=30"], ["env.id=CartPole-v1,tests.faulty:CrashLoop-v0"], [1])
    rows = run_sweep(client, graph, trials, tmp_path / "sweep", progress=False)
    assert [(r["setting"], r["failed"]) for r in rows] == [("id=CartPole-v1", 0), ("id=tests.faulty:CrashLoop-v0", 1)]
    records = [json.loads(line) for line in (tmp_path / "sweep" / "trials.jsonl").read_text().splitlines()]
    [failed] = [r for r in records if "error" in r]
    assert "simulator licence expired" in failed["error"]
    assert rows[0]["stops"] == {"iterations": 1} and rows[1]["mean_return"] is None


def test_the_table_gives_each_setting_its_mean_spread_and_stops():
    records = [
        {"setting": "lr=1", "seed": 1, "summary": {"mean_return": 10.0, "env_steps": 100, "elapsed_s": 1.0,
                                                   "stop_reason": "iterations"}},
        {"setting": "lr=1", "seed": 2, "error": "RuntimeError: env exploded"},
        {"setting": "lr=2", "seed": 1, "summary": {"mean_return": 30.0, "env_steps": 300, "elapsed_s": 3.0,
                                                   "stop_reason": "mean_return"}},
        {"setting": "lr=2", "seed": 2, "summary": {"mean_return": 50.0, "env_steps": 100, "elapsed_s": 1.0,
                                                   "stop_reason": "mean_return"}},
    ]  # fmt: skip
    rows = table(records)
    assert rows[0] == {"setting": "lr=1", "trials": 2, "failed": 1, "mean_return": 10.0, "std_return": 0.0,
                       "iqm_return": 10.0, "ci_return": None,  # one trial: no interval
                       "eval_iqm": None, "eval_ci": None,  # no evaluation
                       "env_steps": 100.0, "elapsed_s": 1.0, "stops": {"iterations": 1}}  # fmt: skip
    assert rows[1]["mean_return"] == 40.0 and rows[1]["std_return"] == 10.0 and rows[1]["env_steps"] == 200.0
    assert rows[1]["iqm_return"] == 40.0 and rows[1]["ci_return"] == [30.0, 50.0]  # resampled: 30, 40 or 50
    lines = markdown(rows).splitlines()
    assert lines[0].split(" | ")[5:8] == ["IQM", "95 % CI of IQM", "env steps"]  # no eval columns
    assert lines[2].split(" | ")[5:7] == ["10.0", "-"] and lines[3].split(" | ")[5:7] == ["40.0", "30.0 to 50.0"]


def test_the_table_gives_the_final_greedy_evaluations_iqm_where_the_graph_evaluates():
    """A trial's final evaluation is the one its stop waited for (``summary["eval"]``), else the newest
    that finished (``eval_return``); settings whose trials never evaluated show none."""
    base = {"mean_return": 10.0, "env_steps": 100, "elapsed_s": 1.0, "stop_reason": "iterations"}
    records = [
        {"setting": "a", "seed": 1, "summary": {**base, "eval_return": 150.0, "eval": {"eval/return_mean": 200.0}}},
        {"setting": "a", "seed": 2, "summary": {**base, "eval_return": 100.0}},
        {"setting": "b", "seed": 1, "summary": {**base, "eval_return": None}},
    ]
    rows = table(records)
    assert rows[0]["eval_iqm"] == 150.0 and rows[0]["eval_ci"] == [100.0, 200.0]  # 200 (waited for) and 100
    assert rows[1]["eval_iqm"] is None and rows[1]["eval_ci"] is None
    lines = markdown(rows).splitlines()
    assert lines[0].split(" | ")[7:9] == ["eval IQM", "95 % CI of eval IQM"]
    assert lines[2].split(" | ")[7:9] == ["150.0", "100.0 to 200.0"] and lines[3].split(" | ")[7:9] == ["-", "-"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 10, 13])
def test_the_iqm_cuts_a_quarter_of_the_runs_from_each_end_as_scipy_does(n):
    from scipy.stats import trim_mean

    x = np.random.default_rng(n).normal(100.0, 30.0, n)
    assert iqm(x) == pytest.approx(trim_mean(x, 0.25))
    if n >= 3:  # 4 runs or more: one seed gone wild is cut
        assert iqm(np.append(x, 1e9)) < 1000.0


def test_the_bootstrap_interval_is_scipys_percentile_bootstrap_of_the_iqm():
    """Against ``scipy.stats.bootstrap`` (percentile method, another RNG): the same interval within the
    resampling noise of 20,000 draws, for a sweep's typical 10 seeds with one collapsed."""
    from scipy.stats import bootstrap, trim_mean

    runs = np.array([480.0, 500.0, 500.0, 310.0, 495.0, 470.0, 500.0, 120.0, 455.0, 500.0])
    ours = bootstrap_interval(runs, resamples=20_000)
    theirs = bootstrap(
        (runs,), lambda x, axis: trim_mean(x, 0.25, axis=axis), n_resamples=20_000, method="percentile", rng=1
    ).confidence_interval
    assert ours == pytest.approx((theirs.low, theirs.high), abs=15.0)  # scipy over its own seeds: 372.5-380
    assert ours[0] < iqm(runs) < ours[1] and ours[1] - ours[0] > 20  # ten runs, one collapsed: still wide
    assert bootstrap_interval(runs) == bootstrap_interval(runs)  # seeded: a table read twice stays
    assert bootstrap_interval(runs[:1]) is None
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval(runs, level=95)


def test_a_sweep_started_again_reads_back_what_ended_and_runs_nothing_twice(client, graphs_dir, tmp_path):
    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    _, trials = plan(graph, ["stop.iterations=2"], [], [1, 2])
    first = run_sweep(client, graph, trials, tmp_path / "sweep", progress=False)
    with get_task_stream(client) as stream:
        again = run_sweep(client, graph, trials, tmp_path / "sweep", progress=False)
    assert again == first and first[0]["trials"] == 2
    assert not [t for t in stream.data if t["key"].startswith("trial-")]
    assert len((tmp_path / "sweep" / "trials.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_trial_whose_worker_is_killed_goes_on_from_its_checkpoint_elsewhere(client, graphs_dir, tmp_path):
    import os
    import signal
    import threading
    import time

    graph = f"{graphs_dir}/ppo-cartpole-single.yaml"
    sets = ["stop.iterations=150", "stop.mean_return=100000", "checkpoint.every=10"]
    _, trials = plan(graph, sets, [], [1])
    out = tmp_path / "sweep"
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(rows=run_sweep(client, graph, trials, out, progress=False)))
    thread.start()
    run = out / trials[0].dirname
    end = time.monotonic() + 120
    while not [c for c in (run / "checkpoints").glob("ckpt-*.pt") if int(c.stem.split("-")[1]) >= 10]:
        assert time.monotonic() < end, "no checkpoint"
        time.sleep(0.1)
    before = (run / "metrics.jsonl").read_text().splitlines()[:10]  # up to the first checkpoint
    [worker] = [w for w, keys in client.processing().items() if any(k.startswith("trial-") for k in keys)]
    os.kill(client.run(os.getpid, workers=[worker])[worker], signal.SIGKILL)
    thread.join(240)
    assert not thread.is_alive()
    [row] = result["rows"]
    assert row["failed"] == 0 and row["stops"] == {"iterations": 1}
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert rows[:10] == before  # resumed from the checkpoint, not started over
    assert [json.loads(r)["iteration"] for r in rows] == list(range(1, 151))


def test_trials_on_workers_find_an_env_the_driver_registered_under_a_plain_id(client, graphs_dir, tmp_path):
    """The id a user's module registered, imported by the driver only: each trial names the module too."""
    import tests.registered_env as registered

    def known(env_id):
        import gymnasium

        return env_id in gymnasium.registry

    assert not any(client.run(known, registered.ID).values())  # the workers never imported the module
    graph = f"{graphs_dir}/ppo-cartpole-sync.yaml"
    _, trials = plan(graph, [f"env.id={registered.ID}", "stop.iterations=1", "checkpoint.every=0"], [], [1])
    rows = run_sweep(client, graph, trials, tmp_path / "sweep", progress=False)
    record = json.loads((tmp_path / "sweep" / "trials.jsonl").read_text())
    assert rows[0]["failed"] == 0, record
    config = yaml.safe_load(Path(record["run_dir"], "config.yaml").read_text())
    assert config["env"]["id"] == f"tests.registered_env:{registered.ID}"
