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

With ``asynchronous: true`` the samplers stream as under ``async`` (SEED RL's shape): the learner
updates on arrived rollouts while the samplers go on, and each new weights version is loaded into the
inference role as soon as it is published, without waiting for the samplers; an env step is acted on
with whatever version the role holds then. A rollout's version (what ``max_staleness`` judges) is the
newest one published when its collect was submitted; its actions may come from that version or a newer
one, never an older one once the load has run. PPO's ratio uses the log-probabilities recorded with
each action, so the correction holds step by step.

A sampler that cannot reach the inference role fails its fragment; if the inference host does not
answer a heartbeat either, the failure is the inference role's: it is replaced in place (its state is
only a copy of the weights) and the iteration redone (lockstep) or the samplers' streams resumed
(asynchronous), the samplers kept. ``inference/*`` metrics (batch rows and requests, queue and
forward time, utilisation, the samplers' round trip) join each iteration's row.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from dagrl.core.distribution import INFERENCE_ROLE
from dagrl.core.fragment import Node
from dagrl.core.graph import Graph
from dagrl.policies.base import StepResult
from dagrl.policies.lockstep import Lockstep
from dagrl.policies.streaming import Rounds
from dagrl.runtime.executor import Call
from dagrl.runtime.host import load_acting
from dagrl.runtime.inference import InferenceUnavailable
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


class StreamingCentralInference(Acting, Rounds):
    """``central-inference`` with ``asynchronous: true`` (module docstring)."""

    name = "central-inference"

    def __init__(self, graph: Graph, hosts: dict[str, list[Any]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        self.loaded: Call | None = None
        """The newest ``load`` of weights into the inference role (every stream call watches it)."""
        self.excused: set[Any] = set()
        """Samplers that acted through an inference role when it was replaced: their failure to reach
        it, arriving after the replacement, is not theirs."""
        self.attach_lock = threading.Lock()
        """One sampler thread at a time judges a failure and re-attaches (several fail at once when
        the inference role dies)."""

    @property
    def stream_options(self) -> Any:
        return self.options.streaming

    def start(self) -> None:
        self._attach()
        super().start()

    def _use(self, calls: dict[int, list[Call]], new_version: bool = False) -> None:
        super()._use(calls, new_version)
        self._load(wait=self.loaded is None)  # the first version before any sampler acts

    def _load(self, wait: bool) -> None:
        """Give the inference role the weights of the newest version (``self.current``)."""
        with self.cond:
            current = self.current
        weights = [current[a.id][0] for a in self.shape.stream.inputs if isinstance(a, Node)]
        call = self._submit_load(weights)
        self.loaded = call
        if wait:
            self.executor.wait([call], [call, *weights])

    def _submit_one(self, i: int, previous: Any, seen: int) -> Any:
        pending = super()._submit_one(i, previous, seen)
        if self.loaded is not None:
            pending.watch.append(self.loaded)  # a load that failed: the inference role is lost
        return pending

    def _on_failure(self, failure: RoleFailure) -> None:
        role = failure.handle.role
        if role not in (self.actors_role, INFERENCE_ROLE):
            return super()._on_failure(failure)
        with self.attach_lock:
            server = self.server
            if role == INFERENCE_ROLE:
                if failure.handle is server:  # else: already replaced by another sampler's thread
                    if failure.kind == "raised" and not self._server_answers():
                        # an error seen on a call of a role that no longer answers is its loss, not its
                        # own: it may be a sampler's report of the loss, inherited by the call
                        failure = RoleFailure(server, "lost", failure.cause)
                    self._replace_server(failure)
            elif not isinstance(failure.cause, InferenceUnavailable):
                super()._on_failure(failure)  # the sampler's own: replaced
            elif failure.handle in self.excused:
                pass  # it asked an inference role that another sampler's thread has replaced since
            elif not self._server_answers():
                self._replace_server(RoleFailure(server, "lost", failure.cause))
            else:  # the role answers, this sampler cannot reach it: the sampler's (a crash loop stops it)
                super()._on_failure(failure)
            self.excused.discard(failure.handle)
            self._attach()

    def _replace_server(self, failure: RoleFailure) -> None:
        old = self.server
        self.excused = {h for h, s in self.attached.items() if s is old}
        self.replace_in_place(failure)
        self._serve()
        self._load(wait=True)

    def step(self, ahead: bool = False) -> StepResult:
        res = super().step(ahead)
        res.metrics.update(self._stats())
        return res
