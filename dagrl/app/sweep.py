"""``dagrl sweep``: hyperparameter settings x seeds, each trial a whole run in one Dask task.

RL results need several seeds, and tuning needs several settings; each such run is independent of
the others, so the cluster runs them side by side. Every trial is one task (``trial-<name>`` in the
dashboard's Task Stream) that trains the graph in one process on a worker (policy ``single``: the
graph's own distribution policy is not used, the cluster's cores go to trials instead), writing a run
directory of its own. The driver gathers only each trial's summary and writes a table per setting:
mean, spread, interquartile mean and its bootstrap interval of the final mean return
(:mod:`dagrl.app.aggregate`), env steps, wall time and how the trials stopped.

Every trial's graph is validated before a cluster starts. The workers write into the sweep's
directory, so a cluster reached by ``--scheduler`` or started on SLURM (one worker job per trial, or
``--workers`` jobs, of the cluster file's first pool or ``--pool``) must share that filesystem with
the driver, as the nodes of a SLURM cluster share their home or scratch directories.

Design notes
------------

``dagrl sweep`` is the one place where a Dask task is a whole training run rather than a fragment call: the
grid's settings times the seeds, every trial validated as a graph before a cluster starts, then one
``client.submit(run_trial, ...)`` per trial (key ``trial-<setting>_seed-<s>-<tag>``, ``pure=False``), which loads
the graph on the worker and trains it under ``single`` in that worker's process, writing its own run directory.
Dask places the trials (one per worker thread; the local cluster gets one single-threaded worker per core, at
most one per trial) and the driver gathers only summaries, as ``as_completed`` hands them back, into
``trials.jsonl``, then ``results.md``/``results.json``. Trials run under ``single`` because independent runs use a
cluster best side by side: a distributed policy per trial would need a cluster per trial, and on
CartPole-sized tasks ``single`` is the fastest setting per core anyway (BENCHMARKS.md). A failing trial is the
trial's result, not the sweep's. A trial's task resumes from its run directory's newest checkpoint when there
is one: Dask reruns the task of a worker that died (up to ``distributed.scheduler.allowed-failures`` times), and
a sweep started again over its directory reads back the trials with a final ``summary.json`` and resubmits only
the rest. Each trial's metrics rows go to the RL page from its worker (``dashboard.feed.TrialFeed``:
``Worker.log_event`` only queues the message, so the training loop does not wait); the page draws every run's
mean return. On SLURM a sweep's workers are generic, not a graph's roles: ``slurm.jobs_cluster`` (which
``slurm.cluster`` also runs, with one job per role replica) submits one job per trial (or ``--workers`` jobs) of
one pool, each checked with ``sbatch --test-only`` first and resubmitted if it leaves, on a shared filesystem.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import math
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dagrl.app.aggregate import bootstrap_interval, iqm
from dagrl.core.schema import ConfigError

log = logging.getLogger("dagrl")

__all__ = ["Trial", "parse_grid", "plan", "run_sweep", "run_trial", "table"]


@dataclass(frozen=True)
class Trial:
    """One run of a sweep: a setting of the grid's keys and a seed."""

    setting: tuple[tuple[str, str], ...]
    seed: int
    overrides: tuple[str, ...] = field(compare=False)

    @property
    def label(self) -> str:
        """The setting as ``key=value`` pairs (the last part of each dotted key)."""
        return ",".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in self.setting) or "as written"

    @property
    def dirname(self) -> str:
        parts = [f"{key.rsplit('.', 1)[-1]}-{value}" for key, value in self.setting] + [f"seed-{self.seed}"]
        return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts))


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """``KEY=V1,V2,...`` items as (key, values), refusing what cannot be a grid."""
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        key, eq, values = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError("--grid", item, "expected KEY=VALUE1,VALUE2,... e.g. hyperparameters.lr=1e-3,3e-4")
        choices = [v.strip() for v in values.split(",")]
        if not all(choices):
            raise ConfigError("--grid", key, f"empty value in {values!r}")
        if key == "seed":
            raise ConfigError("--grid", key, "give seeds with --seeds 1 2 3")
        if key == "policy" or key.startswith("policy."):
            raise ConfigError("--grid", key, "every trial runs in one process (policy single); sweep hyperparameters")
        if any(key == k for k, _ in grid):
            raise ConfigError("--grid", key, "given twice")
        grid.append((key, choices))
    return grid


