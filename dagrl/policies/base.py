"""What every distribution policy gives the driver: one iteration at a time, plus checkpoint state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagrl.context import Episodes
from dagrl.runtime.host import Ref
from dagrl.runtime.hosts import Handle
from dagrl.runtime.supervisor import RoleFailure


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
        """Count env steps and finished episodes if ``out`` is a sampler output (of replica ``source``)."""
        steps = getattr(out, "env_steps", None)
        episodes = getattr(out, "episodes", None)
        if isinstance(steps, int | np.integer):
            self.env_steps += int(steps)
        if isinstance(episodes, Episodes) and len(episodes):
            self.episodes = Episodes(
                np.concatenate([self.episodes.returns, episodes.returns]),
                np.concatenate([self.episodes.lengths, episodes.lengths]),
            )
            self.sources = np.concatenate([self.sources, np.full(len(episodes), source, np.int64)])


class Policy:
    """Base of the distribution policies: owns role hosts, runs iterations, exposes learner state."""

    name = "base"
    distributed = True
    """Whether the policy needs a Dask cluster (``single`` does not)."""

    def __init__(self, graph: Any, hosts: dict[str, list[Handle]]):
        self.graph = graph
        self.hosts = hosts
        self.supervisor: Any = None
        """A :class:`~dagrl.runtime.supervisor.Supervisor` for policies on a cluster (set by build_policy)."""

    def replace_in_place(self, failure: RoleFailure) -> Handle:
        """Replace a failed replica of a replicated role (sampler, replay shard) and go on; a failure of a
        single-instance role (a learner) is the driver's to handle (roll back to the checkpoint)."""
        algo, role = self.graph.algorithm, failure.handle.role
        if self.supervisor is None or not (algo.roles[role].many or role in algo.eval_only_roles):
            raise failure
        return self.supervisor.replace(failure)

    def evaluate(self) -> dict[str, float]:
        """Run the algorithm's ``@evaluation`` graph once, in lockstep, on this policy's hosts.

        Called by the driver between iterations (so a learner's ``publish`` is never concurrent with
        its ``update``); an evaluator that fails is replaced and the evaluation run again.
        """
        from dagrl.policies.lockstep import run_nodes

        graph = self.graph.algorithm.eval_graph
        while True:
            try:
                values = run_nodes(graph.nodes, self.hosts, self.graph.algorithm.roles)
                break
            except RoleFailure as failure:
                self.replace_in_place(failure)
        out = values[graph.output.id][0]
        return {k: float(v) for k, v in out.items()} if isinstance(out, dict) else {}

    def after_restore(self) -> None:
        """Called after the driver restored learner state from a checkpoint (republish weights)."""

    @classmethod
    def check(cls, algorithm: Any) -> None:
        """Raise ``TypeError`` if the algorithm's iteration cannot be run by this policy."""

    def step(self) -> StepResult:
        raise NotImplementedError

    def state_dict(self) -> dict[str, list[Any]]:
        while True:
            futures = {role: [h.state_dict() for h in hs] for role, hs in self.hosts.items()}
            try:
                return {role: [f.result() for f in fs] for role, fs in futures.items()}
            except RoleFailure as failure:  # a replay shard died: reopen it, ask again
                self.replace_in_place(failure)

    def load_state_dict(self, sd: dict[str, list[Any]]) -> None:
        futures = [
            h.load_state_dict(state)
            for role, states in sd.items()
            if role in self.hosts  # a role this run does not start (an evaluator, evaluation off)
            for h, state in zip(self.hosts[role], states, strict=True)
            if state is not None
        ]
        for f in futures:
            f.result()

    def actors(self) -> list[dict[str, Any]]:
        """Role, replica, address and device of every host (for logs, status and the dashboard)."""
        out = []
        for role, hs in self.hosts.items():
            for h in hs:
                info = h.info().result()
                out.append({"role": role, "index": h.index, "address": h.address or "in-process", **info})
        return out

    def close(self) -> None:
        """Stop background work and release the role actors."""
        for handles in self.hosts.values():
            for h in handles:
                h.close()


def call_with_cached_args(handle: Handle, fragment: str, version: int, args: list[Any], sent: int) -> Any:
    """Call ``fragment`` on a host that keeps its arguments: they are sent again only when ``version``
    differs from the version the host last got (``sent``), so weights cross once per update."""
    if version != sent:
        for i, a in enumerate(args):
            handle.put(f"arg{i}", a).result()
    return handle.call(fragment, *[Ref(f"arg{i}") for i in range(len(args))]).result()
