"""The cost model of ``dagrl tune``: which settings a graph could run with, and how fast each would go.

Everything here is a pure function of a :class:`Shape` (what the graph fixes) and
:class:`~dagrl.app.tune.measure.Measurements` (what the cluster showed), so the same measurements give
the same ranking.

What the tuner may change and what it keeps
-------------------------------------------
It changes how the work is spread, never what is learnt from: the env steps behind each learner
update (PPO's batch, an off-policy algorithm's steps between learner rounds, so its update-to-data
ratio) and every hyperparameter but the off-policy rollout length stay as written, and an ``async``
candidate's weights lag stays within the graph's own (1 for a graph that is not ``async``). Candidates differ
in the policy, the number of samplers, envs per sampler and, where the policy decouples them, how
many collects feed one update (``rollouts_per_update``, ``update_ratio``), and the vector env backend
among those measured (:attr:`Shape.vectors`): the probes run on one (:attr:`Shape.vector`), and a
candidate on another has its env's seconds swapped for that backend's
(:meth:`~dagrl.app.tune.measure.Measurements.costs`).

The model
---------
A collect of ``envs`` envs for ``length`` steps takes ``length * (a + b * envs)`` seconds on an idle
core (``a``, ``b`` fitted to the probes), of which the env's measured CPU share uses a core (a
sleeping simulator does not). With ``k`` samplers collecting at once beside a learner it takes
longer, by a factor measured with 2, 4, 8... samplers collecting beside a learner (none for one
sampler; between and past those, on the line through them). A
learner round takes the measured ``L``. Moving a collect between workers costs one task hop plus its
bytes at the measured peer bandwidth; a ``sync`` iteration adds a task round trip per fragment
after the samplers' and one for ``publish`` after ``update`` (``sync`` runs ahead of the driver).
What a distributed run loses beyond that (the driver's dispatch, samplers waiting for weights or
for the rate limiter) is measured once, by a short real run, as achieved over predicted,
and scales every distributed candidate.

* ``single``: collects then the update, one after another: ``steps / (collects * collect + L)``.
* ``sync``: every sampler collects at once, then the update: the collects stretched by CPU
  contention when the samplers want more cores than there are.
* ``async``, ``apex``, ``split-learner``: samplers and learner run at once, as loops on their workers
  (:attr:`~dagrl.core.distribution.Traits.streams`); throughput is the slower of the two rates (samplers
  counted only as many as the rate limiter lets collect at once: ``async`` lets ``2 x rollouts_per_update``
  collects run ahead of the learner), the learner's slowed by the CPU everything else needs: the samplers,
  as busy as the rate limiter lets them be. No scheduler task and no driver decision is on a rollout's or a round's
  path: a sampler pushes its rollout to the hub beside the learner while the round before runs, and
  the learner loop calls a round's fragments one after another, a call to a role on another worker (a
  replay shard, ``split-learner``'s actor) a direct call (:attr:`Costs.call_s`) rather than a task's
  round trip. A round's time is its critical path (:func:`round_period`, with calls for hops and the
  rounds back to back); ``split-learner`` feeds a learner role the other's previous round, so its
  roles update at once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from dagrl.core.distribution import POLICY_TRAITS, traits

__all__ = ["Candidate", "LearnStep", "Prediction", "Shape", "candidates", "predict", "rank", "round_period"]

ONPOLICY = tuple(p for p, t in POLICY_TRAITS.items() if t.cost in ("serial", "lockstep", "stream"))
"""The policies the tuner weighs for an on-policy algorithm (their :attr:`~dagrl.core.distribution.Traits.cost`)."""
OFFPOLICY = tuple(p for p, t in POLICY_TRAITS.items() if t.cost in ("serial", "lockstep", "replay"))
SAMPLER_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_ENVS = 64
"""Most envs one sampler gets among the candidates (a vector env steps them in one thread)."""


@dataclass(frozen=True)
class LearnStep:
    """One fragment call of a learner round, for the round's critical path (:func:`round_period`)."""

    key: str
    """``role.fragment``: where its seconds per round are in :attr:`Costs.fragment_s`."""
    role: str
    inputs: tuple[int, ...] = ()
    """Earlier steps of the same round whose outputs it takes."""
    delayed: tuple[int, ...] = ()
    """Steps on another learner role whose output it takes: the previous round's under
    ``split-learner`` (its delayed edges), this round's under every other policy."""


