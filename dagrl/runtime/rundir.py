"""A run directory: resolved config, per-iteration metrics, checkpoints and the learning curve."""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import yaml

CHECKPOINT_RE = re.compile(r"ckpt-(\d+)\.pt$")


class RunDirInUse(RuntimeError):
    """Another process trains into this run directory (:meth:`RunDir.hold`)."""


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
        path = self.path / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

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
        """Drop the rows after ``iteration`` (a rollback or a resume redoes them); how many were dropped.

        Rewritten atomically, so the file never shows repeated iterations or env steps going back.
        """
        if not self.metrics_path.exists():
            return 0
        lines = [line for line in self.metrics_path.read_text().splitlines() if line.strip()]
        keep = [line for line in lines if json.loads(line).get("iteration", 0) <= iteration]
        if len(keep) < len(lines):
            tmp = self.path / ".metrics.jsonl.tmp"
            tmp.write_text("".join(line + "\n" for line in keep))
            os.replace(tmp, self.metrics_path)
        return len(lines) - len(keep)

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

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
        hz.line(steps, [r.get("perf/sample_hz") or 0 for r in rows], legend_label="sample Hz", color="navy")
        hz.line(steps, [r.get("perf/update_hz") or 0 for r in rows], legend_label="update Hz", color="firebrick")
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
