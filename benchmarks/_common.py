"""Shared pieces of the benchmarks: machine description, tables, the final JSON line."""

from __future__ import annotations

import collections
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PACKAGES = (
    "dask",
    "distributed",
    "gymnasium",
    "numpy",
    "zarr",
    "numcodecs",
    "stable-baselines3",
    "mujoco",
    "ale-py",
    "envpool",
)
"""Recorded with every result: a run's env steps to a target moved once between two runs and nothing
said which package had changed."""


LOAD_AT_START = os.getloadavg()[0]
"""The 1-minute load average when the benchmark started (other work on a shared machine)."""


def machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_avg_at_start": LOAD_AT_START,
        "packages": {name: installed(name) for name in PACKAGES},
    }


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


RESULTS = Path(os.environ.get("DAGRL_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
"""Where each benchmark keeps its latest result, as ``<name>.json`` with the command that made it
(``DAGRL_BENCH_RESULTS``: elsewhere, as the tests do)."""


def emit(name: str, result: dict[str, Any]) -> None:
    """The last line of every benchmark: one JSON object, printed and kept in :data:`RESULTS`."""
    line = json.dumps({"benchmark": name, "machine": machine(), "command": " ".join(sys.argv), **result})
    print(line)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(line + "\n")


def sb3_to_target(model, budget: int, target: float, window: int) -> dict[str, Any]:
    """Train a Stable-Baselines3 model until the mean of its last ``window`` episode returns reaches
    ``target`` (or ``budget`` env steps); wall time from the start of ``learn()``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAtTarget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: collections.deque[float] = collections.deque(maxlen=window)

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
            return not self.solved()

        def solved(self) -> bool:
            return len(self.returns) == window and statistics.mean(self.returns) >= target

    cb = StopAtTarget()
    t0 = time.perf_counter()
    model.learn(total_timesteps=budget, callback=cb)
    return {"wall_s": time.perf_counter() - t0, "env_steps": model.num_timesteps, "solved": cb.solved()}


def sampler_in_env(run_dir: str) -> float | None:
    """The samplers' share of their fragment time spent inside ``env.step`` over a whole run (warm-up
    included), from the ``actors.json`` the run writes at its end."""
    from pathlib import Path

    from dagrl.runtime.report import in_env, role_time

    return in_env(role_time(json.loads((Path(run_dir) / "actors.json").read_text()), "sampler"))


def role_busy(run_dir: str, role: str, wall_s: float) -> float | None:
    """How much of a run's ``wall_s`` the instances of ``role`` were busy in their fragments (their mean),
    from the run's ``actors.json``; ``None`` without that role."""
    from pathlib import Path

    from dagrl.runtime.report import busy_share, role_time

    summed = role_time(json.loads((Path(run_dir) / "actors.json").read_text()), role)
    return busy_share(summed, wall_s) if summed["instances"] else None


class MachineBusy:
    """The share of all cores' time spent busy (not idle, not waiting on I/O) between :meth:`start` and
    :meth:`share`, from ``/proc/stat`` (Linux; ``None`` elsewhere): everything on the machine, not only
    the run's processes."""

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        return sum(ticks), ticks[3] + ticks[4]  # all, idle + iowait

    def start(self) -> MachineBusy:
        self.begin = self._read()
        return self

    def share(self) -> float | None:
        end = self._read()
        if self.begin is None or end is None or end[0] == self.begin[0]:
            return None
        return 1.0 - (end[1] - self.begin[1]) / (end[0] - self.begin[0])
