"""``async``, ``apex`` and ``split-learner``: samplers stream to the learner's hub; the learner pulls.

The iteration runs without the driver (:mod:`dagrl.runtime.stream`, :mod:`dagrl.runtime.loops`): one
long-running task per sampler collects back to back and hands each rollout on, worker to worker; one
on the learner's worker runs the learner's rounds and publishes each new weights version, which each
sampler takes between two rollouts. No scheduler task and no driver decision per rollout. The driver
watches (:class:`~dagrl.runtime.watch.StreamWatch`: the rounds, the loops' health, recovery); what is
left here is what each policy chooses:

* ``async``: the rollouts go to the hub, and each round takes ``min_rollouts_per_update`` to
  ``rollouts_per_update`` of them (by default one per sampler), dropping those staler than
  ``max_staleness`` versions;
* ``apex``: each sampler stores its rollouts in its replay shard itself (``add`` on the shard's
  worker) and the hub gets their reports; the rounds (``sample -> update -> reprioritize``) follow the
  inserts at ``update_ratio``, both ways, after the warm-up (``learning_starts``);
* ``split-learner``: as ``apex``, two learner roles updating at once.

Under ``async`` and ``apex`` a learner given ``replicas: K`` runs as a data-parallel group
(:mod:`dagrl.runtime.groups`): each round is shared among the K replicas in equal parts (rollouts
under ``async``, a multiple of K a round; replay shards ``m % K == k`` to replica k under ``apex``),
which average gradients every step and publish one weights version. Their states are compared after
the first round that learns and at every checkpoint; a lost replica past the first is replaced and
the group formed anew without a rollback.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dagrl.core.distribution import delayed_edges, warmup_steps
from dagrl.core.graph import Graph
from dagrl.policies.base import Policy, StepResult
from dagrl.runtime.hosts import Handle
from dagrl.runtime.stream import Learned, Limit
from dagrl.runtime.supervisor import RoleFailure
from dagrl.runtime.watch import Hooks, StreamWatch


class Stream(Hooks, Policy):
    """A policy whose samplers stream (module docstring): its watch runs the stream, :meth:`hub_options`
    says how the learner takes what the samplers made."""

    staleness_key = "perf/staleness"

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        self.recovery.regroups = frozenset(self.groups.roles)
        self.checked = False
        """A learner group's replicas were found equal after the first round that learnt."""
        self.watch = StreamWatch(
            graph, hosts, self.executor.client, self.recovery, self.hub_options, self.delayed_edges(), hooks=self
        )

    def hub_options(self, samplers: int) -> dict[str, Any]:
        """How this policy's hub takes what ``samplers`` samplers make (:class:`~dagrl.runtime.stream.Hub`)."""
        raise NotImplementedError

    def delayed_edges(self) -> set[tuple[int, int]]:
        """Learn-side edges carrying the previous round's value (``split-learner``)."""
        return set()

    def step(self, ahead: bool = False) -> StepResult:
        checking = bool(self.groups) and not self.checked
        if checking:  # a round at a time until the first that learns: the replicas are compared at rest
            self.groups.prepare()
        r = self.watch.next_round(1 if checking else self.horizon)
        if checking and r.learnt:
            self.groups.check("after the first round")
            self.checked = True
        return self._result(r)

    def regroup(self, role: str) -> None:
        self.groups.regroup(role)

    @property
    def pending(self) -> bool:
        """Rounds the learner finished past the stop: stop the stream, then hand them over (they count)."""
        return self.watch.finish()

    def role_failed(self, failure: RoleFailure) -> None:
        """A sampler found failed outside the watch (asked for its state at a checkpoint) is handled as
        the watch handles one: dropped, or replaced with its loop started again."""
        h = failure.handle
        if self.watch.started and h.role == self.watch.role and self.hosts[h.role][h.index] is h:
            self.watch.sampler_failed(h.index, failure)
        else:
            super().role_failed(failure)

    def _result(self, r: Learned) -> StepResult:
        res = StepResult()
        for source, rep in r.reports:
            res.add_output(rep, source=source)
        res.metrics = dict(r.metrics)
        res.metrics[self.staleness_key] = float(np.mean(r.lags)) if r.lags else 0.0
        res.metrics["perf/rollouts_per_update"] = float(len(r.lags))
        res.metrics["stream/version"] = float(r.version)
        res.metrics["stream/oldest_version"] = float(r.oldest)
        res.metrics["perf/collects"] = float(r.collects)
        res.metrics["samplers/active"] = float(self.watch.active)
        if self.watch.status is not None:
            res.metrics["perf/dropped_rollouts"] = float(self.watch.dropped)
            res.metrics["stream/refused"] = float(self.watch.refused)
        for k, busy in enumerate(r.busy):  # a learner group: each replica's share of the round in its fragments
            res.metrics[f"learners/{k}/busy"] = busy / r.wall_s if r.wall_s > 0 else 0.0
        res.update_time, res.sample_time = r.update_s, r.wall_s
        return res

    def after_restore(self) -> None:
        """The learner was replaced and restored: a new hub for it; the old one redirects its samplers."""
        self.watch.new_generation()

    def close(self) -> None:
        self.watch.close()
        super().close()


class Async(Stream):
    """``async``: the learner takes the rollouts themselves, ``min_rollouts_per_update`` to
    ``rollouts_per_update`` of them; staler than ``max_staleness`` versions: dropped (counted)."""

    name = "async"

    @property
    def stream_options(self) -> Any:
        """The :class:`~dagrl.core.distribution.AsyncOptions` this stream runs with."""
        return self.options

    def hub_options(self, samplers: int) -> dict[str, Any]:
        o = self.stream_options
        budget = o.per_update(samplers)
        return {
            "budget": budget, "capacity": max(budget, (o.in_flight - 1) * samplers),
            "max_staleness": o.max_staleness, "least": o.least_per_update(samplers),
        }  # fmt: skip


class Apex(Stream):
    """``apex``: each sampler stores its rollouts in replay shard i mod K itself; the learner's rounds
    (``sample -> update -> reprioritize``) follow ``update_ratio`` rounds per insert both ways
    (``rate_limit: false``: free), from the point the replay holds ``learning_starts`` env steps; until
    then an iteration counts a round's worth of inserts and nothing learns."""

    name = "apex"
    staleness_key = "perf/weights_lag"
    runs_ahead = True
    """Its learner's rounds follow each other without the driver (what :mod:`dagrl.app.tune.model` calls
    running ahead; ``async``'s do too, and the model has a form of its own for them)."""

    def hub_options(self, samplers: int) -> dict[str, Any]:
        o = self.options
        ratio = o.update_ratio if o.update_ratio is not None else 1.0 / samplers
        limit = Limit(
            ratio, o.max_lead if o.max_lead is not None else samplers, o.rate_limit,
            warmup_steps(self.graph.config), max(1, round(1 / ratio)), o.publish_every,
        )  # fmt: skip
        shards = {n.id: len(self.hosts[n.role]) for n in self.watch.shape.insert}
        return {"budget": 1, "capacity": 1, "max_staleness": None, "limit": limit, "shards": shards}


class SplitLearner(Apex):
    """``split-learner``: as ``apex``, but a value passed between two single-instance learner roles in a
    round (SAC: the critic's new weights to the actor) arrives one round late, so both learner roles
    update at once, on their own workers and devices (Spreeze's dual-GPU idea). The learner loop calls
    the two updates of a round together (:meth:`~dagrl.runtime.loops.Caller.run`)."""

    name = "split-learner"

    def delayed_edges(self) -> set[tuple[int, int]]:
        return delayed_edges(self.graph.algorithm)
