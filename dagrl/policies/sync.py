"""``sync``: N sampler actors in lockstep, rollouts gathered to one learner actor, weights broadcast."""

from __future__ import annotations

from typing import Any

from dagrl.core.distribution import mail_edges
from dagrl.core.graph import Graph
from dagrl.policies.lockstep import Lockstep


class Sync(Lockstep):
    """Each iteration: weights to every sampler, all samplers collect in parallel, the learner updates
    on the gathered rollouts (A2C/PPO-style synchronous data parallelism, MSRL's AllGather policy).
    The iteration is one Dask graph: ``publish`` on the learner's worker, ``collect`` on each
    sampler's, ``update`` back on the learner's, data fetched worker to worker; a sampler on the
    learner's host takes the weights from a mailbox and the learner its rollouts (``policy.mailbox``;
    not with ``shared_memory: false``)."""

    name = "sync"
    runs_ahead = True

    def __init__(self, graph: Graph, hosts: dict[str, list[Any]], executor: Any = None):
        super().__init__(graph, hosts, executor)
        if self.executor.remote and self.options.mailbox and graph.spec.shared_memory:
            self.mail = mail_edges(graph.algorithm)
