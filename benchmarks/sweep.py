"""Seeds side by side: ``dagrl sweep`` on the embedded LocalCluster vs the same runs one after another.

    dagrl bench sweep [--graph ppo-cartpole-single] [--seeds 1 2 3 4] [--iterations 200] [--rounds 2]
                      [--workers N]

The same trials (the graph under ``single`` for ``--iterations`` iterations, one per seed) are run
two ways, alternated over ``--rounds``: one after another in this process (``dagrl.train``, what a
shell loop over seeds does, less the interpreter and torch start-up it would also pay per run), and
as one sweep on a LocalCluster of ``--workers`` single-threaded worker processes (default: one per
core), cluster start-up included. Reported: wall seconds of each and the speedup (sequential / sweep),
against the core count as its ceiling.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import emit, table

from dagrl.app.catalog import resolve
from dagrl.app.graphs import load_graph
from dagrl.app.sweep import plan, run_sweep, sweep_client
from dagrl.app.training import train
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.runtime.rundir import RunDir


def sequential(graph_path: str, trials: list, out: Path) -> float:
    t0 = time.perf_counter()
    for t in trials:
        graph = load_graph(graph_path, list(t.overrides))
        rundir = RunDir.create(out, t.dirname)
        train(graph, rundir=rundir)
    return time.perf_counter() - t0


def swept(graph_path: str, trials: list, out: Path, workers: int | None) -> float:
    t0 = time.perf_counter()
    with sweep_client(LocalClusterSpec(), len(trials), workers) as client:
        rows = run_sweep(client, graph_path, trials, out, progress=False)
    assert all(r["failed"] == 0 for r in rows), rows
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", default="ppo-cartpole-single")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args()
    logging.getLogger("dagrl").setLevel(logging.WARNING)  # the in-process runs' own log lines

    graph_path = str(resolve("graphs", args.graph, "--graph"))
    sets = [f"stop.iterations={args.iterations}", "stop.mean_return=100000", "checkpoint.every=0"]
    _, trials = plan(graph_path, sets, [], args.seeds)
    workers = args.workers or min(len(trials), os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dagrl-bench-sweep-") as tmp:
        for r in range(args.rounds):
            seq = sequential(graph_path, trials, Path(tmp) / f"seq-{r}")
            par = swept(graph_path, trials, Path(tmp) / f"sweep-{r}", workers)
            rows.append({"round": r + 1, "sequential_s": seq, "sweep_s": par, "speedup": seq / par})
            records = (Path(tmp) / f"sweep-{r}" / "trials.jsonl").read_text().splitlines()
            trial_s = [json.loads(line)["summary"]["elapsed_s"] for line in records]
            rows[-1]["trial_training_s"] = statistics.mean(trial_s)
            print(table(rows[-1:], ["round", "sequential_s", "sweep_s", "speedup", "trial_training_s"]), flush=True)
    speedup = statistics.median(r["speedup"] for r in rows)
    print(f"{len(trials)} trials of {args.iterations} iterations: sweep on {workers} workers {speedup:.2f} x "
          f"one after another (ceiling {workers})")  # fmt: skip
    emit("sweep", {"trials": len(trials), "iterations": args.iterations, "workers": workers, "rounds": rows,
                   "speedup": speedup})  # fmt: skip


if __name__ == "__main__":
    main()
