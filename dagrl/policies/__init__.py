"""Distribution policies: how one training iteration maps onto role hosts. None knows an algorithm."""

from __future__ import annotations

from typing import Any

from dagrl.policies.apex import Apex
from dagrl.policies.asynchronous import Async
from dagrl.policies.base import Policy, StepResult
from dagrl.policies.single import Single
from dagrl.policies.split_learner import SplitLearner
from dagrl.policies.sync import Sync
from dagrl.runtime.hosts import start_actors, start_local

POLICIES: dict[str, type[Policy]] = {
    "single": Single,
    "sync": Sync,
    "async": Async,
    "apex": Apex,
    "split-learner": SplitLearner,
}

__all__ = ["POLICIES", "Policy", "StepResult", "build_policy"]


def build_policy(graph: Any, client: Any = None, seed_offset: int = 0, run_dir: Any = None) -> Policy:
    """Start the role hosts a graph asks for and wrap them in its policy.

    ``client`` is a ``distributed.Client`` for every policy but ``single``; ``run_dir`` is where
    roles without their own ``path`` keep on-disk data.
    """
    run_dir = None if run_dir is None else str(run_dir)
    cls = POLICIES[graph.spec.policy]
    if cls.distributed:
        if client is None:
            raise ValueError(f"policy {cls.name} needs a Dask client")
        hosts = start_actors(client, graph, seed_offset, run_dir=run_dir)
    else:
        hosts = start_local(graph, seed_offset, run_dir)
    return cls(graph, hosts)
