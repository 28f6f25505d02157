"""What ``dagrl tune`` measures, on a worker of the cluster it tunes for.

* **Fragments** (:func:`probe_fragments`): the graph's own iteration under ``single`` inside one
  worker, one sampler with a given number of envs, timed per fragment by the role hosts (the
  ``busy_s`` they keep): a collect's seconds per vector step, and each learner role's seconds per
  round, with the graph's own networks, batch sizes and devices.
* **Envs** (:func:`probe_env`): a vector env stepped with random actions, its wall and CPU time: how
  much of a step takes a core (a simulator that waits on something else does not). Each vector env
  backend the graph could use is stepped this way, at the envs counts of the fragment probes; every
  other probe then uses the backend chosen from these (:func:`dagrl.app.tune.tuner.choose_vector`), and
  a candidate on another backend has its env time swapped for that backend's (:meth:`Measurements.costs`).
* **Load** (:func:`probe_loaded`): a sampler collecting with the graph's networks on as many
  workers at once as candidates would run samplers (2, 4, 8, 16 and every worker but one), while
  another worker runs the graph's iteration: how much slower a collect gets when samplers share the
  machine with each other and a learner (on a few cores, a sleeping simulator mostly waits for a
  core to wake it on; on many, batch-1 forwards and emulators share caches and memory bandwidth).
* **The cluster** (:func:`probe_cluster`): cores per host, GPUs, the time a task takes to reach a
  worker and report back, and worker-to-worker bandwidth.

Off-policy probes start learning at once (``learning_starts`` lowered to one batch), so a round's
cost is that of a real update.
"""

from __future__ import annotations

import copy
import os
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dagrl.app.tune.model import Costs
from dagrl.envs.wrappers import parse as parse_wrappers
from dagrl.runtime.workers import workers as live_workers

__all__ = ["Measurements", "load_counts", "probe_cluster", "probe_env", "probe_fragments", "probe_loaded"]


