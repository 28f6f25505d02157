"""Central inference where it should pay: PPO on Atari with a CNN, side by side with samplers that run
their own copy of the network.

    dagrl bench seed [--samplers 14] [--envs 8] [--game Pong] [--seconds 60] [--warmup 25]
                     [--policies sync async central-inference central-async] [--max-wait-ms 1] [--inference-device cuda]
                     [--repeats 1] [--cnn nature]

``graphs/ppo-atari.yaml`` (CleanRL's Atari PPO hyperparameters) with ``samplers`` x ``envs`` envs, each
setup a real training run on one LocalCluster started once, timed over ``seconds`` after a warm-up:
env steps/s between the first metrics row after the warm-up and the last. ``--cnn impala`` puts IMPALA's
residual encoder in place of the Nature CNN: about 11 x its forward on a CPU core, so a sampler acting
for itself spends more of its time in the network.

* ``sync`` and ``async``: every sampler acts with its own CPU copy of the CNN (one torch thread);
  ``async`` updates once per ``samplers`` rollouts (the same samples per update as the others), with
  rollouts at most one weight version old;
* ``central-inference``: samplers only step their emulators; one ``inference`` role answers every env
  step of all samplers with one batched forward (SEED RL), on ``--inference-device``; a forward
  starts when every sampler has asked or ``--max-wait-ms`` after the first request (one run per value);
* ``central-async``: the same, the samplers streaming as under ``async`` (``asynchronous: true``).

``--repeats N`` runs every setup N times, odd rounds in reverse order, each ratio taken within its round,
and prints each ratio's median over the rounds.

Where this machine has CUDA the learner is on the GPU in every setup (and the inference role beside
it under ``central-inference``, each asking for half of the GPU worker). The inference role's own
numbers (rows per forward, forward and queue time, the samplers' round trip) come from the last
metrics row of the run; ``sampler_in_env``, the samplers' share of their ``collect`` time spent
stepping their envs, from the run's ``actors.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from _common import emit, sampler_in_env, table
from scaling import Window

from dagrl.app.graphs import load_graph
from dagrl.app.training import train
from dagrl.clusters.local import cuda_count, local_cluster
from dagrl.clusters.spec import LocalClusterSpec

GRAPH = "graphs/ppo-atari.yaml"
POLICIES = {
    "sync": "sync",
    "async": "{{name: async, max_staleness: 1, rollouts_per_update: {samplers}}}",
    "central-inference": "{{name: central-inference, max_wait_ms: {max_wait_ms}}}",
    "central-async": "{{name: central-inference, asynchronous: true, max_staleness: 1, "
    "rollouts_per_update: {samplers}, max_wait_ms: {max_wait_ms}}}",
}
INFERENCE_KEYS = ("batch_rows", "batch_requests", "forward_ms", "queue_ms", "latency_ms", "utilisation")


def run(policy: str, args: argparse.Namespace, gpu: bool, client, root: str, max_wait_ms: float = 1.0) -> dict:
    options = POLICIES[policy].format(samplers=args.samplers, max_wait_ms=max_wait_ms)
    sets = [
        f"policy={options}", f"env.kwargs.game={args.game}",
        f"roles.sampler.replicas={args.samplers}", f"roles.sampler.envs={args.envs}",
        "stop.mean_return=1.0e9", f"stop.wall_time_s={args.warmup + args.seconds}", "stop.env_steps=1000000000",
        "checkpoint.every=0", f"runs_dir={root}", f"hyperparameters.cnn={args.cnn}",
    ]  # fmt: skip
    if gpu:
        sets.append("roles.learner.resources.GPU=0.5")
    if policy.startswith("central"):
        sets.append("roles.inference.replicas=1")
        if args.inference_device == "cuda":
            sets.append("roles.inference.resources.GPU=0.5")
    graph = load_graph(GRAPH, sets)
    window, last = Window(args.warmup), {}
    cpu = time.process_time()
    summary = train(graph, client, listeners=[window.on_row, lambda row, *_: last.update(row)])
    cpu = time.process_time() - cpu
    out = {
        "steps_s": window.rate(), "iterations": summary["iterations"], "env_steps": summary["env_steps"],
        "driver_cpu_ms_per_1k_steps": 1e6 * cpu / max(1, summary["env_steps"]),
        "sample_s": last.get("perf/sample_time_s"), "update_s": last.get("perf/update_time_s"),
    }  # fmt: skip
    out.update({f"inference {k}": last[f"inference/{k}"] for k in INFERENCE_KEYS if f"inference/{k}" in last})
    out["sampler_in_env"] = sampler_in_env(summary["run_dir"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samplers", type=int, default=14)
    p.add_argument("--envs", type=int, default=8, help="envs per sampler")
    p.add_argument("--game", default="Pong")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds per run (after the warm-up)")
    p.add_argument("--warmup", type=float, default=25.0)
    p.add_argument(
        "--max-wait-ms", type=float, nargs="+", default=[1.0],
        help="central-inference: how long the first request of an env step waits for the others (one run each)",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=1, help="rounds of every setup, odd rounds in reverse order")
    p.add_argument("--inference-device", choices=["cpu", "cuda"], default=None, help="default: cuda where present")
    p.add_argument("--cnn", choices=["nature", "impala"], default="nature", help="the encoder (hyperparameters.cnn)")
    args = p.parse_args()
    from distributed import Client

    gpu = cuda_count() > 0
    args.inference_device = args.inference_device or ("cuda" if gpu else "cpu")
    if args.inference_device == "cuda" and not gpu:
        p.error("--inference-device cuda: this machine has no CUDA device")
    root = tempfile.mkdtemp(prefix="dagrl-bench-seed-")
    n_workers = args.samplers + 1 + (any(p.startswith("central") for p in args.policies) and not gpu)
    t0 = time.perf_counter()
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), n_workers) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        print(f"LocalCluster of {len(cluster.worker_spec)} workers: {time.perf_counter() - t0:.1f} s", flush=True)
        rows = []
        setups = [(p, w) for p in args.policies for w in (args.max_wait_ms if p.startswith("central") else [None])]
        for repeat in range(args.repeats):
            for policy, wait in setups if repeat % 2 == 0 else setups[::-1]:  # odd rounds in reverse order
                r = run(policy, args, gpu, client, root, wait)
                name = policy if wait is None else f"{policy} (wait {wait:g} ms)"
                rows.append({"round": repeat + 1, "policy": name, **r})
                print(f"{name}: {r['steps_s']:,.0f} env steps/s ({r['iterations']} iterations)", flush=True)
    for r in rows:
        base = {o["policy"]: o["steps_s"] for o in rows if o["round"] == r["round"]}
        for other in ("sync", "async"):
            if other in base and r["policy"] != other:
                r[f"/ {other}"] = r["steps_s"] / base[other]
    cols = ["round", "policy", "steps_s", "/ sync", "/ async", "sample_s", "update_s", "sampler_in_env"]
    cols += ["driver_cpu_ms_per_1k_steps"]
    cols += [f"inference {k}" for k in INFERENCE_KEYS]
    print(f"\nPPO {args.game}, {args.cnn} CNN, {args.samplers} samplers x {args.envs} envs,", end=" ")
    print(f"learner on {'cuda' if gpu else 'cpu'},")
    print(f"inference role (central-inference) on {args.inference_device}; env steps/s over {args.seconds:g} s")
    print(table(rows, [c for c in cols if any(c in r for r in rows)]))
    medians = {}
    for name in dict.fromkeys(r["policy"] for r in rows):
        for other in ("sync", "async"):
            ratios = [r[f"/ {other}"] for r in rows if r["policy"] == name and f"/ {other}" in r]
            if ratios:
                medians[f"{name} / {other}"] = statistics.median(ratios)
                print(f"{name} / {other}: median {medians[f'{name} / {other}']:.2f} over {len(ratios)} round(s)")
    emit("seed", {"args": vars(args), "rows": rows, "median_ratios": medians})


if __name__ == "__main__":
    main()
