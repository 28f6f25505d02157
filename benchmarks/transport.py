"""Bytes/s of image-sized rollouts delivered to the learner: worker to worker vs through the driver.

    dagrl bench transport [--samplers 4] [--seconds 15]

Atari-shaped rollouts (uint8 4x84x84 observations, 8 envs x 128 steps: ~29 MB each) from
``--samplers`` sampler actors to one learner on the embedded LocalCluster, measured side by side:

* ``peer``: dagrl's path. ``sync`` iterations on the executor: ``collect`` tasks on the samplers'
  workers, ``update`` on the learner's worker fetching the rollouts peer to peer (two iterations in
  flight, as a stream keeps them); the observations through same-host shared memory (the default);
* ``peer-socket``: the same with ``shared_memory: false``: every byte over Dask's TCP comms;
* ``driver``: the path before it. The same fragments as actor calls: each rollout comes back to
  the driver and is sent on to the learner;
* ``ceiling``: raw Dask worker-to-worker bandwidth: the same bytes, already made, fetched by a
  task on the learner's worker (no fragment, no copy);
* ``sync-mailbox`` / ``sync-dask``: whole ``sync`` iterations through the policy's own ``step``,
  running ahead as the driver does, with the same-host mailbox (the default: the learner's task
  waits on its worker and maps each rollout from ``/dev/shm``) and without it.

Final JSON line: ``peer_bytes_s``, ``peer_socket_bytes_s``, ``driver_bytes_s``, ``ceiling_bytes_s``,
``speedup`` = peer / driver, ``shm_vs_socket`` = peer / peer-socket, ``peer_vs_ceiling``,
``sync_mailbox_bytes_s``, ``sync_dask_bytes_s``, ``mailbox_vs_dask``.
"""

from __future__ import annotations

import argparse
import time

import _transport_algo as transport_algo
import numpy as np
from _common import emit, table

from dagrl.app.graphs import resolve_graph
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.policies import build_policy


def graph(samplers: int, shared_memory: bool = True, mailbox: bool = True):
    return resolve_graph(
        {
            "algorithm": "_transport_algo",
            "env": {"id": "CartPole-v1"},
            "policy": {"name": "sync", "mailbox": mailbox},
            "roles": {"sampler": {"replicas": samplers}},
            "shared_memory": shared_memory,
        },
        "transport",
    )


INFLIGHT = 2


def peer(policy, seconds: float) -> float:
    ex, hosts, algo = policy.executor, policy.hosts, policy.graph.algorithm
    nodes = algo.graph.nodes
    done, inflight, t0 = 0, [], time.perf_counter()
    while time.perf_counter() - t0 < seconds or inflight:
        if time.perf_counter() - t0 < seconds and len(inflight) < INFLIGHT:
            calls = ex.run_nodes(nodes, hosts, algo.roles)
            inflight.append(calls[nodes[-1].id][0])
            continue
        (out,) = ex.wait([inflight.pop(0)])
        done += out["perf/bytes"]
    return done / (time.perf_counter() - t0)


def stepped(policy, seconds: float) -> float:
    """``sync`` through its own ``step``, running ahead as the driver does (so with the mailbox where
    the graph allows it), until ``seconds`` passed and the iteration ahead is in."""
    done, t0 = 0.0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += policy.step(ahead=True).metrics["perf/bytes"]
    while policy.pending:
        done += policy.step().metrics["perf/bytes"]
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
        rates = {}
        for mailbox in (True, False):  # sync's steps, rollouts through the mailbox or through Dask
            policy = build_policy(graph(args.samplers, mailbox=mailbox), client)
            try:
                stepped(policy, 2.0)
                rates["sync-mailbox" if mailbox else "sync-dask"] = stepped(policy, args.seconds)
            finally:
                policy.close()
        for shared in (True, False):
            policy = build_policy(graph(args.samplers, shared), client)
            try:
                peer(policy, 2.0)  # warm-up: imports, first transfers
                if shared:
                    rates["peer"] = peer(policy, args.seconds)
                    continue
                driver(policy, 2.0)
                rates["ceiling"] = ceiling(client, policy, args.seconds)
                rates["peer-socket"] = peer(policy, args.seconds)
                rates["driver"] = driver(policy, args.seconds)
            finally:
                policy.close()
    names = {
        "ceiling": "ceiling (raw Dask worker-to-worker)",
        "peer": "peer (dagrl tasks, shared memory)",
        "peer-socket": "peer-socket (dagrl tasks, shared_memory: false)",
        "driver": "driver (actor calls via client)",
        "sync-mailbox": "sync's steps, same-host mailbox (policy.mailbox, the default)",
        "sync-dask": "sync's steps, through Dask (policy.mailbox: false)",
    }
    print(table([{"path": names[k], "MB/s": rates[k] / 1e6} for k in names], ["path", "MB/s"]))
    emit(
        "transport",
        {
            "samplers": args.samplers,
            "rollout_bytes": int(np.prod(transport_algo.SHAPE)),
            "peer_bytes_s": rates["peer"],
            "peer_socket_bytes_s": rates["peer-socket"],
            "driver_bytes_s": rates["driver"],
            "ceiling_bytes_s": rates["ceiling"],
            "speedup": rates["peer"] / rates["driver"],
            "shm_vs_socket": rates["peer"] / rates["peer-socket"],
            "peer_vs_ceiling": rates["peer"] / rates["ceiling"],
            "sync_mailbox_bytes_s": rates["sync-mailbox"],
            "sync_dask_bytes_s": rates["sync-dask"],
            "mailbox_vs_dask": rates["sync-mailbox"] / rates["sync-dask"],
        },
    )


if __name__ == "__main__":
    main()
