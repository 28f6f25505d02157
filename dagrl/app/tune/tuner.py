"""``dagrl tune``: measure, predict, verify by short real runs, write the tuned graph.

:func:`shape_of` reads what a graph fixes, :mod:`.measure` measures on the cluster,
:mod:`.model` ranks the settings, :func:`verify` runs the best few (and the graph as written, and the
best one-process setting) for a few seconds each with :func:`dagrl.train`, and :func:`write_tuned`
writes the chosen one (:attr:`Tuning.chosen`) as a graph file whose comments say what was measured,
predicted and achieved.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dagrl.app.graphs import resolve_graph
from dagrl.app.tune.measure import (
    Measurements,
    env_step_s,
    learn_at_once,
    load_counts,
    probe_cluster,
    probe_env,
    probe_fragments,
    probe_loaded,
)
from dagrl.app.tune.model import (
    MAX_ENVS,
    OFFPOLICY,
    ONPOLICY,
    Candidate,
    LearnStep,
    Prediction,
    Shape,
    divisors,
    lag,
    predict,
    rank,
    staleness,
)
from dagrl.core import distribution
from dagrl.core.fragment import Node
from dagrl.core.graph import Graph
from dagrl.core.schema import ConfigError
from dagrl.runtime.workers import workers as live_workers

log = logging.getLogger("dagrl")

__all__ = ["Result", "Tuning", "shape_of", "tune", "verify", "write_tuned"]

MODELLED = tuple(p for p, t in distribution.POLICY_TRAITS.items() if t.cost)
"""Policies the cost model predicts (:attr:`~dagrl.core.distribution.Traits.cost`)."""

LENGTH_KEYS = ("num_steps", "steps")
"""Hyperparameters that hold a collect's length, in the order looked for."""

MARGIN = 0.1
"""Settings within this fraction of the fastest count as equally fast (short runs on a shared machine
vary by more). Among them the one nearest the graph as written wins: the number of envs stepping at once
and a collect's length change what is learnt (how episodes interleave in replay, PPO's GAE horizon,
how soon whole episodes reach the stop window), which a throughput run cannot show. Equally near, the
one whose data trails the newest weights least (:func:`~dagrl.app.tune.model.staleness`) wins: the same env
steps per second buy at least as much learning when they are fresher (SAC on Pendulum, two seeds: 7,008
and 7,200 env steps to its target under ``single``, 10,000 and 7,600 under ``split-learner``, whose actor
trails its critic)."""


def distance(c: Candidate, hand: Candidate) -> float:
    """How far ``c`` moves the data's shape from ``hand``: envs stepping at once and the collect's
    length, each as an absolute log ratio (0: the same shape)."""
    return abs(math.log(c.samplers * c.envs / (hand.samplers * hand.envs))) + abs(math.log(c.length / hand.length))


def nearest(options: list[tuple[Candidate, float]], hand: Candidate | None) -> Candidate:
    """Of ``(candidate, env steps/s)`` options, the nearest to ``hand`` among those within :data:`MARGIN`
    of the fastest; the faster of equally near ones (the fastest outright without ``hand``)."""
    best = max(rate for _, rate in options)
    close = [(c, rate) for c, rate in options if rate >= (1 - MARGIN) * best]
    if hand is None:
        return min(close, key=lambda cr: -cr[1])[0]
    # equally near: the fresher data, then the graph's own vector env backend (another must be clearly
    # faster), then speed
    return min(
        close,
        key=lambda cr: (round(distance(cr[0], hand), 9), staleness(cr[0]), cr[0].vector != hand.vector, -cr[1]),
    )[0]


def _distributed(c: Candidate) -> bool:
    return distribution.traits(c.policy).distributed


def _runs(policy: str, algorithm: Any) -> bool:
    try:
        distribution.check(policy, algorithm)
    except TypeError:
        return False
    return True


