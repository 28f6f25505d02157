"""Small collects under ``apex``: env steps/s of a graph in one process and under ``apex``, side by side.

    dagrl bench small-collects [--pairs GRAPH[,APEX_GRAPH]:ENV_STEPS ...] [--repeats 2]

Each pair is a graph as written (``single``) and its ``apex`` twin: the graph named after the comma, else
the same graph with ``policy=apex`` and two samplers (nothing else changed, so the same updates per env
step). Each runs for ``ENV_STEPS`` with no return target, the two alternating ``--repeats`` times on
one machine. The rate is the run's env steps over its training wall time (its last metrics row), and the
ratio is ``apex`` over ``single`` per repeat. The defaults are the rl-zoo's SAC on Pendulum and DQN on
Acrobot as ``dagrl graph --from-zoo`` writes them (one env, a collect of 1 and of 4 env steps), and the
hand-written Acrobot pair (2 envs, collects of 8 env steps and 16 gradient steps a round).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from _common import emit, table
from distributed import Client

import dagrl
from dagrl.app.graphs import load_graph
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.runtime.rundir import RunDir

PAIRS = ["sac-pendulum-zoo:3000", "dqn-acrobot-zoo:10000", "dqn-acrobot-single,dqn-acrobot-apex:10000"]


def rate(name: str, overrides: list[str], steps: int, client: Client | None) -> float:
    """Env steps per second of training wall time of one run of ``steps`` env steps."""
    with tempfile.TemporaryDirectory() as tmp:
        fixed = [f"stop.env_steps={steps}", "stop.mean_return=null", "stop.wall_time_s=null", "checkpoint.every=0"]
        graph = load_graph(f"graphs/{name}.yaml", [*overrides, *fixed, f"runs_dir={tmp}", "evaluate.every=0"])
        summary = dagrl.train(graph, client, progress=False)
        last = RunDir(summary["run_dir"]).read_metrics()[-1]
        return last["env_steps"] / last["time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(prog="dagrl bench small-collects", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="+", default=PAIRS, metavar="GRAPH[,APEX_GRAPH]:ENV_STEPS")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), 4) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        for pair in args.pairs:
            names, _, steps = pair.partition(":")
            single, _, twin = names.partition(",")
            apex = (twin, []) if twin else (single, ["policy=apex", "roles.sampler.replicas=2"])
            ratios, rates = [], {"single": [], "apex": []}
            for _ in range(args.repeats):
                one = rate(single, [], int(steps), None)
                two = rate(*apex, int(steps), client)
                rates["single"].append(one)
                rates["apex"].append(two)
                ratios.append(two / one)
                print(f"{names}: single {one:.0f}, apex {two:.0f} env steps/s ({two / one:.2f} x)", flush=True)
            rows.append({
                "graph": names, "env_steps": int(steps), "single": statistics.median(rates["single"]),
                "apex": statistics.median(rates["apex"]), "ratio": statistics.median(ratios),
                "ratios": [round(r, 3) for r in ratios],
            })  # fmt: skip
    print(table(rows, ["graph", "env_steps", "single", "apex", "ratio", "ratios"]))
    emit("small-collects", {"rows": rows})


if __name__ == "__main__":
    main()
