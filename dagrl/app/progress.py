"""A one-line live progress display: redrawn in place on a terminal, a log line every few seconds otherwise;
in a notebook, tqdm's bar (:class:`NotebookProgress`), which ``dagrl.train`` shows there by default.

On a terminal the line fits its width (80 columns hold all of it), and log records and warnings of
this process (Dask's among them) are printed above the line instead of into it.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
import warnings
from typing import Any, TextIO

LOGGERS = ("distributed", "dask", "dagrl")
"""Loggers whose records go above the line while it is drawn."""


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def format_row(row: dict) -> str:
    """One metrics row as at most 79 characters: ``sps`` is env steps per second of wall time, the row's
    ``env_steps`` over its ``time_s`` (what the run makes; the per-busy-second rates of sampling and of
    the update are in ``metrics.jsonl`` and on the RL page).

    >>> format_row({"iteration": 12, "env_steps": 25088, "episodes": 310, "time_s": 16.2,
    ...             "charts/episode_return_mean": 475.3, "perf/update_hz": 3100.0})
    'it    12 steps  25.1k ep    310 ret   475.3 sps   1.5k    16.2s'
    """
    ret = row.get("charts/episode_return_mean")
    sps = row["env_steps"] / row["time_s"] if row["time_s"] > 0 else 0.0
    return (
        f"it {row['iteration']:>5} steps {_si(row['env_steps']):>6} ep {row['episodes']:>6} "
        f"ret {'-' if ret is None else f'{ret:.1f}':>7} sps {_si(sps):>6} {row['time_s']:7.1f}s"
    )


class _Above(logging.Handler):
    """Writes a logger's records above the progress line, formatted as its own handlers would."""

    def __init__(self, progress: Progress, formatter: logging.Formatter | None):
        super().__init__()
        self.progress = progress
        self.setFormatter(formatter or logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.progress.above(self.format(record))
        except Exception:
            self.handleError(record)


class Progress:
    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self.enabled = enabled
        self.last = 0.0
        self.line = ""
        self.captured = False
        self._saved: list[tuple[logging.Logger, list[logging.Handler]]] = []
        self._showwarning: Any = None

    def update(self, row: dict, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty and not force and now - self.last < self.every_s:
            return
        self.last = now
        line = format_row(row)
        if self.tty:
            if not self.captured:
                self._capture()
            self.line = line[: max(20, shutil.get_terminal_size().columns - 1)]
            self.stream.write("\r" + self.line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def above(self, text: str) -> None:
        """Print ``text`` on its own lines above the progress line, then redraw the line."""
        self.stream.write("\r\x1b[K" + text.rstrip("\n") + "\n" + self.line)
        self.stream.flush()

    def _capture(self) -> None:
        """Send this process's log records and warnings above the line until :meth:`close`."""
        self.captured = True
        for name in LOGGERS:
            logger = logging.getLogger(name)
            streams = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]
            if streams:
                self._saved.append((logger, list(logger.handlers)))
                above = _Above(self, streams[0].formatter)
                above.setLevel(streams[0].level)
                logger.handlers[:] = [h for h in logger.handlers if h not in streams] + [above]
        self._showwarning = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
            self.above(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = show

    def close(self) -> None:
        self.captured = False
        for logger, handlers in self._saved:
            logger.handlers[:] = handlers
        self._saved = []
        if self._showwarning is not None:
            warnings.showwarning, self._showwarning = self._showwarning, None
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def in_notebook() -> bool:
    """This process is a Jupyter kernel (where ``dagrl.train`` shows a progress bar unless told not to)."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


class NotebookProgress:
    """The run's progress as tqdm's notebook bar (:mod:`tqdm.auto`: a widget where ipywidgets is installed,
    text otherwise): env steps against ``stop.env_steps`` where the graph has one, the rest of
    :func:`format_row` beside it. The same calls as :class:`Progress`."""

    def __init__(self, name: str, total: int | None):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=name, unit="step", unit_scale=True, dynamic_ncols=True)

    def update(self, row: dict, force: bool = False) -> None:
        self.bar.update(row["env_steps"] - self.bar.n)
        ret = row.get("charts/episode_return_mean")
        self.bar.set_postfix_str(
            f"it {row['iteration']} ep {row['episodes']} ret {'-' if ret is None else f'{ret:.1f}'}"
        )

    def above(self, text: str) -> None:
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


def progress_display(enabled: bool | None, name: str, total: int | None) -> Progress | NotebookProgress:
    """What ``dagrl.train(progress=...)`` shows: ``None`` is a bar in a notebook and nothing elsewhere."""
    notebook = in_notebook()
    if enabled is None:
        enabled = notebook
    if enabled and notebook:
        return NotebookProgress(name, total)
    return Progress(enabled=enabled)