def shape_of(graph: Graph) -> Shape:
    """What ``graph`` fixes for the tuner; ``ConfigError`` for a graph it cannot tune."""
    algo = graph.algorithm
    try:
        stream = distribution.stream_shape(algo)
    except TypeError as err:
        raise ConfigError(graph.path, "algorithm", f"{graph.spec.algorithm}: nothing to tune: {err}") from None
    sampler = stream.stream.role
    key = next((k for k in LENGTH_KEYS if hasattr(graph.config, k)), None)
    if key is None:
        raise ConfigError(
            graph.path,
            "hyperparameters",
            f"{graph.spec.algorithm} has none of {', '.join(LENGTH_KEYS)} (a collect's length)",
        )
    length = int(getattr(graph.config, key))
    role = graph.role(sampler)
    cost, options = graph.traits.cost, graph.policy_options
    collect = role.envs * length
    if cost == "stream":
        round_steps = options.per_update(role.replicas) * collect
    elif cost == "replay":
        ratio = options.update_ratio if options.update_ratio is not None else 1.0 / role.replicas
        round_steps = max(1, round(collect / ratio))
    else:
        round_steps = role.replicas * collect
    onpolicy = any(_runs(p, algo) for p, t in distribution.POLICY_TRAITS.items() if t.cost == "stream")
    obs, act = graph.observation_space, graph.action_space
    obs_bytes = int(np.prod(obs.shape or (1,))) * np.dtype(obs.dtype).itemsize
    act_bytes = int(np.prod(act.shape or (1,))) * max(np.dtype(act.dtype).itemsize, 4)
    return Shape(
        onpolicy=onpolicy,
        sampler=sampler,
        length_key=key,
        length=length,
        round_steps=round_steps,
        policies=tuple(p for p in (ONPOLICY if onpolicy else OFFPOLICY) if _runs(p, algo)),
        step_bytes=obs_bytes * (1 if onpolicy else 2) + act_bytes + 16,
        max_staleness=options.max_staleness if cost == "stream" else 2,
        round_hops=len(stream.insert) + len(stream.learn) + 1,
        inserts=len(stream.insert),
        learn=learn_steps(algo, stream),
        max_lag=max(1.0, lag(as_candidate(graph, sampler, length, round_steps))) if cost == "stream" else 1.0,
        vector=role.vector,
    )


def learn_steps(algo: Any, stream: Any) -> tuple[LearnStep, ...]:
    """The learner round of ``algo`` (its fragments after the stream and the inserts) as the cost
    model's :class:`LearnStep` s: which earlier steps each takes, which through a delayed edge."""
    index = {n.id: i for i, n in enumerate(stream.learn)}
    delayed = distribution.delayed_edges(algo)
    steps = []
    for n in stream.learn:
        args = [a for a in n.inputs if isinstance(a, Node)]
        steps.append(
            LearnStep(
                key=f"{n.role}.{n.name}",
                role=n.role,
                inputs=tuple(index[a.id] for a in args if a.id in index and (a.id, n.id) not in delayed),
                delayed=tuple(index[a.id] for a in args if (a.id, n.id) in delayed),
            )
        )
    return tuple(steps)


VECTOR_CHOICES = ("sync", "threads", "envpool")
"""Vector env backends the tuner measures and may choose. ``async`` is left to the user: its envs
step in processes of their own, whose cores the cost model does not count (it would predict them
free), and a process per env is rarely worth it for the cheap envs a sampler steps in bulk.
``threads`` pays where envs wait (their waits overlap) and costs a little where they compute under
the GIL; its probes count the whole process's CPU, like EnvPool's."""


def vector_backends(graph: Graph, sampler: str) -> list[str]:
    """The backends worth measuring for ``graph``'s samplers: the graph's own first, then those of
    :data:`VECTOR_CHOICES` that can run its env (EnvPool: installed, with the env's task and spaces).
    A graph on ``async`` keeps it: the probes could not compare its CPU, spent in other processes.
    One on ``auto`` (the default) has them all measured, and the tuned graph names the one chosen."""
    from dagrl.app.graphs import _check_envpool

    own = graph.role(sampler).vector
    if own not in (*VECTOR_CHOICES, "auto"):
        return [own]
    out = [] if own == "auto" else [own]
    for backend in VECTOR_CHOICES:
        if backend in out:
            continue
        if backend == "envpool":
            try:
                _check_envpool(graph.spec.env, (graph.observation_space, graph.action_space), graph.path, "vector")
            except ConfigError:
                continue
        out.append(backend)
    return out


