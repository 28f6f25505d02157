"""A learning curve that redraws in place in a notebook: what ``dagrl.train(..., live=True)`` shows.

>>> import dagrl
>>> summary = dagrl.train("ppo-cartpole-sync", client, live=True)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any


class LiveCurve:
    """A Trainer listener drawing mean return over env steps, redrawn at most every ``every_s`` seconds."""

    def __init__(self, title: str, every_s: float = 1.0):
        try:
            import matplotlib.pyplot as plt
            from IPython.display import display
        except ImportError as err:
            raise ImportError(f"dagrl.train(live=True) draws with matplotlib in IPython ({err}): "
                              "pip install 'dagrl[notebook]'") from None  # fmt: skip

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
