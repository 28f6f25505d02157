"""What the driver sends to the RL page: metrics rows and actor heartbeats, as Dask events."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dagrl.dashboard import ACTORS, METRICS

log = logging.getLogger("dagrl")

MAX_EPISODES = 64
"""Episode returns sent per iteration (the newest), enough for the scatter, small on the wire."""


class Feed:
    """Publishes a run's metrics (per iteration) and its actors' heartbeats (every ``interval`` s)."""

    def __init__(self, client: Any, policy: Any, run: str, interval: float = 2.0):
        self.client, self.policy, self.run, self.interval = client, policy, run, interval
        self.devices = {(a["role"], a["index"]): a["device"] for a in policy.actors()}
        self.last_seen: dict[tuple[str, int], float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="dagrl-feed", daemon=True)

    def start(self) -> Feed:
        self.thread.start()
        return self

    def on_row(self, row: dict[str, Any], res: Any) -> None:
        """Trainer listener: one event per iteration, with the returns of the episodes that finished and
        the sampler that produced each."""
        n = min(len(res.episodes), MAX_EPISODES)
        returns = [float(r) for r in res.episodes.returns[len(res.episodes) - n :]]
        sources = [int(s) for s in res.sources[len(res.sources) - n :]] if len(res.sources) >= n else [-1] * n
        self._send(METRICS, {"run": self.run, "row": row, "returns": returns, "sources": sources})

    def _send(self, topic: str, msg: dict[str, Any]) -> None:
        try:
            self.client.log_event(topic, msg)
        except Exception as err:  # the dashboard is a view: never stop training for it
            log.debug("dashboard feed: %s", err)

    def _loop(self) -> None:
        while not self.stopping.wait(self.interval):
            self._send(ACTORS, {"run": self.run, "actors": self.actors()})

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
                row.update(state=state, calls=beat["calls"], stats=beat.get("stats"))
                self.devices[key] = beat.get("device", "?")
            row["device"] = self.devices.get(key, "?")
            seen = self.last_seen.get(key)
            row["heartbeat_age_s"] = None if seen is None else now - seen
            rows.append(row)
        return rows

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        self._send(ACTORS, {"run": self.run, "actors": self.actors(), "final": True})
