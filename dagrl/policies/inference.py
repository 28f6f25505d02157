"""``central-inference``: ``sync``, with every sampler's actions picked by one batched ``inference`` role.

The iteration runs as under ``sync`` (one Dask graph; rollouts worker to worker). Two things change:

* before the samplers' fragment runs, a ``load-inference`` task gives the inference role the
  weights that fragment receives (fetched from the learner's worker peer to peer); the samplers'
  tasks wait for it, so every action of the iteration comes from that version;
* each sampler acts through :meth:`dagrl.context.RoleContext.acting`, which here is a client of the
  inference role: one request per env step on a socket of the inference worker's host, answered
  from one forward pass over all samplers' observations (:mod:`dagrl.runtime.inference`).

A sampler that cannot reach the inference role fails its fragment; if the inference host does not
answer a heartbeat either, the failure is the inference role's: it is replaced in place (its state is
only a copy of the weights) and the iteration redone, the samplers kept. ``inference/*`` metrics
(batch rows and requests, queue and forward time, utilisation, the samplers' round trip) join
each iteration's row.
"""

from __future__ import annotations

import contextlib
from typing import Any

from dagrl.distribution import INFERENCE_ROLE
from dagrl.fragment import Node
from dagrl.policies.base import StepResult
from dagrl.policies.lockstep import Lockstep
from dagrl.runtime.executor import Call
from dagrl.runtime.host import load_acting
from dagrl.runtime.supervisor import RoleFailure

HEARTBEAT_S = 10.0
"""How long the inference host may take to answer a heartbeat before a sampler's failure is its."""


class CentralInference(Lockstep):
    name = "central-inference"

    def __init__(self, graph: Any, hosts: dict[str, list[Any]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        algo = graph.algorithm
        self.actors_role = next(n.role for n in algo.graph.nodes if algo.roles[n.role].many)
        self.endpoint: tuple[str, int, str] | None = None
        """The inference role's socket: host, port, token (:meth:`dagrl.runtime.host.RoleHost.serve`)."""
        self.attached: dict[Any, Any] = {}
        """Sampler handle -> the inference handle it acts through (handles, not ids: a replaced
        handle's id may be reused by its replacement)."""
        self._serve()

    @property
    def server(self) -> Any:
        return self.hosts[INFERENCE_ROLE][0]

    def _serve(self) -> None:
        expected = len(self.hosts[self.actors_role])
        self.endpoint = tuple(self.server.serve(expected, self.options.max_wait_ms).result())

    def _attach(self) -> None:
        """Point every sampler (a replacement, or all after the inference role was replaced) at it."""
        server = self.server
        samplers = self.hosts[self.actors_role]
        todo = [h for h in samplers if self.attached.get(h) is not server]
        for fut in [h.attach_inference(self.endpoint) for h in todo]:  # all at once
            fut.result()
        self.attached = dict.fromkeys(samplers, server)  # replaced samplers' handles are dropped

    def before(self, node: Node, calls: dict[int, list[Call]]) -> list[Call]:
        if node.role != self.actors_role:
            return []
        weights = [calls[a.id][0] for a in node.inputs if isinstance(a, Node)]  # single-instance: broadcast
        return [self.executor.submit(self.server, "load", weights, task=load_acting)]

    def step(self, ahead: bool = False) -> StepResult:
        while True:
            try:
                self._attach()
                res = self._step(False)
                break
            except RoleFailure as failure:
                if failure.handle.role == self.actors_role and not self._server_answers():
                    failure = RoleFailure(self.server, "lost", failure.cause)
                self.replace_in_place(failure)
                if failure.handle.role == INFERENCE_ROLE:
                    self._serve()
        res.metrics.update(self._stats())
        return res

    def _server_answers(self) -> bool:
        try:
            self.server.target.heartbeat().result(timeout=HEARTBEAT_S)  # the actor itself: no retries
            return True
        except Exception:
            return False

    def _stats(self) -> dict[str, float]:
        out = {}
        with contextlib.suppress(Exception):  # metrics only: a host lost now fails the next iteration
            out.update(self.server.inference_stats().result())
            sampled = [h.acting_stats() for h in self.hosts[self.actors_role]]
            calls, wait = map(sum, zip(*(f.result() for f in sampled), strict=True))
            if calls:
                out["inference/latency_ms"] = 1e3 * wait / calls
        return out
