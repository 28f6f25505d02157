"""``single`` and ``sync``: the whole iteration submitted at once, each fragment on every replica.

Values move between roles by the one routing rule (:func:`dagrl.runtime.executor.route`):
replica to replica within a role, broadcast from a single-instance role, gathered into a list
towards one, sharded between two replicated roles. ``single`` runs it over in-process hosts,
``sync`` as Dask tasks on the role actors' workers, so with the same seeds they compute the same
numbers. Under ``sync`` the rollouts go from the sampler workers to the learner's worker directly;
the driver receives only each rollout's :class:`~dagrl.runtime.report.Report` and the metrics.
"""

from __future__ import annotations

from typing import Any

from dagrl.core.graph import Graph
from dagrl.policies.base import Policy, StepResult
from dagrl.runtime.iteration import Submitted, learn_time, stage_time
from dagrl.runtime.supervisor import RoleFailure


class Lockstep(Policy):
    name = "lockstep"
    runs_ahead = False
    """Whether the next iteration may be submitted before this one is waited for (see :meth:`step`)."""

    def __init__(self, graph: Graph, hosts: dict[str, list[Any]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        self.ahead: Submitted | None = None
        """The next iteration, submitted while this one ran (``step(ahead=True)``)."""
        self.mail: dict[tuple[int, int], tuple[int, ...]] = {}
        """Edges of the iteration whose value may go through a same-host mailbox (``sync``), with the
        nodes each consumer then also waits for (:func:`~dagrl.core.distribution.mail_edges`)."""

    def step(self, ahead: bool = False) -> StepResult:
        """Run one iteration. ``ahead``: the driver will ask for the next one right after, with
        nothing in between (no checkpoint, no blocking evaluation, no stop it can foresee), so it
        is submitted now, behind this one: Dask starts its ``publish`` the moment this ``update``
        ends, without the round trip through the driver."""

        def redo(failure: RoleFailure) -> None:  # a sampler or replay shard died: replace it, redo the iteration
            self.drop_ahead()
            self.recover(failure)

        return self.recovery.attempt(lambda: self._step(ahead), redo)

    def drop_ahead(self) -> None:
        """Cancel an iteration submitted ahead (after a failure, or at a rollback)."""
        if self.ahead is not None:
            self.cancel(self.ahead)
            self.ahead = None

    @property
    def pending(self) -> bool:
        return self.ahead is not None

    def restore(self, sd: dict[str, list[Any]]) -> None:
        self.drop_ahead()  # it followed the iteration that failed
        super().restore(sd)

    def close(self) -> None:
        self.drop_ahead()
        super().close()

    def _step(self, ahead: bool) -> StepResult:
        graph = self.graph.algorithm.graph
        current = self.ahead if self.ahead is not None else self.submit_graph(graph, mail=self.mail)
        self.ahead = None
        if ahead and self.runs_ahead and self.executor.remote:
            self.ahead = self.submit_graph(graph, previous=current, mail=self.mail)
        calls, reports, out, t0 = self.finish_graph(current)
        res = StepResult()
        for node in graph.nodes:
            if node.id in reports:
                values = reports[node.id]
                self.iterations.learn_counting(node, values)
                for r, rep in enumerate(values):
                    res.add_output(rep, source=r)
                if any(v.counted for v in values):
                    res.sample_time += stage_time(node, calls, t0)
        if graph.output is not None:
            res.update_time = learn_time(graph, self.graph.algorithm.roles, calls, t0)
            if isinstance(out, dict):
                res.metrics = dict(out)
        return res
