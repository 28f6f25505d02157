"""What every distribution policy gives the driver: one iteration at a time, plus checkpoint state.

Fragment calls go through one :class:`~dagrl.runtime.executor.Executor` (Dask tasks on the role's
worker, or in-process for ``single``); control (checkpoints, heartbeats, where a host runs) goes
through the role actors' own methods.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagrl.core.context import Episodes
from dagrl.core.fragment import FragmentGraph, Node
from dagrl.core.graph import Graph
from dagrl.runtime import mailbox, shm
from dagrl.runtime.executor import Call, Executor, Transport
from dagrl.runtime.hosts import Handle, close_all
from dagrl.runtime.recovery import Recovery
from dagrl.runtime.report import Report
from dagrl.runtime.supervisor import RoleFailure

log = logging.getLogger("dagrl")


@dataclass
class StepResult:
    """What one iteration produced, as the driver counts it."""

    env_steps: int = 0
    episodes: Episodes = field(default_factory=Episodes)
    metrics: dict[str, float] = field(default_factory=dict)
    sample_time: float = 0.0
    """Seconds spent producing env steps (wall time of the sampling stage)."""
    update_time: float = 0.0
    """Seconds spent in the fragment that returned the metrics (the update)."""
    sources: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """For each episode, the replica of the role that produced it (-1: unknown)."""

    def add_output(self, out: Any, source: int = -1) -> None:
        """Count env steps and finished episodes if ``out`` is a sampler output or its :class:`Report`."""
        steps = getattr(out, "env_steps", None)
        episodes = getattr(out, "episodes", None)
        if isinstance(steps, int | np.integer):
            self.env_steps += int(steps)
        if isinstance(episodes, Episodes) and len(episodes):
            self.episodes = Episodes.concat([self.episodes, episodes])
            self.sources = np.concatenate([self.sources, np.full(len(episodes), source, np.int64)])


@dataclass
class Submitted:
    """An iteration submitted and not yet waited for (:meth:`Policy.submit_graph`)."""

    calls: dict[int, list[Call]]
    reports: dict[int, list[Call]]
    outs: list[Call]
    watch: list[Call]
    """Every call of the iteration, in submission order (a failure is blamed on the first that failed)."""
    t0: float
    folded: list[int] = field(default_factory=list)
    """Nodes whose reports the output's own task computes, in the order it returns them."""


