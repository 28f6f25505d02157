"""``dagrl tune`` judged by time to target: the tuned graph vs the graph as written vs ``single``.

    dagrl bench tune [--graphs ppo-cartpole sac-pendulum-apex] [--seeds 1 2 3] [--budget-s 120]
                     [--set stop.mean_return=2000 ...]

For each graph: ``dagrl tune`` (measure, predict, verify) on an embedded LocalCluster, then each of
the three graphs trained to the graph's own ``stop.mean_return`` with each seed, side by side in one
run. ``single`` is the graph as written with every sampler's envs in one sampler under ``single``
(same batch, same hyperparameters), the tuner's own ``single`` candidate. Reports the median wall time
to target of each, ``tuned / best of the others`` (target <= 0.9), and for every verified candidate
but the calibration run predicted vs achieved env steps/s (target: within 20 %).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import emit, table

from dagrl.app.catalog import resolve
from dagrl.app.graphs import load_graph, resolve_graph
from dagrl.app.training import train
from dagrl.app.tune import shape_of, tune, write_tuned
from dagrl.app.tune.model import Candidate
from dagrl.app.tune.tuner import candidate_data
from dagrl.core.schema import apply_overrides, read_yaml


def to_target(data: dict, where: str, seed: int, runs: str, name: str) -> dict:
    data = {**data, "seed": seed, "runs_dir": runs, "evaluate": {"every": 0}, "name": name}
    data["checkpoint"] = {"every": 10**6, "keep": 1}
    summary = train(resolve_graph(data, where))
    return {
        "reached": summary["stop_reason"] == "mean_return",
        "s": summary["elapsed_s"],
        "steps": summary["env_steps"],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graphs", nargs="+", default=["ppo-cartpole"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--budget-s", type=float, default=120.0)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every graph (the target)")
    args = p.parse_args()
    results, verified = [], []
    for name in args.graphs:
        path = str(resolve("graphs", name, "--graphs"))
        data, graph = apply_overrides(read_yaml(path), args.set), load_graph(path, args.set)
        shape = shape_of(graph)
        tuning = tune(graph, data, None, budget_s=args.budget_s, progress=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / f"{graph.name}-tuned.yaml"
            write_tuned(tuning, data, " ".join(["dagrl bench tune --graphs", name, *args.set]), out, path)
            print(out.read_text())
            tuned = read_yaml(out)
            if shape.onpolicy:
                one = Candidate("single", 1, shape.round_steps // shape.length, shape.length, 1)
            else:
                one = Candidate("single", 1, 1, shape.round_steps, 1)
            variants = {"as written": data, "single": candidate_data(data, shape, one), "tuned": tuned}
            times: dict[str, list[float]] = {k: [] for k in variants}
            labels = list(variants)
            for i, seed in enumerate(args.seeds):  # the order turns with the seed: no variant always runs first
                for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                    d = variants[label]
                    r = to_target(d, path, seed, tmp, f"{graph.name}-{label.replace(' ', '-')}")
                    print(f"{name} seed {seed} {label}: {r}", flush=True)
                    times[label].append(r["s"] if r["reached"] else float("inf"))
        med = {k: statistics.median(v) for k, v in times.items()}
        best_other = min(med["as written"], med["single"])
        results.append({
            "graph": name, "as_written_s": med["as written"], "single_s": med["single"], "tuned_s": med["tuned"],
            "tuned_vs_best": med["tuned"] / best_other, "tuned": tuning.chosen.candidate.describe(),
        })  # fmt: skip
        calibrated_on = tuning.measurements.calibration.get("candidate")
        for r in tuning.verified:  # the calibration run matches its prediction by construction: left out
            if r.predicted is not None and r.achieved and r.candidate.describe() != calibrated_on:
                verified.append({
                    "graph": name, "candidate": r.candidate.describe(), "predicted": r.predicted.steps_s,
                    "achieved": r.achieved, "error": r.predicted.steps_s / r.achieved - 1,
                })  # fmt: skip
    print(table(results, ["graph", "as_written_s", "single_s", "tuned_s", "tuned_vs_best", "tuned"]))
    print(table(verified, ["graph", "candidate", "predicted", "achieved", "error"]))
    emit("tune", {
        "graphs": results, "verified": verified, "seeds": args.seeds, "budget_s": args.budget_s, "set": args.set,
    })  # fmt: skip


if __name__ == "__main__":
    main()
