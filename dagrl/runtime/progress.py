"""A one-line live progress display: redrawn in place on a terminal, a log line every few seconds otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


class Progress:
    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self.enabled = enabled
        self.last = 0.0

    def update(self, row: dict, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty and not force and now - self.last < self.every_s:
            return
        self.last = now
        ret = row.get("charts/episode_return_mean")
        line = (
            f"it {row['iteration']:>5}  steps {_si(row['env_steps']):>6}  episodes {row['episodes']:>6}  "
            f"return {'-' if ret is None else f'{ret:8.1f}'}  "
            f"sample {_si(row.get('perf/sample_hz', 0.0)):>6} Hz  update {_si(row.get('perf/update_hz', 0.0)):>6} Hz  "
            f"{row['time_s']:6.1f}s"
        )
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
