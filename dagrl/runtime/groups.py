"""Data-parallel learner groups: K replicas of a learner role, one per worker, averaging gradients.

A single-instance role whose state is the run (a learner: ``recover="rollback"``) may run as K
identical replicas under ``dp-learners`` (lockstep) and the streams (``async``, ``apex``). They form
one ``torch.distributed`` group (:mod:`dagrl.runtime.collective`: gloo on CPU, NCCL where each has a
GPU of its own); the algorithm averages gradients with ``ctx.average_gradients`` before each
optimiser step, so the replicas stay bit-identical. :class:`Groups` is what a policy does with them:

* :meth:`Groups.prepare` forms the groups once and gives every replica replica 0's state;
* :meth:`Groups.check` compares the replicas' digests (after the first round, at every checkpoint):
  an algorithm that does not average its gradients stops with :class:`ReplicasDiverged`;
* a checkpoint holds replica 0's state once (:meth:`Groups.first`), and a restore gives it to every
  replica (:meth:`Groups.spread`);
* :meth:`Groups.regroup`: a replica replaced while the others live (a stream's learner replica past
  the first) takes replica 0's state and the group forms anew, with no rollback: the survivors hold
  identical weights.
"""

from __future__ import annotations

import functools
from typing import Any

from dagrl.core.distribution import data_parallel_roles
from dagrl.core.graph import Graph
from dagrl.runtime.collective import form_group
from dagrl.runtime.hosts import Handle
from dagrl.runtime.supervisor import TrainingError

__all__ = ["Groups", "ReplicasDiverged"]


class ReplicasDiverged(TrainingError):
    """Data-parallel replicas hold different states: the algorithm does not average its gradients."""


class Groups:
    """The data-parallel groups of a run's learner roles (module docstring).

    Parameters
    ----------
    graph, hosts : the run's graph and the policy's role hosts (a replacement takes its place there).
    client : the Dask client (``None`` in one process, where no role has replicas).
    recovery : replaces a replica found dead while the group forms.
    backend, timeout_s : the group's ``torch.distributed`` backend (``auto``: NCCL when every replica
        has a GPU of its own) and how long a replica waits for the others.
    """

    def __init__(
        self, graph: Graph, hosts: dict[str, list[Handle]], client: Any, recovery: Any, backend: str = "auto",
        timeout_s: float = 120.0,
    ) -> None:  # fmt: skip
        self.graph, self.hosts, self.client, self.recovery = graph, hosts, client, recovery
        self.backend, self.timeout_s = backend, timeout_s
        self.roles = [r for r in data_parallel_roles(graph.algorithm) if len(hosts.get(r, [])) > 1]
        """The roles running as groups (more than one replica)."""
        self.formed = False

    def __bool__(self) -> bool:
        return bool(self.roles)

    def size(self, role: str) -> int:
        """How many replicas ``role`` runs as (1: not a group)."""
        return len(self.hosts[role]) if role in self.roles else 1

    @property
    def largest(self) -> int:
        return max((len(self.hosts[r]) for r in self.roles), default=1)

    def prepare(self) -> None:
        """Once: form the groups and give every replica replica 0's state."""
        if self.formed or not self.roles:
            return
        self.form()
        for role in self.roles:
            self._copy_first(role)
        self.formed = True

    def form(self) -> None:
        """(Re)form each group's process group; a replica found dead is replaced first."""
        for role in self.roles:
            form = functools.partial(form_group, self.client, self.hosts[role], self.backend, self.timeout_s)
            self.recovery.attempt(form, self.recovery.renew)  # a replica found dead: a new one, then again

    def regroup(self, role: str) -> None:
        """A replica of ``role`` was replaced while replica 0 lives: every other replica takes replica 0's
        state and the group forms anew (its old group broke with the lost peer)."""
        self._copy_first(role)
        form = functools.partial(form_group, self.client, self.hosts[role], self.backend, self.timeout_s)
        self.recovery.attempt(form, self.recovery.renew)
        self._copy_first(role)  # a replica found dead meanwhile starts from its factory's state

    def _copy_first(self, role: str) -> None:
        sd = self.hosts[role][0].state_dict().result()
        for f in [h.load_state_dict(sd) for h in self.hosts[role][1:]]:
            f.result()

    def check(self, when: str) -> None:
        """Raise :class:`ReplicasDiverged` if a replica's state differs from replica 0's."""
        for role in self.roles:
            digests = [f.result() for f in [h.digest() for h in self.hosts[role]]]
            differ = [i for i, d in enumerate(digests) if d != digests[0]]
            if differ:
                raise ReplicasDiverged(
                    f"{role} replicas {', '.join(map(str, differ))} differ from replica 0 {when}: algorithm "
                    f"{self.graph.spec.algorithm} must call ctx.average_gradients(...) before each optimiser "
                    f"step to run its learners as data-parallel replicas ({self.graph.spec.policy})"
                )

    def first(self, role: str, handles: list[Handle]) -> list[Handle]:
        """The replicas whose state a checkpoint keeps: a group's first only (the others are equal)."""
        return handles[:1] if role in self.roles else handles

    def spread(self, sd: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """A checkpoint's states with a group's one state given to each of its replicas."""
        return {r: [s[0]] * len(self.hosts[r]) if r in self.roles and s else s for r, s in sd.items()}