@dataclass(frozen=True)
class Shape:
    """What a graph fixes for the tuner (see the module docstring)."""

    onpolicy: bool
    """Samplers feed the learner directly (PPO, IMPALA); else through replay (DQN, SAC, TD3)."""
    sampler: str
    """The replicated role that collects (its name in ``roles``)."""
    length_key: str
    """The hyperparameter holding a collect's length in vector steps (``num_steps``, ``steps``)."""
    length: int
    """Its value in the graph."""
    round_steps: int
    """Env steps behind one learner update; kept by every candidate."""
    policies: tuple[str, ...]
    """The policies the algorithm can run, among those the tuner considers."""
    step_bytes: int
    """Bytes one env step adds to a rollout (observation, action, reward, flags)."""
    max_staleness: int = 2
    """``async``'s bound, as in the graph when it is an ``async`` graph."""
    max_lag: float = 1.0
    """Most weights lag (:func:`lag`) an ``async`` candidate may have: the graph's own when it is an
    ``async`` graph, else 1. Staler rollouts change what PPO learns from (and past ``max_staleness``
    are dropped), so a faster setting with more lag can reach the target later."""
    round_hops: int = 2
    """Task round trips on a ``sync`` iteration's critical path after the samplers': each fragment
    (``update``; a replay's ``add`` and ``sample``), and one for ``publish`` after ``update``."""
    vector: str = "sync"
    """The samplers' vector env backend (``roles.<sampler>.vector``) the probes ran on: the graph's,
    until the tuner has measured the backends and chosen one (:func:`dagrl.app.tune.tuner.choose_vector`)."""
    vectors: tuple[str, ...] = ()
    """The backends candidates may use (each measured); empty: :attr:`vector` alone."""
    inserts: int = 0
    """Fragments each collect calls on other roles (a replay shard's ``add``): a direct call each."""
    learn: tuple[LearnStep, ...] = ()
    """A streaming policy's learner round, step by step (empty, or a step's seconds unmeasured: priced
    as the learner roles' work and a direct call per step)."""


@dataclass(frozen=True)
class Candidate:
    policy: str
    samplers: int
    envs: int
    """Envs per sampler."""
    length: int
    """Vector steps per collect."""
    collects_per_round: int
    """Collects behind one learner update (``rollouts_per_update``; ``1 / update_ratio``)."""
    vector: str = "sync"
    """The samplers' vector env backend."""

    def describe(self) -> str:
        per = f", {self.collects_per_round} collects/update" if traits(self.policy).streams else ""
        backend = "" if self.vector == "sync" else f", {self.vector}"
        return f"{self.policy}: {self.samplers} x {self.envs} envs x {self.length} steps{per}{backend}"


@dataclass(frozen=True)
class Prediction:
    steps_s: float
    """Env steps per second the candidate should reach."""
    collect_s: float
    """Seconds one collect takes on an idle core."""
    round_s: float
    """Seconds one learner round takes (its transfers included)."""
    contention: float
    """How much CPU contention slows everything (1: none)."""
    bound: str
    """What limits it: ``samplers``, ``learner`` or ``serial`` (one waits for the other)."""


def parallel(c: Candidate) -> int:
    """Collects running at once: the rate limiter lets samplers be ``collects_per_round + max_lead``
    collects ahead of the last finished round; async's ``max_lead`` is ``rollouts_per_update``,
    apex's one per sampler."""
    lead = c.collects_per_round if traits(c.policy).cost == "stream" else c.samplers
    return min(c.samplers, c.collects_per_round + lead)


def lag(c: Candidate) -> float:
    """Updates the learner makes, about, while one ``async`` collect runs: the collects running at
    once over the collects each update takes."""
    return parallel(c) / c.collects_per_round if traits(c.policy).cost == "stream" else 0.0


