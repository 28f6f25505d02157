"""Does IMPALA under ``async`` stay learnt? Settings x seeds, a fixed budget, no return stop.

    dagrl bench impala-stability [--graph graphs/impala-cartpole.yaml] [--seeds 1 2 3 4]
        [--env-steps 150000] [--setting NAME KEY=VALUE ...] ...

Each run trains the graph under its own policy (``async`` as shipped) on one embedded LocalCluster of
three single-threaded workers (two samplers and a learner, as the test suite's), for ``--env-steps``
with the mean-return stop off, so a run that reached 475 goes on and shows whether it stays there.
A setting is a name and graph overrides (``--setting lr1e-3 hyperparameters.lr=1.0e-3``); with no
``--setting``, the graph as written. Per setting: the env steps to a mean return of 475 (window
20), runs that *collapsed for good* (at the end: policy entropy under 0.01, one action always, and
mean return under 100), the lowest return after first reaching 475, the largest mean KL of one batch.
Settings alternate within each seed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import emit, table

TARGET = 475.0


def outcome(rows: list[dict]) -> dict:
    ret = [r.get("charts/episode_return_mean") for r in rows]
    first = next((i for i, x in enumerate(ret) if x is not None and x >= TARGET), None)
    after = [x for x in ret[first:] if x is not None] if first is not None else []
    last = rows[-1]
    return {
        "to_475": None if first is None else rows[first]["env_steps"],
        "collapsed": last["losses/entropy"] < 0.01 and (ret[-1] or 0.0) < 100,
        "min_after_475": min(after) if after else None,
        "max_kl": max(r["losses/approx_kl"] for r in rows),
        "final": ret[-1],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", default="graphs/impala-cartpole.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--env-steps", type=int, default=150_000)
    p.add_argument("--setting", nargs="+", action="append", metavar=("NAME", "KEY=VALUE"), default=None)
    args = p.parse_args()
    settings = {s[0]: s[1:] for s in args.setting} if args.setting else {"as-written": []}

    from distributed import Client, LocalCluster

    import dagrl
    from dagrl.clusters import untrimmed
    from dagrl.graph import load_graph
    from dagrl.runtime.rundir import RunDir

    runs: dict[str, list[dict]] = {name: [] for name in settings}
    with (
        tempfile.TemporaryDirectory(prefix="dagrl-bench-impala-") as tmp,
        untrimmed(),
        LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        for seed in args.seeds:
            for name, overrides in settings.items():
                fixed = [f"seed={seed}", "stop.mean_return=1.0e9", f"stop.env_steps={args.env_steps}"]
                fixed += ["stop.wall_time_s=1.0e9", "checkpoint.every=0", f"runs_dir={Path(tmp) / name}"]
                summary = dagrl.train(load_graph(args.graph, [*overrides, *fixed]), client)
                got = {"seed": seed, **outcome(RunDir(summary["run_dir"]).read_metrics())}
                runs[name].append(got)
                print(name, got, flush=True)
    rows = []
    for name, got in runs.items():
        reached = [g["to_475"] for g in got if g["to_475"] is not None]
        rows.append({
            "setting": name,
            "overrides": " ".join(settings[name]) or "-",
            "runs": len(got),
            "reached 475": len(reached),
            "median steps to 475": statistics.median(reached) if reached else None,
            "collapsed": sum(g["collapsed"] for g in got),
            "max KL (median)": statistics.median(g["max_kl"] for g in got),
            "per seed (steps to 475 / final)": " ".join(f"{g['to_475'] or '-'}/{g['final'] or 0:.0f}" for g in got),
        })  # fmt: skip
    print(f"\n{args.graph} for {args.env_steps:,} env steps, no return stop, seeds {args.seeds}")
    print(table(rows, list(rows[0])))
    emit("impala-stability", {"args": vars(args), "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
