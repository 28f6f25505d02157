"""Bytes/s of image-sized rollouts delivered to the learner: worker to worker vs through the driver.

    dagrl bench transport [--samplers 4] [--seconds 15]

Atari-shaped rollouts (uint8 4x84x84 observations, 8 envs x 128 steps: ~29 MB each) from
``--samplers`` sampler actors to one learner on the embedded LocalCluster, measured side by side:

* ``peer``: dagrl's path. ``sync`` iterations on the executor: ``collect`` tasks on the samplers'
  workers, ``update`` on the learner's worker fetching the rollouts peer to peer (two iterations in
  flight, as a stream keeps them);
* ``driver``: the path before it. The same fragments as actor calls: each rollout comes back to
  the driver and is sent on to the learner;
* ``ceiling``: raw Dask worker-to-worker bandwidth: the same bytes, already made, fetched by a
  task on the learner's worker (no fragment, no copy).

Final JSON line: ``peer_bytes_s``, ``driver_bytes_s``, ``ceiling_bytes_s``, ``speedup`` = peer / driver.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import transport_algo
from _common import emit, table

from dagrl.clusters import LocalClusterSpec, local_cluster
from dagrl.graph import resolve_graph
from dagrl.policies import build_policy


def graph(samplers: int):
    return resolve_graph(
        {
            "algorithm": "transport_algo",
            "env": {"id": "CartPole-v1"},
            "policy": "sync",
            "roles": {"sampler": {"replicas": samplers}},
        },
        "transport",
    )


def peer(policy, seconds: float) -> float:
    ex, hosts, algo = policy.executor, policy.hosts, policy.graph.algorithm
    nodes = algo.graph.nodes
    done, inflight, t0 = 0, [], time.perf_counter()
    while time.perf_counter() - t0 < seconds or inflight:
        if time.perf_counter() - t0 < seconds and len(inflight) < 2:
            calls = ex.run_nodes(nodes, hosts, algo.roles)
            inflight.append(calls[nodes[-1].id][0])
            continue
        (out,) = ex.wait([inflight.pop(0)])
        done += out["perf/bytes"]
    return done / (time.perf_counter() - t0)


def driver(policy, seconds: float) -> float:
    samplers, (learner,) = policy.hosts["sampler"], policy.hosts["learner"]
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        version = learner.call("publish").result()
        rollouts = [f.result() for f in [s.call("collect", version) for s in samplers]]
        done += learner.call("update", rollouts).result()["perf/bytes"]
    return done / (time.perf_counter() - t0)


def _held(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, transport_algo.SHAPE, dtype=np.uint8)


def _total(arrays: list[np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in arrays)


def ceiling(client, policy, seconds: float) -> float:
    from distributed import wait

    samplers, (learner,) = policy.hosts["sampler"], policy.hosts["learner"]
    done, t0 = 0, time.perf_counter()
    moved = 0.0
    while time.perf_counter() - t0 < seconds:
        made = [client.submit(_held, i, workers=[s.address], pure=False) for i, s in enumerate(samplers)]
        wait(made)
        t1 = time.perf_counter()
        done += client.submit(_total, made, workers=[learner.address], pure=False).result()
        moved += time.perf_counter() - t1
    return done / moved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samplers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=15.0)
    args = p.parse_args()
    from distributed import Client

    g = graph(args.samplers)
    with (
        local_cluster(LocalClusterSpec(dashboard_address=":0"), g.n_actors) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        policy = build_policy(g, client)
        try:
            peer(policy, 2.0)  # warm-up: imports, first transfers
            driver(policy, 2.0)
            rows = [
                {"path": "ceiling (raw worker-to-worker)", "MB/s": ceiling(client, policy, args.seconds) / 1e6},
                {"path": "peer (dagrl tasks)", "MB/s": peer(policy, args.seconds) / 1e6},
                {"path": "driver (actor calls via client)", "MB/s": driver(policy, args.seconds) / 1e6},
            ]
        finally:
            policy.close()
    print(table(rows, ["path", "MB/s"]))
    ceil, peer_bs, drv = (r["MB/s"] * 1e6 for r in rows)
    emit(
        "transport",
        {
            "samplers": args.samplers,
            "rollout_bytes": int(np.prod(transport_algo.SHAPE)),
            "peer_bytes_s": peer_bs,
            "driver_bytes_s": drv,
            "ceiling_bytes_s": ceil,
            "speedup": peer_bs / drv,
            "peer_vs_ceiling": peer_bs / ceil,
        },
    )


if __name__ == "__main__":
    main()
