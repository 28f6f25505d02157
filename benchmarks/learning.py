"""Learning quality against published results: fixed env-step budgets, several seeds, one table.

    dagrl bench learning [--preset mujoco|mujoco-published|cartpole|recurrent|acrobot|zoo|multiagent|mappo-paper]
                         [--graphs G[:STEPS] ...] [--seeds 1 2 3]
                         [--out benchmarks/results/learning] [--cluster] [--jobs N]

Each graph runs for its budget of env steps once per seed (``single`` graphs in this process;
distributed ones on an embedded LocalCluster with ``--cluster``). Per run: the final return (mean of
the last 10 training episodes), the last evaluation return (greedy policy, the graph's ``evaluate``),
env steps/s and wall time, and the env steps until the mean training return first reached the graph's
own ``stop.mean_return`` (median over the seeds that did). Beside each: the published reference for the
same algorithm and env, at the same budget where a source gives one, else the nearest budget the sources give (said in
the table). Numbers are carried from the cited pages; no code is.

``--final-eval N`` (default 10) then plays N greedy episodes with each run's final checkpoint
(``dagrl eval``; kept in ``OUT/<graph>-s<seed>/eval/``): the evaluation return at exactly the budget,
over more episodes than the graph's periodic evaluations, as the references report it.

``--jobs N`` runs N of the ``single`` runs at once, each in a process of its own with one torch
thread (its output in ``OUT/<graph>-s<seed>.log``), then writes the table as one run would.

Resumable: every run lives in ``OUT/<graph>-s<seed>``; a finished run (``summary.json``) is read
back, an interrupted one continues from its last checkpoint. Writes ``OUT/results.json``, a
Markdown table ``OUT/results.md`` and, per env, ``OUT/<env>.png`` and ``OUT/<env>.html`` (every
seed's curve, mean return over env steps, with the references marked).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path
from typing import Any

from _common import emit, table

import dagrl
from dagrl.app.graphs import load_graph
from dagrl.runtime.checkpoint import load_checkpoint
from dagrl.runtime.rundir import RunDir

WINDOW = 10
PRESETS = {
    "mujoco": ["sac-halfcheetah-single:100000", "td3-halfcheetah-single:100000", "ppo-hopper-single:300000"],
    # the budgets the carried sources give (no source gives SAC/TD3 at 100k or PPO Hopper at 300k)
    "mujoco-published": [
        "sac-halfcheetah-single:300000",
        "td3-halfcheetah-single:300000",
        "ppo-hopper-single:1000000",
    ],
    "cartpole": ["ppo-cartpole-single:50000", "dqn-cartpole-single:50000"],
    "recurrent": ["ppo-lstm-cartpole-novel:100000"],
    # the rl-zoo's hyperparameters as `dagrl graph --from-zoo` converts them, at the zoo's budgets
    "zoo": ["dqn-acrobot-zoo:100000", "sac-pendulum-zoo:20000", "td3-pendulum-zoo:20000", "ppo-acrobot-zoo:1000000"],
    # the same DQN in one process and under apex (one gradient step per env step both ways): env steps to -100
    "acrobot": ["dqn-acrobot-single:100000", "dqn-acrobot-apex:100000"],
    # a central critic against independent ones, the same budget and seeds (no published figure in these units)
    "multiagent": ["mappo-spread-single:300000", "ippo-spread-single:300000"],
    # MAPPO on the game the MAPPO paper's code plays, in one process and (with --cluster) under async
    "mappo-paper": ["mappo-spread-paper-single:10000000", "mappo-spread-paper:10000000"],
}

CLEANRL_SAC = "docs.cleanrl.dev/rl-algorithms/sac (sac_continuous_action.py, training return, MuJoCo v2)"
CLEANRL_TD3 = "docs.cleanrl.dev/rl-algorithms/td3 (td3_continuous_action.py, training return, MuJoCo v2)"
TD7_REPO = "github.com/seungju-k1m/sac-td3-td7 README (4 seeds, evaluation return, MuJoCo v4)"
CLEANRL_PPO = (
    "docs.cleanrl.dev/rl-algorithms/ppo (ppo_continuous_action.py, training return, MuJoCo v2; openai/baselines' "
    "PPO on the same page: 2518.95 +- 850.46)"
)
ON_POLICY_USERS = (
    "~-120 in MAPPO's units (6 x dagrl's return - 75: the multi-agent guide) that users of the MAPPO authors' "
    "code report after 10-20M steps, training return (github.com/marlbenchmark/on-policy issues #49, #112)"
)
ZOO_LSTM = (
    "huggingface.co/sb3/ppo_lstm-CartPoleNoVel-v1 model card (rl-zoo RecurrentPPO, CartPole without its velocities, "
    "as ppo-lstm-cartpole-novel.yaml)"
)
ZOO = (
    "github.com/DLR-RM/rl-baselines3-zoo benchmark.md (one run, greedy evaluation over ~150k steps; Pendulum-v0 for "
    "the Pendulum rows)"
)
REFERENCES: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("dqn", "Acrobot"): [{"steps": 100_000, "return": -76.639, "pm": 11.752, "source": ZOO}],
    ("ppo", "Acrobot"): [{"steps": 1_000_000, "return": -73.506, "pm": 18.201, "source": ZOO}],
    ("sac", "Pendulum"): [{"steps": 20_000, "return": -156.995, "pm": 88.714, "source": ZOO}],
    ("td3", "Pendulum"): [{"steps": 20_000, "return": -151.855, "pm": 90.227, "source": ZOO}],
    ("sac", "HalfCheetah"): [
        {"steps": 300_000, "return": 7847, "pm": 384, "source": TD7_REPO},
        {"steps": 1_000_000, "return": 9634.89, "pm": 1423.73, "source": CLEANRL_SAC},
    ],
    ("sac", "Hopper"): [
        {"steps": 300_000, "return": 1908, "pm": 1117, "source": TD7_REPO},
        {"steps": 1_000_000, "return": 2310.46, "pm": 342.82, "source": CLEANRL_SAC},
    ],
    ("td3", "HalfCheetah"): [
        {"steps": 300_000, "return": 7316, "pm": 118, "source": TD7_REPO},
        {"steps": 1_000_000, "return": 9018.31, "pm": 1078.31, "source": CLEANRL_TD3},
    ],
    ("mappo", "dagrl.envs.mpe:simple_spread_mappo"): [
        {"steps": 20_000_000, "return": -7.5, "pm": None, "source": ON_POLICY_USERS}
    ],
    ("ppo", "Hopper"): [{"steps": 1_000_000, "return": 2231.12, "pm": 656.72, "source": CLEANRL_PPO}],
    ("ppo_lstm", "CartPole"): [{"steps": 100_000, "return": 500.0, "pm": 0.0, "source": ZOO_LSTM}],
    ("td3", "Hopper"): [
        {"steps": 300_000, "return": 733, "pm": 817, "source": TD7_REPO},
        {"steps": 1_000_000, "return": 3391.78, "pm": 232.21, "source": CLEANRL_TD3},
    ],
}


def reference(algorithm: str, env_id: str, budget: int) -> dict[str, Any] | None:
    """The published number at ``budget`` steps, else at the nearest budget given."""
    found = REFERENCES.get((algorithm, env_id.split("-")[0]), [])
    return min(found, key=lambda r: (abs(r["steps"] - budget), r["steps"]), default=None)


def final_eval(path: Path, episodes: int) -> list[float] | None:
    """The returns of ``episodes`` greedy episodes with the run's final checkpoint (read back if done)."""
    from dagrl.app.evaluate import evaluate_checkpoint, write_result

    if episodes < 1:
        return None
    last = RunDir(path).list_checkpoints()[-1]
    kept = sorted((path / "eval").glob(f"{last.stem}-seed*.json"))
    for saved in kept:
        returns = json.loads(saved.read_text())["returns"]
        if len(returns) == episodes:
            return returns
    result = evaluate_checkpoint(last, episodes=episodes)
    write_result(path, result)
    return result.returns


