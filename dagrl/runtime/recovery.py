"""Recovery as data: what the loss of a role instance means, decided in one place for every policy.

Each role declares it (``@role(..., recover=...)``, :class:`~dagrl.core.fragment.RoleDef`):

* ``replace``: a new instance from the role's factory on a live worker, and the run goes on
  (samplers, replay shards that reopen their stores, evaluators, the inference role);
* ``rollback``: a new instance and the whole run back to the last checkpoint (learners, whose state
  is the run). The driver carries it out (:meth:`dagrl.app.driver.Driver.restore`).

The graph adds three cases. A role that may grow (``max_replicas`` above the replicas it started with)
*drops* a replica lost with its worker while it has more than it started with: its slot waits for a
worker that joins. The replicas of a data-parallel group fail together: one that raised while a peer
was lost (its all-reduce broke) is not blamed, the lost peer is, and the group rolls back; under a
stream (:attr:`Recovery.regroups`) a lost replica past the first is *regrouped* instead: replaced,
given replica 0's state, the group formed anew, no rollback (the survivors hold identical weights;
replica 0 holds the stream's hub, so its loss still rolls back).

:class:`Recovery` turns a :class:`~dagrl.runtime.supervisor.RoleFailure` into its :class:`Action` and
carries out those a policy goes on after (replace, drop); a rollback is raised on, to the driver. A
policy reports what failed and does what its own shape needs next (restart a sampler's loop, serve
again), never which action to take.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dagrl.core.graph import Graph
from dagrl.runtime.hosts import Handle
from dagrl.runtime.stream import PeerFailed
from dagrl.runtime.supervisor import RoleFailure

__all__ = ["Action", "Outcome", "Recovery"]

T = TypeVar("T")


class Action(enum.Enum):
    REPLACE = "replace"
    DROP = "drop"
    ROLLBACK = "rollback"
    REGROUP = "regroup"


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Recovery.recover` did: ``handle`` is the replacement (``REPLACE``) or the one let go."""

    action: Action
    handle: Handle


class Recovery:
    """The one place a role failure becomes an action (module docstring).

    Parameters
    ----------
    graph : the run's graph (its algorithm's roles, what each may grow to).
    hosts : the policy's role hosts, which replacements take the place of (the same dict).
    supervisor : replaces and drops hosts on a cluster; ``None`` in one process, where every loss
        goes to the driver (which ends the run: there is nothing to start a replacement on).
    """

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], supervisor: Any = None):
        self.algorithm, self.hosts, self.supervisor = graph.algorithm, hosts, supervisor
        self.floor = {
            role: len(handles)
            for role, handles in hosts.items()
            if role in graph.spec.roles and (graph.role(role).max_replicas or 0) > len(handles)
        }
        """Per role that may grow: the replicas it started with, below which a lost one is replaced."""
        self.gone: dict[str, set[int]] = collections.defaultdict(set)
        """Per role, the indices dropped with their workers (slots a worker that joins takes first)."""
        self.groups: frozenset[str] = frozenset()
        """Roles whose replicas fail together (``dp-learners``' data-parallel learners)."""
        self.regroups: frozenset[str] = frozenset()
        """Data-parallel roles whose lost replica past the first is replaced and the group formed anew
        without a rollback (a stream's learner group)."""

    def action(self, failure: RoleFailure) -> Action:
        """What ``failure`` means for the run (module docstring)."""
        role = failure.handle.role
        if self.supervisor is None:
            return Action.ROLLBACK
        if role in self.regroups and failure.handle.index > 0 and failure.kind != "raised":
            return Action.REGROUP
        if role in self.groups:
            return Action.ROLLBACK
        if self.algorithm.roles[role].recover != "replace" and role not in self.algorithm.eval_only_roles:
            return Action.ROLLBACK
        if failure.kind == "lost" and role in self.floor and self.active(role) > self.floor[role]:
            return Action.DROP
        return Action.REPLACE

    def recover(self, failure: RoleFailure) -> Outcome:
        """Carry out ``failure``'s action: a replacement on a live worker, or the replica let go; a
        rollback (or a crash loop the replacement found) raises, for the driver."""
        failure = self.blame(failure)
        action = self.action(failure)
        if action is Action.ROLLBACK:
            raise failure
        old = failure.handle
        if action is Action.DROP:
            self.gone[old.role].add(old.index)
            self.supervisor.drop(failure)
            return Outcome(action, old)
        return Outcome(action, self.supervisor.replace(failure))

    def attempt(self, work: Callable[[], T], handle: Callable[[RoleFailure], Any] | None = None) -> T:
        """``work()``'s value, run again after each role failure it raises is recovered (``handle``, by
        default :meth:`recover`: a replacement, or a rollback raised on to the driver)."""
        while True:
            try:
                return work()
            except RoleFailure as failure:
                (handle or self.recover)(failure)

    def renew(self, failure: RoleFailure) -> Handle:
        """The first half of a rollback, or of forming a group again: a new instance in the failed one's
        place, its state what its factory builds (the caller restores the rest)."""
        if self.supervisor is None:
            raise failure
        return self.supervisor.replace(failure)

    def peer(self, err: PeerFailed, peers: dict[tuple[str, int], Handle]) -> Outcome | None:
        """A loop failed in another role's fragment (a replay shard's ``add``): that role's failure, on the
        host the loop called (``peers``), recovered if its role is replaced in place or it is a learner
        replica to regroup; ``None`` if the loop did not call such a host (then the failure is the loop's
        own, or a rollback's)."""
        old = peers.get((err.role, err.index))
        if old is None:
            return None
        sup = self.supervisor
        kind = err.kind if sup is None or err.kind == "lost" or sup.alive(old.address, fresh=True) else "lost"
        failure = RoleFailure(old, kind, err)
        if self.algorithm.roles[err.role].recover != "replace" and self.action(failure) is not Action.REGROUP:
            return None
        return self.recover(failure)

    def blame(self, failure: RoleFailure) -> RoleFailure:
        """A replica of a group that raised because a peer was lost mid all-reduce: the lost peer's failure."""
        if failure.kind != "raised" or failure.handle.role not in self.groups:
            return failure
        for h in self.hosts[failure.handle.role]:
            if h is failure.handle:
                continue
            try:
                h.heartbeat().result()
            except RoleFailure as lost:
                return lost
        return failure

    def active(self, role: str) -> int:
        """``role``'s replicas at work: all but those dropped."""
        return len(self.hosts[role]) - len(self.gone[role])

    def dropped(self, handle: Handle) -> bool:
        """Whether ``handle`` was let go and its slot not yet taken again: it is asked nothing more."""
        return handle.index in self.gone[handle.role] and self.hosts[handle.role][handle.index] is handle

    def rejoined(self, role: str, index: int) -> None:
        """Slot ``index`` of ``role`` has a host again (a worker joined)."""
        self.gone[role].discard(index)
