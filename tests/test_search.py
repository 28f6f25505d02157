"""``dagrl sweep --search random|optuna`` and ``dagrl pbt``: trials and members as runs on the LocalCluster's
workers, reaching CartPole's target; the pruner stops a trial below the median; the lineage shows the
exploit steps."""

from __future__ import annotations

import json
import math
import random

import optuna
import pytest

from dagrl.app.cli import main
from dagrl.app.pbt import FACTORS, perturb
from dagrl.app.search import STUDY, Reporter, Space, parse_space, study
from dagrl.core.schema import ConfigError


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["hyperparameters.lr"], "expected KEY=LOW:HIGH"),
        (["hyperparameters.lr=1e-3:1e-4"], "LOW must be below HIGH"),
        (["hyperparameters.lr=0:1e-2:log"], "log range must be above 0"),
        (["hyperparameters.lr=a:b"], "must be numbers"),
        (["hyperparameters.lr=1e-3:1e-2:ln"], "LOW:HIGH:log"),
        (["hyperparameters.update_epochs=10"], "two or more values"),
        (["seed=1:5"], "first seed"),
        (["hyperparameters.lr=1e-4:1e-3", "hyperparameters.lr=1e-3:1e-2"], "given twice"),
        ([], "at least one --space"),
    ],
)
def test_a_space_that_cannot_be_one_is_refused_naming_it(items, message):
    with pytest.raises(ConfigError, match=message):
        parse_space(items)


def test_ranges_choices_and_integers_are_read_as_written():
    lr, epochs, batch = parse_space(
        [
            "hyperparameters.lr=1e-4:1e-2:log",
            "hyperparameters.update_epochs=5,10,20",
            "hyperparameters.minibatch_size=64:512",
        ]
    )
    assert (lr.low, lr.high, lr.log, lr.integer) == (1e-4, 1e-2, True, False)
    assert epochs.choices == ("5", "10", "20")
    assert batch.integer and (batch.low, batch.high) == (64, 512)


def test_a_value_the_graph_refuses_names_the_space_item_before_any_cluster(tmp_path, capsys):
    out = tmp_path / "search"
    args = ["sweep", "ppo-cartpole-single", "--search", "random", "--space", "hyperparameters.gamma=0.9:1.5"]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "hyperparameters.gamma" in err and "(from --space hyperparameters.gamma=1.5)" in err
    assert not out.exists()
    assert main(["sweep", "ppo-cartpole-single", "--space", "hyperparameters.lr=1e-4:1e-3"]) == 2
    assert "--search random or --search optuna" in capsys.readouterr().err


def test_the_median_pruner_stops_a_trial_below_the_earlier_trials_at_a_milestone(tmp_path):
    found = study(tmp_path, "optuna", seed=0, pruning=True)
    for value in (400.0, 420.0, 380.0, 450.0, 410.0):  # five trials that ended, each reporting at 1,000 steps
        trial = found.ask()
        trial.report(value / 2, 1000)
        found.tell(trial, value)
    low, high = found.ask(), found.ask()
    journal = str(tmp_path / "study.journal")
    Reporter(journal, high.number, 1000, pruning=True)({"env_steps": 1024, "charts/episode_return_mean": 300.0}, None)
    reporter = Reporter(journal, low.number, 1000, pruning=True)
    reporter({"env_steps": 512, "charts/episode_return_mean": 20.0}, None)  # before the milestone: not asked
    with pytest.raises(optuna.TrialPruned, match="1,000 env steps, mean return 30.0"):
        reporter({"env_steps": 1088, "charts/episode_return_mean": 30.0}, None)
    unpruned = Reporter(journal, low.number, 1000, pruning=False)  # NopPruner: reports, never stops
    unpruned({"env_steps": 2048, "charts/episode_return_mean": 30.0}, None)
    stored = optuna.load_study(study_name=STUDY, storage=found._storage).trials[low.number]
    assert stored.intermediate_values == {1000: 30.0, 2000: 30.0}


