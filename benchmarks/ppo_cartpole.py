"""Wall time and env steps to mean return 475 on CartPole-v1: dagrl single/sync/async vs Stable-Baselines3.

    dagrl bench ppo-cartpole [--seeds 1 2 3] [--policies single sync async] [--budget 300000]

Same hyperparameters everywhere (rl-zoo's CartPole set: 8 envs x 32 steps, batch 256, 20 epochs,
gae_lambda 0.8, gamma 0.98, lr 1e-3 constant, clip 0.2 constant, no entropy bonus), torch on one
thread, same seeds, in one run; times are from the start of training (SB3: ``learn()``; dagrl: the
first iteration) to the iteration where the mean of the last 20 episodes reached 475. Cluster start
(once, for sync and async) is reported apart. Ratios are per seed, then the median.

Where the time of dagrl's policies goes comes from the role hosts' own clocks: seconds inside the
learner's fragments, inside the samplers' (mean over samplers), and the rest (framework: transport,
Dask, driver), which for lockstep policies is ``wall - learner - samplers``. The engine before the streams
(``async-before``) left the package; its figures stay in BENCHMARKS.md, measured at ``0e27a49``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from _common import emit, sb3_to_target, table

from dagrl.app.driver import Trainer
from dagrl.app.graphs import load_graph
from dagrl.app.progress import Progress
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.policies import build_policy
from dagrl.runtime.rundir import RunDir

TARGET, WINDOW = 475.0, 20


def sb3(seed: int, budget: int) -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gae_lambda=0.8, gamma=0.98,
        learning_rate=1e-3, clip_range=0.2, ent_coef=0.0, seed=seed, device="cpu",
    )  # fmt: skip
    return sb3_to_target(model, budget, TARGET, WINDOW)


def dagrl(policy: str, seed: int, budget: int, client, root: str) -> dict:
    graph = load_graph(
        f"graphs/ppo-cartpole-{policy}.yaml",
        [f"seed={seed}", f"stop.env_steps={budget}", f"stop.mean_return={TARGET}", f"stop.window={WINDOW}",
         "stop.wall_time_s=600", "checkpoint.every=0", f"runs_dir={root}"],
    )  # fmt: skip
    pol = build_policy(graph, client)
    rundir = RunDir.create(root, graph.name)
    try:
        summary = Trainer(graph, pol, rundir, progress=Progress(enabled=False)).run()
        actors = pol.actors()
    finally:
        pol.close()
    solved = [  # the iteration that reached the target (sync runs one more, submitted ahead of the stop)
        r for r in rundir.read_metrics()
        if r["episodes"] >= WINDOW and (r.get("charts/episode_return_mean") or 0.0) >= TARGET
    ]  # fmt: skip
    if solved:
        summary.update(elapsed_s=solved[0]["time_s"], env_steps=solved[0]["env_steps"])
    learner = sum(sum(a["busy_s"].values()) for a in actors if a["role"] == "learner")
    samplers = [sum(a["busy_s"].values()) for a in actors if a["role"] == "sampler"]
    wall = summary["elapsed_s"]
    sampling = sum(samplers) if policy == "single" else statistics.mean(samplers)
    return {
        "wall_s": wall,
        "env_steps": summary["env_steps"],
        "solved": summary["stop_reason"] == "mean_return",
        "learner_s": learner,
        "sampler_s": sampling,
        "framework_s": wall - learner - sampling if not policy.startswith("async") else None,
        "learner_util": learner / wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--policies", nargs="+", default=["single", "sync", "async"])
    p.add_argument("--budget", type=int, default=300_000, help="env steps before a run counts as unsolved")
    args = p.parse_args()
    from distributed import Client

    results: dict[str, list[dict]] = {name: [] for name in ["sb3", *args.policies]}
    root = tempfile.mkdtemp(prefix="dagrl-bench-")
    t0 = time.perf_counter()
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), 3) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        cluster_start = time.perf_counter() - t0
        for seed in args.seeds:
            results["sb3"].append(sb3(seed, args.budget))
            for policy in args.policies:
                results[policy].append(dagrl(policy, seed, args.budget, client, root))
            line = "  ".join(f"{k} {v[-1]['wall_s']:.1f}s/{v[-1]['env_steps'] // 1000}k" for k, v in results.items())
            print(f"seed {seed}: {line}", flush=True)

    rows = []
    for name, runs in results.items():
        ratios = [r["wall_s"] / b["wall_s"] for r, b in zip(runs, results["sb3"], strict=True)]
        row = {
            "setup": "stable-baselines3" if name == "sb3" else f"dagrl {name}",
            "solved": f"{sum(r['solved'] for r in runs)}/{len(runs)}",
            "wall s (median)": statistics.median(r["wall_s"] for r in runs),
            "env steps (median)": statistics.median(r["env_steps"] for r in runs),
            "time vs SB3 (median)": statistics.median(ratios),
        }
        if name != "sb3":
            row["learner s"] = statistics.median(r["learner_s"] for r in runs)
            row["sampler s"] = statistics.median(r["sampler_s"] for r in runs)
            fw = [r["framework_s"] for r in runs if r["framework_s"] is not None]
            row["framework s"] = statistics.median(fw) if fw else "overlapped"
            row["learner busy"] = statistics.median(r["learner_util"] for r in runs)
        rows.append(row)
    cols = ["setup", "solved", "wall s (median)", "env steps (median)", "time vs SB3 (median)"]
    print(f"\nCartPole-v1 to mean return {TARGET:g} over {WINDOW} episodes, seeds {args.seeds}")
    print(table(rows, cols))
    print("\nwhere dagrl's time goes (medians): inside learner fragments, inside sampler fragments, the rest")
    print(table(rows[1:], ["setup", "wall s (median)", "learner s", "sampler s", "framework s", "learner busy"]))
    print(f"(LocalCluster start, once, not counted above: {cluster_start:.1f} s)")
    emit("ppo-cartpole", {"seeds": args.seeds, "cluster_start_s": cluster_start, "runs": results, "summary": rows})


if __name__ == "__main__":
    main()
