"""``apex``: samplers stream into replay shards; the learner samples and updates on its own clock.

The traced iteration is split at its first replicated fragment (``collect``, the *stream*):

* fragments before it (``publish``) run on the learner side once per ``publish_every`` rounds;
* fragments that consume the stream directly (``add``, the *insert*) run right after each
  ``collect``, in the sampler's own thread, on replay shard ``i % K`` for sampler ``i``;
* the rest (``sample -> update``) is one learner *round*, run by the driver.

A rate limiter ties rounds to collects both ways, as Reverb's does, so a run does not depend on
machine speed: the learner waits while ``rounds > ratio * collects``; samplers wait once
``collects >= (rounds + 1) / ratio + max_lead`` (always enough for the learner's next round).
``update_ratio`` (rounds per collect) defaults to one round per ``N`` collects for ``N``
samplers, the schedule of ``single``/``sync``. ``rate_limit: false`` lets both sides run free.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np

from dagrl.context import Episodes
from dagrl.fragment import Node
from dagrl.policies.base import Policy, StepResult, call_with_cached_args
from dagrl.policies.lockstep import route
from dagrl.runtime.hosts import Handle
from dagrl.runtime.supervisor import RoleFailure


class Apex(Policy):
    name = "apex"

    def __init__(self, graph: Any, hosts: dict[str, list[Handle]]):
        super().__init__(graph, hosts)
        self.before, self.stream, self.insert, self.learn = self.split(graph.algorithm)
        self.roles = graph.algorithm.roles
        spec = graph.spec
        samplers = len(hosts[self.stream.role])
        self.ratio = spec.update_ratio if spec.update_ratio is not None else 1.0 / samplers
        self.limited = spec.rate_limit
        self.max_lead = spec.max_lead if spec.max_lead is not None else 2 * samplers
        self.publish_every = spec.publish_every
        self.cond = threading.Condition()
        self.collects_started = self.collects_done = self.rounds = 0
        self.version = 0
        self.values: dict[int, Any] = {}
        self.latest: dict[int, list[Any]] = {n.id: [None] * len(hosts[n.role]) for n in self.insert}
        self.arrived: list[tuple[int, Episodes, int, int]] = []
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.error: BaseException | None = None
        self.last_step_end = 0.0

    @classmethod
    def check(cls, algorithm: Any) -> None:
        cls.split(algorithm)

    @staticmethod
    def split(algorithm: Any) -> tuple[list[Node], Node, list[Node], list[Node]]:
        """Fragments before the stream, the stream, its direct consumers (insert), the rest (learn)."""
        nodes, roles = algorithm.graph.nodes, algorithm.roles
        streamed = [n for n in nodes if roles[n.role].many]
        if not streamed:
            raise TypeError("apex needs a fragment on a replicated role (samplers) in the iteration")
        stream = streamed[0]
        if any(isinstance(a, Node) and roles[a.role].many for a in stream.inputs):
            raise TypeError(f"apex: {stream.name} may only take inputs from single-instance roles")
        insert = [n for n in nodes if n.id > stream.id and stream in n.inputs]
        if not insert:
            raise TypeError(f"apex: nothing consumes {stream.name} (expected e.g. a replay add)")
        if any(n.role == stream.role for n in insert):
            raise TypeError("apex: the stream's consumers must run on another role (replay)")
        learn = [n for n in nodes if n.id > stream.id and n not in insert]
        if any(stream in n.inputs for n in learn):
            raise TypeError(f"apex: only the insert fragments may consume {stream.name}")
        before = [n for n in nodes if n.id < stream.id]
        return before, stream, insert, learn

    # -- learner side -----------------------------------------------------------------------------

    def _run(self, node: Node, resolve: Any) -> list[Any]:
        handles = self.hosts[node.role]
        futures = [h.call(node.name, *[resolve(a, node, r) for a in node.inputs]) for r, h in enumerate(handles)]
        return [f.result() for f in futures]

    def _learner_arg(self, arg: Any, node: Node, replica: int) -> Any:
        if not isinstance(arg, Node):
            return arg
        outs = self.latest[arg.id] if arg.id in self.latest else self.values[arg.id]
        return route(outs, arg.role, node.role, self.roles, replica, len(self.hosts[node.role]))

    def _learn_round(self) -> None:
        """One learner round: the fragments after the stream, in order."""
        for node in self.learn:
            self.values[node.id] = self._run(node, self._learner_arg)

    def _refresh(self) -> None:
        for node in self.before:
            self.values[node.id] = self._run(node, self._learner_arg)
        args = [self._learner_arg(a, self.stream, 0) for a in self.stream.inputs]
        with self.cond:
            self.current = (self.version, args)

    def start(self) -> None:
        self.last_step_end = time.perf_counter()
        self._refresh()
        for i, handle in enumerate(self.hosts[self.stream.role]):
            t = threading.Thread(target=self._sample_loop, args=(i, handle), name=f"dagrl-apex-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def step(self) -> StepResult:
        if not self.threads:
            self.start()
        with self.cond:
            while self.limited and self.rounds + 1 > self.ratio * self.collects_done:
                if self.error is not None:
                    raise self.error
                self.cond.wait(0.2)
            if self.error is not None:
                raise self.error
            arrived, self.arrived = self.arrived, []
        t0 = time.perf_counter()
        while True:
            try:
                self._learn_round()
                break
            except RoleFailure as failure:  # a replay shard died: reopen it from its store, redo the round
                self.replace_in_place(failure)
        update_time = time.perf_counter() - t0
        with self.cond:
            self.rounds += 1
            self.cond.notify_all()
        if self.rounds % self.publish_every == 0:
            self.version += 1
            self._refresh()
        res = StepResult(update_time=update_time)
        lags = []
        for steps, episodes, version, index in arrived:
            res.env_steps += steps
            res.add_output(_Counted(episodes), source=index)
            lags.append(self.version - version)
        now = time.perf_counter()
        res.sample_time, self.last_step_end = now - self.last_step_end, now  # samplers never pause for us
        out = self.values[self.learn[-1].id][0] if self.learn else None
        if isinstance(out, dict):
            res.metrics = dict(out)
        res.metrics["perf/weights_lag"] = float(np.mean(lags)) if lags else 0.0
        res.metrics["perf/collects"] = float(self.collects_done)
        return res

    # -- sampler side -----------------------------------------------------------------------------

    def _sample_loop(self, index: int, handle: Handle) -> None:
        sent = -1
        try:
            while not self.stopping.is_set():
                with self.cond:
                    # the collects the learner's next round needs, plus max_lead: never a deadlock
                    while (
                        self.limited
                        and self.collects_started >= math.ceil((self.rounds + 1) / self.ratio) + self.max_lead
                    ):
                        if self.stopping.is_set():
                            return
                        self.cond.wait(0.2)
                    self.collects_started += 1
                    version, args = self.current
                try:
                    out = call_with_cached_args(handle, self.stream.name, version, args, sent)
                    sent = version
                    results = self._insert(index, out)
                except RoleFailure as failure:  # the sampler or its replay shard died: replace, collect again
                    self.replace_in_place(failure)
                    with self.cond:
                        self.collects_started -= 1
                    if failure.handle is handle:
                        handle, sent = self.hosts[self.stream.role][index], -1
                    continue
                with self.cond:
                    for node_id, (shard, value) in results.items():
                        self.latest[node_id][shard] = value
                    self.collects_done += 1
                    self.arrived.append(
                        (int(getattr(out, "env_steps", 0)), getattr(out, "episodes", Episodes()), version, index)
                    )
                    self.cond.notify_all()
        except BaseException as err:  # handed to the driver thread, which raises it
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _insert(self, index: int, out: Any) -> dict[int, tuple[int, Any]]:
        """The stream's consumers (replay ``add``) on sampler ``index``'s shard."""
        results = {}
        for node in self.insert:
            shards = self.hosts[node.role]
            shard = index % len(shards)
            node_args = [[out] if a is self.stream else self._learner_arg(a, node, shard) for a in node.inputs]
            results[node.id] = (shard, shards[shard].call(node.name, *node_args).result())
        return results

    def after_restore(self) -> None:
        self._refresh()

    def close(self) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
        for t in self.threads:
            t.join(timeout=30)
        super().close()


class _Counted:
    """Adapter so StepResult.add_output counts episodes without counting steps twice."""

    def __init__(self, episodes: Episodes):
        self.episodes = episodes
