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

import functools
from typing import Any

from dagrl.core.distribution import data_parallel_roles, mail_edges
from dagrl.core.graph import Graph
from dagrl.policies.base import StepResult
from dagrl.policies.lockstep import Lockstep
from dagrl.runtime.collective import form_group
from dagrl.runtime.hosts import Handle
from dagrl.runtime.supervisor import TrainingError


class ReplicasDiverged(TrainingError):
    """Data-parallel replicas hold different states: the algorithm does not average its gradients."""


class DataParallel(Lockstep):
    name = "dp-learners"
    runs_ahead = True

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        self.parallel = [r for r in data_parallel_roles(graph.algorithm) if len(hosts.get(r, [])) > 1]
        self.recovery.groups = frozenset(self.parallel)  # a replica's loss rolls every one back
        self.formed = False
        self.checked = False
        if self.executor.remote and self.options.mailbox and graph.spec.shared_memory:
            self.mail = mail_edges(graph.algorithm)

    def step(self, ahead: bool = False) -> StepResult:
        self.prepare()
        res = super().step(ahead and self.checked)  # the first iteration's states are compared when it ends
        if not self.checked:
            self._check_identical("after the first iteration")
            self.checked = True
        return res

    def collective(self, node: Any) -> bool:
        """A data-parallel role's calls may all-reduce: each waits for its worker's earlier calls first."""
        return node.role in self.parallel

    def output_calls(self, output: Any, calls: dict[int, list[Any]]) -> list[Any]:
        """Replay shard m passes on learner replica m % K's metrics: shards 0..K-1 give all K."""
        if not self.graph.algorithm.roles[output.role].many:
            return calls[output.id]
        k = max((len(self.hosts[r]) for r in self.parallel), default=1)
        return calls[output.id][:k]

    def restore(self, sd: dict[str, list[Any]]) -> None:
        self.drop_ahead()  # it followed the iteration that failed
        self._form()  # replaces a replica found dead, then re-forms the group
        self.load_state_dict(sd)
        self.after_restore()

    def state_dict(self) -> dict[str, list[Any]]:
        """Every role's state; a data-parallel role's once (replica 0's), after checking the others match it."""
        self.prepare()

        def ask() -> dict[str, list[Any]]:
            self._check_identical("at a checkpoint")
            futures = {
                role: [h.state_dict() for h in (hs[:1] if role in self.parallel else hs)]
                for role, hs in self.hosts.items()
            }
            return {role: [f.result() for f in fs] for role, fs in futures.items()}

        return self.recovery.attempt(ask)

    def load_state_dict(self, sd: dict[str, list[Any]]) -> None:
        """A data-parallel role's first state goes to every replica (a checkpoint holds one)."""
        spread = {r: [s[0]] * len(self.hosts[r]) if r in self.parallel and s else s for r, s in sd.items()}
        super().load_state_dict(spread)

    # -- helpers ---------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Once: form the groups and give every replica replica 0's state (``step`` does it first)."""
        if self.formed:
            return
        self._form()
        for role in self.parallel:
            sd = self.hosts[role][0].state_dict().result()
            for f in [h.load_state_dict(sd) for h in self.hosts[role][1:]]:
                f.result()
        self.formed = True

    def _form(self) -> None:
        """(Re)form each data-parallel role's process group; a replica found dead is replaced first."""
        options, client = self.options, self.executor.client
        for role in self.parallel:
            form = functools.partial(form_group, client, self.hosts[role], options.backend, options.timeout_s)
            self.recovery.attempt(form, self.recovery.renew)  # a replica found dead: a new one, then again

    def _check_identical(self, when: str) -> None:
        for role in self.parallel:
            digests = [f.result() for f in [h.digest() for h in self.hosts[role]]]
            differ = [i for i, d in enumerate(digests) if d != digests[0]]
            if differ:
                raise ReplicasDiverged(
                    f"{role} replicas {', '.join(map(str, differ))} differ from replica 0 {when}: algorithm "
                    f"{self.graph.spec.algorithm} must call ctx.average_gradients(...) before each optimiser "
                    "step to run under dp-learners"
                )
