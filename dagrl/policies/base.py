"""What every distribution policy gives the driver: one iteration at a time, plus checkpoint state.

Fragment calls go through one :class:`~dagrl.runtime.executor.Executor` (Dask tasks on the role's
worker, or in-process for ``single``); control (checkpoints, heartbeats, where a host runs) goes
through the role actors' own methods.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagrl.core.context import Episodes
from dagrl.core.fragment import FragmentGraph
from dagrl.core.graph import Graph
from dagrl.runtime import mailbox, shm
from dagrl.runtime.executor import Executor
from dagrl.runtime.groups import Groups
from dagrl.runtime.hosts import Handle, close_all
from dagrl.runtime.iteration import Finished, GraphHooks, GraphRun, Submitted
from dagrl.runtime.recovery import Recovery
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


class Policy(GraphHooks):
    """Base of the distribution policies: owns role hosts, runs iterations, exposes learner state."""

    name = "base"

    def __init__(self, graph: Graph, hosts: dict[str, list[Handle]], executor: Executor | None = None):
        self.graph = graph
        self.hosts = hosts
        self.options = graph.policy_options
        self.executor = executor or Executor()
        self.supervisor: Any = self.executor.supervisor
        """A :class:`~dagrl.runtime.supervisor.Supervisor` for policies on a cluster (the executor's)."""
        self.algorithm = graph.algorithm
        self.recovery = Recovery(graph, hosts, self.supervisor)
        """What the loss of a role instance means, decided once for every policy (the policy reports)."""
        group = (getattr(self.options, "backend", "auto"), getattr(self.options, "timeout_s", 120.0))
        self.groups = Groups(graph, hosts, self.executor.client, self.recovery, *group)
        """Learner roles run as data-parallel replicas (``dp-learners``, the streams); empty: none."""
        self.iterations = GraphRun(self.executor, hosts, self)
        self.horizon: int | None = None
        """Set by the driver before each :meth:`step`: the iterations, that one included, that may end
        before the driver must act (a checkpoint, a blocking evaluation, a foreseeable stop);
        ``None``: no bound. A policy whose learner runs on its own never runs past it."""

    def recover(self, failure: RoleFailure) -> None:
        """A role instance failed: :class:`~dagrl.runtime.recovery.Recovery` replaces it (a sampler, a replay
        shard, an evaluator) and the iteration is redone, or raises it on for the driver to roll back."""
        self.recovery.recover(failure)

    def run_graph(self, graph: FragmentGraph) -> Finished:
        """Submit a whole fragment graph at once and wait for it (:meth:`GraphRun.run`)."""
        return self.finish_graph(self.submit_graph(graph))

    def submit_graph(
        self, graph: FragmentGraph, previous: Submitted | None = None, mail: dict[tuple[int, int], Any] | None = None
    ) -> Submitted:
        """Submit every call of ``graph`` (:meth:`GraphRun.submit`); wait for none of them."""
        return self.iterations.submit(graph, previous, mail)

    def finish_graph(self, sub: Submitted) -> Finished:
        return self.iterations.finish(sub)

    def cancel(self, sub: Submitted) -> None:
        self.iterations.cancel(sub)

    def evaluate(self) -> dict[str, float]:
        """Run the algorithm's ``@evaluation`` graph once on this policy's hosts.

        Called by the driver between iterations (so a learner's ``publish`` is never concurrent with
        its ``update``); an evaluator that fails is replaced and the evaluation run again.
        """
        graph = self.graph.algorithm.eval_graph
        _, _, out, _ = self.recovery.attempt(lambda: self.run_graph(graph))
        return {k: float(v) for k, v in out.items()} if isinstance(out, dict) else {}

    def restore(self, sd: dict[str, list[Any]]) -> None:
        """Load checkpointed learner-side state after a rollback (the failed host already replaced); a
        learner group forms anew first (a replica found dead is replaced)."""
        if self.groups:
            self.groups.form()
            self.groups.formed = True
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
        """Every role replica's state (``None`` for one without, as a sampler, or one dropped); a learner
        group's once, replica 0's, after checking the others match it."""
        self.groups.prepare()

        def ask() -> dict[str, list[Any]]:
            if self.groups:
                self.groups.check("at a checkpoint")
            futures = {
                role: [None if self.dropped(h) else h.state_dict() for h in self.groups.first(role, hs)]
                for role, hs in self.hosts.items()
            }
            return {role: [None if f is None else f.result() for f in fs] for role, fs in futures.items()}

        return self.recovery.attempt(ask, self.role_failed)  # a replay shard died: reopen it, ask again

    def role_failed(self, failure: RoleFailure) -> None:
        """A role instance failed while asked for its state, outside an iteration."""
        self.recover(failure)

    def load_state_dict(self, sd: dict[str, list[Any]]) -> None:
        """Load a checkpoint's role states. Skipped: a role this run does not start (an evaluator,
        evaluation off), replicas that hold no state (samplers under a streaming policy), and the
        snapshots of a role whose replica count changed since (its envs start fresh, said once)."""
        from dagrl.runtime.snapshot import KEY

        futures = []
        for role, states in self.groups.spread(sd).items():
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
