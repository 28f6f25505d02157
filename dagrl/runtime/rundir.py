"""A run directory: resolved config, per-iteration metrics, checkpoints and the learning curve.

Design notes
------------

``runs/<name>-<YYYYmmdd-HHMMSS>/``: ``config.yaml`` (the resolved graph, defaults filled in), ``metrics.jsonl`` (one
row per iteration: counters, ``charts/*``, ``losses/*``, ``perf/*``), ``checkpoints/ckpt-<iteration>.pt`` (newest
``checkpoint.keep``), ``summary.json``, ``curve.html``, ``actors.json`` (where each role actor runs: written at the
start, again after each iteration in which supervision replaced a role, and at the end with each instance's
busy seconds), ``events.jsonl`` (restarts, rollbacks), ``.lock``. One process trains into a run directory at a
time: ``dagrl.train`` and ``dagrl run`` hold an advisory ``flock`` on ``.lock`` (which names the holder's pid) while
they run, so a ``--resume`` of a run that is still going, or a second ``--run-dir`` into it, stops with `DIR is in
use by another dagrl process (pid N)` before writing anything, instead of interleaving its metrics and
checkpoints with the first's. The system drops the lock when the holder ends, however it ends. `dagrl run
--resume DIR` reads the newest checkpoint and continues the counters; samplers restart with seeds shifted by
the iteration count so they do not replay the same episodes. The stop window comes back from the checkpoint; a
restarted sampler's episodes join it only once every one of its envs has finished an episode
(``Episodes.in_window``, set by ``EpisodeTracker``), because the first to finish after a reset of all envs are the
shortest, and where length and return go together (Pong) a window of them stopped a resumed run on 20.9 with a
true mean near 18.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CHECKPOINT_RE = re.compile(r"ckpt-(\d+)\.pt$")

log = logging.getLogger("dagrl")


class RunDirInUse(RuntimeError):
    """Another process trains into this run directory (:meth:`RunDir.hold`)."""


class MetricsError(ValueError):
    """A line of ``metrics.jsonl`` other than the last does not parse: the file was damaged, not torn by
    a crash (which can only cut the line being appended)."""


def _lines_backwards(path: Path, block: int = 1 << 16) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of a file's lines from the last to the first, reading ``block`` bytes at a time
    from the end (the newline that ends the last line starts no line of its own)."""
    with path.open("rb") as f:
        pos = f.seek(0, os.SEEK_END)
        buf = b""
        first = True
        while True:
            cut = buf.rfind(b"\n")
            if cut < 0 and pos > 0:  # the line goes on in the block before
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                buf = f.read(step) + buf
                continue
            line, buf = buf[cut + 1 :], buf[: max(cut, 0)]
            if not (first and not line and cut >= 0):
                yield pos + cut + 1, line
            first = False
            if cut < 0:
                return


