"""SAC on Pendulum-v1: time to mean return -200 (dagrl single/apex/split-learner vs SB3) and the
update frame rate of dagrl's learner roles vs a raw torch SAC loop.

    dagrl bench sac-pendulum [--seeds 1 2 3] [--policies single apex split] [--skip-sb3]

Same hyperparameters everywhere: lr 1e-3 (policy, Q, temperature), batch 256, gamma 0.99, tau
0.005, 1,000 random steps first, one gradient step per env step, two hidden layers of 128, auto
entropy; torch on one thread. Times run from the start of training to the episode at which the
mean of the last 20 episode returns reached -200. The frame rate (Spreeze's metric: transitions
consumed by gradient updates per second) compares one ``update_critic`` + ``update_actor`` call
pair of 16 steps, in-process, with the same 16 steps written as one plain torch loop.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from _common import emit, sb3_to_target, table

from dagrl.algos import sac
from dagrl.app.driver import Trainer
from dagrl.app.graphs import load_graph
from dagrl.app.progress import Progress
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.core.context import RoleContext
from dagrl.policies import build_policy
from dagrl.replay.synthetic import random_sample
from dagrl.runtime.rundir import RunDir

TARGET, WINDOW, BATCH, STEPS = -200.0, 20, 256, 16
GRAPHS = {
    "single": "sac-pendulum-single", "apex": "sac-pendulum-apex", "split": "sac-pendulum-split",
}  # fmt: skip


def sb3(seed: int, budget: int) -> dict:
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
    model = SAC(
        "MlpPolicy", env, learning_rate=1e-3, batch_size=BATCH, gamma=0.99, tau=0.005, learning_starts=1000,
        policy_kwargs={"net_arch": [128, 128]}, seed=seed, device="cpu",
    )  # fmt: skip
    return sb3_to_target(model, budget, TARGET, WINDOW)


def dagrl(name: str, seed: int, budget: int, client, root: str) -> dict:
    graph = load_graph(
        f"graphs/{GRAPHS[name]}.yaml",
        [f"seed={seed}", f"stop.env_steps={budget}", f"stop.mean_return={TARGET}", "stop.wall_time_s=900",
         "checkpoint.every=0", f"runs_dir={root}"],
    )  # fmt: skip
    rundir = RunDir.create(root, graph.name)
    pol = build_policy(graph, None if name == "single" else client, run_dir=rundir.path)
    try:
        summary = Trainer(graph, pol, rundir, progress=Progress(enabled=False)).run()
    finally:
        pol.close()
    return {
        "wall_s": summary["elapsed_s"],
        "env_steps": summary["env_steps"],
        "solved": summary["stop_reason"] == "mean_return",
    }


def frame_rates(seconds: float, device: str = "cpu", batch: int = BATCH, graphs: bool = False) -> tuple[float, float]:
    """Transitions/s through 16-step update calls: dagrl's two fragments vs one raw torch loop
    (``graphs``: dagrl's steps replayed from CUDA graphs, the raw loop as written)."""
    cfg = sac.Config(hidden=128, batch_size=batch, gradient_steps=STEPS, cuda_graphs=graphs)
    ctx = RoleContext("critic", 0, 1, 0, "Pendulum-v1", device=device).with_spaces()
    crit, act = sac.critic(ctx, cfg), sac.actor(ctx, cfg)
    n = batch * STEPS
    samples = [random_sample(ctx.observation_space, ctx.action_space, n)]
    data = samples[0].data

    def dagrl_call() -> None:
        sac.update_actor(act, samples, sac.update_critic(crit, samples, sac.publish(act)))

    # the same networks and math, without fragments, numpy exchange or re-batching
    q, target, policy = crit.q, crit.target, act.policy
    q_opt, pi_opt, a_opt, log_alpha = crit.optimizer, act.optimizer, act.alpha_optimizer, act.log_alpha
    t = {k: torch.as_tensor(v).float().to(device) for k, v in data.items()}

    def raw_call() -> None:
        for i in range(0, n, batch):
            b = {k: v[i : i + batch] for k, v in t.items()}
            alpha = log_alpha.detach().exp()
            with torch.no_grad():
                na, nlp = policy(b["next_obs"])
                tq = torch.min(*target(b["next_obs"], na)) - alpha * nlp
                y = b["reward"] + 0.99 * (1 - b["terminated"]) * tq
            q1, q2 = q(b["obs"], b["action"])
            loss = ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()
            q_opt.zero_grad()
            loss.backward()
            q_opt.step()
            with torch.no_grad():
                for p, tp in zip(q.parameters(), target.parameters(), strict=True):
                    tp.lerp_(p, 0.005)
            a, lp = policy(b["obs"])
            pl = (alpha * lp - torch.min(*q(b["obs"], a))).mean()
            pi_opt.zero_grad()
            pl.backward()
            pi_opt.step()
            al = -(log_alpha * (lp.detach() - 1.0)).mean()
            a_opt.zero_grad()
            al.backward()
            a_opt.step()

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    rates = {}
    for name, fn in (("raw", raw_call), ("dagrl", dagrl_call), ("raw2", raw_call), ("dagrl2", dagrl_call)):
        fn()
        sync()
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            calls += 1
        sync()
        rates[name] = calls * n / (time.perf_counter() - t0)
    return (rates["dagrl"] + rates["dagrl2"]) / 2, (rates["raw"] + rates["raw2"]) / 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--policies", nargs="+", default=["single", "apex", "split"], choices=list(GRAPHS))
    p.add_argument("--budget", type=int, default=40_000)
    p.add_argument("--skip-sb3", action="store_true")
    p.add_argument("--frame-seconds", type=float, default=5.0)
    p.add_argument("--frame-device", default="cpu", help="device of the frame-rate measurement (cpu, cuda)")
    p.add_argument(
        "--frame-batch", type=int, nargs="+", default=[BATCH], help="batch sizes of the frame-rate measurement"
    )
    p.add_argument("--frames-only", action="store_true", help="measure the update frame rate only")
    p.add_argument(
        "--cuda-graphs", action="store_true", help="also measure dagrl's steps replayed from CUDA graphs (cuda only)"
    )
    args = p.parse_args()
    from distributed import Client

    torch.set_num_threads(1)
    for batch in args.frame_batch:
        dagrl_fps, raw_fps = frame_rates(args.frame_seconds, args.frame_device, batch)
        print(
            f"update frame rate ({args.frame_device}, batch {batch}): dagrl {dagrl_fps:,.0f} /s, "
            f"raw torch {raw_fps:,.0f} /s: {dagrl_fps / raw_fps:.2f} x (target >= 0.95)",
            flush=True,
        )
        if args.cuda_graphs:
            graph_fps, raw_fps = frame_rates(args.frame_seconds, args.frame_device, batch, graphs=True)
            print(
                f"update frame rate ({args.frame_device}, batch {batch}, CUDA graphs): dagrl {graph_fps:,.0f} /s, "
                f"raw torch {raw_fps:,.0f} /s: {graph_fps / raw_fps:.2f} x",
                flush=True,
            )
            emit("sac-frames", {"batch": batch, "eager_fps": dagrl_fps, "graphs_fps": graph_fps, "raw_fps": raw_fps,
                  "graphs_vs_raw": graph_fps / raw_fps, "graphs_vs_eager": graph_fps / dagrl_fps})  # fmt: skip
    if args.frames_only:
        return
    names = ([] if args.skip_sb3 else ["sb3"]) + args.policies
    results: dict[str, list[dict]] = {k: [] for k in names}
    root = tempfile.mkdtemp(prefix="dagrl-bench-sac-")
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), 3) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        for seed in args.seeds:
            for name in names:
                r = sb3(seed, args.budget) if name == "sb3" else dagrl(name, seed, args.budget, client, root)
                results[name].append(r)
                print(
                    f"seed {seed} {name}: {r['wall_s']:.1f} s, {r['env_steps']} steps, solved {r['solved']}", flush=True
                )
    rows = []
    for name, runs in results.items():
        row = {
            "setup": "stable-baselines3 SAC" if name == "sb3" else f"dagrl {name}",
            "solved": f"{sum(r['solved'] for r in runs)}/{len(runs)}",
            "wall s (median)": statistics.median(r["wall_s"] for r in runs),
            "env steps (median)": statistics.median(r["env_steps"] for r in runs),
        }
        if "sb3" in results:
            row["time vs SB3 (median)"] = statistics.median(
                r["wall_s"] / b["wall_s"] for r, b in zip(runs, results["sb3"], strict=True)
            )
        rows.append(row)
    print(f"\nPendulum-v1 to mean return {TARGET:g} over {WINDOW} episodes, seeds {args.seeds}")
    print(table(rows, list(rows[0])))
    emit("sac-pendulum", {"frame_rate": {"dagrl": dagrl_fps, "raw": raw_fps}, "runs": results, "summary": rows})


if __name__ == "__main__":
    main()