class Policy:
    """Base of the distribution policies: owns role hosts, runs iterations, exposes learner state."""

    name = "base"
    distributed = True
    """Whether the policy needs a Dask cluster (``single`` does not)."""

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Executor | None = None):
        self.graph = graph
        self.hosts = hosts
        self.options = graph.policy_options
        self.executor = executor or Executor()
        self.supervisor: Any = self.executor.supervisor
        """A :class:`~dagrl.runtime.supervisor.Supervisor` for policies on a cluster (the executor's)."""
        self.recovery = Recovery(graph, hosts, self.supervisor)
        """What the loss of a role instance means, decided once for every policy (the policy reports)."""
        self.horizon: int | None = None
        """Set by the driver before each :meth:`step`: the iterations, that one included, that may end
        before the driver must act (a checkpoint, a blocking evaluation, a foreseeable stop);
        ``None``: no bound. A policy whose learner runs on its own never runs past it."""
        self.counting: dict[int, bool] = {}
        """Per node on a replicated role: whether its outputs carry env steps (learnt from the first report)."""

    def recover(self, failure: RoleFailure) -> None:
        """A role instance failed: :class:`~dagrl.runtime.recovery.Recovery` replaces it (a sampler, a replay
        shard, an evaluator) and the iteration is redone, or raises it on for the driver to roll back."""
        self.recovery.recover(failure)

    def counts(self, node: Node) -> bool:
        """Whether the driver needs a :class:`Report` of ``node``'s outputs (sampler outputs)."""
        return self.graph.algorithm.roles[node.role].many and self.counting.get(node.id, True)

    def learn_counting(self, node: Node, reports: list[Report]) -> None:
        self.counting[node.id] = any(r.counted for r in reports)

    def run_graph(self, graph: FragmentGraph) -> tuple[dict[int, list[Call]], dict[int, list[Report]], Any, float]:
        """Submit a whole fragment graph at once and wait for it: calls, reports, output, start time.

        Sampler outputs stay on their workers; only their reports and the output come back.
        """
        return self.finish_graph(self.submit_graph(graph))

    def submit_graph(
        self,
        graph: FragmentGraph,
        previous: Submitted | None = None,
        mail: dict[tuple[int, int], tuple[int, ...]] | None = None,
    ) -> Submitted:
        """Submit every call of ``graph`` and the reports the driver needs; wait for none of them.

        ``previous``: an iteration still in flight that this one follows. Each call then also waits
        for the last call of ``previous`` on its role, so a role state sees the iterations in order
        (the next ``publish`` after this ``update``), however Dask orders ready tasks.
        ``mail``: edges whose value may go through a same-host mailbox (:meth:`Executor.run_nodes`), each
        with the nodes its consumer then also waits for (:func:`~dagrl.core.distribution.mail_edges`).
        """
        t0 = time.perf_counter()
        roles = self.graph.algorithm.roles
        side: dict[int, list[Call]] = {}
        last: dict[str, list[Call]] = {}
        if previous is not None:
            for node in graph.nodes:
                last[node.role] = previous.calls[node.id]

        mail = mail or {}
        waits = {dst: ids for (_, dst), ids in mail.items() if ids}

        def after(node: Node, calls: dict[int, list[Call]]) -> list[Call]:
            side[node.id] = self.before(node, calls)
            ordered = [c for i in waits.get(node.id, ()) for c in calls[i]]
            return [*side[node.id], *ordered, *last.get(node.role, [])]

        positions = self.folded_reports(graph)
        folded = [graph.output.inputs[i].id for i in positions]
        fold = {graph.output.id: positions} if positions else {}
        reported = {n.id for n in graph.nodes if self.counts(n) and n.id not in folded}
        transport = Transport(
            reports=fold, announce=frozenset(reported), mail=frozenset(mail),
            collective=frozenset(n.id for n in graph.nodes if self.collective(n)),
        )  # fmt: skip
        calls = self.executor.run_nodes(graph.nodes, self.hosts, roles, after=after, transport=transport)
        reports = {n.id: [self.executor.report(c) for c in calls[n.id]] for n in graph.nodes if n.id in reported}
        outs = self.output_calls(graph.output, calls) if graph.output is not None else []
        watch = [c for n in graph.nodes for c in [*side.get(n.id, []), *calls[n.id]]]  # submission order: blame
        return Submitted(calls, reports, outs, watch, t0, folded)

    def collective(self, node: Node) -> bool:
        """Whether ``node``'s replicas wait for each other inside the call (:meth:`Executor.run_nodes`)."""
        return False

    def folded_reports(self, graph: FragmentGraph) -> tuple[int, ...]:
        """Positions of the output node's inputs whose reports its own task computes.

        A report task per sampler output costs the scheduler and the sampler's worker a task each
        (two of a ``sync`` PPO iteration's six tasks, 5 % of its time on two cores); when every
        replica's output goes to the one output call, which nothing but the driver reads, that call
        reports them instead.
        """
        out = graph.output
        roles = self.graph.algorithm.roles
        if not self.executor.remote or out is None or roles[out.role].many or len(self.hosts[out.role]) != 1:
            return ()
        if any(isinstance(a, Node) and a.id == out.id for n in graph.nodes for a in n.inputs):
            return ()  # another fragment consumes the output: it must stay the plain value
        seen: set[int] = set()
        positions = []
        for i, a in enumerate(out.inputs):
            if isinstance(a, Node) and a.id not in seen and self.counts(a):
                seen.add(a.id)
                positions.append(i)
        return tuple(positions)

    def finish_graph(self, sub: Submitted) -> tuple[dict[int, list[Call]], dict[int, list[Report]], Any, float]:
        """Wait for an iteration :meth:`submit_graph` submitted; on a failure, cancel what is left of it."""
        wanted = [r for rs in sub.reports.values() for r in rs]
        try:
            values = self.executor.wait([*wanted, *sub.outs], sub.watch)
        except RoleFailure:
            self.cancel(sub)
            raise
        got = iter(values)
        reports = {i: [next(got) for _ in rs] for i, rs in sub.reports.items()}
        outputs = list(got)
        if sub.folded:
            first, outputs[0] = outputs[0], outputs[0].value
            reports.update(zip(sub.folded, first.reports, strict=True))
        out = merge_outputs(outputs) if sub.outs else None
        return sub.calls, reports, out, sub.t0

    def cancel(self, sub: Submitted) -> None:
        self.executor.cancel([*sub.watch, *(r for rs in sub.reports.values() for r in rs)])

    def before(self, node: Node, calls: dict[int, list[Call]]) -> list[Call]:
        """Calls to submit before ``node`` runs, which it then waits for (none here; central inference
        loads the weights into its role before the samplers act)."""
        return []

    def output_calls(self, output: Node, calls: dict[int, list[Call]]) -> list[Call]:
        """The calls whose values make the iteration's output (merged by :func:`merge_outputs`):
        every replica of a single-instance role (data-parallel learners), the first of a replicated
        one (replay shards pass the learner's metrics on, each the same)."""
        return calls[output.id][:1] if self.graph.algorithm.roles[output.role].many else calls[output.id]

    def evaluate(self) -> dict[str, float]:
        """Run the algorithm's ``@evaluation`` graph once on this policy's hosts.

        Called by the driver between iterations (so a learner's ``publish`` is never concurrent with
        its ``update``); an evaluator that fails is replaced and the evaluation run again.
        """
        graph = self.graph.algorithm.eval_graph
        while True:
            try:
                _, _, out, _ = self.run_graph(graph)
                break
            except RoleFailure as failure:
                self.recover(failure)
        return {k: float(v) for k, v in out.items()} if isinstance(out, dict) else {}

    def restore(self, sd: dict[str, list[Any]]) -> None:
        """Load checkpointed learner-side state after a rollback (the failed host already replaced)."""
        self.load_state_dict(sd)
        self.after_restore()

    def after_restore(self) -> None:
        """Called after the driver restored learner state from a checkpoint (republish weights)."""

    def step(self, ahead: bool = False) -> StepResult:
        """Run one iteration. ``ahead`` is the driver's word that it will ask for the next one right
        after, with nothing in between; a policy may use it to submit the next one now."""
        raise NotImplementedError

    def resumed(self, env_steps: int) -> None:
        """The run goes on from a checkpoint taken after ``env_steps`` env steps."""

    @property
    def pending(self) -> bool:
        """Whether an iteration was submitted ahead: the driver runs it (:meth:`step`) before stopping."""
        return False

    def state_dict(self) -> dict[str, list[Any]]:
        """Every role replica's state (``None`` for one without, as a sampler, or one dropped)."""
        while True:
            futures = {
                role: [None if self.dropped(h) else h.state_dict() for h in hs] for role, hs in self.hosts.items()
            }
            try:
                return {role: [None if f is None else f.result() for f in fs] for role, fs in futures.items()}
            except RoleFailure as failure:  # a replay shard died: reopen it, ask again
                self.role_failed(failure)

    def role_failed(self, failure: RoleFailure) -> None:
        """A role instance failed while asked for its state, outside an iteration."""
        self.recover(failure)

    def load_state_dict(self, sd: dict[str, list[Any]]) -> None:
        """Load a checkpoint's role states. Skipped: a role this run does not start (an evaluator,
        evaluation off), replicas that hold no state (samplers under a streaming policy), and the
        snapshots of a role whose replica count changed since (its envs start fresh, said once)."""
        from dagrl.runtime.snapshot import KEY

        futures = []
        for role, states in sd.items():
            if role not in self.hosts or not any(s is not None for s in states):
                continue
            hosts = self.hosts[role]
            snapshots = all(s is None or KEY in s for s in states if isinstance(s, dict))
            if len(states) != len(hosts) and snapshots:
                log.info(
                    "%s: %d replicas now, %d in the checkpoint: their envs start fresh (the resume goes on "
                    "from the checkpoint, not exactly as the run would have)", role, len(hosts), len(states),
                )  # fmt: skip
                continue
            futures += [h.load_state_dict(s) for h, s in zip(hosts, states, strict=True) if s is not None]
        for f in futures:
            f.result()

    def actors(self) -> list[dict[str, Any]]:
        """Role, replica, address and device of every host (for logs, status and the dashboard)."""
        out = []
        for role, hs in self.hosts.items():
            for h in (h for h in hs if not self.dropped(h)):
                info = h.info().result()
                out.append({"role": role, "index": h.index, "address": h.address or "in-process", **info})
        return out

    def dropped(self, handle: Handle) -> bool:
        """Whether ``handle`` was dropped with its worker and not replaced (an elastic stream's sampler):
        it is no longer asked anything."""
        return self.recovery.dropped(handle)

    def close(self) -> None:
        """Stop background work, close every role state (its envs, threads, env processes and sockets)
        and release the role actors, and remove shared-memory segments of transfers that never
        completed (a sender or receiver killed mid-way) and the files of the weights' mailbox."""
        close_all([h for handles in self.hosts.values() for h in handles if not self.dropped(h)])
        self.executor.close()
        if self.executor.remote:
            with contextlib.suppress(Exception):  # the cluster may be going down
                self.executor.client.run(shm.sweep, True)
                self.executor.client.run(mailbox.sweep, True)
        shm.sweep()
        mailbox.sweep()
        if self.supervisor is not None:
            self.supervisor.close()