def choose_vector(step_s: dict[str, float], cpu_s: dict[str, float], own: str, by_cpu: bool) -> str:
    """The backend whose vector step took least wall time (``by_cpu``: least CPU time), unless the
    graph's ``own`` is within :data:`MARGIN` of it: a backend must be clearly faster to change what
    the graph runs.

    CPU decides when the run will need every core (the graph has as many actors as the cluster has
    cores, or more): EnvPool's threads step a vector env sooner than one thread does, but on cores that
    samplers and a learner would use anyway. Pong at 4 envs here: EnvPool 1.16 ms of wall time per
    vector step against gymnasium's 1.86 ms, and 2.03 ms of CPU against 1.86 ms.

    >>> choose_vector({"sync": 1.9e-3, "envpool": 1.2e-3}, {"sync": 1.9e-3, "envpool": 2.0e-3}, "sync", False)
    'envpool'
    >>> choose_vector({"sync": 1.9e-3, "envpool": 1.2e-3}, {"sync": 1.9e-3, "envpool": 2.0e-3}, "sync", True)
    'sync'
    """
    cost = cpu_s if by_cpu else step_s
    best = min(cost, key=lambda b: cost[b])
    if own in cost and cost[own] * (1 - MARGIN) <= cost[best]:
        return own
    return best


def auto_backend(step_s: dict[str, float]) -> str:
    """What ``vector: auto`` steps a graph's envs on, from the backends' measured seconds per vector
    step: on threads where those overlapped the envs' steps (they wait), else in turn.

    >>> auto_backend({"sync": 4.2e-3, "threads": 1.3e-3}), auto_backend({"sync": 1e-4, "threads": 2e-4})
    ('threads', 'sync')
    """
    return "threads" if step_s.get("threads", math.inf) < step_s.get("sync", math.inf) else "sync"


def with_vector(data: dict[str, Any], sampler: str, vector: str) -> dict[str, Any]:
    """Graph mapping ``data`` with its samplers on the ``vector`` backend (``vector_threads`` only
    kept for EnvPool, the one backend it applies to)."""
    data = copy.deepcopy(data)
    role = dict(data.setdefault("roles", {}).get(sampler) or {})
    role["vector"] = vector
    if vector != "envpool":
        role.pop("vector_threads", None)
    data["roles"][sampler] = role
    return data


def learner_roles(graph: Graph) -> list[str]:
    """Single-instance roles holding the run's state (learners): ``split-learner`` overlaps them."""
    return [n for n, r in graph.algorithm.roles.items() if not r.many and r.recover == "rollback"]


def candidate_data(data: dict[str, Any], shape: Shape, c: Candidate) -> dict[str, Any]:
    """The graph mapping ``data`` changed to run candidate ``c``."""
    data = copy.deepcopy(data)
    for key in distribution.FLAT_KEYS:
        data.pop(key, None)
    cost = distribution.traits(c.policy).cost
    if cost == "stream":
        data["policy"] = {
            "name": c.policy,
            "max_staleness": shape.max_staleness,
            "rollouts_per_update": c.collects_per_round,
        }
    elif cost == "replay":
        data["policy"] = {"name": c.policy, "update_ratio": 1.0 / c.collects_per_round}
    else:
        data["policy"] = c.policy
    data = with_vector(data, shape.sampler, c.vector)
    data["roles"][shape.sampler].update(replicas=c.samplers, envs=c.envs)
    data.setdefault("hyperparameters", {})[shape.length_key] = c.length
    return data