def to_target(rows: list[dict[str, Any]], target: float | None) -> int | None:
    """The env steps of the first row whose mean training return (over the last ``WINDOW`` episodes)
    reaches ``target`` (the graph's own ``stop.mean_return``); ``None``: never, or no target."""
    if target is None:
        return None
    return next((r["env_steps"] for r in rows if (r.get("charts/episode_return_mean") or -1e18) >= target), None)


def run_one(graph_name: str, budget: int, seed: int, out: Path, client: Any, episodes: int = 0) -> dict[str, Any]:
    path = out / f"{graph_name}-s{seed}"
    rundir = RunDir(path)
    target = load_graph(f"graphs/{graph_name}.yaml").spec.stop.mean_return
    overrides = [f"seed={seed}", f"stop.env_steps={budget}", "stop.mean_return=null", f"stop.window={WINDOW}"]
    overrides += ["stop.wall_time_s=null", f"runs_dir={out}"]
    graph = load_graph(f"graphs/{graph_name}.yaml", overrides)
    if not (path / "summary.json").exists():
        resume = None
        if rundir.list_checkpoints():
            resume = load_checkpoint(path)
            print(f"{path.name}: resuming at {resume['counters']['env_steps']} env steps", flush=True)
        else:
            path.mkdir(parents=True, exist_ok=True)
            rundir.write_config(graph.to_dict())
        dagrl.train(graph, client, rundir=rundir, resume=resume, progress=True)
    summary = json.loads((path / "summary.json").read_text())
    rows = rundir.read_metrics()
    evals = [r for r in rows if "eval/return_mean" in r]
    last_eval = summary.get("eval") or (evals[-1] if evals else {})
    final = final_eval(path, episodes)
    return {
        "graph": graph_name,
        "algorithm": graph.spec.algorithm,
        "env": graph.spec.env.id,
        "policy": graph.spec.policy,
        "seed": seed,
        "budget": budget,
        "env_steps": summary["env_steps"],
        "final_return": summary["mean_return"],
        "eval_return": last_eval.get("eval/return_mean"),
        "eval_at": next((r["env_steps"] for r in reversed(rows) if "eval/return_mean" in r), None),
        "final_eval": None if final is None else statistics.mean(final),
        "final_eval_episodes": 0 if final is None else len(final),
        "target": target,
        "to_target": to_target(rows, target),
        "wall_s": summary["elapsed_s"],
        "steps_per_s": summary["env_steps"] / summary["elapsed_s"],
        "curve": [
            (r["env_steps"], r["charts/episode_return_mean"])
            for r in rows
            if r.get("charts/episode_return_mean") is not None
        ],
    }