@pytest.mark.slow
def test_an_optuna_search_on_the_cluster_reaches_cartpoles_target(tmp_path, capsys):
    out = tmp_path / "search"
    args = [
        "sweep", "ppo-cartpole-single", "--search", "optuna", "--trials", "6", "--workers", "2", "--seeds", "1",
        "--space", "hyperparameters.lr=5e-4:2e-3:log", "--space", "hyperparameters.update_epochs=10,20",
        "--set", "stop.env_steps=60000", "--out", str(out), "--quiet",
    ]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert sorted(r["trial"] for r in records) == list(range(6))
    best = max((r for r in records if r["state"] == "complete"), key=lambda r: r["value"])
    assert best["stop_reason"] == "mean_return" and best["value"] >= 475, records
    assert all(5e-4 <= r["params"]["hyperparameters.lr"] <= 2e-3 for r in records)
    assert (out / f"trial-{best['trial']:03d}" / "summary.json").exists()
    assert f"| {best['trial']} | complete |" in printed.splitlines()[2]  # best first
    assert "bokeh" in (out / "results.html").read_text()
    done = study(out, "optuna", seed=1, pruning=True)  # the search's own, loaded from its journal
    assert len([t for t in done.trials if t.state.is_finished()]) == 6


def test_a_random_search_draws_its_trials_inside_the_space(tmp_path):
    out = tmp_path / "random"
    args = [
        "sweep", "ppo-cartpole-single", "--search", "random", "--trials", "3", "--workers", "1",
        "--space", "hyperparameters.lr=1e-4:1e-3:log", "--space", "hyperparameters.update_epochs=2,4",
        "--set", "stop.iterations=2", "--out", str(out), "--quiet",
    ]  # fmt: skip
    assert main(args) == 0
    records = json.loads((out / "results.json").read_text())["trials"]
    assert [r["state"] for r in records] == ["complete"] * 3
    assert len({r["params"]["hyperparameters.lr"] for r in records}) == 3
    assert all(r["params"]["hyperparameters.update_epochs"] in ("2", "4") for r in records)


def test_exploring_moves_a_range_by_its_factors_inside_it_and_redraws_a_choice_now_and_then():
    rng = random.Random(0)
    lr, epochs = Space("lr", 1e-4, 1e-2, log=True), Space("epochs", choices=("5", "10"))
    assert {round(perturb(lr, 1e-3, rng) / 1e-3, 9) for _ in range(50)} == set(FACTORS)
    assert perturb(lr, 9.5e-3, random.Random(1)) <= 1e-2 and perturb(lr, 1.1e-4, random.Random(1)) >= 1e-4
    redrawn = [perturb(epochs, "5", rng) for _ in range(400)]
    assert 0.05 < redrawn.count("10") / 400 < 0.2  # drawn again a quarter of the time, half of those the other


@pytest.mark.slow
def test_a_pbt_population_reaches_cartpoles_target_and_its_lineage_shows_the_exploits(tmp_path, capsys):
    out = tmp_path / "pbt"
    args = [
        "pbt", "ppo-cartpole-single", "--perturb", "hyperparameters.lr=1e-4:3e-3:log", "--population", "4",
        "--interval", "8000", "--workers", "2", "--set", "stop.env_steps=120000", "--out", str(out), "--quiet",
    ]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())["members"]
    assert results[0]["stop_reason"] == "mean_return" and results[0]["score"] >= 475, results
    rows = [json.loads(line) for line in (out / "lineage.jsonl").read_text().splitlines()]
    exploits = [r for r in rows if r["event"] == "exploit"]
    assert exploits, rows
    for e in exploits:  # a copy of a better member's checkpoint, its rate times 0.8 or 1.2
        assert e["from_score"] > e["score"] and e["from"] != e["member"] and e["checkpoint"].endswith(".pt")
        ready = next(r for r in rows if r["event"] == "ready" and r["round"] == e["round"] and r["member"] == e["from"])
        ratio = e["after"]["hyperparameters.lr"] / ready["params"]["hyperparameters.lr"]
        assert any(math.isclose(ratio, f) for f in FACTORS) or e["after"]["hyperparameters.lr"] in (1e-4, 3e-3)
        later = [
            r for r in rows if r["event"] == "ready" and r["round"] == e["round"] + 1 and r["member"] == e["member"]
        ]
        assert not later or later[0]["params"] == e["after"]
    assert "lineage.jsonl" in capsys.readouterr().out


def test_a_resumed_optimizer_keeps_its_moments_and_takes_the_graphs_rate():
    """A PBT member (or ``--set hyperparameters.lr=...`` on a resume) learns at its own rate from the copied
    optimizer state."""
    import torch

    from dagrl.nn.optim import adam, load_state

    w = torch.nn.Parameter(torch.ones(3))
    before = adam([w], lr=1e-3, device="cpu")
    w.sum().backward()
    before.step()
    after = adam([w], lr=5e-4, device="cpu")
    load_state(after, before.state_dict())
    assert after.param_groups[0]["lr"] == 5e-4
    assert torch.equal(after.state[w]["exp_avg"], before.state[w]["exp_avg"])
