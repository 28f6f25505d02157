"""``split-learner``: Spreeze's dual-device idea, the learner roles of one algorithm updating at once.

As ``apex`` (samplers stream into replay, a rate-limited learner round), except that a value
passed between two single-instance learner roles inside a round (SAC: the critic's new weights to
the actor) arrives *one round late*. Both learner roles then start each round together, on their
own workers and devices (``resources: {GPU: 1}`` each), instead of one waiting for the other; the
price is one round of extra staleness in that exchange (``gradient_steps`` steps).
"""

from __future__ import annotations

from typing import Any

from dagrl.fragment import Node
from dagrl.policies.apex import Apex
from dagrl.policies.lockstep import route


class SplitLearner(Apex):
    name = "split-learner"

    def __init__(self, graph: Any, hosts: Any):
        super().__init__(graph, hosts)
        self.delayed = self.delayed_edges(graph.algorithm)
        self.previous: dict[int, Any] = {}

    @classmethod
    def check(cls, algorithm: Any) -> None:
        Apex.split(algorithm)
        if not cls.delayed_edges(algorithm):
            raise TypeError(
                "split-learner needs two learner roles that pass values within a round "
                "(e.g. critic -> actor, as in sac.py); this iteration has none"
            )

    @staticmethod
    def delayed_edges(algorithm: Any) -> set[tuple[int, int]]:
        """(src, dst) node ids of edges between two different single-instance learner-side roles."""
        _, _, _, learn = Apex.split(algorithm)
        roles, ids = algorithm.roles, {n.id for n in learn}
        return {
            (e.src.id, e.dst.id)
            for e in algorithm.graph.edges
            if e.src.id in ids and e.dst.id in ids and e.src.role != e.dst.role
            and not roles[e.src.role].many and not roles[e.dst.role].many
        }  # fmt: skip

    def _learn_round(self) -> None:
        pending, done = list(self.learn), set()
        while pending:
            ready = [n for n in pending if all(self._available(a, n, done) for a in n.inputs)]
            calls = {n.id: self._submit(n) for n in ready}  # every ready fragment at once
            for n in ready:
                self.values[n.id] = [f.result() for f in calls[n.id]]
                done.add(n.id)
                pending.remove(n)
        for src, _ in self.delayed:
            self.previous[src] = self.values[src]

    def _available(self, arg: Any, node: Node, done: set[int]) -> bool:
        if not isinstance(arg, Node) or arg.id not in {n.id for n in self.learn}:
            return True
        if (arg.id, node.id) in self.delayed and arg.id in self.previous:
            return True  # last round's value will do
        return arg.id in done

    def _submit(self, node: Node) -> list[Any]:
        handles = self.hosts[node.role]
        return [h.call(node.name, *[self._arg(a, node, r) for a in node.inputs]) for r, h in enumerate(handles)]

    def _arg(self, arg: Any, node: Node, replica: int) -> Any:
        if isinstance(arg, Node) and (arg.id, node.id) in self.delayed and arg.id in self.previous:
            return route(self.previous[arg.id], arg.role, node.role, self.roles, replica, len(self.hosts[node.role]))
        return self._learner_arg(arg, node, replica)
