"""``single`` and ``sync``: the whole iteration submitted at once, each fragment on every replica.

Values move between roles by the one routing rule (:func:`dagrl.runtime.executor.route`):
replica to replica within a role, broadcast from a single-instance role, gathered into a list
towards one, sharded between two replicated roles. ``single`` runs it over in-process hosts,
``sync`` as Dask tasks on the role actors' workers, so with the same seeds they compute the same
numbers. Under ``sync`` the rollouts go from the sampler workers to the learner's worker directly;
the driver receives only each rollout's :class:`~dagrl.runtime.executor.Report` and the metrics.
"""

from __future__ import annotations

from dagrl.policies.base import Policy, StepResult, learn_time, stage_time
from dagrl.runtime.supervisor import RoleFailure


class Lockstep(Policy):
    name = "lockstep"

    def step(self) -> StepResult:
        while True:
            try:
                return self._step()
            except RoleFailure as failure:  # a sampler or replay shard died: replace it, redo the iteration
                self.replace_in_place(failure)

    def _step(self) -> StepResult:
        graph = self.graph.algorithm.graph
        calls, reports, out, t0 = self.run_graph(graph)
        res = StepResult()
        for node in graph.nodes:
            if node.id in reports:
                values = reports[node.id]
                self.learn_counting(node, values)
                for r, rep in enumerate(values):
                    res.add_output(rep, source=r)
                if any(v.counted for v in values):
                    res.sample_time += stage_time(node, calls, t0)
        if graph.output is not None:
            res.update_time = learn_time(graph, self.graph.algorithm.roles, calls, t0)
            if isinstance(out, dict):
                res.metrics = dict(out)
        return res
