"""How env-step throughput scales with samplers: dagrl's policies vs Stable-Baselines3.

    dagrl bench scaling [--samplers 1 2 4 8 16] [--envs 4] [--step-ms 1.0] [--cost sleep busy]
                        [--policies sync async async-threads async-subproc central-inference central-async]
                        [--seconds 8] [--skip-sb3] [--learner-device cpu]
    dagrl bench scaling --learners 1 2 4 [--learner-us 20] --samplers 16 --cost sleep --skip-sb3

PPO on ``dagrl.envs:CostlyCartPole-v0`` (graphs/ppo-costly-cartpole.yaml): CartPole whose every step
costs ``step-ms`` more, slept (a remote or GPU-bound simulator) or spun (CPU-bound). For each cost,
policy and sampler count k, a real training run on one LocalCluster (k + 1 workers started once for
the largest k, then warmed by a 3 s run of the first setup) is timed over ``seconds`` after a warm-up;
throughput is env steps/s between the first metrics row after the warm-up and the last. The graph runs as
a user writes it: its own policy options (``async``'s defaults: each update takes what has arrived, up to
one rollout per sampler) and hyperparameters (10 epochs); only the samplers, their envs and the env's cost
change.

* **efficiency** = steps/s(k) / (k x steps/s(1)) of the same policy: 1.0 is perfect scaling.
* **setups**: ``sync`` and ``async`` (the samplers' envs on the graph's own backend, ``vector: auto``:
  in turn, each on a thread of its own once their first steps show them waiting), ``async-packed`` (as
  ``dagrl run`` starts it: more samplers than cores merged to the cores, ``pack_samplers``), ``async-sync``
  (in turn, ``vector: sync``), ``async-subproc`` (each env of a sampler in its own subprocess,
  ``roles.sampler.vector: async``), ``async-threads`` (each env stepped in a thread of the sampler's
  process, ``vector: threads``) and ``central-inference``
  (as ``sync``, one inference actor acting for all samplers: one batched forward per env step),
  ``central-async`` (the same, the samplers streaming as under ``async``);
  ``async-report-tasks`` is ``async`` with a report task per rollout instead of a report event;
  the engine before the streams (the driver issued every collect and learner round) left the package;
  its figures stay in BENCHMARKS.md and in the results of ``0e27a49``, the last commit that has it.
* **cpu**: CPU time of the driver process (the client and the LocalCluster's scheduler) per 1,000 env
  steps: what the driver pays per rollout; **net cpu**: the same less the process's CPU rate with the
  cluster idle (measured for 2 s before each run), which with many workers is most of it.
* **in env**: the samplers' share of their ``collect`` time spent inside ``env.step`` (from each
  run's ``actors.json``): near 1 the envs bound the samplers.
* **learner busy**: the learner's share of the run spent in its fragments (near 1 it sets the pace);
  **machine busy**: all cores' busy share over the run, every process on the machine counted (near 1
  the machine is full).
* **plain loop**: the same ``collect`` fragment on ``envs`` envs stepped in turn in one process, no Dask.
* **plain || k**: k such loops at once, one process each, no Dask: what the machine itself allows k
  samplers (on 2 cores, 8 processes contend for the CPU even when their envs sleep). ``/ plain||``
  is a policy's throughput over it: the framework's share of the loss, apart from the machine's.
* **plain at cores**: where k samplers outnumber the cores, the same k x ``envs`` envs in one such loop per
  core (two processes of 16 envs for 8 samplers of 4 on 2 cores): what a hand-written program would run
  on this machine; ``/ plain cores`` is a policy's throughput over it.
* **SB3**: Stable-Baselines3 PPO on a ``SubprocVecEnv`` of k x ``envs`` env processes (the same total
  envs), the graph's n_steps, epochs and minibatch, timed the same way (up to ``--sb3-max`` samplers:
  k x envs processes).

``--learners 1 2 4`` measures the learners' scaling instead: ``async`` with ``roles.learner.replicas: K``
(a data-parallel group, :mod:`dagrl.runtime.groups`) at each sampler count, **learner eff** =
steps/s(K) / (K x steps/s(1)). ``--learner-us`` makes the learner bound the run the way a GPU-bound
one does on a big machine: each row of each epoch costs it that many microseconds more, slept
(``benchmarks/_costly_learner.py``), each replica paying for its own share.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from typing import Any

from _common import MachineBusy, emit, role_busy, sampler_in_env, table

from dagrl.algos import ppo
from dagrl.app.graphs import load_graph
from dagrl.app.packing import packed_samplers
from dagrl.app.training import train
from dagrl.clusters.local import local_cluster, usable_cores
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.core.context import RoleContext
from dagrl.runtime.executor import Executor

GRAPH = "graphs/ppo-costly-cartpole.yaml"
ENV = "dagrl.envs:CostlyCartPole-v0"
NUM_STEPS = 32
SETUPS = {
    "sync": "policy sync, the samplers' envs on the graph's backend (auto: in turn, or threads once they wait)",
    "async": "policy async, the samplers' envs on the graph's backend (auto: in turn, or threads once they wait)",
    "async-sync": "policy async, each sampler steps its envs in turn (roles.sampler.vector: sync)",
    "async-report-tasks": "as async, each rollout's report a task of its own (before report events)",
    "async-packed": "policy async as dagrl's own LocalCluster runs it: more samplers than cores merged to the cores",
    "async-subproc": "policy async, each env of a sampler in a subprocess (roles.sampler.vector: async)",
    "async-threads": "policy async, each env of a sampler stepped in a thread (roles.sampler.vector: threads)",
    "central-inference": "policy central-inference, one inference actor picks every sampler's actions",
    "central-async": "as central-inference, the samplers streaming as under async (asynchronous: true)",
}
VECTORS = {"subproc": "async", "threads": "threads", "sync": "sync"}
"""A setup's suffix -> roles.sampler.vector; any other setup runs the graph's own."""


class Window:
    """Env steps/s between the first metrics row after ``warmup`` seconds and the last row."""

    def __init__(self, warmup: float):
        self.t0, self.warmup, self.rows = time.perf_counter(), warmup, []

    def on_row(self, row: dict, *_: object) -> None:
        now = time.perf_counter()
        if now - self.t0 >= self.warmup:
            self.rows.append((now, row["env_steps"]))

    def rate(self) -> float:
        if len(self.rows) < 2:
            return float("nan")
        (t_a, s_a), (t_b, s_b) = self.rows[0], self.rows[-1]
        return (s_b - s_a) / (t_b - t_a)


def dagrl(
    setup: str, k: int, args: argparse.Namespace, cost: str, client, root: str, learners: int = 1, learner_us: float = 0
) -> dict:
    """One run of the graph as a user writes it: its own policy options and hyperparameters; only the
    samplers, their envs, the env's cost and the stop change (and, measuring learners, their replicas
    and cost)."""
    setup, _, buffering = setup.partition("/")  # "async-packed/off": roles.sampler.double_buffer off
    policy, _, vector = setup.partition("-") if not setup.startswith("central") else (setup, "", "")
    Executor.report_events = vector != "report-tasks"
    options = {"central-async": "{name: central-inference, asynchronous: true}"}.get(policy, policy)
    graph = load_graph(GRAPH, [
        f"policy={options}", f"roles.sampler.replicas={k}", f"roles.sampler.envs={args.envs}",
        *([f"roles.sampler.vector={VECTORS[vector]}"] if vector in VECTORS else []),
        *([f"roles.sampler.double_buffer={buffering}"] if buffering else []),
        f"env.kwargs.step_ms={args.step_ms}", f"env.kwargs.cost={cost}",
        "stop.mean_return=1.0e9", f"stop.wall_time_s={args.warmup + args.seconds}", "stop.env_steps=100000000",
        "checkpoint.every=0", f"runs_dir={root}",
        *(["roles.learner.resources.GPU=1"] if args.learner_device == "cuda" else []),
        *([f"roles.learner.replicas={learners}"] if learners > 1 else []),
        *(["algorithm=_costly_learner", f"hyperparameters.update_us_per_row={learner_us}"] if learner_us else []),
    ])  # fmt: skip
    if vector == "packed":  # what `dagrl run` starts: 8 samplers of 4 envs on 2 cores as 2 of 16
        graph = packed_samplers(graph, usable_cores())
    idle = idle_cpu_rate()
    window, machine = Window(args.warmup), MachineBusy()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        machine.start()
        summary = train(graph, client, listeners=[window.on_row])
    finally:
        Executor.report_events = True
    cpu = time.process_time() - cpu  # this process: the driver, the client and the scheduler
    net = cpu - idle * (time.perf_counter() - wall)  # less what the cluster costs it doing nothing
    return {
        "steps_s": window.rate(), "iterations": summary["iterations"], "env_steps": summary["env_steps"],
        "driver_cpu_ms_per_1k_steps": 1e6 * cpu / max(1, summary["env_steps"]),
        "net_cpu_ms_per_1k_steps": 1e6 * net / max(1, summary["env_steps"]),
        "idle_cpu_share": idle,
        "sampler_in_env": sampler_in_env(summary["run_dir"]),
        "learner_busy": role_busy(summary["run_dir"], "learner", summary["elapsed_s"]),
        "machine_busy": machine.share(),
    }  # fmt: skip


def idle_cpu_rate(seconds: float = 2.0) -> float:
    """CPU seconds per second this process spends with the cluster idle (the scheduler hearing its
    workers' heartbeats): with 65 workers it is most of the driver's CPU at one slow sampler."""
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def plain_loop(args: argparse.Namespace, cost: str) -> float:
    import torch

    torch.set_num_threads(1)
    env_kwargs = {"step_ms": args.step_ms, "cost": cost}
    ctx = RoleContext("sampler", 0, 1, seed=0, env_id=ENV, num_envs=args.envs, vector="sync", env_kwargs=env_kwargs)
    state = ppo.sampler(ctx, ppo.Config(num_steps=NUM_STEPS))
    weights = {k: v.detach().numpy().copy() for k, v in state.agent.state_dict().items()}
    ppo.collect(state, weights)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        done += ppo.collect(state, weights).env_steps
    return done / (time.perf_counter() - t0)


def _plain_process(args: argparse.Namespace, cost: str, index: int, start: Any, out: Any, envs: int) -> None:
    """One of :func:`plain_parallel`'s loops: built, then timed from the moment every loop is built."""
    import torch

    torch.set_num_threads(1)
    env_kwargs = {"step_ms": args.step_ms, "cost": cost}
    ctx = RoleContext("sampler", index, 1, seed=index, env_id=ENV, num_envs=envs, vector="sync", env_kwargs=env_kwargs)
    state = ppo.sampler(ctx, ppo.Config(num_steps=NUM_STEPS))
    weights = {k: v.detach().numpy().copy() for k, v in state.agent.state_dict().items()}
    ppo.collect(state, weights)
    start.wait()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        done += ppo.collect(state, weights).env_steps
    out.put(done / (time.perf_counter() - t0))


def plain_parallel(k: int, args: argparse.Namespace, cost: str, envs: int | None = None) -> float:
    """Total env steps/s of ``k`` plain loops running at once in ``k`` processes of ``envs`` envs each
    (default ``--envs``; spawned: this process runs a LocalCluster's threads, which a fork would copy
    mid-flight)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(k), ctx.Queue()
    envs = envs or args.envs
    procs = [ctx.Process(target=_plain_process, args=(args, cost, i, start, out, envs), daemon=True) for i in range(k)]
    for proc in procs:
        proc.start()
    try:
        return sum(out.get(timeout=args.seconds + 300) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=10)


def sb3(k: int, args: argparse.Namespace, cost: str) -> float:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import SubprocVecEnv

    torch.set_num_threads(1)
    n = k * args.envs

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.t0, self.marks = time.perf_counter(), []

        def _on_step(self) -> bool:
            now = time.perf_counter()
            if now - self.t0 >= args.warmup:
                self.marks.append((now, self.model.num_timesteps))
            return now - self.t0 < args.warmup + args.seconds

    def make(i: int):
        return lambda: gym.make(ENV, step_ms=args.step_ms, cost=cost)

    cfg = load_graph(GRAPH).config  # the graph's own hyperparameters, as dagrl runs it
    envs = SubprocVecEnv([make(i) for i in range(n)])
    try:
        model = PPO(
            "MlpPolicy", envs, n_steps=cfg.num_steps, batch_size=cfg.minibatch_size, n_epochs=cfg.update_epochs,
            gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
            learning_rate=1e-3, policy_kwargs={"net_arch": [64, 64]}, device="cpu", seed=0,
        )  # fmt: skip
        clock = Clock()
        model.learn(total_timesteps=10**9, callback=clock)
    finally:
        envs.close()
    (t_a, s_a), (t_b, s_b) = clock.marks[0], clock.marks[-1]
    return (s_b - s_a) / (t_b - t_a)


def learner_scaling(args: argparse.Namespace) -> None:
    """``--learners``: ``async`` with K learner replicas at each sampler count (module docstring)."""
    from distributed import Client

    root = tempfile.mkdtemp(prefix="dagrl-bench-scaling-")
    rows, runs = [], []
    n_workers = max(args.samplers) + max(args.learners)
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), n_workers) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        for cost, us, k in itertools.product(args.cost, args.learner_us, args.samplers):
            base = None
            for n in sorted(args.learners):
                r = dagrl("async", k, args, cost, client, root, learners=n, learner_us=us)
                base = base or r["steps_s"] / n
                row = {
                    "cost": cost, "learner us": us, "samplers": k, "learners": n, "steps/s": r["steps_s"],
                    "learner eff": r["steps_s"] / (n * base), "learner busy": r["learner_busy"],
                    "machine busy": r["machine_busy"], "cpu": r["driver_cpu_ms_per_1k_steps"],
                }  # fmt: skip
                rows.append(row)
                runs.append({"cost": cost, "learner_us": us, "samplers": k, "learners": n, "policy": "async", **r})
                print(
                    f"[{cost}] {us:g} us/row k={k} learners={n}: {r['steps_s']:,.0f} steps/s, "
                    f"eff {row['learner eff']:.2f}, learner busy {r['learner_busy']:.2f}",
                    flush=True,
                )
    print(f"\nenv steps/s, PPO on CostlyCartPole ({args.step_ms:g} ms/step), {args.envs} envs per sampler, async;")
    print("learner us: what each row of each epoch costs the learner more (slept); learner eff = steps/s(K) /")
    print("(K x steps/s(1)); learner busy: the replicas' mean share of the run in their fragments")
    cols = ["cost", "learner us", "samplers", "learners", "steps/s", "learner eff", "learner busy", "machine busy"]
    cols.append("cpu")
    print(table(rows, cols))
    emit("scaling-learners", {"args": vars(args), "rows": rows, "runs": runs})


def setup_name(name: str) -> str:
    """A ``--policies`` entry: a setup of :data:`SETUPS`, maybe ``/auto``, ``/on`` or ``/off`` after it."""
    setup, _, buffering = name.partition("/")
    if setup not in SETUPS or buffering not in ("", "auto", "on", "off"):
        raise argparse.ArgumentTypeError(f"{name!r}: a setup of {', '.join(SETUPS)}, maybe /auto, /on or /off after it")
    return name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samplers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--envs", type=int, default=4, help="envs per sampler")
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--cost", nargs="+", default=["sleep", "busy"], choices=["sleep", "busy"])
    p.add_argument(
        "--policies",
        nargs="+",
        default=["sync", "async"],
        type=setup_name,
        help=", ".join(f"{k}: {v}" for k, v in SETUPS.items())
        + "; a setup ending in /on or /off sets roles.sampler.double_buffer (async-packed/off)",
    )
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run (after the warm-up)")
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--busy-max", type=int, default=None, help="largest k for --cost busy (default: core count)")
    p.add_argument("--skip-sb3", action="store_true")
    p.add_argument("--learner-device", choices=["cpu", "cuda"], default="cpu", help="cuda: the learner on the GPU")
    p.add_argument(
        "--learners", type=int, nargs="+", default=None,
        help="learner replicas K under async: the learners' scaling at each sampler count, not the policies'",
    )  # fmt: skip
    p.add_argument(
        "--learner-us", type=float, nargs="+", default=[0.0],
        help="with --learners: microseconds each row of each epoch costs the learner, slept (a device-bound one)",
    )  # fmt: skip
    p.add_argument("--sb3-max", type=int, default=16, help="largest k for SB3 (k x envs env processes)")
    p.add_argument(
        "--plain-max",
        type=int,
        default=64,
        help="largest k for plain || k (k processes: what the machine allows k samplers)",
    )
    args = p.parse_args()
    import os

    from dagrl.clusters.local import cuda_count

    if args.learner_device == "cuda" and not cuda_count():
        p.error("--learner-device cuda: this machine has no CUDA device")

    from distributed import Client

    if args.learners:
        return learner_scaling(args)
    cores = os.cpu_count() or 1
    ks = {c: sorted(k for k in args.samplers if c == "sleep" or k <= (args.busy_max or cores)) for c in args.cost}
    root = tempfile.mkdtemp(prefix="dagrl-bench-scaling-")
    rows, runs = [], []
    central = any(p.startswith("central") for p in args.policies)
    n_workers = max(args.samplers) + 1 + central  # + the inference actor
    t0 = time.perf_counter()
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), n_workers) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        print(f"LocalCluster of {n_workers} workers: {time.perf_counter() - t0:.1f} s", flush=True)
        for cost in args.cost:
            if ks[cost]:  # a first run on fresh workers pays their imports: not the first setup's to pay
                short = argparse.Namespace(**{**vars(args), "seconds": 2.0, "warmup": 1.0})
                dagrl(args.policies[0], ks[cost][-1], short, cost, client, root)
            plain = plain_loop(args, cost)
            print(f"[{cost}] plain loop, {args.envs} envs: {plain:,.0f} steps/s", flush=True)
            base: dict[str, float] = {}
            for k in ks[cost]:
                row = {"cost": cost, "samplers": k, "envs": k * args.envs, "plain x k": plain * k}
                if k <= args.plain_max:
                    row["plain || k"] = plain if k == 1 else plain_parallel(k, args, cost)
                    print(f"[{cost}] plain || {k}: {row['plain || k']:,.0f} steps/s", flush=True)
                if k > cores and k * args.envs % cores == 0:  # the same envs in a process per core
                    row["plain at cores"] = plain_parallel(cores, args, cost, k * args.envs // cores)
                    print(f"[{cost}] plain at {cores} cores: {row['plain at cores']:,.0f} steps/s", flush=True)
                for policy in args.policies:
                    r = dagrl(policy, k, args, cost, client, root)
                    base.setdefault(policy, r["steps_s"])
                    row[policy] = r["steps_s"]
                    row[f"{policy} eff"] = r["steps_s"] / (k * base[policy])
                    row[f"{policy} cpu"] = r["driver_cpu_ms_per_1k_steps"]
                    row[f"{policy} net cpu"] = r["net_cpu_ms_per_1k_steps"]
                    row[f"{policy} in env"] = r["sampler_in_env"]
                    row[f"{policy} learner busy"] = r["learner_busy"]
                    row[f"{policy} machine busy"] = r["machine_busy"]
                    if "plain || k" in row:
                        row[f"{policy} / plain||"] = r["steps_s"] / row["plain || k"]
                    if "plain at cores" in row:
                        row[f"{policy} / plain cores"] = r["steps_s"] / row["plain at cores"]
                    runs.append({"cost": cost, "samplers": k, "policy": policy, **r})
                    cpu, net = r["driver_cpu_ms_per_1k_steps"], r["net_cpu_ms_per_1k_steps"]
                    print(
                        f"[{cost}] {policy} k={k}: {r['steps_s']:,.0f} steps/s, driver CPU {cpu:.1f} ms/1k steps "
                        f"({net:.1f} above idle)",
                        flush=True,
                    )
                if not args.skip_sb3 and k <= args.sb3_max:
                    row["sb3"] = sb3(k, args, cost)
                    runs.append({"cost": cost, "samplers": k, "policy": "sb3", "steps_s": row["sb3"]})
                    print(f"[{cost}] sb3 SubprocVecEnv x{k * args.envs}: {row['sb3']:,.0f} steps/s", flush=True)
                    for policy in args.policies:
                        row[f"{policy}/sb3"] = row[policy] / row["sb3"]
                rows.append(row)
    cols = ["cost", "samplers", "envs", "plain x k", "plain || k", "plain at cores"]
    for policy in args.policies:
        cols += [policy, f"{policy} eff", f"{policy} / plain||", f"{policy} / plain cores", f"{policy} cpu"]
        cols += [f"{policy} net cpu"]
        cols += [f"{policy} in env", f"{policy} learner busy", f"{policy} machine busy"]
    if not args.skip_sb3:
        cols += ["sb3"] + [f"{policy}/sb3" for policy in args.policies]
    print(f"\nenv steps/s, PPO on CostlyCartPole ({args.step_ms:g} ms/step), {args.envs} envs per sampler;")
    print("cpu: CPU time of the driver process (client and scheduler) per 1,000 env steps, ms;")
    print("net cpu: the same less the process's CPU with the cluster idle (measured before each run);")
    print("in env: the samplers' share of their collect time spent inside env.step")
    print("learner busy: the learner's share of the run in its fragments; machine busy: all cores' busy share")
    print(table(rows, cols))
    for cost in args.cost:
        effs = [r.get("async eff") for r in rows if r["cost"] == cost and "async eff" in r]
        if effs:
            print(f"[{cost}] async efficiency: min {min(effs):.2f}, median {statistics.median(effs):.2f}")
    emit(f"scaling-{args.step_ms:g}ms", {"args": vars(args), "rows": rows, "runs": runs})  # one file per env cost


if __name__ == "__main__":
    main()
