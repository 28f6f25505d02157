"""One iteration as one Dask graph: every fragment call of it submitted at once, then waited for.

The lockstep policies (``single``, ``sync``, ``dp-learners``, ``central-inference``) run each iteration
this way: :class:`GraphRun` submits each fragment on every replica of its role through the
:class:`~dagrl.runtime.executor.Executor` (values routed by its one rule, sampler outputs left on their
workers), asks only for what the driver needs (the samplers' reports, the output), and waits. A policy
shapes it through :class:`GraphHooks`: calls a fragment waits for (central inference loads its
weights first), fragments whose replicas meet inside the call (data-parallel learners), the calls
whose values make the output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagrl.core.fragment import Algorithm, FragmentGraph, Node
from dagrl.runtime.executor import Call, Executor, Transport
from dagrl.runtime.hosts import Handle
from dagrl.runtime.report import Report

__all__ = ["GraphHooks", "GraphRun", "Submitted", "learn_time", "merge_outputs", "stage_time"]

Finished = tuple[dict[int, list[Call]], dict[int, list[Report]], Any, float]
"""A waited-for iteration: its calls, the reports of its sampler outputs, its output, its start time."""


@dataclass
class Submitted:
    """An iteration submitted and not yet waited for (:meth:`GraphRun.submit`)."""

    calls: dict[int, list[Call]]
    reports: dict[int, list[Call]]
    outs: list[Call]
    watch: list[Call]
    """Every call of the iteration, in submission order (a failure is blamed on the first that failed)."""
    t0: float
    folded: list[int] = field(default_factory=list)
    """Nodes whose reports the output's own task computes, in the order it returns them."""


class GraphHooks:
    """What a policy changes in how an iteration is submitted (module docstring)."""

    algorithm: Algorithm

    def before(self, node: Node, calls: dict[int, list[Call]]) -> list[Call]:
        """Calls to submit before ``node`` runs, which it then waits for (none here; central inference
        loads the weights into its role before the samplers act)."""
        return []

    def collective(self, node: Node) -> bool:
        """Whether ``node``'s replicas wait for each other inside the call (:meth:`Executor.run_nodes`)."""
        return False

    def output_calls(self, output: Node, calls: dict[int, list[Call]]) -> list[Call]:
        """The calls whose values make the iteration's output (merged by :func:`merge_outputs`):
        every replica of a single-instance role (data-parallel learners), the first of a replicated
        one (replay shards pass the learner's metrics on, each the same)."""
        return calls[output.id][:1] if self.algorithm.roles[output.role].many else calls[output.id]


class GraphRun:
    """Submits whole fragment graphs on role hosts and waits for them (module docstring).

    Parameters
    ----------
    executor : how calls reach the hosts (Dask tasks, or in-process).
    hosts : the role hosts, by role (replacements take their places).
    hooks : the policy's :class:`GraphHooks`.
    """

    def __init__(self, executor: Executor, hosts: dict[str, list[Handle]], hooks: GraphHooks):
        self.executor, self.hosts, self.hooks = executor, hosts, hooks
        self.roles = hooks.algorithm.roles
        self.counting: dict[int, bool] = {}
        """Per node on a replicated role: whether its outputs carry env steps (learnt from the first report)."""

    def counts(self, node: Node) -> bool:
        """Whether the driver needs a :class:`Report` of ``node``'s outputs (sampler outputs)."""
        return self.roles[node.role].many and self.counting.get(node.id, True)

    def learn_counting(self, node: Node, reports: list[Report]) -> None:
        self.counting[node.id] = any(r.counted for r in reports)

    def run(self, graph: FragmentGraph) -> Finished:
        """Submit a whole fragment graph at once and wait for it: calls, reports, output, start time.

        Sampler outputs stay on their workers; only their reports and the output come back.
        """
        return self.finish(self.submit(graph))

    def submit(
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
        roles = self.roles
        side: dict[int, list[Call]] = {}
        last: dict[str, list[Call]] = {}
        if previous is not None:
            for node in graph.nodes:
                last[node.role] = previous.calls[node.id]

        mail = mail or {}
        waits = {dst: ids for (_, dst), ids in mail.items() if ids}

        def after(node: Node, calls: dict[int, list[Call]]) -> list[Call]:
            side[node.id] = self.hooks.before(node, calls)
            ordered = [c for i in waits.get(node.id, ()) for c in calls[i]]
            return [*side[node.id], *ordered, *last.get(node.role, [])]

        positions = self.folded_reports(graph)
        folded = [graph.output.inputs[i].id for i in positions]
        fold = {graph.output.id: positions} if positions else {}
        reported = {n.id for n in graph.nodes if self.counts(n) and n.id not in folded}
        transport = Transport(
            reports=fold, announce=frozenset(reported), mail=frozenset(mail),
            collective=frozenset(n.id for n in graph.nodes if self.hooks.collective(n)),
        )  # fmt: skip
        calls = self.executor.run_nodes(graph.nodes, self.hosts, roles, after=after, transport=transport)
        reports = {n.id: [self.executor.report(c) for c in calls[n.id]] for n in graph.nodes if n.id in reported}
        outs = self.hooks.output_calls(graph.output, calls) if graph.output is not None else []
        watch = [c for n in graph.nodes for c in [*side.get(n.id, []), *calls[n.id]]]  # submission order: blame
        return Submitted(calls, reports, outs, watch, t0, folded)

    def folded_reports(self, graph: FragmentGraph) -> tuple[int, ...]:
        """Positions of the output node's inputs whose reports its own task computes.

        A report task per sampler output costs the scheduler and the sampler's worker a task each
        (two of a ``sync`` PPO iteration's six tasks, 5 % of its time on two cores); when every
        replica's output goes to the one output call, which nothing but the driver reads, that call
        reports them instead.
        """
        out = graph.output
        roles = self.roles
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

    def finish(self, sub: Submitted) -> Finished:
        """Wait for an iteration :meth:`submit` submitted; on a failure, cancel what is left of it."""
        wanted = [r for rs in sub.reports.values() for r in rs]
        try:
            values = self.executor.wait([*wanted, *sub.outs], sub.watch)
        except BaseException:  # a role failure (or an interrupt): nothing of it is left running
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
