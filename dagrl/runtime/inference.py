"""Central batched inference (SEED RL's shape): samplers step envs, one role picks every action.

Two halves, one per side of an actor call:

* :class:`Batcher` lives in the ``inference`` role's host. Its ``act`` is an ``async`` actor method,
  so Dask runs it on the worker's event loop: requests from all samplers queue there, and one
  forward pass answers a batch as soon as every sampler has asked (``expected``) or ``max_wait_s``
  after the first request, whichever comes first. The forward runs on the loop itself, under the
  host's lock (a weights load never lands in the middle of a batch): handing it to a thread cost
  about 1 ms per step on a 2-core machine, more than a small network's forward; while a large
  network's forward runs, the worker's other messages wait for it.
* :class:`InferenceClient` is what a sampler's :meth:`dagrl.context.RoleContext.acting` returns:
  one blocking actor call per env step, straight to the inference worker (never the driver).

Numbers the policy reports each iteration (``inference/*`` metrics): rows per forward, requests per
forward, time a request waits in the queue, forward time, the share of wall time spent in forwards
(utilisation) and, from the samplers, the round trip of one step's call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np

__all__ = ["Batcher", "InferenceClient", "InferenceUnavailable"]


class InferenceUnavailable(RuntimeError):
    """A sampler could not reach the inference role (its worker died, or it did not answer in time)."""


class InferenceClient:
    """A sampler's handle on the inference role; ``attach`` points it at the role's host (again after a
    replacement, which a call already running then follows from its next step)."""

    def __init__(self, owner: str, timeout_s: float = 60.0):
        self.owner, self.timeout_s = owner, timeout_s
        self.address: str | None = None
        self.key: str | None = None
        self._calls, self._wait_s = 0, 0.0

    def attach(self, address: str, key: str) -> None:
        self.address, self.key = address, key

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, ...]:
        """One actor call, made through the worker's own connection pool rather than a Dask ``Actor``
        proxy: the proxy, finding the actor's worker gone, waits for the actor's key to be computed
        again (never, for a pinned actor), holding this sampler's only thread."""
        from distributed import get_worker
        from distributed.protocol import to_serialize
        from distributed.utils import sync

        if self.address is None:
            raise InferenceUnavailable(f"{self.owner}: no inference role attached (policy central-inference)")
        worker, address, key = get_worker(), self.address, self.key

        async def call() -> Any:
            rpc = worker.rpc(address)
            msg = rpc.actor_execute(actor=key, function="act", args=[to_serialize(np.ascontiguousarray(obs))])
            return await asyncio.wait_for(msg, self.timeout_s)

        t0 = time.perf_counter()
        try:
            reply = sync(worker.loop, call)
        except Exception as err:
            raise InferenceUnavailable(
                f"{self.owner} could not reach the inference role at {address}: {type(err).__name__}: {err}"
            ) from None
        if reply["status"] != "OK":
            raise reply["exception"]
        self._calls += 1
        self._wait_s += time.perf_counter() - t0
        return reply["result"]

    def load(self, weights: Any) -> None:
        """Nothing: the inference role receives the learner's weights itself."""

    def stats(self) -> tuple[int, float]:
        """Calls and seconds spent in them since the last time asked."""
        out = (self._calls, self._wait_s)
        self._calls, self._wait_s = 0, 0.0
        return out


class Batcher:
    """Batches ``act`` requests for ``forward`` (the inference role's acting object, under ``lock``)."""

    def __init__(self, forward: Any, lock: threading.RLock, expected: int, max_wait_s: float):
        self.forward, self.lock = forward, lock
        self.expected, self.max_wait_s = max(1, expected), max_wait_s
        self.pending: list[tuple[np.ndarray, asyncio.Future, float]] = []
        self.timer: asyncio.TimerHandle | None = None
        self._reset_stats()

    async def act(self, obs: np.ndarray) -> tuple[np.ndarray, ...]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((obs, fut, time.perf_counter()))
        if len(self.pending) >= self.expected:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.max_wait_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending, []
        if batch:
            self._run(batch)

    def _run(self, batch: list[tuple[np.ndarray, asyncio.Future, float]]) -> None:
        obs = np.concatenate([b[0] for b in batch])
        start = time.perf_counter()
        try:
            outs = self._forward(obs)
        except Exception as err:
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(err)
            return
        done = time.perf_counter()
        self.busy_s += done - start
        self.batches += 1
        self.rows += len(obs)
        self.requests += len(batch)
        self.queued_s += sum(start - t for _, _, t in batch)
        at = 0
        for b_obs, fut, _ in batch:
            n = len(b_obs)
            if not fut.done():
                fut.set_result(tuple(np.ascontiguousarray(o[at : at + n]) for o in outs))
            at += n

    def _forward(self, obs: np.ndarray) -> tuple[np.ndarray, ...]:
        with self.lock:
            out = self.forward(obs)
        return out if isinstance(out, tuple) else (out,)

    def _reset_stats(self) -> None:
        self.since = time.perf_counter()
        self.batches = self.rows = self.requests = 0
        self.busy_s = self.queued_s = 0.0

    def stats(self) -> dict[str, float]:
        """``inference/*`` metrics since the last call (then reset)."""
        wall = max(time.perf_counter() - self.since, 1e-9)
        n = max(self.batches, 1)
        out = {
            "inference/forwards": float(self.batches),
            "inference/batch_rows": self.rows / n,
            "inference/batch_requests": self.requests / n,
            "inference/queue_ms": 1e3 * self.queued_s / max(self.requests, 1),
            "inference/forward_ms": 1e3 * self.busy_s / n,
            "inference/utilisation": self.busy_s / wall,
        }
        self._reset_stats()
        return out
