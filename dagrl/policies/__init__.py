"""Distribution policies: how one training iteration maps onto role hosts. None knows an algorithm.

Each is a configuration of one engine (:class:`~dagrl.runtime.executor.Executor`): ``single`` and
``sync`` submit the whole iteration at once (:mod:`.lockstep`), ``dp-learners`` too, with
data-parallel learner replicas (:mod:`.dataparallel`), and ``central-inference``, with one batched
``inference`` role acting for every sampler (:mod:`.inference`; streamed as ``async`` with
``asynchronous: true``), ``async``,
``apex`` and ``split-learner`` stream the samplers to the learner, which pulls what has arrived
(through replay under ``apex`` and ``split-learner``), without the driver (:mod:`.pull`).
Their names and options are data in :mod:`dagrl.core.distribution`.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from dagrl.core.graph import Graph
from dagrl.policies.base import Policy, StepResult
from dagrl.policies.dataparallel import DataParallel
from dagrl.policies.inference import CentralInference, StreamingCentralInference
from dagrl.policies.pull import Apex, Async, SplitLearner
from dagrl.policies.single import Single
from dagrl.policies.sync import Sync
from dagrl.runtime.executor import Executor
from dagrl.runtime.hosts import Start, start_actors, start_local, start_one
from dagrl.runtime.supervisor import Supervisor

POLICIES: dict[str, type[Policy]] = {
    "single": Single,
    "sync": Sync,
    "async": Async,
    "apex": Apex,
    "split-learner": SplitLearner,
    "dp-learners": DataParallel,
    "central-inference": CentralInference,
}

__all__ = ["POLICIES", "Policy", "StepResult", "build_policy"]


def sweep_stale(client: Any = None) -> None:
    """Remove the shared-memory segments and mailbox files that runs killed before their close left on
    this machine and, given a ``client``, on its workers' (their makers' processes are gone)."""
    from dagrl.runtime import mailbox, shm

    for sweep in (shm.sweep, mailbox.sweep):
        sweep()
        if client is not None:
            with contextlib.suppress(Exception):  # a worker going away is the supervisor's to see
                client.run(sweep)


def build_policy(
    graph: Graph, client: Any = None, seed_offset: int = 0, run_dir: Any = None, env_steps: int = 0
) -> Policy:
    """Start the role hosts a graph asks for and wrap them in its policy.

    ``client`` is a ``distributed.Client`` for every policy but ``single``; ``run_dir`` is where
    roles without their own ``path`` keep on-disk data; ``env_steps``: the run's so far (a resume).
    """
    begin = Start(seed_offset, None if run_dir is None else str(run_dir), env_steps)
    sweep_stale(client)
    cls = POLICIES[graph.spec.policy]
    if cls is CentralInference and graph.policy_options.asynchronous:
        cls = StreamingCentralInference
    if not graph.traits.distributed:
        return cls(graph, start_local(graph, begin))
    if client is None:
        raise ValueError(f"policy {cls.name} needs a Dask client")
    hosts = start_actors(client, graph, begin)

    def start(role: str, index: int, address: str, offset: int, steps: int) -> Any:
        return start_one(client, graph, role, index, address, replace(begin, seed_offset=offset, env_steps=steps))

    supervisor = Supervisor(client, graph, hosts, start, seed_offset)
    supervisor.env_steps = env_steps
    return cls(graph, hosts, Executor(client, supervisor))