def run_parallel(specs: list[tuple[str, int]], seeds: list[int], out: Path, jobs: int, episodes: int) -> None:
    """Run every unfinished (graph, seed) in a process of its own, ``jobs`` at once, one torch thread
    each; :func:`run_one` then reads them back."""
    import os
    import subprocess
    import sys
    import time

    todo = [(name, budget, seed) for name, budget in specs for seed in seeds]
    todo = [t for t in todo if not (out / f"{t[0]}-s{t[2]}" / "summary.json").exists()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    running: list[tuple[subprocess.Popen, str]] = []
    while todo or running:
        while todo and len(running) < jobs:
            name, budget, seed = todo.pop(0)
            log = out / f"{name}-s{seed}.log"
            cmd = [sys.executable, __file__, "--graphs", f"{name}:{budget}", "--seeds", str(seed), "--out", str(out)]
            cmd += ["--final-eval", str(episodes), "--part"]
            print(f"started {name} seed {seed} ({log})", flush=True)
            with open(log, "a") as f:
                running.append((subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env), f"{name} s{seed}"))
        time.sleep(1.0)
        for proc, label in [r for r in running if r[0].poll() is not None]:
            running.remove((proc, label))
            print(f"{label}: {'done' if proc.returncode == 0 else f'exit {proc.returncode}'}", flush=True)


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name in dict.fromkeys(r["graph"] for r in runs):
        mine = [r for r in runs if r["graph"] == name]
        first = mine[0]
        finals = [r["final_return"] for r in mine if r["final_return"] is not None]
        evals = [r["eval_return"] for r in mine if r["eval_return"] is not None]
        finals_eval = [r["final_eval"] for r in mine if r.get("final_eval") is not None]
        ref = reference(first["algorithm"], first["env"], first["budget"])
        row = {
            "graph": name,
            "env": first["env"],
            "steps": first["budget"],
            "seeds": len(mine),
            "final_return": _mean_pm(finals),
            "eval_return": _mean_pm(evals) + (f" @ {first['eval_at'] / 1000:.0f}k" if evals else ""),
            "final_eval": _mean_pm(finals_eval) + (f" ({first['final_eval_episodes']} ep)" if finals_eval else ""),
            "to_target": _to_target(mine),
            "steps/s": statistics.mean(r["steps_per_s"] for r in mine),
            "wall_s": statistics.mean(r["wall_s"] for r in mine),
            "published": "none carried" if ref is None else _published(ref),
            "source": "" if ref is None else ref["source"],
        }
        rows.append(row)
    return rows


def _to_target(runs: list[dict[str, Any]]) -> str:
    """``12,288 (3/3) to -100``: the median env steps to the graph's target over the seeds that reached it."""
    target = runs[0].get("target")
    if target is None:
        return "-"
    reached = sorted(r["to_target"] for r in runs if r.get("to_target") is not None)
    median = f"{statistics.median(reached):,.0f}" if reached else "never"
    return f"{median} ({len(reached)}/{len(runs)}) to {target:g}"


def _published(ref: dict[str, Any]) -> str:
    """``2,231 ± 657 @ 1000k``; a reference without a spread (``pm: None``) as ``-7.5 @ 20000k``."""
    if ref["pm"] is None:
        return f"{ref['return']:.3g} @ {ref['steps'] // 1000}k"
    return f"{ref['return']:,.0f} ± {ref['pm']:,.0f} @ {ref['steps'] // 1000}k"


