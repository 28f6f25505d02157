"""``central-inference``: every sampler's actions picked by one batched ``inference`` role.

Lockstep (the default) runs the iteration as ``sync`` does (one Dask graph; rollouts worker to
worker). Two things change:

* before the samplers' fragment runs, a ``load-inference`` task gives the inference role the
  weights that fragment receives (fetched from the learner's worker peer to peer); the samplers'
  tasks wait for it, so every action of the iteration comes from that version;
* each sampler acts through :meth:`dagrl.core.context.RoleContext.acting`, which here is a client of the
  inference role: one request per env step on a socket of the inference worker's host, answered
  from one forward pass over all samplers' observations (:mod:`dagrl.runtime.inference`); TLS with
  the cluster's own certificates where Dask's comms are TLS.

With ``asynchronous: true`` the samplers stream exactly as under ``async`` (SEED RL's shape;
:mod:`dagrl.policies.pull`): each loops on its own worker and hands its rollouts to the learner's hub,
with neither the driver nor the scheduler on a rollout's path, and the learner takes what has arrived.
A loop beside the inference role (:func:`~dagrl.runtime.loops.inference_loop`) loads each weights
version into it as soon as the learner publishes it on the hub; an env step is acted on with whatever
version the role holds then. A rollout's version (what ``max_staleness`` judges) is the one its
sampler took before collecting; its actions may come from that version or a newer one. PPO's ratio
uses the log-probabilities recorded with each action, so the correction holds step by step.

A sampler that cannot reach the inference role fails its fragment; if the inference host does not
answer a heartbeat either, the failure is the inference role's: it is replaced in place (its state is
only a copy of the weights) and the iteration redone (lockstep) or the samplers' streams resumed
(asynchronous), the samplers kept. ``inference/*`` metrics (batch rows and requests, queue and
forward time, utilisation, the samplers' round trip) join each iteration's row.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

from dagrl.core.distribution import INFERENCE_ROLE
from dagrl.core.fragment import Node
from dagrl.core.graph import Graph
from dagrl.policies.base import StepResult
from dagrl.policies.lockstep import Lockstep
from dagrl.policies.pull import Async
from dagrl.runtime.executor import Call
from dagrl.runtime.host import load_acting
from dagrl.runtime.inference import InferenceUnavailable
from dagrl.runtime.loops import inference_loop
from dagrl.runtime.supervisor import RoleFailure

log = logging.getLogger("dagrl")

HEARTBEAT_S = 10.0
"""How long the inference host may take to answer a heartbeat before a sampler's failure is its."""


class Acting:
    """What both forms share: the inference role's socket, the samplers attached to it, its metrics."""

    graph: Graph
    hosts: dict[str, list[Any]]
    options: Any
    executor: Any

    def __init__(self, graph: Graph, hosts: dict[str, list[Any]], executor: Any = None):
        super().__init__(graph, hosts, executor)  # the policy it is mixed into (cooperative)
        algo = self.graph.algorithm
        self.actors_role = next(n.role for n in algo.graph.nodes if algo.roles[n.role].many)
        self.endpoint: tuple[str, int, str, bool] | None = None
        """The inference role's socket: host, port, token, TLS (:meth:`dagrl.runtime.host.RoleHost.serve`)."""
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
        host, port, _, tls = self.endpoint
        log.info("inference role: %d samplers act through %s:%d (%s)", expected, host, port, "TLS" if tls else "TCP")

    def _attach(self) -> None:
        """Point every sampler (a replacement, or all after the inference role was replaced) at it."""
        server = self.server
        samplers = self.hosts[self.actors_role]
        todo = [h for h in samplers if self.attached.get(h) is not server]
        for fut in [h.attach_inference(self.endpoint) for h in todo]:  # all at once
            fut.result()
        self.attached = dict.fromkeys(samplers, server)  # replaced samplers' handles are dropped

    def _submit_load(self, weights: list[Call]) -> Call:
        """A task giving the inference role ``weights`` (fetched from the learner's worker peer to peer)."""
        return self.executor.submit(self.server, "load", weights, task=load_acting)

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


class CentralInference(Acting, Lockstep):
    name = "central-inference"

    def before(self, node: Node, calls: dict[int, list[Call]]) -> list[Call]:
        if node.role != self.actors_role:
            return []
        weights = [calls[a.id][0] for a in node.inputs if isinstance(a, Node)]  # single-instance: broadcast
        return [self._submit_load(weights)]

    def step(self, ahead: bool = False) -> StepResult:

        def attached_step() -> StepResult:
            self._attach()
            return self._step(False)

        def redo(failure: RoleFailure) -> None:
            if failure.handle.role == self.actors_role and not self._server_answers():
                failure = RoleFailure(self.server, "lost", failure.cause)  # the role they act through
            self.recover(failure)
            if failure.handle.role == INFERENCE_ROLE:
                self._serve()

        res = self.recovery.attempt(attached_step, redo)
        res.metrics.update(self._stats())
        return res


class StreamingCentralInference(Acting, Async):
    """``central-inference`` with ``asynchronous: true`` (module docstring): ``async``'s streams, the
    samplers acting through the inference role, which a loop beside it keeps on the newest weights."""

    name = "central-inference"

    def __init__(self, graph: Graph, hosts: dict[str, list[Any]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        self.loading: Any = None
        """The inference role's weights loop (:func:`~dagrl.runtime.loops.inference_loop`) on this hub."""

    @property
    def stream_options(self) -> Any:
        return self.options.streaming

    def hub_opened(self) -> None:
        self._start_loading()

    def _start_loading(self) -> None:
        """The loop that loads each published version into the inference role (one per hub and role)."""
        if self.loading is not None:
            with contextlib.suppress(Exception):
                self.executor.client.cancel([self.loading], force=True)
        server, watch = self.server, self.watch
        spec = [("node", a.id) if isinstance(a, Node) else ("value", a) for a in watch.shape.stream.inputs]
        self.loading = self.executor.client.submit(
            inference_loop, (watch.hub_address, watch.hub_key), server.host_id, spec,
            workers=[server.address], allow_other_workers=False, pure=False,
            key=f"inference-load-{watch.generation}-{uuid.uuid4().hex[:8]}",
        )  # fmt: skip

    def loop_starting(self, index: int) -> None:
        self._attach()  # a replaced sampler, or all of them after the inference role was replaced

    def sampler_failed(self, index: int, failure: RoleFailure) -> bool:
        """A sampler that could not reach the inference role: the role's loss if it does not answer
        either (replaced, every sampler pointed at the new one); else it asked one replaced meanwhile.
        Either way only its loop starts again. Any other failure is the sampler's own."""
        if not isinstance(failure.cause, InferenceUnavailable):
            return False
        if not self._server_answers():
            self._replace_server(RoleFailure(self.server, "lost", failure.cause))
        self.watch.start_sampler(index)
        return True

    def watched(self) -> None:
        if self.loading is not None and self.loading.status in ("error", "lost"):
            cause = self.loading.exception() if self.loading.status == "error" else OSError("worker gone")
            if not self._server_answers():
                self._replace_server(RoleFailure(self.server, "lost", cause))
            else:
                self._start_loading()

    def _replace_server(self, failure: RoleFailure) -> None:
        self.recover(failure)
        self._serve()
        self.attached = {}  # every sampler acts through the new role from its next step
        self._attach()
        self._start_loading()

    def _result(self, r: Any) -> StepResult:
        res = super()._result(r)
        res.metrics.update(self._stats())
        return res
