"""Metrics rows to Weights & Biases (``wandb: {project: NAME}`` in a graph).

Each row of ``metrics.jsonl`` is logged once, its numbers at W&B step = the row's ``env_steps`` (the
x axis CleanRL and Stable-Baselines3 use); the graph as run (``config.yaml``) is the W&B run's config,
the run directory's name its name, and the run's summary (``summary.json``: how it stopped, its final
mean return) joins the W&B run's summary as ``dagrl/<key>``. W&B's files go under ``<run>/wandb/``;
``metrics.jsonl`` stays the record.

A W&B run's history cannot be rewritten, and its steps only go forward. So the W&B run id and the
last env steps logged are kept in ``<run>/wandb.json``: ``dagrl run --resume`` continues the same W&B
run, and rows redone after a learner rollback or a resume are sent once the run passes the env steps
already logged (``metrics.jsonl`` holds the redone rows themselves).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import uuid
from pathlib import Path
from typing import Any

from dagrl.core.graph import WandbSpec
from dagrl.core.schema import ConfigError

log = logging.getLogger("dagrl")

__all__ = ["WandbLog", "WandbSpec", "available"]

STATE = "wandb.json"
"""The W&B run id and the last env steps logged, in the run directory."""


def available() -> bool:
    """Whether the ``wandb`` package is installed."""
    return importlib.util.find_spec("wandb") is not None


class WandbLog:
    """A metrics-row listener sending rows to the W&B run of ``run_dir`` (a new one, or the one a
    resumed run started); a W&B run that cannot start (no API key) is a :class:`ConfigError` of the
    graph ``where``."""

    def __init__(self, spec: WandbSpec, run_dir: str | Path, config: dict[str, Any], where: str = "wandb"):
        import wandb

        self.run_dir = Path(run_dir)
        state = self._read_state()
        self.run_id = state.get("id") or uuid.uuid4().hex[:8]
        self.last = int(state.get("last_env_steps", -1))
        try:
            self.run = wandb.init(
                project=spec.project, entity=spec.entity, group=spec.group, tags=spec.tags or None,
                mode=spec.mode, name=self.run_dir.name, id=self.run_id, resume="allow", dir=str(self.run_dir),
                config=config,
            )  # fmt: skip
        except wandb.errors.UsageError as err:  # no API key, mostly: say what to do, in the graph's terms
            raise ConfigError(
                where, "wandb.project", f"{spec.project}: W&B did not start a run: {err} (or wandb.mode: offline)"
            ) from None
        self._write_state()
        log.info("W&B: run %s in project %s (%s)", self.run_id, spec.project, self.run.settings.mode)

    def _read_state(self) -> dict[str, Any]:
        path = self.run_dir / STATE
        return json.loads(path.read_text()) if path.exists() else {}

    def _write_state(self) -> None:
        (self.run_dir / STATE).write_text(json.dumps({"id": self.run_id, "last_env_steps": self.last}) + "\n")

    def on_row(self, row: dict[str, Any], _result: Any = None) -> None:
        step = int(row["env_steps"])
        if step <= self.last:  # redone after a rollback or a resume: W&B already has this step
            return
        values = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "env_steps"}
        self.run.log(values, step=step)
        self.last = step
        self._write_state()

    def on_end(self, summary: dict[str, Any]) -> None:
        """The run's summary (how it stopped, its final mean return, ...) as the W&B run's summary."""
        keep = {k: v for k, v in summary.items() if k != "run_dir" and isinstance(v, str | int | float)}
        keep |= {f"stopped_at/{k}": v for k, v in (summary.get("stopped_at") or {}).items() if v is not None}
        self.run.summary.update({f"dagrl/{k}": v for k, v in keep.items()})

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)