def merge_outputs(values: list[Any]) -> Any:
    """One iteration output from data-parallel replicas' metrics: each key averaged, except
    ``perf/frames`` (samples consumed), summed. A single output is returned as it is.

    >>> merge_outputs([{"losses/v": 1.0, "perf/frames": 8.0}, {"losses/v": 3.0, "perf/frames": 8.0}])
    {'losses/v': 2.0, 'perf/frames': 16.0}
    """
    if len(values) == 1 or not all(isinstance(v, dict) for v in values):
        return values[0]
    merged = {}
    for key in values[0]:
        column = [float(v[key]) for v in values if key in v]
        merged[key] = float(np.sum(column)) if key == "perf/frames" else float(np.mean(column))
    return merged


def stage_time(node: Node, calls: dict[int, list[Call]], t0: float, last: Node | None = None) -> float:
    """Seconds from ``node``'s inputs being ready (or ``t0``) to the last replica of ``last`` (default:
    ``node``) finishing.

    In-process that is exactly the fragments' run time; on a cluster it adds the scheduler's hops.
    """
    now = time.perf_counter()
    mine = calls[node.id]
    ready = max([t0, min(c.started for c in mine)] + [
        c.done_at or now for a in node.inputs if isinstance(a, Node) and a.id in calls for c in calls[a.id]
    ])  # fmt: skip
    return max(0.0, max(c.done_at or now for c in calls[(last or node).id]) - ready)


def learn_time(graph: FragmentGraph, roles: Any, calls: dict[int, list[Call]], t0: float) -> float:
    """Seconds the learner side took: from the first learner fragment after the samplers' (``update``,
    or ``update_critic``) being ready to the last one finishing; not the replay's ``reprioritize``,
    which passes the metrics on. Without such fragments, the output's own time."""
    first_stream = next((n.id for n in graph.nodes if roles[n.role].many), -1)
    learn = [n for n in graph.nodes if n.id > first_stream and not roles[n.role].many and n.id in calls]
    if learn:
        return stage_time(learn[0], calls, t0, last=learn[-1])
    return stage_time(graph.output, calls, t0) if graph.output is not None and graph.output.id in calls else 0.0
