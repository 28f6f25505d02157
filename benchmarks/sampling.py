"""Env steps/s of PPO's ``collect`` fragment: a plain loop in one process vs 1 and 2 sampler actors.

    dagrl bench sampling [--envs 16] [--steps 256] [--seconds 10]

Each sampler call steps ``envs`` CartPole envs ``steps`` times with a 64x64 MLP policy. The plain
loop calls the same fragment on an in-process state; the actors run on a LocalCluster, one per
worker process (two workers), each ``collect`` a Dask task on its actor's worker with two in flight
per sampler, as the streaming policies run them; only each rollout's report comes back (an event).
Parallel efficiency is Hz(2 actors) / (2 x Hz(plain loop)): 1.0 is perfect scaling over two cores.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import emit, table

from dagrl.algos import ppo
from dagrl.algos.common import actor_critic
from dagrl.app.graphs import load_graph
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.core.context import RoleContext
from dagrl.runtime.executor import Executor, Sending
from dagrl.runtime.hosts import start_actors


def sampler_state(envs: int, steps: int = 1) -> actor_critic.SamplerState:
    ctx = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", num_envs=envs)
    return ppo.sampler(ctx, ppo.Config(num_steps=steps))


def initial_weights(envs: int) -> actor_critic.Weights:
    return {k: v.detach().numpy().copy() for k, v in sampler_state(envs).agent.state_dict().items()}


def plain_loop(envs: int, steps: int, seconds: float) -> float:
    import torch

    torch.set_num_threads(1)
    state = sampler_state(envs, steps)
    weights = initial_weights(envs)
    ppo.collect(state, weights)  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += ppo.collect(state, weights).env_steps
    return done / (time.perf_counter() - t0)


def actors(client, replicas: int, envs: int, steps: int, seconds: float) -> float:
    graph = load_graph(
        "graphs/ppo-cartpole-sync.yaml",
        [f"roles.sampler.replicas={replicas}", f"roles.sampler.envs={envs}", f"hyperparameters.num_steps={steps}"],
    )
    hosts = start_actors(client, graph, roles=["sampler"])
    ex = Executor(client)
    try:
        weights = client.scatter(initial_weights(envs), broadcast=True)
        samplers = hosts["sampler"]

        def collect(s):  # the stream's path: a task on the sampler's worker; only its report comes back
            return ex.report(ex.submit(s, "collect", [weights], send=Sending(announce=True)))

        for s in samplers:
            ex.wait([collect(s)])  # warm-up
        inflight = {i: [collect(s), collect(s)] for i, s in enumerate(samplers)}  # in_flight 2, as streams
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for i, s in enumerate(samplers):
                done += ex.wait([inflight[i].pop(0)])[0].env_steps
                inflight[i].append(collect(s))
        elapsed = time.perf_counter() - t0
        ex.wait([c for cs in inflight.values() for c in cs])
        return done / elapsed
    finally:
        ex.close()
        for hs in hosts.values():
            for h in hs:
                h.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    p.add_argument("--repeats", type=int, default=3, help="rounds of (plain, 1 actor, 2 actors); medians reported")
    args = p.parse_args()
    from distributed import Client

    runs: dict[str, list[float]] = {"plain": [], "one": [], "two": []}
    # dagrl's own embedded cluster (Dask's per-worker profiler off), one worker per sampler actor
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), 2) as cluster,
        Client(cluster, direct_to_workers=True) as c,
    ):
        for _ in range(args.repeats):  # interleaved, so a noisy neighbour hits every setup alike
            runs["plain"].append(plain_loop(args.envs, args.steps, args.seconds))
            runs["one"].append(actors(c, 1, args.envs, args.steps, args.seconds))
            runs["two"].append(actors(c, 2, args.envs, args.steps, args.seconds))
    plain, one, two = (statistics.median(runs[k]) for k in ("plain", "one", "two"))
    rows = [
        {"setup": "plain loop, 1 process", "steps/s": plain, "vs plain": 1.0},
        {"setup": "dagrl, 1 sampler actor", "steps/s": one, "vs plain": one / plain},
        {"setup": "dagrl, 2 sampler actors", "steps/s": two, "vs plain": two / plain},
    ]
    print(f"collect: CartPole-v1, {args.envs} envs x {args.steps} steps per call, 64x64 MLP policy")
    print(f"medians of {args.repeats} interleaved rounds of {args.seconds:g} s")
    print(table(rows, ["setup", "steps/s", "vs plain"]))
    efficiency = two / (2 * plain)
    print(f"parallel efficiency on 2 actors: {efficiency:.2f} (target >= 0.85)")
    emit(
        "sampling",
        {
            "envs": args.envs,
            "steps_per_call": args.steps,
            "runs_hz": runs,
            "one_actor_ratio": one / plain,
            "parallel_efficiency": efficiency,
        },
    )


if __name__ == "__main__":
    main()
