"""``async``: samplers keep collecting with the weights they have; the learner consumes as data arrives.

The traced iteration is split at its one replicated fragment (``collect``): the fragments before it
(``publish``) run once per learner version, the fragments after it (``update``) run whenever
``rollouts_per_update`` outputs have arrived. Every sampler actor is driven by its own thread that
calls ``collect`` back to back, sending new weights only when the version changed.

Each output is tagged with the version of the weights that produced it; its *staleness* is the
number of updates made since. Outputs staler than ``max_staleness`` are dropped (their env steps
and episodes still count); the mean staleness consumed is reported as ``perf/staleness``. The
algorithm corrects for what remains (PPO: ratio against the behaviour log-probs in the rollout).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from dagrl.fragment import Node
from dagrl.policies.base import Policy, StepResult, call_with_cached_args
from dagrl.runtime.hosts import Handle
from dagrl.runtime.supervisor import RoleFailure


class Async(Policy):
    name = "async"

    def __init__(self, graph: Any, hosts: dict[str, list[Handle]]):
        super().__init__(graph, hosts)
        self.before, self.stream, self.after = self.split(graph.algorithm)
        self.max_staleness = graph.spec.max_staleness
        self.per_update = graph.spec.rollouts_per_update
        self.version = 0
        self.values: dict[int, Any] = {}
        # Backpressure: samplers wait once one update's worth is queued, so on a small machine they
        # do not take the learner's cores to make rollouts that would only go stale.
        self.inbox: queue.Queue = queue.Queue(maxsize=self.per_update)
        self.last_step_end = 0.0
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.consumed = self.dropped = 0
        self.error: BaseException | None = None

    @classmethod
    def check(cls, algorithm: Any) -> None:
        cls.split(algorithm)

    @staticmethod
    def split(algorithm: Any) -> tuple[list[Node], Node, list[Node]]:
        """The fragments before, at and after the one replicated fragment of the iteration."""
        fgraph, roles = algorithm.graph, algorithm.roles
        streamed = [n for n in fgraph.nodes if roles[n.role].many]
        if len(streamed) != 1:
            raise TypeError(
                "async needs exactly one fragment on a replicated role in the iteration, found "
                f"{[n.name for n in streamed]}"
            )
        stream = streamed[0]
        for arg in stream.inputs:
            if isinstance(arg, Node) and roles[arg.role].many:
                raise TypeError(f"async: {stream.name} may only take inputs from single-instance roles")
        before = [n for n in fgraph.nodes if n.id < stream.id]
        after = [n for n in fgraph.nodes if n.id > stream.id]
        return before, stream, after

    # -- the learner side -------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Run the fragments before the stream (``publish``) and make their outputs current."""
        for node in self.before:
            self.values[node.id] = self._call_single(node)
        with self.lock:
            self.current = (self.version, [self._arg(a) for a in self.stream.inputs])

    def _call_single(self, node: Node) -> Any:
        (host,) = self.hosts[node.role]
        return host.call(node.name, *[self._arg(a) for a in node.inputs]).result()

    def _arg(self, arg: Any) -> Any:
        if not isinstance(arg, Node):
            return arg
        return self.values[arg.id]

    def start(self) -> None:
        self.last_step_end = time.perf_counter()
        self._refresh()
        for handle in self.hosts[self.stream.role]:
            t = threading.Thread(target=self._sample_loop, args=(handle,), name=f"dagrl-{handle!r}", daemon=True)
            t.start()
            self.threads.append(t)

    def step(self) -> StepResult:
        if not self.threads:
            self.start()
        res = StepResult()
        batch: list[Any] = []
        staleness: list[int] = []
        while len(batch) < self.per_update:
            try:
                version, source, out = self.inbox.get(timeout=0.2)
            except queue.Empty:
                if self.error is not None:
                    raise self.error from None
                continue
            res.add_output(out, source=source)
            lag = self.version - version
            if lag > self.max_staleness:
                self.dropped += 1
                continue
            batch.append(out)
            staleness.append(lag)
        self.values[self.stream.id] = batch
        t1 = time.perf_counter()
        for node in self.after:
            self.values[node.id] = self._call_single(node)
        res.update_time = time.perf_counter() - t1
        out = self.values[self.after[-1].id] if self.after else None
        if isinstance(out, dict):
            res.metrics = dict(out)
        self.version += 1
        self._refresh()
        self.consumed += len(batch)
        now = time.perf_counter()
        res.sample_time, self.last_step_end = now - self.last_step_end, now  # samplers never pause
        res.metrics["perf/staleness"] = sum(staleness) / len(staleness)
        res.metrics["perf/dropped_rollouts"] = float(self.dropped)
        return res

    # -- the sampler side -------------------------------------------------------------------------

    def _sample_loop(self, handle: Handle) -> None:
        sent = -1
        try:
            while not self.stopping.is_set():
                with self.lock:
                    version, args = self.current
                try:
                    out = call_with_cached_args(handle, self.stream.name, version, args, sent)
                except RoleFailure as failure:  # this sampler died: a new one gets weights with its first call
                    handle, sent = self.replace_in_place(failure), -1
                    continue
                sent = version
                while not self.stopping.is_set():
                    try:
                        self.inbox.put((version, handle.index, out), timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except BaseException as err:  # handed to the driver thread, which raises it
            self.error = err

    def after_restore(self) -> None:
        self._refresh()

    def close(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=30)
        super().close()
