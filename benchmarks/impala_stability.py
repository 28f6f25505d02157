"""Does IMPALA under ``async`` stay learnt? Settings x seeds, a fixed budget, no return stop.

    dagrl bench impala-stability [--graph graphs/impala-cartpole.yaml] [--seeds 1 2 3 4]
        [--env-steps 150000] [--setting NAME KEY=VALUE ...] ...

Each run trains the graph under its own policy (``async`` as shipped) on one embedded LocalCluster of
three single-threaded workers (two samplers and a learner, as the test suite's), for ``--env-steps``
with the mean-return stop off, so a run that reached its target (the graph's ``stop.mean_return``,
475 for CartPole) goes on and shows whether it stays there. A setting is a name and graph overrides
(``--setting lr1e-3 hyperparameters.lr=1.0e-3``); with no ``--setting``, the graph as written. Per
setting: the env steps to the target, runs that *collapsed for good* (at the end: policy entropy
under 0.01, one action always, and a mean return under ``--floor``), the lowest return after first
reaching the target, the largest mean KL of one batch. Settings alternate within each seed. Any graph
whose algorithm logs ``losses/entropy`` and ``losses/approx_kl`` (PPO's and IMPALA's) will do.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import emit, table


def outcome(rows: list[dict], target: float, floor: float) -> dict:
    ret = [r.get("charts/episode_return_mean") for r in rows]
    first = next((i for i, x in enumerate(ret) if x is not None and x >= target), None)
    after = [x for x in ret[first:] if x is not None] if first is not None else []
    final = ret[-1]
    return {
        "to_target": None if first is None else rows[first]["env_steps"],
        "collapsed": rows[-1]["losses/entropy"] < 0.01 and final is not None and final < floor,
        "min_after_target": min(after) if after else None,
        "max_kl": max(r["losses/approx_kl"] for r in rows),
        "final": final,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", default="graphs/impala-cartpole.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--env-steps", type=int, default=150_000)
    p.add_argument("--setting", nargs="+", action="append", metavar=("NAME", "KEY=VALUE"), default=None)
    p.add_argument("--floor", type=float, default=100.0, help="a collapsed run ends below this mean return")
    args = p.parse_args()
    settings = {s[0]: s[1:] for s in args.setting} if args.setting else {"as-written": []}

    from distributed import Client, LocalCluster

    import dagrl
    from dagrl.app.graphs import load_graph
    from dagrl.clusters.local import untrimmed
    from dagrl.runtime.rundir import RunDir

    target = load_graph(args.graph).spec.stop.mean_return
    if target is None:
        raise SystemExit(f"{args.graph}: stop.mean_return is not set; the benchmark needs a target return")
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
                got = {"seed": seed, **outcome(RunDir(summary["run_dir"]).read_metrics(), target, args.floor)}
                runs[name].append(got)
                print(name, got, flush=True)
    rows = []
    for name, got in runs.items():
        per_seed = " ".join(f"{g['to_target'] or '-'}/{g['final'] or 0:.0f}" for g in got)
        reached = [g["to_target"] for g in got if g["to_target"] is not None]
        rows.append({
            "setting": name,
            "overrides": " ".join(settings[name]) or "-",
            "runs": len(got),
            f"reached {target:g}": len(reached),
            "median steps to it": statistics.median(reached) if reached else None,
            "collapsed": sum(g["collapsed"] for g in got),
            "max KL (median)": statistics.median(g["max_kl"] for g in got),
            "per seed (steps to target / final)": per_seed,
        })  # fmt: skip
    print(f"\n{args.graph} for {args.env_steps:,} env steps, no return stop, seeds {args.seeds}")
    print(table(rows, list(rows[0])))
    emit("impala-stability", {"args": vars(args), "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