@dataclass
class Measurements:
    """Everything the model needs, as measured; saved in JSON so a choice can be reproduced."""

    fragments: list[dict[str, Any]] = field(default_factory=list)
    """One :func:`probe_fragments` result per envs count probed."""
    env: list[dict[str, Any]] = field(default_factory=list)
    """One :func:`probe_env` result per envs count probed."""
    cluster: dict[str, Any] = field(default_factory=dict)
    """:func:`probe_cluster`'s result."""
    calibration: dict[str, Any] = field(default_factory=dict)
    """The short real distributed run that calibrates the model: its candidate, predicted (before
    calibration) and achieved env steps/s."""
    loaded: dict[str, Any] = field(default_factory=dict)
    """:func:`probe_loaded`'s result: a collect's seconds per vector step while other samplers and a
    learner share the machine, one point per number of samplers at once."""
    vector: dict[str, Any] = field(default_factory=dict)
    """The vector env backends stepped alone: each one's :func:`probe_env` results at the fragment
    probes' envs counts (``probes``), its ``step_s`` and ``cpu_s`` per vector step at the graph's
    ``envs`` (on the line through them), whether the choice of the backend every other probe ran on
    went by CPU (``by``) and that backend (``chosen``); empty when the graph's own was the only one."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurements:
        return cls(
            **{k: data[k] for k in ("fragments", "env", "cluster")},
            loaded=data.get("loaded", {}),
            calibration=data.get("calibration", {}),
            vector=data.get("vector", {}),
        )

    def costs(self, sampler: str, learners: list[str], vector: str | None = None) -> Costs:
        """The model's view: a line through the fragment probes' seconds per vector step against envs;
        ``learners`` are the roles ``split-learner`` runs at once.

        ``vector``: for samplers on that backend instead of the one the probes ran on. Their collect
        is the probed one with the env's seconds swapped for that backend's (both as lines through
        the env probes at the same envs counts); acting, the learner and the cluster stay as measured."""
        points = sorted((p["envs"], p["busy"][sampler]["step_s"]) for p in self.fragments)
        fixed, per_env = line(points)
        fixed_probed, per_env_probed = fixed, per_env
        env_points = sorted(self.env, key=lambda e: e["envs"])
        probes = self.vector.get("probes", {})
        theirs = env_points
        if vector in probes and vector != self.vector.get("chosen") and env_points:
            theirs = sorted(probes[vector], key=lambda e: e["envs"])
            (mine_0, mine_1), (their_0, their_1) = env_line(env_points), env_line(theirs)
            fixed, per_env = max(0.0, fixed + their_0 - mine_0), max(0.0, per_env + their_1 - mine_1)
        full = max(self.fragments, key=lambda p: p["envs"])  # the probe with the graph's own batch
        roles = {r: v["round_s"] for r, v in full["busy"].items() if r != sampler}
        overlap = sum(s for r, s in roles.items() if r not in learners) + max(
            (roles.get(r, 0.0) for r in learners), default=0.0
        )
        load = self.load(fixed_probed, per_env_probed, env_points)
        biggest = theirs[-1] if theirs else None
        env_share = 0.0
        if biggest is not None:
            step_s = fixed + per_env * biggest["envs"]
            env_share = min(1.0, biggest["step_s"] / step_s) if step_s > 0 else 1.0
        return Costs(
            step_fixed_s=fixed,
            step_per_env_s=per_env,
            env_cpu=biggest["cpu_share"] if biggest else 1.0,
            env_share=env_share,
            round_s=sum(roles.values()),
            round_overlap_s=overlap,
            hop_s=self.cluster.get("hop_s", 0.0),
            call_s=self.cluster.get("call_s", self.cluster.get("hop_s", 0.0)),  # older measurements: a hop's
            peer_bytes_s=self.cluster.get("peer_bytes_s", float("inf")),
            cores=int(self.cluster.get("cores", os.cpu_count() or 1)),
            task_cpu_s=self.cluster.get("task_cpu_s", 0.0),
            calibration=self.calibration["achieved"] / self.calibration["predicted"] if self.calibration else 1.0,
            fragment_s={f"{r}.{f}": t for r, fs in full.get("fragments", {}).items() for f, t in fs.items()},
            load=load,
        )

    def load(self, fixed: float, per_env: float, env_points: list[dict[str, Any]]) -> tuple[tuple[int, float], ...]:
        """``(samplers, slowdown)`` of each load probe window: a collect's seconds per vector step
        there over the same alone (the fragment probes' line, on the backend they ran on). A file
        of an earlier version holds one window of env steps alone: compared with the env probes."""
        if not self.loaded:
            return ()
        if "points" in self.loaded:
            alone = fixed + per_env * self.loaded["envs"]
            return tuple((p["samplers"], max(1.0, p["step_s"] / alone)) for p in self.loaded["points"] if alone > 0)
        if not env_points:
            return ()
        alone = env_step_s(env_points, self.loaded["envs"])
        return ((self.loaded["samplers"], max(1.0, self.loaded["step_s"] / alone)),)


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of seconds ``a + b * envs`` through the first and last ``(envs, seconds)`` points
    (through the origin for one point), neither below zero."""
    if len(points) == 1 or points[0][0] == points[-1][0]:
        return 0.0, points[-1][1] / points[-1][0]
    (n0, s0), (n1, s1) = points[0], points[-1]
    per_env = max(0.0, (s1 - s0) / (n1 - n0))
    return max(0.0, s0 - per_env * n0), per_env


def env_line(points: list[dict[str, Any]], key: str = "step_s") -> tuple[float, float]:
    """:func:`line` through env probes, sorted by envs (``key``: ``step_s`` or ``cpu_s``)."""
    return line([(p["envs"], p[key]) for p in points])


def env_step_s(points: list[dict[str, Any]], envs: int, key: str = "step_s") -> float:
    """Seconds per vector step of ``envs`` envs alone, on the line through the env probes."""
    (n0, s0), (n1, s1) = (points[0]["envs"], points[0][key]), (points[-1]["envs"], points[-1][key])
    if n1 == n0:
        return s1 * envs / n1
    return s0 + (s1 - s0) * (envs - n0) / (n1 - n0)


def probe_data(data: dict[str, Any], sampler: str, envs: int, length: tuple[str, int]) -> dict[str, Any]:
    """A graph mapping for a probe: ``single``, one sampler of ``envs`` envs, nothing else running."""
    from dagrl.core.distribution import FLAT_KEYS

    data = copy.deepcopy(data)
    for key in FLAT_KEYS:
        data.pop(key, None)
    data["policy"] = "single"
    data.setdefault("roles", {}).setdefault(sampler, {})
    data["roles"][sampler] = {**(data["roles"][sampler] or {}), "replicas": 1, "envs": envs}
    data.setdefault("hyperparameters", {})[length[0]] = length[1]
    learn_at_once(data)
    budget = (data.get("stop") or {}).get("env_steps")
    data["stop"] = {"iterations": 10**9}
    if budget is not None:  # what ends with the run (PPO's anneal_lr) keeps the graph's clock, as in verify
        data["stop"]["env_steps"] = budget
    return data


def learn_at_once(data: dict[str, Any]) -> None:
    """Off-policy graphs (those with ``batch_size`` or ``learning_starts``) learn from one batch on,
    so a short run measures real updates; evaluation off."""
    hp = data.setdefault("hyperparameters", {})
    if "learning_starts" in hp or "batch_size" in hp:
        hp["learning_starts"] = int(hp.get("batch_size", 256))
    data["evaluate"] = {"every": 0}


def probe_fragments(
    data: dict[str, Any], where: str, sampler: str, envs: int, length: tuple[str, int], seconds: float
) -> dict[str, Any]:
    """Run the graph under ``single`` here for about ``seconds`` after its first update; per role and
    fragment, seconds per iteration, and per vector step for the sampler (see the module docstring)."""
    import torch

    from dagrl.app.graphs import resolve_graph
    from dagrl.policies import build_policy

    graph = resolve_graph(probe_data(data, sampler, envs, length), where)
    torch.set_num_threads(graph.spec.torch_threads)
    with tempfile.TemporaryDirectory(prefix="dagrl-tune-") as tmp:
        policy = build_policy(graph, None, run_dir=tmp)
        try:
            warm = 0
            while warm < 500:  # until the learner has updated once (off-policy: replay filled)
                warm += 1
                if policy.step().metrics.get("perf/frames", 0) > 0:
                    break
            before = busy(policy)
            t0, iterations, steps = time.perf_counter(), 0, 0
            while iterations < 3 or (time.perf_counter() - t0 < seconds and iterations < 10_000):
                steps += policy.step().env_steps
                iterations += 1
            wall = time.perf_counter() - t0
            after = busy(policy)
        finally:
            policy.close()
    roles: dict[str, dict[str, float]] = {}
    for role in after:
        spent = sum(after[role].values()) - sum(before.get(role, {}).values())
        roles[role] = {"round_s": spent / iterations}
    roles[sampler]["step_s"] = roles[sampler]["round_s"] / length[1]
    return {
        "envs": envs,
        "length": length[1],
        "iterations": iterations,
        "env_steps": steps,
        "wall_s": wall,
        "busy": roles,
        "fragments": {r: {f: (s - before.get(r, {}).get(f, 0.0)) / iterations for f, s in fs.items()}
                      for r, fs in after.items()},
    }  # fmt: skip


def busy(policy: Any) -> dict[str, dict[str, float]]:
    """Seconds each role has spent in each of its fragments so far (summed over replicas)."""
    out: dict[str, dict[str, float]] = {}
    for info in policy.actors():
        role = out.setdefault(info["role"], {})
        for fragment, s in info["busy_s"].items():
            role[fragment] = role.get(fragment, 0.0) + s
    return out


def probe_env(
    env_id: str, kwargs: dict[str, Any], envs: int, seconds: float, vector: str = "sync", wrappers: list[Any] = ()
) -> dict[str, Any]:
    """Step ``envs`` copies of an env (inside the graph's ``env.wrappers`` entries ``wrappers``) with random
    actions for about ``seconds`` in a ``vector`` env (``sync``, ``threads`` or ``envpool``): wall seconds
    per vector step and the share of them that took a core.

    The CPU counted is this thread's for ``sync``, and the whole process's for ``threads`` and
    ``envpool``, whose own threads step the envs (the probe is the only task on its worker meanwhile),
    less what the process spent at the same rate while idle just before (a worker's event loop); with
    several threads stepping, the share can pass 1."""

    from dagrl.app.graphs import _probe_env
    from dagrl.core.graph import EnvSpec

    _probe_env(EnvSpec(env_id, kwargs, list(wrappers)), "env")  # imports the env's module, like a sampler
    if vector == "envpool":
        from dagrl.envs.vector import EnvPoolVector

        vec = EnvPoolVector(env_id, envs, seed=0, **kwargs)
    else:
        from dagrl.envs.vector import make_vector

        vec = make_vector(env_id.rpartition(":")[2], envs, vector, parse_wrappers(wrappers), **kwargs)
    threaded = vector in ("threads", "envpool")  # the envs step in threads of their own
    clock, idle = (time.process_time, idle_cpu_rate()) if threaded else (time.thread_time, 0.0)
    try:
        vec.reset(seed=0)
        vec.action_space.seed(0)
        actions = [vec.action_space.sample() for _ in range(64)]
        steps, t0, c0 = 0, time.perf_counter(), clock()
        while steps < 16 or time.perf_counter() - t0 < seconds:
            vec.step(actions[steps % len(actions)])
            steps += 1
        wall, cpu = time.perf_counter() - t0, clock() - c0
        cpu = max(0.0, cpu - idle * wall)
    finally:
        vec.close()
    return {
        "envs": envs,
        "steps": steps,
        "step_s": wall / steps,
        "cpu_s": cpu / steps,
        "cpu_share": cpu / wall if threaded else min(1.0, cpu / wall),
        "vector": vector,
    }


def idle_cpu_rate(seconds: float = 0.25) -> float:
    """CPU seconds per second this process spends while this thread sleeps (its other threads)."""
    t0, c0 = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    return (time.process_time() - c0) / (time.perf_counter() - t0)


def load_counts(workers: int) -> list[int]:
    """Samplers at once in the load probe's windows: 2, 4, 8, 16 and every worker but the learner's."""
    most = workers - 1
    return sorted({k for k in (2, 4, 8, 16) if k <= most} | ({most} if most >= 2 else set()))


def probe_loaded(
    client: Any, probe: tuple, counts: list[int], seconds: float, warm: bool, learner: str | None = None
) -> dict[str, Any]:
    """A sampler's collect while the machine is as busy as a distributed run makes it, for each of
    ``counts`` samplers collecting at once beside a learner.

    One task per worker (:func:`probe_share`): the learner's worker (``learner``, else the first) runs
    the graph's iteration under ``single`` throughout (a sampler and learner taking turns), worker ``i``
    of the others collects with the graph's networks from window ``i``'s sampler count on: windows of
    ``seconds`` each, ``counts`` samplers in turn, all starting once every task has built its state.
    ``probe``: ``(data, where, sampler, envs, (length_key, length))`` as for :func:`probe_fragments`.
    Median seconds per vector step (the sampler's busy time, acting included) in each window."""
    from distributed import Queue, Variable

    workers = sorted(live_workers(client))
    if not counts or len(workers) < 2:
        return {}
    first = learner if learner in workers else workers[0]
    loaders = [w for w in workers if w != first][: max(counts)]
    name = f"dagrl-tune-load-{time.time_ns()}"
    ready, start = Queue(f"{name}-ready", client=client), Variable(f"{name}-start", client=client)
    windows = [(i * seconds, (i + 1) * seconds) for i in range(len(counts))]
    tasks = [client.submit(probe_share, *probe, name, windows, -1, warm, pure=False, workers=[first])]
    for i, w in enumerate(loaders):  # the loader joins at the first window with more samplers than it
        joins = next(j for j, k in enumerate(counts) if k > i)
        tasks.append(client.submit(probe_share, *probe, name, windows, joins, warm, pure=False, workers=[w]))
    try:
        while ready.qsize() < len(tasks):  # (a timed-out get logs an error on the scheduler)
            for t in tasks:
                if t.status == "error":  # one that failed building its roles raises here
                    t.result()
            time.sleep(0.2)
        start.set(time.time() + 0.5)
        results = client.gather(tasks)
    finally:
        for t in tasks:
            t.cancel()
        start.delete()
    points = []
    for j, k in enumerate(counts):
        steps = [r[j] for r in results[1 : k + 1] if r[j] is not None]
        if steps:
            points.append({"samplers": k, "step_s": statistics.median(steps)})
    return {"envs": probe[3], "points": points}


def probe_share(
    data: dict[str, Any],
    where: str,
    sampler: str,
    envs: int,
    length: tuple[str, int],
    name: str,
    windows: list[tuple[float, float]],
    joins: int,
    warm: bool,
) -> list[float | None]:
    """One worker's part of :func:`probe_loaded`: build the graph's roles under ``single``, say so on
    the ``ready`` queue, wait for the common start, then from window ``joins`` on collect with the
    sampler alone (``joins`` -1: run the whole iteration throughout, the learner's load). Seconds
    per vector step of the collects whose middle fell in each window (``None`` outside its share).
    ``warm``: learn first, so an off-policy sampler acts with its network, not at random."""
    import torch
    from distributed import Queue, Variable

    from dagrl.app.graphs import resolve_graph
    from dagrl.policies import build_policy

    probed = probe_data(data, sampler, envs, length)
    if joins >= 0:  # a loader's learner never computes for long: keep it off the GPU
        for spec in probed["roles"].values():
            if isinstance(spec, dict) and isinstance(spec.get("resources"), dict):
                spec["resources"].pop("GPU", None)
    graph = resolve_graph(probed, where)
    torch.set_num_threads(graph.spec.torch_threads)
    steps = length[1]
    with tempfile.TemporaryDirectory(prefix="dagrl-tune-") as tmp:
        policy = build_policy(graph, None, run_dir=tmp)
        try:
            for _ in range(500 if warm or joins < 0 else 0):
                if policy.step().metrics.get("perf/frames", 0) > 0:
                    break
            nodes, roles = graph.algorithm.graph.nodes, graph.algorithm.roles
            last = max(i for i, n in enumerate(nodes) if n.role == sampler)
            calls = policy.executor.run_nodes(nodes[: last + 1], policy.hosts, roles)
            mine = [n for n in nodes if n.role == sampler]
            Queue(f"{name}-ready").put(joins)
            t0 = Variable(f"{name}-start").get(timeout=600)
            begin, end = windows[max(joins, 0)][0], windows[-1][1]
            time.sleep(max(0.0, t0 + begin - time.time()))
            spent = [[0.0, 0] for _ in windows]
            while (now := time.time()) < t0 + end:
                before = sum(busy(policy)[sampler].values())
                if joins < 0:
                    policy.step()
                else:
                    policy.executor.run_nodes(mine, policy.hosts, roles, calls=dict(calls))
                middle = (now + time.time()) / 2 - t0
                j = next((j for j, (a, b) in enumerate(windows) if a <= middle < b), None)
                if j is not None:
                    spent[j][0] += sum(busy(policy)[sampler].values()) - before
                    spent[j][1] += steps
        finally:
            policy.close()
    return [s / n if n and j >= joins >= 0 else None for j, (s, n) in enumerate(spent)]


def probe_cluster(client: Any, transfer_bytes: int = 64 * 2**20) -> dict[str, Any]:
    """Cores (per distinct host), GPUs, a task's round trip, and worker-to-worker bytes/s."""
    from distributed import wait

    def where() -> tuple[str, int]:
        return socket.gethostname(), len(os.sched_getaffinity(0)) if hasattr(
            os, "sched_getaffinity"
        ) else os.cpu_count()

    hosts = dict(client.run(where).values())
    workers = live_workers(client)
    gpus = sum(w.get("resources", {}).get("GPU", 0) for w in workers.values())
    addresses = sorted(workers)
    hops = []
    for i in range(25):
        if i == 5:  # after warming up: the CPU the scheduler, a worker and this client spend per task
            cpu0 = _cpu(client, addresses[0])
        t0 = time.perf_counter()
        client.submit(_nothing, pure=False, workers=addresses[:1]).result()
        hops.append(time.perf_counter() - t0)
    task_cpu = (_cpu(client, addresses[0]) - cpu0) / 20
    echo = client.submit(_Echo, actor=True, workers=addresses[:1], pure=False).result()
    calls = []
    for _ in range(25):  # a direct call to an actor, as a streaming loop calls a role on another worker
        t0 = time.perf_counter()
        echo.ping().result()
        calls.append(time.perf_counter() - t0)
    del echo
    out = {
        "cores": sum(hosts.values()),
        "hosts": len(hosts),
        "workers": len(addresses),
        "gpus": gpus,
        "hop_s": statistics.median(hops[5:]),
        "call_s": statistics.median(calls[5:]),
        "task_cpu_s": max(0.0, task_cpu),
    }
    if len(addresses) > 1:  # a big block's move minus a tiny one's: the bytes' own time
        moves = {}
        for size in (1, transfer_bytes):
            times = []
            for _ in range(3):
                block = client.submit(_block, size, pure=False, workers=addresses[:1])
                with client.as_current():  # distributed.wait uses the thread's default client
                    wait(block)  # made there; the timing below is the move
                t0 = time.perf_counter()
                client.submit(_size, block, pure=False, workers=addresses[1:2]).result()
                times.append(time.perf_counter() - t0)
                del block
            moves[size] = statistics.median(times)
        big, small = moves[transfer_bytes], moves[1]
        bytes_time = big - small if big - small > big / 4 else big  # a noisy hop can swallow the difference
        out["peer_bytes_s"] = transfer_bytes / bytes_time
    return out


def _cpu(client: Any, worker: str) -> float:
    """CPU seconds so far of the scheduler, ``worker`` and this process, together."""
    scheduler = client.run_on_scheduler(time.process_time)
    return scheduler + client.run(time.process_time, workers=[worker])[worker] + time.process_time()


def _nothing() -> None:
    return None


class _Echo:
    """An actor that answers at once: :func:`probe_cluster` times a direct call to it."""

    def ping(self) -> None:
        return None


def _block(n: int) -> np.ndarray:
    return np.ones(n, np.uint8)


def _size(a: np.ndarray) -> int:
    return int(a.nbytes)