def staleness(c: Candidate) -> float:
    """How many learner rounds what a round learns from may trail the newest weights, about: 0 where
    every collect acts with the newest weights and each learner role takes the others' newest
    (``single``, ``sync``); under the streaming policies the collects running at once over those a round
    takes, plus, under ``split-learner``, the round by which the actor's input trails the critic."""
    kind = traits(c.policy)
    if not kind.streams:
        return 0.0
    return parallel(c) / c.collects_per_round + (1.0 if kind.split else 0.0)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(shape: Shape, max_samplers: int) -> list[Candidate]:
    """Every setting the tuner considers for ``shape``, with at most ``max_samplers`` samplers."""
    counts = [k for k in SAMPLER_COUNTS if k <= max_samplers]
    out: list[Candidate] = []
    if shape.onpolicy:  # the rollout length stays; the batch's envs are spread over samplers
        if shape.round_steps % shape.length:
            return []
        total = shape.round_steps // shape.length
        envs = [n for n in divisors(total) if n <= MAX_ENVS]
        for policy in shape.policies:
            cost = traits(policy).cost
            if cost == "serial" and total <= MAX_ENVS:
                out.append(Candidate(policy, 1, total, shape.length, 1))
            elif cost == "lockstep":
                out += [Candidate(policy, k, total // k, shape.length, k) for k in counts if k > 1 and total % k == 0]
                out = [c for c in out if c.envs <= MAX_ENVS]
            elif cost == "stream":
                # more samplers than the rate limiter lets collect at once would only wait (see `parallel`)
                out += [
                    Candidate(policy, k, n, shape.length, total // n)
                    for n in envs
                    for k in counts
                    if k <= 2 * total // n
                ]
        return on_backends([c for c in out if lag(c) <= shape.max_lag + 1e-9], shape)
    per_collect = [e for e in divisors(shape.round_steps)]  # env steps one collect adds between rounds
    for policy in shape.policies:
        for e in per_collect:
            for n in (n for n in divisors(e) if n <= MAX_ENVS):
                collects = shape.round_steps // e
                cost = traits(policy).cost
                if cost == "serial" and collects == 1:
                    out.append(Candidate(policy, 1, n, e // n, 1))
                elif cost == "lockstep":
                    if collects > 1 and collects in counts:
                        out.append(Candidate(policy, collects, n, e // n, collects))
                elif cost == "replay":
                    out += [Candidate(policy, k, n, e // n, collects) for k in counts]
    return on_backends(out, shape)


def on_backends(out: list[Candidate], shape: Shape) -> list[Candidate]:
    """Each candidate once per vector env backend of ``shape``."""
    return [replace(c, vector=v) for v in (shape.vectors or (shape.vector,)) for c in out]


@dataclass(frozen=True)
class Costs:
    """The measurements the model reads (a view of :class:`~dagrl.app.tune.measure.Measurements`)."""

    step_fixed_s: float
    """Seconds per vector step of a sampler, whatever its envs (``a``)."""
    step_per_env_s: float
    """Seconds per vector step per env (``b``)."""
    env_cpu: float
    """Share of an env step's time that takes a core (0: the simulator sleeps; 1: it computes)."""
    env_share: float
    """Share of a vector step's time spent inside the envs (the rest is acting: a CPU forward)."""
    round_s: float
    """Seconds of one learner round, all learner roles one after another."""
    round_overlap_s: float
    """Seconds of one learner round when learner roles run at once (``split-learner``)."""
    hop_s: float
    """Seconds a task takes to reach a worker and report back (distributed only)."""
    peer_bytes_s: float
    """Worker-to-worker bandwidth."""
    cores: int
    task_cpu_s: float = 0.0
    """CPU seconds the scheduler, the driver and a worker spend on one task (distributed only)."""
    call_s: float = 0.0
    """Seconds of a direct call from one worker to another and its answer: what a streaming learner
    loop pays per fragment on another worker (distributed only)."""
    calibration: float = 1.0
    """Achieved over predicted env steps/s of one short real distributed run: what orchestration
    (the driver's dispatch, weights waits, the rate limiter's pauses) costs beyond the model."""
    fragment_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds per round of each learner-side fragment, by ``role.fragment`` (:class:`LearnStep`)."""
    load: tuple[tuple[int, float], ...] = ()
    """``(samplers, slowdown)``: how much slower a collect ran with that many samplers collecting at
    once beside a learner, one pair per load probe window, fewest samplers first."""

    def slowdown(self, samplers: int) -> float:
        """A collect's slowdown with ``samplers`` collecting at once beside a learner: on the line
        through the measured windows (none for one sampler), past the last along its last segment."""
        points = [(1, 1.0), *((k, s) for k, s in self.load if k > 1)]
        if len(points) == 1:
            return 1.0
        segments = list(itertools.pairwise(points))
        (k0, s0), (k1, s1) = next((seg for seg in segments if samplers <= seg[1][0]), segments[-1])
        return max(1.0, s0 + (s1 - s0) * (samplers - k0) / (k1 - k0))


def predict(c: Candidate, shape: Shape, costs: Costs) -> Prediction:
    """Env steps/s of ``c`` under ``costs`` (see the module docstring)."""
    steps = c.envs * c.length
    collect = c.length * (costs.step_fixed_s + costs.step_per_env_s * c.envs)
    cpu = 1.0 - costs.env_share * (1.0 - costs.env_cpu)  # the core share of a collect
    kind = traits(c.policy)
    if kind.cost == "serial":
        total = c.collects_per_round * collect + costs.round_s
        return Prediction(shape.round_steps / total, collect, costs.round_s, 1.0, "serial")
    if kind.cost == "lockstep":
        move = costs.hop_s + steps * shape.step_bytes / costs.peer_bytes_s
        stretch = max(1.0, (c.samplers * cpu + costs.task_cpu_s * c.samplers / collect) / costs.cores)
        collect *= max(stretch, costs.slowdown(c.samplers))
        total = collect + (1 + shape.round_hops) * costs.hop_s + c.samplers * move + costs.round_s
        return Prediction(costs.calibration * shape.round_steps / total, collect, costs.round_s, stretch, "serial")
    if shape.learn and all(s.key in costs.fragment_s for s in shape.learn):  # calls overlap other roles' work
        round_s = round_period(shape, costs, kind.split)
        learner_cores = max(1.0, sum(costs.fragment_s.get(s.key, 0.0) for s in shape.learn) / round_s)
    else:
        learner = costs.round_overlap_s if kind.split else costs.round_s
        round_s = learner + (len(shape.learn) or 1) * costs.call_s
        learner_cores = 1.0
    at_once = parallel(c)
    collect *= costs.slowdown(at_once)
    handover = (1 + shape.inserts) * costs.call_s + steps * shape.step_bytes / costs.peer_bytes_s  # push, adds
    sampler_rate = at_once * steps / (collect + handover)
    learner_rate = shape.round_steps / round_s
    rate, stretch, samplers_at = min(sampler_rate, learner_rate), 1.0, sampler_rate
    for _ in range(4):  # everything shares the cores: no task per rollout or round adds to it
        busy = min(1.0, rate / samplers_at)  # a rate limiter holds samplers that run ahead of the learner
        demand = at_once * cpu * busy + learner_cores * rate / learner_rate
        stretch = max(1.0, demand / costs.cores)
        # collects measured beside a learner (costs.load) already ran with the CPU they compete for
        samplers_at = sampler_rate if costs.load else sampler_rate / stretch
        rate = min(samplers_at, learner_rate / stretch)
    bound = "samplers" if samplers_at <= learner_rate / stretch else "learner"
    return Prediction(costs.calibration * rate, collect, round_s, stretch, bound)


def round_period(shape: Shape, costs: Costs, delayed: bool, rounds: int = 24) -> float:
    """Seconds between a streaming learner loop's rounds in steady state, rounds simulated one after
    another, each started when the one before has ended (no driver, no submission). A step starts once
    the loop's call has reached it and its inputs have (a direct call each, :attr:`Costs.call_s`, never a
    task's round trip) and its role's previous step is done (one fragment at a time per role); it takes
    its probed seconds. ``delayed``: a :attr:`LearnStep.delayed` input is the previous round's
    (``split-learner``), so the two learner roles update at once."""
    hop, steps = costs.call_s, shape.learn
    seconds = [costs.fragment_s.get(s.key, 0.0) for s in steps]
    free: dict[str, float] = {}
    previous: list[float] | None = None
    started, starts = 0.0, []
    for _ in range(rounds):
        starts.append(started)
        done: list[float] = []
        for s, took in zip(steps, seconds, strict=True):
            ready = max([started + hop, *(done[j] + hop for j in s.inputs)])
            if delayed:
                ready = max([ready, *(previous[j] + hop for j in s.delayed if previous is not None)])
            else:
                ready = max([ready, *(done[j] + hop for j in s.delayed)])
            done.append(max(ready, free.get(s.role, 0.0)) + took)
            free[s.role] = done[-1]
        started, previous = max(done), done
    half = rounds // 2
    return (starts[-1] - starts[half]) / (rounds - 1 - half)


def rank(shape: Shape, costs: Costs | Mapping[str, Costs], max_samplers: int) -> list[tuple[Candidate, Prediction]]:
    """Candidates, fastest predicted first; ties go to fewer samplers, then fewer envs (cheaper).
    ``costs``: one for every candidate, or one per vector env backend."""

    def of(c: Candidate) -> Costs:
        return costs if isinstance(costs, Costs) else costs[c.vector]

    scored = [(c, predict(c, shape, of(c))) for c in candidates(shape, max_samplers)]
    scored = [(c, p) for c, p in scored if math.isfinite(p.steps_s) and p.steps_s > 0]
    order = {p: i for i, p in enumerate(ONPOLICY + OFFPOLICY)}
    scored.sort(
        key=lambda cp: (
            -round(cp[1].steps_s, 6), cp[0].samplers, cp[0].envs, order[cp[0].policy], cp[0].vector != shape.vector
        )
    )  # fmt: skip
    return scored