def plan(graph_path: str | Path, sets: list[str], grid_items: list[str], seeds: list[int]) -> tuple[Any, list[Trial]]:
    """The trials of a sweep, each graph loaded and validated; the graph as written (with ``sets``)."""
    from dagrl.app.graphs import load_graph

    grid = parse_grid(grid_items)
    if not seeds:
        raise ConfigError("--seeds", "", "give at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds", "", f"seeds repeat: {seeds}")
    base = load_graph(graph_path, sets)
    trials = []
    for values in itertools.product(*(choices for _, choices in grid)):
        setting = tuple((key, value) for (key, _), value in zip(grid, values, strict=True))
        for seed in seeds:
            overrides = (*sets, *(f"{k}={v}" for k, v in setting), f"seed={seed}", "policy=single")
            if base.spec.wandb.project is not None and base.spec.wandb.group is None:  # W&B shows seeds together
                overrides = (*overrides, f"wandb.group={base.name}:{Trial(setting, seed, ()).label}")
            try:
                graph = load_graph(graph_path, list(overrides))
            except ConfigError as err:
                where = ", ".join(f"{k}={v}" for k, v in setting)
                raise ConfigError(err.where, err.key, f"{err.problem} (in the trial {where}, seed {seed})") from None
            named = graph.spec.env.api == "gymnasium" and graph.env_id != graph.spec.env.id
            if named:  # registered by a module this process imported: name it
                overrides = (*overrides, f"env.id={graph.env_id}")
            trials.append(Trial(setting, seed, overrides))
    return base, trials


def run_trial(graph_path: str, overrides: list[str], run_dir: str) -> dict[str, Any]:
    """Train one trial in this process (a Dask task on a worker): its run summary.

    A trial whose run directory holds a checkpoint goes on from it: Dask runs a task again elsewhere
    when the worker running it dies, and a sweep started again over the same directory resumes the
    trials it had not finished.
    """
    import shutil

    from dagrl.app.graphs import load_graph
    from dagrl.app.training import train
    from dagrl.dashboard.feed import TrialFeed
    from dagrl.runtime.checkpoint import CheckpointError, load_checkpoint
    from dagrl.runtime.rundir import RunDir

    graph = load_graph(graph_path, overrides)
    rundir = RunDir(run_dir)
    resume = None
    if rundir.path.exists():
        try:
            resume = load_checkpoint(rundir.path)
        except (FileNotFoundError, CheckpointError):
            shutil.rmtree(rundir.path)  # started, never checkpointed: start over
    if resume is None:
        rundir.path.mkdir(parents=True)
        rundir.write_config(graph.to_dict())
    else:
        log.warning("trial %s: resuming at iteration %d", rundir.path.name, resume["counters"]["iteration"])
    feed = TrialFeed.here(rundir.path.name)  # the RL page plots every trial's curve
    try:
        return train(graph, rundir=rundir, resume=resume, listeners=[feed.on_row] if feed else ())
    finally:
        if feed is not None:
            feed.flush()


