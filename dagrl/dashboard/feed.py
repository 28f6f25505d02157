"""What the driver sends to the RL page: metrics rows and actor heartbeats, as Dask events."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dagrl.dashboard.topics import ACTORS, METRICS
from dagrl.runtime.report import in_env

log = logging.getLogger("dagrl")

MAX_EPISODES = 64
"""Episode returns sent per iteration (the newest), enough for the scatter, small on the wire."""


def row_message(row: dict[str, Any], res: Any) -> dict[str, Any]:
    """An iteration's metrics row, with the returns of the newest episodes that finished in it and the
    sampler replica that produced each."""
    n = min(len(res.episodes), MAX_EPISODES)
    returns = [float(r) for r in res.episodes.returns[len(res.episodes) - n :]]
    sources = [int(s) for s in res.sources[len(res.sources) - n :]] if len(res.sources) >= n else [-1] * n
    return {"row": row, "returns": returns, "sources": sources}


class TrialFeed:
    """Publishes the metrics rows of a run that trains inside a Dask task (a ``dagrl sweep`` trial), from
    that worker: the rows of ``flush_s`` as one event, as :class:`Feed` does; no actor heartbeats (a
    trial's roles live in its own process). ``Worker.log_event`` only queues the message on the worker's
    stream to the scheduler, so the training loop sends without waiting and needs no thread of its own.
    """

    def __init__(self, worker: Any, run: str, flush_s: float = 0.25):
        self.worker, self.run, self.flush_s = worker, run, flush_s
        self.queued: list[dict[str, Any]] = []
        self.sent = time.monotonic()

    @classmethod
    def here(cls, run: str) -> TrialFeed | None:
        """A feed through the Dask worker running this code, or ``None`` outside one."""
        from distributed import get_worker

        try:
            return cls(get_worker(), run)
        except ValueError:  # not in a worker's task
            return None

    def on_row(self, row: dict[str, Any], res: Any) -> None:
        self.queued.append(row_message(row, res))
        if time.monotonic() - self.sent >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        rows, self.queued = self.queued, []
        self.sent = time.monotonic()
        if rows:
            try:
                self.worker.log_event(METRICS, {"run": self.run, "rows": rows})
            except Exception as err:  # the dashboard is a view: never stop training for it
                log.debug("dashboard feed: %s", err)


class Feed:
    """Publishes a run's metrics rows and its actors' heartbeats (every ``interval`` s).

    The training loop only queues a row (:meth:`on_row`); the feed's own thread sends what queued
    every ``flush_s`` as one event. Logging an event is a round trip to the scheduler: one per
    iteration from the training loop cost a ``sync`` PPO iteration on CartPole about 1 ms of the
    driver's time and a blocking wait, and filled the scheduler's event log (1000 events per topic)
    with a minute of rows.
    """

    def __init__(self, client: Any, policy: Any, run: str, interval: float = 2.0, flush_s: float = 0.25):
        self.client, self.policy, self.run, self.interval, self.flush_s = client, policy, run, interval, flush_s
        self.devices = {(a["role"], a["index"]): a["device"] for a in policy.actors()}
        self.last_seen: dict[tuple[str, int], float] = {}
        self.queued: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="dagrl-feed", daemon=True)

    def start(self) -> Feed:
        self.thread.start()
        return self

    def on_row(self, row: dict[str, Any], res: Any) -> None:
        """Trainer listener: queue the iteration's row (:func:`row_message`)."""
        with self.lock:
            self.queued.append(row_message(row, res))

    def flush(self) -> None:
        """Send the queued rows as one event (topic ``dagrl-metrics``: ``{"run", "rows": [...]}``)."""
        with self.lock:
            rows, self.queued = self.queued, []
        if rows:
            self._send(METRICS, {"run": self.run, "rows": rows})

    def _send(self, topic: str, msg: dict[str, Any]) -> None:
        try:
            self.client.log_event(topic, msg)
        except Exception as err:  # the dashboard is a view: never stop training for it
            log.debug("dashboard feed: %s", err)

    def _loop(self) -> None:
        beat = time.monotonic() + self.interval
        while not self.stopping.wait(self.flush_s):
            self.flush()
            if time.monotonic() >= beat:
                self._send(ACTORS, {"run": self.run, "actors": self.actors()})
                beat = time.monotonic() + self.interval

    def actors(self) -> list[dict[str, Any]]:
        """One row per role replica: where it runs, what it is doing, when it last answered."""
        handles = [h for hs in list(self.policy.hosts.values()) for h in hs]
        pending = []
        for h in handles:
            try:
                pending.append(h.heartbeat())
            except Exception:
                pending.append(None)
        rows, now = [], time.time()
        for h, fut in zip(handles, pending, strict=True):
            key = (h.role, h.index)
            row = {"role": h.role, "index": h.index, "worker": h.address or "in-process"}
            try:
                beat = fut.result() if fut is not None else None
            except Exception:
                beat = None
            if beat is None:
                row.update(state="not answering", calls=None)
            else:
                self.last_seen[key] = now
                running = beat["running"]
                state = f"running {running} ({beat['running_s']:.1f} s)" if running else "idle"
                row.update(state=state, calls=beat["calls"], stats=beat.get("stats"), in_env=in_env(beat))
                self.devices[key] = beat.get("device", "?")
            row["device"] = self.devices.get(key, "?")
            seen = self.last_seen.get(key)
            row["heartbeat_age_s"] = None if seen is None else now - seen
            rows.append(row)
        return rows

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        self.flush()
        self._send(ACTORS, {"run": self.run, "actors": self.actors(), "final": True})
