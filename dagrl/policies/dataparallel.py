"""``dp-learners``: the ``sync`` iteration with K identical learner replicas averaging gradients.

A learner role given ``replicas: K`` runs as K data-parallel replicas, one per worker process,
joined in a ``torch.distributed`` group (:mod:`dagrl.runtime.collective`: gloo on CPU, NCCL where
each replica has a GPU of its own). The iteration is submitted as under ``sync``; the routing rule
(:func:`dagrl.runtime.executor.route`) gives learner replica k the rollouts of samplers
``i % K == k`` (replay shards likewise) and sampler i reads the weights of replica i % K. The
algorithm averages gradients with ``ctx.average_gradients`` before each optimiser step, so the
replicas stay bit-identical: checked after the first iteration and at every checkpoint, which
stores replica 0's state once. From the second iteration on, the next one is submitted while the
current one runs, as under ``sync``; samplers on a learner replica's host take its weights from a
same-host mailbox and each replica the rollouts of its samplers (``policy.mailbox``).

A replica that fails rolls all of them back: the dead one is replaced, the group formed anew and
every replica loaded from the checkpoint (a survivor whose all-reduce failed with its peer is
not blamed for it).
"""

from __future__ import annotations

from typing import Any

from dagrl.core.distribution import mail_edges
from dagrl.core.graph import Graph
from dagrl.policies.base import StepResult
from dagrl.policies.lockstep import Lockstep
from dagrl.runtime.groups import ReplicasDiverged
from dagrl.runtime.hosts import Handle

__all__ = ["DataParallel", "ReplicasDiverged"]


class DataParallel(Lockstep):
    name = "dp-learners"
    runs_ahead = True

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        self.recovery.groups = frozenset(self.groups.roles)  # a replica's loss rolls every one back
        self.checked = False
        if self.executor.remote and self.options.mailbox and graph.spec.shared_memory:
            self.mail = mail_edges(graph.algorithm)

    def step(self, ahead: bool = False) -> StepResult:
        self.groups.prepare()
        res = super().step(ahead and self.checked)  # the first iteration's states are compared when it ends
        if not self.checked:
            self.groups.check("after the first iteration")
            self.checked = True
        return res

    def collective(self, node: Any) -> bool:
        """A data-parallel role's calls may all-reduce: each waits for its worker's earlier calls first."""
        return node.role in self.groups.roles

    def output_calls(self, output: Any, calls: dict[int, list[Any]]) -> list[Any]:
        """Replay shard m passes on learner replica m % K's metrics: shards 0..K-1 give all K."""
        if not self.graph.algorithm.roles[output.role].many:
            return calls[output.id]
        return calls[output.id][: self.groups.largest]

    def restore(self, sd: dict[str, list[Any]]) -> None:
        self.drop_ahead()  # it followed the iteration that failed
        super().restore(sd)  # replaces a replica found dead, re-forms the group, loads every replica
