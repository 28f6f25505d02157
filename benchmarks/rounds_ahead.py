"""Learner rounds per second under ``apex``: the next round submitted behind the one in flight, or not.

    dagrl bench rounds-ahead [--graph sac-pendulum-apex] [--repeats 3] [--env-steps 4000] [--set K=V ...]

Each repeat trains the graph twice on one embedded 3-worker LocalCluster, once running rounds ahead
(as dagrl does) and once with that turned off, in alternating order. Rounds per second count the
learner rounds after the warm-up, from the Task Stream: how many of the round's last learner task
ran, over the time from the first one's start to the last one's end. The ratio is taken per repeat,
so both runs of a pair share the machine's load at the time. Then, per task (fragment and role): the
median time computing, and the median time fetching its inputs from other workers, over each run's
tasks (the medians of the repeats' medians), where the round's time goes.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time

from _common import emit, table
from distributed import Client, get_task_stream

from dagrl.app.driver import Trainer
from dagrl.app.graphs import load_graph
from dagrl.app.progress import Progress
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.core.distribution import stream_shape
from dagrl.policies import build_policy
from dagrl.policies.streaming import Streaming
from dagrl.runtime.rundir import RunDir


def run(graph_name: str, overrides: list[str], ahead: bool, client: Client, root: str) -> dict:
    graph = load_graph(f"graphs/{graph_name}.yaml", [*overrides, "checkpoint.every=0", f"runs_dir={root}"])
    last = stream_shape(graph.algorithm).learn[-1].name
    rundir = RunDir.create(root, graph.name)
    policy = build_policy(graph, client, run_dir=rundir.path)
    if not isinstance(policy, Streaming):
        raise SystemExit(f"{graph_name}: policy {graph.spec.policy} does not stream (apex, split-learner do)")
    policy.runs_ahead = ahead
    t0 = time.perf_counter()
    try:
        with get_task_stream(client) as stream:
            summary = Trainer(graph, policy, rundir, progress=Progress(enabled=False)).run()
    finally:
        policy.close()
    wall = time.perf_counter() - t0
    spans = sorted(
        (t["startstops"][-1]["start"], t["startstops"][-1]["stop"])
        for t in stream.data
        if t["key"].startswith(f"{last}-")
    )
    rounds = len(spans)
    rate = rounds / (spans[-1][1] - spans[0][0]) if rounds > 1 else 0.0
    return {
        "ahead": ahead,
        "rounds": rounds,
        "rounds_s": rate,
        "wall_s": wall,
        "env_steps": summary["env_steps"],
        "tasks": task_times(stream.data),
    }


def task_times(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per ``fragment-role`` (the executor's task keys are ``fragment-role-index-uuid``): how many
    tasks ran, and the median milliseconds computing and fetching inputs from other workers."""
    spent: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: {"compute": [], "transfer": []})
    for t in records:
        parts = t["key"].split("-") if isinstance(t["key"], str) else []
        if len(parts) < 4:
            continue
        for s in t["startstops"]:
            kind = "compute" if s["action"] == "compute" else "transfer"
            spent[f"{parts[0]}-{parts[1]}"][kind].append(1e3 * (s["stop"] - s["start"]))
    return {
        name: {
            "n": len(v["compute"]),
            "compute_ms": statistics.median(v["compute"]) if v["compute"] else 0.0,
            "transfer_ms": statistics.median(v["transfer"]) if v["transfer"] else 0.0,
        }
        for name, v in spent.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", default="sac-pendulum-apex")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--env-steps", type=int, default=4000)
    p.add_argument("--set", dest="overrides", action="append", help="a graph override (default: hidden=64)")
    args = p.parse_args()
    args.overrides = args.overrides or ["hyperparameters.hidden=64"]
    overrides = [*args.overrides, f"stop.env_steps={args.env_steps}", "stop.mean_return=null"]
    root = tempfile.mkdtemp(prefix="dagrl-bench-rounds-")
    gpu_actors = load_graph(f"graphs/{args.graph}.yaml", overrides).n_gpu_actors  # a thread each on a GPU worker
    runs = []
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), 3, gpu_actors) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        for i in range(args.repeats):
            pair = {}
            for ahead in (False, True) if i % 2 == 0 else (True, False):
                pair[ahead] = run(args.graph, overrides, ahead, client, root)
                r = pair[ahead]
                print(f"repeat {i + 1} ahead={ahead}: {r['rounds']} rounds, {r['rounds_s']:.2f}/s", flush=True)
            ratio = pair[True]["rounds_s"] / pair[False]["rounds_s"]
            runs.append({"off": pair[False], "on": pair[True], "ratio": ratio})
    rows = [
        {
            "repeat": i + 1,
            "rounds/s not ahead": r["off"]["rounds_s"],
            "rounds/s ahead": r["on"]["rounds_s"],
            "ratio": r["ratio"],
        }
        for i, r in enumerate(runs)
    ]
    ratio = statistics.median(r["ratio"] for r in runs)
    print(f"\n{args.graph}, {args.env_steps} env steps, overrides {args.overrides}")
    print(table(rows, list(rows[0])))
    print(f"median ratio (ahead / not ahead): {ratio:.2f}")
    print("\nper task, ms (median over each run's tasks, then over the repeats):")
    columns = ["task", "tasks per run", "compute, not ahead", "compute, ahead", "inputs fetched, ahead"]
    print(table(breakdown(runs), columns))
    emit("rounds-ahead", {"graph": args.graph, "overrides": args.overrides, "runs": runs, "ratio": ratio})


def breakdown(runs: list[dict]) -> list[dict]:
    def median(mode: str, name: str, key: str) -> float:
        return statistics.median(r[mode]["tasks"].get(name, {}).get(key, 0.0) for r in runs)

    names = sorted({n for r in runs for mode in ("off", "on") for n in r[mode]["tasks"]})
    rows = [
        {
            "task": name,
            "tasks per run": median("on", name, "n"),
            "compute, not ahead": median("off", name, "compute_ms"),
            "compute, ahead": median("on", name, "compute_ms"),
            "inputs fetched, ahead": median("on", name, "transfer_ms"),
        }
        for name in names
    ]
    return sorted(rows, key=lambda r: -r["compute, ahead"] * r["tasks per run"])


if __name__ == "__main__":
    main()
