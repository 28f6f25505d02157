"""Training from a notebook: the same driver as ``dagrl run``, with a learning curve that redraws in place.

>>> from dagrl.app.graphs import load_graph
>>> from dagrl.app.notebook import train
>>> summary, run = train(load_graph("graphs/ppo-cartpole-sync.yaml"), client)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dagrl.runtime.rundir import RunDir


class LiveCurve:
    """A Trainer listener drawing mean return over env steps, redrawn at most every ``every_s`` seconds."""

    def __init__(self, title: str, every_s: float = 1.0):
        import matplotlib.pyplot as plt
        from IPython.display import display

        self.fig, self.ax = plt.subplots(figsize=(7, 3.2))
        plt.close(self.fig)  # shown through the display handle only
        self.ax.set(title=title, xlabel="env steps", ylabel="episode return")
        self.steps: list[int] = []
        self.mean: list[float] = []
        self.handle = display(self.fig, display_id=True)
        self.every_s, self.last = every_s, 0.0

    def __call__(self, row: dict[str, Any], res: Any) -> None:
        if row.get("charts/episode_return_mean") is not None:
            self.steps.append(row["env_steps"])
            self.mean.append(row["charts/episode_return_mean"])
        if time.monotonic() - self.last >= self.every_s:
            self.draw()

    def draw(self) -> None:
        for line in list(self.ax.lines):
            line.remove()
        self.ax.plot(self.steps, self.mean, color="#d62728")
        self.ax.relim()
        self.ax.autoscale_view()
        self.handle.update(self.fig)
        self.last = time.monotonic()


def train(graph: Any, client: Any = None, live: bool = True, runs_dir: str | Path | None = None) -> tuple[dict, Path]:
    """Train ``graph`` to its stop condition (on ``client``'s cluster unless the policy is ``single``),
    through :func:`dagrl.train`, drawing the learning curve live in the notebook.

    Returns the summary and the run directory. The RL dashboard page is fed as with ``dagrl run``.
    """
    from dagrl.app.training import train as run

    rundir = RunDir.create(runs_dir or graph.spec.runs_dir, graph.name)
    rundir.write_config(graph.to_dict())
    curve = LiveCurve(f"{graph.name}: {graph.spec.policy}") if live else None
    summary = run(graph, client, rundir=rundir, listeners=[curve] if curve is not None else [])
    if curve is not None:
        curve.draw()
    return summary, rundir.path