def finished(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a trial that ran to its end (not one interrupted), if ``run_dir`` holds one."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("stop_reason") != "interrupted" else None


def table(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting, in the order of the records: trials, failures; of the final mean returns,
    the mean, standard deviation, interquartile mean and its 95 % bootstrap interval over the trials
    (:mod:`dagrl.app.aggregate`); the IQM and interval of the final greedy evaluations (:func:`final_eval`;
    ``None`` where the graph does not evaluate); mean env steps and wall seconds, stop reasons."""
    rows: dict[str, dict[str, Any]] = {}
    for rec in records:
        row = rows.setdefault(rec["setting"], {"setting": rec["setting"], "trials": 0, "failed": 0, "_done": []})
        row["trials"] += 1
        if rec.get("error"):
            row["failed"] += 1
        else:
            row["_done"].append(rec["summary"])
    out = []
    for row in rows.values():
        done = row.pop("_done")
        returns = [s["mean_return"] for s in done if s.get("mean_return") is not None]
        row["mean_return"] = float(np.mean(returns)) if returns else None
        row["std_return"] = float(np.std(returns)) if returns else None
        row["iqm_return"], row["ci_return"] = robust(returns)
        row["eval_iqm"], row["eval_ci"] = robust([r for r in map(final_eval, done) if r is not None])
        row["env_steps"] = float(np.mean([s["env_steps"] for s in done])) if done else None
        row["elapsed_s"] = float(np.mean([s["elapsed_s"] for s in done])) if done else None
        row["stops"] = dict(sorted(collections.Counter(s["stop_reason"] for s in done).items()))
        out.append(row)
    return out


def final_eval(summary: dict[str, Any]) -> float | None:
    """A trial's newest greedy-evaluation return: the one still running at its stop (waited for), else
    the newest that finished before it; ``None`` where the graph does not evaluate."""
    waited = summary.get("eval") or {}
    value = waited.get("eval/return_mean", summary.get("eval_return"))
    return None if value is None or math.isnan(value) else float(value)


def robust(values: list[float]) -> tuple[float | None, list[float] | None]:
    """The interquartile mean of the trials' values and its 95 % bootstrap interval (``None``: no value;
    one value has no interval)."""
    if not values:
        return None, None
    interval = bootstrap_interval(values)
    return iqm(values), list(interval) if interval is not None else None


def markdown(rows: list[dict[str, Any]]) -> str:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    def interval(ci: list[float] | None) -> str:
        return f"{ci[0]:.1f} to {ci[1]:.1f}" if ci else "-"

    evaluated = any(r["eval_iqm"] is not None for r in rows)  # eval columns only where the graph evaluates
    head = ["setting", "trials", "failed", "mean return", "std", "IQM", "95 % CI of IQM"]
    head += ["eval IQM", "95 % CI of eval IQM"] if evaluated else []
    head += ["env steps", "wall s", "stopped on"]
    lines = ["| " + " | ".join(head) + " |", "| --- | " + "---: | " * (len(head) - 2) + "--- |"]
    for r in rows:
        cells = [r["setting"], str(r["trials"]), str(r["failed"]), num(r["mean_return"], ".1f")]
        cells += [num(r["std_return"], ".1f"), num(r["iqm_return"], ".1f"), interval(r["ci_return"])]
        cells += [num(r["eval_iqm"], ".1f"), interval(r["eval_ci"])] if evaluated else []
        stops = ", ".join(f"{k} {v}" for k, v in r["stops"].items()) or "-"
        cells += [num(r["env_steps"], ",.0f"), num(r["elapsed_s"], ".1f"), stops]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_sweep(
    client: Any,
    graph_path: str | Path,
    trials: list[Trial],
    out: Path,
    progress: bool = True,
    resources: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Run every trial as a task of ``client``'s cluster; write ``trials.jsonl`` as they finish and
    ``results.md``/``results.json`` at the end; return the table (:func:`table`). Over the directory
    of an earlier sweep, trials that ended are read back and the others resumed (:func:`run_trial`).
    ``resources``: what each trial's task asks of a worker (one trial per SLURM job, whatever its cores)."""
    from distributed import as_completed
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    path = str(Path(graph_path).resolve())
    tag = uuid.uuid4().hex[:8]
    records: dict[Trial, dict[str, Any]] = {}
    for t in trials:  # a sweep started again over its directory: trials that ended are read back
        summary = finished(out / t.dirname)
        if summary is not None:
            records[t] = {"setting": t.label, "seed": t.seed, "run_dir": str(out / t.dirname), "summary": summary}
    futures = {}
    for t in trials:
        if t in records:
            continue
        run_dir = str((out / t.dirname).resolve())
        key = f"trial-{t.dirname}-{tag}"  # the Task Stream shows each trial by its setting and seed
        future = client.submit(run_trial, path, list(t.overrides), run_dir, key=key, pure=False, resources=resources)
        futures[future] = t
    t0 = time.monotonic()
    with (
        (out / "trials.jsonl").open("w") as log_file,
        tqdm(total=len(trials), initial=len(records), desc="dagrl sweep", unit="trial", disable=not progress) as bar,
    ):
        for rec in records.values():
            log_file.write(json.dumps(rec) + "\n")
        for future in as_completed(futures, loop=client.loop):  # not the default client's
            trial = futures[future]
            rec: dict[str, Any] = {"setting": trial.label, "seed": trial.seed, "run_dir": str(out / trial.dirname)}
            try:
                rec["summary"] = future.result()
            except Exception as err:  # one trial's failure is the trial's, not the sweep's
                rec["error"] = f"{type(err).__name__}: {err}"
                log.warning("trial %s seed %d failed: %s", trial.label, trial.seed, rec["error"])
            records[trial] = rec
            log_file.write(json.dumps(rec) + "\n")
            log_file.flush()
            bar.update(1)
    rows = table([records[t] for t in trials])
    (out / "results.json").write_text(json.dumps({"rows": rows, "wall_s": time.monotonic() - t0}, indent=1))
    (out / "results.md").write_text(markdown(rows))
    return rows


def local_workers(requested: int | str, trials: int) -> int:
    """Worker processes for a local sweep: as asked, else one per core, at most one per trial."""
    if requested != "auto":
        return int(requested)
    return max(1, min(trials, os.cpu_count() or 1))


@contextlib.contextmanager
def sweep_client(
    spec: Any, trials: int, workers: int | None = None, out: Path | None = None, pool: str | None = None
) -> Iterator[Any]:
    """A client for a sweep: dagrl's LocalCluster (``workers``, else :func:`local_workers`), the
    running scheduler of ``spec``, or ``workers`` SLURM jobs (default one per trial) of ``pool``,
    their scripts, logs and certificates under ``out``."""
    from distributed import Client

    from dagrl.clusters.connect import CONNECT_TIMEOUT_S
    from dagrl.clusters.local import local_cluster
    from dagrl.clusters.spec import LocalClusterSpec, SchedulerSpec, SlurmSpec

    if isinstance(spec, SchedulerSpec):
        with Client(spec.address, timeout=CONNECT_TIMEOUT_S) as client:
            yield client
        return
    if isinstance(spec, SlurmSpec):
        from dagrl.clusters import slurm

        assert out is not None
        assert pool is not None
        jobs = [(f"trial-{i}", pool) for i in range(workers or trials)]
        with slurm.jobs_cluster(spec, jobs, out) as client:
            yield client
        return
    assert isinstance(spec, LocalClusterSpec)
    n = workers or local_workers(spec.workers, trials)
    # one thread per worker: trials side by side in one process would share torch's global state
    cluster = local_cluster(replace(spec, workers=n, threads_per_worker=1), n)
    try:
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()
