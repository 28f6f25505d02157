"""Running the traced iteration in lockstep: each fragment call on every replica of its role.

Values move between roles by one rule, the same in-process and across actors:

* into the same role: replica ``r`` gets replica ``r``'s value;
* from a single-instance role into a replicated one: broadcast (every replica gets it);
* from a replicated role into a single-instance one: gathered, a list with one item per replica;
* from a replicated role into another replicated one: sharded, replica ``k`` of ``K`` gets the list
  of source replicas ``i`` with ``i % K == k`` (two samplers feeding two replay shards: one each).

``single`` runs this over in-process hosts, ``sync`` over Dask actors, so with the same seeds they
compute the same numbers.
"""

from __future__ import annotations

import time
from typing import Any

from dagrl.fragment import Node
from dagrl.policies.base import Policy, StepResult
from dagrl.runtime.supervisor import RoleFailure


class Lockstep(Policy):
    name = "lockstep"

    def step(self) -> StepResult:
        while True:
            try:
                return self._step()
            except RoleFailure as failure:  # a sampler or replay shard died: replace it, redo the iteration
                self.replace_in_place(failure)

    def _step(self) -> StepResult:
        graph = self.graph.algorithm.graph
        res = StepResult()
        values: dict[int, list[Any]] = {}
        for node in graph.nodes:
            handles = self.hosts[node.role]
            t0 = time.perf_counter()
            outs = run_node(node, handles, self.graph.algorithm.roles, values)
            elapsed = time.perf_counter() - t0
            values[node.id] = outs
            before = res.env_steps
            for r, out in enumerate(outs):
                res.add_output(out, source=r)
            if res.env_steps > before:
                res.sample_time += elapsed
            if node is graph.output:
                res.update_time += elapsed
                if isinstance(outs[0], dict):
                    res.metrics = dict(outs[0])
        return res


def run_nodes(nodes: list[Node], hosts: dict[str, list[Any]], roles: Any) -> dict[int, list[Any]]:
    """Every node on every replica of its role, in order (the ``@evaluation`` graph)."""
    values: dict[int, list[Any]] = {}
    for node in nodes:
        values[node.id] = run_node(node, hosts[node.role], roles, values)
    return values


def run_node(node: Node, handles: list[Any], roles: Any, values: dict[int, list[Any]]) -> list[Any]:
    """``node`` on every replica at once, its inputs routed by :func:`route`; the outputs in replica order."""
    futures = []
    for r, h in enumerate(handles):
        args = [
            route(values[a.id], a.role, node.role, roles, r, len(handles)) if isinstance(a, Node) else a
            for a in node.inputs
        ]
        futures.append(h.call(node.name, *args))
    return [f.result() for f in futures]


def route(outs: list[Any], src: str, dst: str, roles: Any, replica: int, shards: int) -> Any:
    """What replica ``replica`` (of ``shards``) of role ``dst`` receives of role ``src``'s outputs."""
    if src == dst:
        return outs[replica]
    if roles[src].many and not roles[dst].many:
        return list(outs)
    if not roles[src].many:
        return outs[0]
    return outs[replica::shards]
