"""The RL page of the Dask dashboard (``/individual-dagrl``) and the feed that fills it.

The driver publishes the iterations' metrics rows (topic ``dagrl-metrics``: each row with the
returns of the episodes that finished, the rows of a quarter second in one event) and, every
``interval`` seconds, the role actors' heartbeats (topic ``dagrl-actors``), through Dask's event
topics (``Client.log_event``, from the feed's own thread, never the training loop's). The page is a
bokeh document served by the scheduler's dashboard; it reads the scheduler's event log and streams
what is new into its plots. The scheduler keeps the last 1000 events per topic, so a page opened
late shows the last four minutes of rows, or the last 1000 iterations if they took longer.

Registering the page uses Dask's dashboard internals (``distributed.dashboard.scheduler.applications``),
so the distributed version is pinned in ``pyproject.toml`` and the page is tested in a real browser.
It must be registered before the scheduler starts: dagrl's own clusters name this module as their
scheduler's preload (a cluster file's ``scheduler_preload``), and for a scheduler started by hand:
``dask scheduler --preload dagrl.dashboard``.
"""

from __future__ import annotations

from typing import Any

from dagrl.dashboard.topics import ACTORS, METRICS, PAGE

__all__ = ["ACTORS", "METRICS", "PAGE", "register"]


def register() -> None:
    """Add the RL page to the dashboard applications of schedulers started after this call."""
    from distributed.dashboard.scheduler import applications

    from dagrl.dashboard.page import rl_doc

    applications.setdefault(PAGE, rl_doc)


def dask_setup(scheduler: Any) -> None:
    """``dask scheduler --preload dagrl.dashboard``: the page was registered when this module was imported."""


# A scheduler preload is imported before the scheduler's dashboard starts, but its ``dask_setup``
# runs after: registering on import is what makes ``--preload dagrl.dashboard`` work.
register()