class RunDir:
    """``runs/<name>-<timestamp>/`` with ``config.yaml``, ``metrics.jsonl``, ``checkpoints/``, ``curve.html``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self._lock: int | None = None

    def hold(self) -> bool:
        """Take this directory for this process, so that a second one training into it (``--resume`` of
        a run still going, or the same ``--run-dir``) is refused instead of interleaving its metrics
        and checkpoints with this one's; :class:`RunDirInUse` names the holder's pid. Whether it was
        taken now (``False``: this object holds it already). An advisory ``flock`` on ``<run>/.lock``,
        which the system drops when the process ends, however it ends."""
        if self._lock is not None:
            return False
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirInUse(f"{self.path} is in use by another dagrl process (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock = fd
        return True

    def release(self) -> None:
        """Give up what :meth:`hold` took."""
        if self._lock is not None:
            os.close(self._lock)  # closing the only descriptor drops the flock
            self._lock = None

    @classmethod
    def create(cls, root: str | Path, name: str) -> RunDir:
        run = cls.new_path(root, name)
        run.path.mkdir(parents=True)
        return run

    @classmethod
    def new_path(cls, root: str | Path, name: str) -> RunDir:
        """A fresh ``<root>/<name>-<timestamp>`` not created yet."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(root) / f"{name}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = Path(root) / f"{name}-{stamp}-{n}"
        return cls(path)

    def write_json(self, name: str, data: Any) -> None:
        """Replace ``<run>/<name>`` atomically (status files read by ``dagrl status``)."""
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2, default=str))
        tmp.replace(self.path / name)

    def append_event(self, event: dict[str, Any]) -> None:
        """One line of ``events.jsonl``: restarts and rollbacks, with their reasons."""
        with open(self.path / "events.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), **event}, default=str) + "\n")

    def read_events(self) -> list[dict[str, Any]]:
        """Every event of ``events.jsonl``; a last line torn by a crash mid-write is left out."""
        path = self.path / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        events = []
        for i, line in enumerate(lines):
            try:
                events.append(json.loads(line))
            except ValueError:
                if i < len(lines) - 1:
                    raise MetricsError(f"{path}: line {i + 1}: not a JSON event ({line[:60]!r})") from None
        return events

    def read_json(self, name: str) -> Any:
        path = self.path / name
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def write_config(self, data: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(data, sort_keys=False))

    def log(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(clean) + "\n")

    def truncate_metrics(self, iteration: int) -> int:
        """Drop the rows after ``iteration`` (a rollback or a resume redoes them), and a last line torn by a
        crash mid-write (with one warning); how many rows were dropped.

        Reads the file backwards only as far as the rows it drops, and cuts it there in one ``ftruncate``:
        a day of metrics (~1 GB at 15 iterations/s) is neither read nor rewritten, and a crash during the
        cut leaves the file either as it was or cut, never with repeated iterations or env steps going back.
        """
        cut, dropped = self.metrics_cut(iteration)
        if cut is not None:
            os.truncate(self.metrics_path, cut)
        return dropped

    def metrics_cut(self, iteration: int, warn: bool = True) -> tuple[int | None, int]:
        """Where :meth:`truncate_metrics` would cut the file (``None``: nowhere) and how many rows it would
        drop; :class:`MetricsError` if a line it reads is damaged (a resume checks this before it writes)."""
        if not self.metrics_path.exists():
            return None, 0
        cut, dropped = None, 0
        for start, line in _lines_backwards(self.metrics_path):
            row = self._row(line, start, last=cut is None, warn=warn)
            if row is not None and row.get("iteration", 0) <= iteration:
                break
            cut, dropped = start, dropped + (row is not None)
        return cut, dropped

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every row of ``metrics.jsonl`` (a torn last line left out, with a warning)."""
        if not self.metrics_path.exists():
            return []
        lines = self.metrics_path.read_bytes().split(b"\n")
        rows, offset = [], 0
        for i, line in enumerate(lines):
            row = self._row(line, offset, last=i >= len(lines) - 2)
            offset += len(line) + 1
            if row is not None:
                rows.append(row)
        return rows

    def last_metrics(self) -> dict[str, Any] | None:
        """The newest row of ``metrics.jsonl`` (read from the end: ``dagrl status`` of a long run), if any."""
        if not self.metrics_path.exists():
            return None
        for start, line in _lines_backwards(self.metrics_path):
            row = self._row(line, start, last=True, warn=False)
            if row is not None:
                return row
        return None

    def _row(self, line: bytes, offset: int, last: bool, warn: bool = True) -> dict[str, Any] | None:
        """One line of ``metrics.jsonl`` as a row; ``None`` for a blank line or, on the ``last`` line, one
        a crash cut short; :class:`MetricsError` for any other line that does not parse."""
        if not line.strip():
            return None
        try:
            row = json.loads(line)
        except ValueError:
            if not last:
                raise MetricsError(f"{self.metrics_path}: byte {offset}: not a JSON row ({line[:60]!r})") from None
            if warn:
                log.warning("%s: last line torn (a crash while it was written): dropped", self.metrics_path)
            return None
        if not isinstance(row, dict):
            raise MetricsError(f"{self.metrics_path}: byte {offset}: not a JSON object ({line[:60]!r})")
        return row

    def checkpoint_path(self, iteration: int) -> Path:
        return self.checkpoints / f"ckpt-{iteration:08d}.pt"

    def list_checkpoints(self) -> list[Path]:
        if not self.checkpoints.exists():
            return []
        found = [p for p in self.checkpoints.iterdir() if CHECKPOINT_RE.search(p.name)]
        return sorted(found, key=lambda p: int(CHECKPOINT_RE.search(p.name).group(1)))

    def write_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.path / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, self.path / "summary.json")

    def plot_later(self) -> None:
        """:meth:`plot` in a detached process (``python -m dagrl.runtime.rundir RUN_DIR``): the file
        appears a second or two after this call returns, and this process need not wait for it."""
        import subprocess
        import sys

        subprocess.Popen(
            [sys.executable, "-m", "dagrl.runtime.rundir", str(self.path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def plot(self) -> Path | None:
        """Write ``curve.html``: episode return and throughput over env steps (standalone bokeh)."""
        rows = [r for r in self.read_metrics() if r.get("charts/episode_return_mean") is not None]
        if not rows:
            return None
        from bokeh.embed import file_html
        from bokeh.layouts import column
        from bokeh.plotting import figure
        from bokeh.resources import INLINE

        steps = [r["env_steps"] for r in rows]
        ret = figure(title=f"{self.path.name}: mean episode return", x_axis_label="env steps", height=320, width=760)
        ret.line(steps, [r["charts/episode_return_mean"] for r in rows], line_width=2)
        hz = figure(
            title="throughput", x_axis_label="env steps", y_axis_label="Hz", height=240, width=760, x_range=ret.x_range
        )
        sps = [r.get("perf/env_steps_per_s") or 0 for r in rows]
        hz.line(steps, sps, legend_label="env steps per second", color="navy")
        busy = [r.get("perf/update_hz") or 0 for r in rows]
        hz.line(steps, busy, legend_label="frames per second of update time", color="firebrick")
        out, tmp = self.path / "curve.html", self.path / ".curve.html.tmp"
        try:
            tmp.write_text(file_html(column(ret, hz), INLINE, title=self.path.name))
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out


if __name__ == "__main__":  # the detached writer of RunDir.plot_later
    import sys

    RunDir(sys.argv[1]).plot()