def _mean_pm(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{statistics.mean(values):.0f} ± {statistics.stdev(values):.0f}"


def plots(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """Per env: every run's curve, references as horizontal marks (PNG with matplotlib, HTML with bokeh)."""
    written = []
    for env in dict.fromkeys(r["env"] for r in runs):
        mine = [r for r in runs if r["env"] == env]
        refs = {(r["algorithm"], r["budget"]): reference(r["algorithm"], env, r["budget"]) for r in mine}
        written.append(_html(env, mine, refs, out / f"{env}.html"))
        try:
            written.append(_png(env, mine, refs, out / f"{env}.png"))
        except ImportError:
            print("matplotlib is not installed: no PNG (pip install 'dagrl[bench]')")
    return written


def _html(env: str, runs: list[dict], refs: dict, path: Path) -> Path:
    from bokeh.embed import file_html
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    fig = figure(
        title=f"{env}: mean return of the last {WINDOW} episodes", x_axis_label="env steps", width=820, height=420
    )
    colours = {g: Category10_10[i % 10] for i, g in enumerate(dict.fromkeys(r["graph"] for r in runs))}
    for r in runs:
        xs, ys = zip(*r["curve"], strict=True) if r["curve"] else ((), ())
        fig.line(xs, ys, color=colours[r["graph"]], legend_label=r["graph"], alpha=0.8)
    for (algo, _), ref in refs.items():
        if ref is not None:
            fig.scatter([ref["steps"]], [ref["return"]], size=10, marker="diamond", legend_label=f"{algo} published")
    fig.legend.location = "top_left"
    path.write_text(file_html(fig, INLINE, title=env))
    return path


def _png(env: str, runs: list[dict], refs: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    graphs = list(dict.fromkeys(r["graph"] for r in runs))
    for r in runs:
        if r["curve"]:
            xs, ys = zip(*r["curve"], strict=True)
            ax.plot(xs, ys, color=f"C{graphs.index(r['graph'])}", alpha=0.8, label=f"{r['graph']} s{r['seed']}")
    for (algo, _), ref in refs.items():
        if ref is not None:
            ax.errorbar(
                [ref["steps"]], [ref["return"]], yerr=[ref["pm"] or 0], fmt="D", capsize=4, label=f"{algo} published"
            )
    ax.set(title=f"{env}: mean return of the last {WINDOW} episodes", xlabel="env steps", ylabel="return")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(prog="dagrl bench learning", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="mujoco")
    ap.add_argument("--graphs", nargs="+", help="GRAPH[:ENV_STEPS] names under graphs/ (instead of the preset)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/learning"))
    ap.add_argument("--cluster", action="store_true", help="run distributed graphs on an embedded LocalCluster")
    ap.add_argument("--jobs", type=int, default=1, help="single runs at once, a process each (not with --cluster)")
    ap.add_argument(
        "--final-eval", type=int, default=10, metavar="N", help="greedy episodes with each final checkpoint (0: none)"
    )
    ap.add_argument("--part", action="store_true", help=argparse.SUPPRESS)  # one run of --jobs: the parent emits
    args = ap.parse_args()
    if args.jobs > 1 and args.cluster:
        ap.error("--jobs runs single graphs in processes of their own; --cluster runs one at a time")
    logging.basicConfig(level=logging.WARNING)
    specs = []
    for item in args.graphs or PRESETS[args.preset]:
        name, _, steps = item.partition(":")
        specs.append((name, int(steps or 100_000)))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.jobs > 1:
        run_parallel(specs, args.seeds, args.out, args.jobs, args.final_eval)
    client = None
    if args.cluster:
        from distributed import Client, LocalCluster

        client = Client(LocalCluster(processes=True, threads_per_worker=1, dashboard_address=":0"))
    runs = []
    total = len(specs) * len(args.seeds)
    for name, budget in specs:
        for seed in args.seeds:
            print(f"[{len(runs) + 1}/{total}] {name} seed {seed}, {budget:,} env steps", flush=True)
            runs.append(run_one(name, budget, seed, args.out, client, args.final_eval))
    rows = aggregate(runs)
    columns = ["graph", "steps", "seeds", "final_return", "eval_return", "final_eval", "to_target", "published"]
    columns += ["steps/s", "wall_s"]
    print(table(rows, columns))
    (args.out / "results.json").write_text(json.dumps({"runs": runs, "table": rows}, indent=1))
    md = ["| " + " | ".join(columns + ["source"]) + " |", "|" + "---|" * (len(columns) + 1)]
    md += ["| " + " | ".join(_cell(r[c]) for c in columns + ["source"]) + " |" for r in rows]
    (args.out / "results.md").write_text("\n".join(md) + "\n")
    for p in plots(runs, args.out):
        print(f"wrote {p}")
    if args.part:
        return
    name = "learning" if args.graphs or args.preset == "mujoco" else f"learning-{args.preset}"
    emit(name, {"table": rows, "runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs]})


def _cell(v: Any) -> str:
    return f"{v:,.1f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
