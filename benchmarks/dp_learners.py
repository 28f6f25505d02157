"""Update frame rate of ``dp-learners``: K data-parallel PPO learner replicas vs one.

    dagrl bench dp-learners [--learners 1 2 4] [--batch 4096] [--hidden 256] [--rounds 6] [--cuda]

Isolates the learner: for each K, a LocalCluster of 2K workers runs ``graphs/ppo-cartpole-dp.yaml``
with K samplers and K learner replicas (one torch thread each, gloo group). The samplers collect
one real rollout each (``batch`` transitions: 8 envs x batch/8 steps); then the learners run
``update`` on those same rollouts ``rounds`` times (after one warm-up round), each replica on its
own rollout, one ``batch``-row minibatch per epoch (4 epochs), gradients averaged every step.

* **frames/s** = samples consumed by gradient steps per second, over all replicas;
* **speedup** = frames/s(K) / frames/s(1), measured side by side in this run (weak scaling: each
  replica's minibatch stays ``batch``, so K replicas together take K x batch per step);
* **step ms** = wall time per gradient step (forward, backward, all-reduce, Adam; the update's
  advantage pass and task dispatch included).

``--cuda``: also K=1 with the learner on the GPU (``resources: {GPU: 1}``), where the machine has one.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from _common import emit, table

from dagrl.app.graphs import load_graph
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.policies import build_policy

GRAPH = "graphs/ppo-cartpole-dp.yaml"
EPOCHS = 4
ENVS = 8


def measure(k: int, args: argparse.Namespace, gpu: bool = False) -> dict:
    from distributed import Client

    overrides = [
        f"roles.sampler.replicas={k}", f"roles.learner.replicas={k}", f"roles.sampler.envs={ENVS}",
        f"hyperparameters.num_steps={args.batch // ENVS}", f"hyperparameters.minibatch_size={args.batch}",
        f"hyperparameters.hidden={args.hidden}", f"hyperparameters.update_epochs={EPOCHS}", "checkpoint.every=0",
    ]  # fmt: skip
    if gpu:
        overrides.append("roles.learner.resources={GPU: 1}")
    graph = load_graph(GRAPH, overrides)
    spec = LocalClusterSpec(dashboard_address=":0", gpu_workers=1 if gpu else 0)
    with (
        local_cluster(spec, graph.n_actors) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        policy = build_policy(graph, client, run_dir=tempfile.mkdtemp(prefix="dagrl-bench-dp-"))
        try:
            policy.prepare()
            nodes = graph.algorithm.graph.nodes  # publish, collect, update
            ex, roles = policy.executor, graph.algorithm.roles
            calls = ex.run_nodes(nodes[:2], policy.hosts, roles)
            ex.wait(calls[nodes[1].id])

            def round_() -> list[dict]:
                done = ex.run_nodes(nodes[2:], policy.hosts, roles, calls=dict(calls))
                return ex.wait(done[nodes[2].id])

            round_()  # warm-up: first backward, the group's first all-reduce
            t0 = time.perf_counter()
            frames = sum(sum(m["perf/frames"] for m in round_()) for _ in range(args.rounds))
            seconds = time.perf_counter() - t0
            device = policy.actors()
        finally:
            policy.close()
    learner_device = next(a["device"] for a in device if a["role"] == "learner")
    steps = args.rounds * EPOCHS
    return {"learners": k, "device": learner_device, "frames_s": frames / seconds, "step_ms": 1000 * seconds / steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--batch", type=int, default=4096, help="transitions per replica per gradient step")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--rounds", type=int, default=6, help="measured update calls per K")
    p.add_argument("--cuda", action="store_true", help="also one learner on the GPU")
    args = p.parse_args()
    rows = []
    for k in args.learners:
        rows.append(measure(k, args))
        print(f"{k} learner(s), cpu: {rows[-1]['frames_s']:,.0f} frames/s", flush=True)
    base = next(r["frames_s"] for r in rows if r["learners"] == min(args.learners))
    for r in rows:
        r["speedup"] = r["frames_s"] / base
    if args.cuda:
        r = measure(1, args, gpu=True)
        r["speedup"] = r["frames_s"] / base
        rows.append(r)
        print(f"1 learner, {r['device']}: {r['frames_s']:,.0f} frames/s", flush=True)
    print(f"\nPPO update, MLP {args.hidden}x2, {args.batch} rows per replica per step, {EPOCHS} steps per update")
    print(table(rows, ["learners", "device", "frames_s", "speedup", "step_ms"]))
    emit("dp-learners", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