def as_candidate(graph: Graph, sampler: str, length: int, round_steps: int) -> Candidate:
    """The graph as written, as a candidate (its policy may be one the tuner does not propose)."""
    role = graph.role(sampler)
    collects = max(1, round_steps // (role.envs * length))
    return Candidate(graph.spec.policy, role.replicas, role.envs, length, collects, role.vector)


def probe_envs(shape: Shape) -> list[tuple[int, int]]:
    """(envs, length) of the fragment probes: one env, and the most envs a candidate gives a sampler.
    Off-policy probes keep the round (envs x length = steps between rounds)."""
    if shape.onpolicy:
        most = max(d for d in divisors(shape.round_steps // shape.length) if d <= MAX_ENVS)
        return sorted({(1, shape.length), (most, shape.length)})
    most = max(d for d in divisors(shape.round_steps) if d <= min(MAX_ENVS, 16))
    return sorted({(1, shape.round_steps), (most, shape.round_steps // most)})


def measure(
    graph: Graph, data: dict[str, Any], client: Any, shape: Shape, seconds: float, bar: Any, backends: list[str]
) -> Measurements:
    """Every probe of :mod:`.measure`, on one worker of ``client``'s cluster (``seconds`` in all);
    ``backends``: the vector env backends to compare first (:func:`vector_backends`)."""
    m = Measurements()
    bar.set_postfix_str("cluster: cores, task round trip, bandwidth")
    m.cluster = probe_cluster(client)
    bar.update(1)
    worker = sorted(live_workers(client))[:1]
    points = probe_envs(shape)
    each = max(2.0, 0.65 * seconds / len(points))
    env_id, kwargs, wrappers = graph.env_id, graph.env_kwargs, graph.spec.env.wrappers
    probes: dict[str, list[dict[str, Any]]] = {}
    for backend in backends if len(backends) > 1 else [shape.vector]:
        probes[backend] = []
        for envs, _ in points:
            bar.set_postfix_str(f"{env_id}: {envs} envs, {backend} vector env")
            args = (env_id, kwargs, envs, min(2.0, each / 4), backend, wrappers)
            probes[backend].append(client.submit(probe_env, *args, pure=False, workers=worker).result())
            bar.update(1)
    vector = shape.vector
    if len(probes) > 1:
        envs = graph.role(shape.sampler).envs  # the backends compared where the graph runs
        step_s = {b: env_step_s(p, envs) for b, p in probes.items()}
        cpu_s = {b: env_step_s(p, envs, "cpu_s") for b, p in probes.items()}
        by_cpu = graph.n_actors >= int(m.cluster.get("cores", 1))
        vector = choose_vector(step_s, cpu_s, shape.vector, by_cpu)
        by = "cpu" if by_cpu else "wall"
        m.vector = {"envs": envs, "step_s": step_s, "cpu_s": cpu_s, "by": by, "chosen": vector, "probes": probes}
        data = with_vector(data, shape.sampler, vector)
    m.env = probes[vector]
    for envs, length in points:
        bar.set_postfix_str(f"fragments: 1 sampler x {envs} envs x {length} steps")
        probe = (data, graph.path, shape.sampler, envs, (shape.length_key, length), each)
        m.fragments.append(client.submit(probe_fragments, *probe, pure=False, workers=worker).result())
        bar.update(1)
    counts = load_counts(int(m.cluster.get("workers", 1)))
    bar.set_postfix_str(f"collects beside a learner: {', '.join(map(str, counts))} samplers at once")
    role = graph.role(shape.sampler)
    probe = (data, graph.path, shape.sampler, role.envs, (shape.length_key, shape.length))
    window = max(1.5, 0.2 * seconds / max(1, len(counts)))
    m.loaded = probe_loaded(client, probe, counts, window, not shape.onpolicy, learner_worker(graph, client))
    bar.update(1)
    return m


def learner_worker(graph: Graph, client: Any) -> str | None:
    """A worker that has what the graph's learner asks for (a GPU), for the load probe's learner."""
    gpu = max((graph.role(r).gpus for r in learner_roles(graph)), default=0.0)
    if not gpu:
        return None
    workers = live_workers(client)
    return next((a for a, w in sorted(workers.items()) if w.get("resources", {}).get("GPU", 0) >= gpu), None)


@dataclass
class Result:
    candidate: Candidate
    predicted: Prediction | None
    achieved: float | None = None
    """Env steps/s of the short real run (steady state: rows after the first update)."""

    def label(self, tuning: Tuning) -> str:
        """The setting, how stale its data may be (what a throughput run does not show) and what it was
        in this tuning (as written, the calibration run, chosen)."""
        behind = staleness(self.candidate)
        tags = [f" [data ~{behind:.3g} round{'' if behind == 1 else 's'} behind]" if behind else ""]
        tags.append(" (as written)" if self.candidate == tuning.hand else "")
        if self.candidate.describe() == tuning.measurements.calibration.get("candidate"):
            tags.append(" (calibration run)")
        if self is tuning.chosen:
            tags.append(" <- chosen")
        return self.candidate.describe() + "".join(tags)


@dataclass
class Tuning:
    shape: Shape
    measurements: Measurements
    ranked: list[tuple[Candidate, Prediction]]
    verified: list[Result] = field(default_factory=list)
    hand: Candidate | None = None
    """The graph as written."""

    @property
    def chosen(self) -> Result:
        """Of the verified runs (of the predictions when nothing was verified), the one nearest the graph
        as written among those within :data:`MARGIN` of the fastest."""
        runs = [r for r in self.verified if r.achieved is not None]
        if runs:
            pick = nearest([(r.candidate, r.achieved) for r in runs], self.hand)
            return next(r for r in runs if r.candidate == pick)
        pick = nearest([(c, p.steps_s) for c, p in self.ranked], self.hand)
        return Result(pick, dict(self.ranked)[pick])


def steady_rate(rows: list[dict[str, Any]]) -> float | None:
    """Env steps/s from the first row after both an update and a third of the run (workers started
    meanwhile settle) to the last row. An update is a row with ``perf/frames`` above 0; where the
    algorithm reports no ``perf/frames`` at all, every row is taken to hold one.

    >>> rows = [{"time_s": t, "env_steps": 100 * t} for t in range(1, 10)]
    >>> steady_rate(rows)  # no perf/frames: from the row at a third of the run
    100.0
    >>> steady_rate([{**r, "perf/frames": 0.0} for r in rows]) is None  # nothing learnt yet
    True
    """
    settled = rows[-1]["time_s"] / 3 if rows else 0.0
    counted = any("perf/frames" in r for r in rows)
    start = next(
        (i for i, r in enumerate(rows) if (not counted or r.get("perf/frames", 0) > 0) and r["time_s"] >= settled),
        None,
    )
    if start is None or len(rows) - start < 3:
        return None
    a, b = rows[start], rows[-1]
    return (b["env_steps"] - a["env_steps"]) / (b["time_s"] - a["time_s"]) if b["time_s"] > a["time_s"] else None


def verify(data: dict[str, Any], where: str, cluster: Any, seconds: float) -> float | None:
    """Run graph mapping ``data`` for ``seconds`` (evaluation off, learning from one batch on) and
    return its steady env steps/s, or ``None`` when it ran too few iterations to tell."""
    from dagrl.app.training import train
    from dagrl.runtime.rundir import RunDir

    data = copy.deepcopy(data)
    learn_at_once(data)
    budget = (data.get("stop") or {}).get("env_steps")
    data["stop"] = {"wall_time_s": seconds}
    if budget is not None:  # what ends with the run (PPO's anneal_lr) keeps the graph's clock
        data["stop"]["env_steps"] = budget
    data["checkpoint"] = {"every": 10**6, "keep": 1}
    data["name"] = "tune"
    rows: list[dict[str, Any]] = []
    level = log.level
    log.setLevel(max(level, logging.WARNING))  # the progress bar says what runs
    try:
        with tempfile.TemporaryDirectory(prefix="dagrl-tune-") as tmp:
            graph = resolve_graph({**data, "runs_dir": tmp}, where)
            rundir = RunDir.create(tmp, graph.name)
            train(graph, cluster=cluster, rundir=rundir, listeners=[lambda row, _: rows.append(row)])
    finally:
        log.setLevel(level)
    return steady_rate(rows)


def tune(
    graph: Graph,
    data: dict[str, Any],
    cluster: Any,
    *,
    budget_s: float = 120.0,
    n_verify: int = 3,
    max_samplers: int | None = None,
    measurements: Measurements | None = None,
    progress: bool = True,
) -> Tuning:
    """Measure on ``cluster`` (unless ``measurements`` are given), calibrate on one short distributed
    run, rank, and verify the best ``n_verify`` candidates (one per policy and sampler count), the
    graph as written and the best one-process setting (where the algorithm runs in one), by real runs
    splitting about 60 % of ``budget_s``."""
    from tqdm import tqdm

    shape = shape_of(graph)
    backends = [] if measurements else vector_backends(graph, shape.sampler)
    probes = 2 + len(probe_envs(shape)) * (1 + max(1, len(backends)))
    runs = n_verify + 3  # the best few, the graph as written, the calibration, one process
    steps = (0 if measurements else probes) + (runs if n_verify else 0)
    with tqdm(total=steps, desc="dagrl tune", disable=not progress, unit="probe", leave=False) as bar:
        if measurements is None:
            from dagrl.clusters.connect import connect
            from dagrl.clusters.spec import LocalClusterSpec

            with connect(measuring(cluster or LocalClusterSpec(), graph), graph) as client:
                measurements = measure(graph, data, client, shape, 0.35 * budget_s, bar, backends)
        chosen = measurements.vector.get("chosen", shape.vector)
        shape = replace(shape, vector=chosen, vectors=tuple(measurements.vector.get("probes", ())) or (chosen,))
        learners = learner_roles(graph)

        def costs() -> dict[str, Any]:  # per backend; read again once calibrated
            return {v: measurements.costs(shape.sampler, learners, v) for v in shape.vectors}

        most = max_samplers or min(16, max(2, 4 * int(measurements.cluster.get("cores", 1))))
        if _packs(cluster):  # more samplers than cores would run as those within (pack_samplers): not candidates
            most = min(most, max(1, int(measurements.cluster.get("cores", 1))))
        if _fixed_workers(cluster):  # runs share the workers there are: the other roles need theirs
            others = graph.n_actors - graph.role(shape.sampler).replicas
            most = min(most, max(1, int(measurements.cluster.get("workers", most + others)) - others))
        hand = as_candidate(graph, shape.sampler, shape.length, shape.round_steps)
        if hand.vector == "auto":  # what it steps on here, as far as the measured backends tell
            hand = replace(hand, vector=auto_backend(measurements.vector.get("step_s", {})))
        slot = max(12.0, (0.6 * budget_s - 5.0 * runs) / runs)
        done: dict[Candidate, float | None] = {}
        if n_verify and not measurements.calibration:
            bar.set_postfix_str("calibrating on a short distributed run")
            raw = rank(shape, costs(), most)
            # the graph as written on the chosen backend: the probes measured that one
            mine = replace(hand, vector=shape.vector)
            probe = (
                mine
                if _distributed(hand) and hand.policy in MODELLED
                else next((c for c, _ in raw if _distributed(c)), None)
            )
            if probe is not None:
                done[probe] = verify(candidate_data(data, shape, probe), graph.path, cluster, slot)
                predicted = predict(probe, shape, costs()[probe.vector]).steps_s
                if done[probe]:
                    measurements.calibration = {
                        "candidate": probe.describe(), "predicted": predicted, "achieved": done[probe]
                    }  # fmt: skip
            bar.update(1)
        ranked = rank(shape, costs(), most)
        if not ranked:
            raise ConfigError(graph.path, "roles", f"no setting keeps {shape.round_steps} env steps per update")
        tuning = Tuning(shape, measurements, ranked, hand=hand)
        if n_verify:
            predicted = dict(ranked)
            if hand not in predicted and hand.policy in MODELLED and hand.vector in shape.vectors:
                predicted[hand] = predict(hand, shape, costs()[hand.vector])
            groups: dict[tuple[str, int], list[tuple[Candidate, float]]] = {}  # by (policy, samplers), best first
            for c, p in ranked:
                groups.setdefault((c.policy, c.samplers), []).append((c, p.steps_s))
            # one of each of the best groups: settings that differ, each the nearest the graph as written
            picks = [nearest(options, hand) for options in list(groups.values())[:n_verify]]
            # and one process, measured: the freshest data, which a distributed setting must clearly outrun
            one = [(c, rate) for options in groups.values() for c, rate in options if not _distributed(c)]
            for c in [hand, *done, *([nearest(one, hand)] if one else [])]:
                if c not in picks:
                    picks.append(c)
            for c in picks:
                if c not in done:
                    bar.set_postfix_str(f"verifying {c.describe()}")
                    done[c] = verify(candidate_data(data, shape, c), graph.path, cluster, slot)
                    bar.update(1)
            tuning.verified = [Result(c, predicted.get(c), done[c]) for c in picks]
        bar.update(bar.total - bar.n)
    return tuning


PROBE_WORKERS = 17
"""Most workers a local cluster started for the probes gets: the load probe's learner and up to 16
samplers (the most a candidate runs)."""


def measuring(spec: Any, graph: Graph) -> Any:
    """The cluster to measure on: a local one sized by the graph (``workers: auto``) gets a worker for
    the learner and twice as many samplers as cores, up to :data:`PROBE_WORKERS`, so the load probe
    runs as many samplers at once as candidates do; other clusters as they are."""
    from dagrl.clusters.spec import LocalClusterSpec

    if not isinstance(spec, LocalClusterSpec) or spec.workers != "auto":
        return spec
    return replace(spec, workers=max(graph.n_actors, min(PROBE_WORKERS, 2 * (os.cpu_count() or 1) + 1)))


def _packs(cluster: Any) -> bool:
    """Whether runs on ``cluster`` merge more sampler replicas than cores into as many as the cores
    (dagrl's own LocalCluster, ``pack_samplers``: :func:`dagrl.app.packing.packed_samplers`)."""
    from dagrl.clusters.spec import LocalClusterSpec

    spec = cluster or LocalClusterSpec()
    return isinstance(spec, LocalClusterSpec) and spec.pack_samplers


def _fixed_workers(cluster: Any) -> bool:
    """Whether runs on ``cluster`` get the workers already there (an attached scheduler) rather than
    a cluster sized for each."""
    from dagrl.clusters.spec import SchedulerSpec

    return isinstance(cluster, SchedulerSpec)


def write_tuned(tuning: Tuning, data: dict[str, Any], command: str, path: str | Path, where: str) -> Graph:
    """Write the chosen setting as a graph file (validated first), comments saying why; return it."""
    shape, m = tuning.shape, tuning.measurements
    chosen = tuning.chosen
    out = candidate_data(data, shape, chosen.candidate)
    out["name"] = Path(path).stem
    graph = resolve_graph(out, str(path))
    c = m.costs(shape.sampler, [])
    cl = m.cluster
    kept = "batch" if shape.onpolicy else "env steps between learner rounds"
    lines = [
        f"Tuned by `{command}`.",
        f"Machine: {cl.get('hosts', 1)} host(s), {c.cores} cores, {cl.get('gpus', 0):g} GPUs, "
        f"{cl.get('workers', 1)} workers probed.",
        f"Kept from {where}: {shape.round_steps} env steps per learner update ({kept}) and every",
        f"other hyperparameter; changed: policy, roles.{shape.sampler} (replicas, envs, vector), "
        f"hyperparameters.{shape.length_key}.",
        "Measured: a sampler's vector step "
        f"{1e3 * c.step_fixed_s:.3f} ms + {1e3 * c.step_per_env_s:.3f} ms per env "
        f"(env {100 * c.env_share:.0f} % of it, taking a core {100 * c.env_cpu:.0f} % of its time);",
        f"  a learner round {1e3 * c.round_s:.1f} ms; a task round trip {1e3 * c.hop_s:.2f} ms, a direct call "
        f"{1e3 * c.call_s:.2f} ms; "
        f"peer bandwidth {_rate(c.peer_bytes_s)};",
        "  beside a learner, samplers collecting at once: "
        + (", ".join(f"{k}: {s:.2f} x slower" for k, s in c.load) if c.load else "not measured (one worker)")
        + ".",
    ]
    if m.vector:
        v = m.vector
        steps = ", ".join(f"{b} {1e3 * t:.3f} ms ({1e3 * v['cpu_s'][b]:.3f} ms CPU)" for b, t in v["step_s"].items())
        lines.append(f"Vector env backends, {v['envs']} envs stepped alone, per vector step: {steps};")
        lines.append(f"  the probes ran on {v['chosen']} (chosen by {v['by']} time); candidates on the others")
        lines.append("  have their env's seconds swapped for that backend's.")
    cal = m.calibration
    if cal:
        lines += [
            f"Calibrated on a short real run of {cal['candidate']}: {cal['achieved']:.0f} env steps/s achieved,",
            f"  {cal['predicted']:.0f} predicted; every distributed prediction is scaled by {c.calibration:.2f}.",
        ]
    lines.append("Predicted (env steps/s), best first:")
    lines += [f"  {p.steps_s:9.0f}  {cand.describe()} ({p.bound}-bound)" for cand, p in tuning.ranked[:5]]
    if tuning.verified:
        lines.append("Verified by short real runs (env steps/s): predicted -> achieved")
        for r in tuning.verified:
            pred = "-" if r.predicted is None else f"{r.predicted.steps_s:.0f}"
            got = "too few iterations" if r.achieved is None else f"{r.achieved:.0f}"
            lines.append(f"  {pred:>9} -> {got:>9}  {r.label(tuning)}")
    header = "".join(f"# {line}\n" for line in lines)
    Path(path).write_text(header + yaml.safe_dump(out, sort_keys=False, default_flow_style=False, width=120))
    return graph


def _rate(bytes_s: float) -> str:
    return "unmeasured (one worker)" if not np.isfinite(bytes_s) else f"{bytes_s / 1e9:.2f} GB/s"
