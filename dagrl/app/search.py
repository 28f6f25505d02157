"""``dagrl sweep --search random|optuna``: hyperparameters drawn from a space, each trial a run on the cluster.

A grid (:mod:`dagrl.app.sweep`) tries every setting; a search draws ``--trials`` settings from a space
given by ``--space`` items (validated at both ends of every range before a cluster starts):

* ``KEY=LOW:HIGH``: uniform between the two (integers when both are), ``KEY=LOW:HIGH:log`` on a log scale;
* ``KEY=A,B,C``: one of the values.

Both searches are Optuna's (the ``search`` extra): ``random`` its ``RandomSampler``, ``optuna`` its TPE
sampler, which draws each setting from the trials that ended before it, and a ``MedianPruner``: a trial
whose mean return at a milestone of env steps (every ``--report-every``) is below the median of the
earlier trials' at that milestone stops there, once five have ended. The trials run as
:func:`run_trial` tasks, ``--workers`` at a time, each a run of its own in one process (policy
``single``) with the sweep's first seed; they report to the study through Optuna's journal file in the
sweep's directory, which the workers must share (as a sweep's trials write their run directories there).
A search started again over its directory goes on with the study it holds.

The objective is the final greedy evaluation's return where the graph evaluates, else the final mean
training return. ``results.md`` lists the trials best first; ``results.html`` plots each trial's return
and the best so far (bokeh).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagrl.core.schema import ConfigError

log = logging.getLogger("dagrl")

__all__ = ["Space", "parse_space", "run_search"]

EXAMPLE = "hyperparameters.lr=1e-4:1e-2:log"
STUDY = "dagrl"
"""The study's name in the journal file."""


@dataclass(frozen=True)
class Space:
    """One ``--space`` item: a key and its range (``low``, ``high``, ``log``, ``integer``) or choices."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple[str, ...] = ()

    def distribution(self) -> Any:
        import optuna

        if self.choices:
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        if self.integer:
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log)
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)

    def ends(self) -> list[str]:
        """The values checked against the graph before a cluster starts."""
        if self.choices:
            return list(self.choices)
        return [str(int(v) if self.integer else v) for v in (self.low, self.high)]


def parse_space(items: list[str]) -> list[Space]:
    """``--space`` items as :class:`Space`, refusing what cannot be one (naming the item)."""
    spaces: list[Space] = []
    for item in items:
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value:
            raise ConfigError(
                "--space", item, "expected KEY=LOW:HIGH[:log] or KEY=A,B,C, e.g. hyperparameters.lr=1e-4:1e-2:log"
            )
        if key == "seed" or key == "policy" or key.startswith("policy."):
            raise ConfigError("--space", key, "every trial runs in one process (policy single) with the first seed")
        if any(s.key == key for s in spaces):
            raise ConfigError("--space", key, "given twice")
        if ":" not in value:
            choices = tuple(v.strip() for v in value.split(","))
            if len(choices) < 2 or not all(choices):
                raise ConfigError("--space", key, f"{value!r}: give two or more values, A,B,C, or a range LOW:HIGH")
            spaces.append(Space(key, choices=choices))
            continue
        parts = value.split(":")
        scale = parts.pop() if len(parts) == 3 else None
        if len(parts) != 2 or scale not in (None, "log"):
            raise ConfigError("--space", key, f"{value!r}: a range is LOW:HIGH or LOW:HIGH:log")
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise ConfigError("--space", key, f"{value!r}: LOW and HIGH must be numbers") from None
        if not low < high:
            raise ConfigError("--space", key, f"{value!r}: LOW must be below HIGH")
        if scale == "log" and low <= 0:
            raise ConfigError("--space", key, f"{value!r}: a log range must be above 0")
        integer = all(p.strip().lstrip("-").isdigit() for p in parts)
        spaces.append(Space(key, low, high, log=scale == "log", integer=integer))
    if not spaces:
        raise ConfigError("--space", "", "a search needs at least one --space KEY=LOW:HIGH or KEY=A,B,C")
    return spaces


def check(graph_path: str | Path, sets: list[str], spaces: list[Space]) -> Any:
    """The graph as written (with ``sets``), after loading it with each end of every range."""
    from dagrl.app.graphs import load_graph

    base = load_graph(graph_path, [*sets, "policy=single"])
    for space in spaces:
        for value in space.ends():
            try:
                load_graph(graph_path, [*sets, f"{space.key}={value}", "policy=single"])
            except ConfigError as err:
                raise ConfigError(err.where, err.key, f"{err.problem} (from --space {space.key}={value})") from None
    return base


def report_every(graph: Any, every: int | None) -> int:
    """The env steps between a trial's reports: as given, else a tenth of ``stop.env_steps`` (10,000 without)."""
    if every is not None:
        if every < 1:
            raise ConfigError("--report-every", "", f"must be >= 1, got {every}")
        return every
    budget = graph.spec.stop.env_steps
    return max(1, budget // 10) if budget else 10_000


def study(out: Path, sampler: str, seed: int, pruning: bool) -> Any:
    """The sweep's study in ``out/study.journal`` (loaded where an earlier search left one). The sampler is
    seeded with ``seed`` plus the trials already there, so a search started again draws new settings."""
    import optuna

    found = optuna.create_study(
        study_name=STUDY,
        storage=_storage(str(out / "study.journal")),
        pruner=_pruner(pruning),
        direction="maximize",
        load_if_exists=True,
    )
    seed += len(found.trials)
    found.sampler = (
        optuna.samplers.RandomSampler(seed) if sampler == "random" else optuna.samplers.TPESampler(seed=seed)
    )
    return found


def _storage(journal: str) -> Any:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(journal))


def _pruner(pruning: bool) -> Any:
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=5) if pruning else optuna.pruners.NopPruner()


class Reporter:
    """A trial's listener: at each milestone of ``every`` env steps its mean return goes to the study,
    which may prune the trial there (raising ``optuna.TrialPruned`` out of the training loop)."""

    def __init__(self, journal: str, number: int, every: int, pruning: bool):
        import optuna

        storage = _storage(journal)
        found = optuna.load_study(study_name=STUDY, storage=storage, pruner=_pruner(pruning))
        trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(STUDY), number)
        self.trial = optuna.trial.Trial(found, trial_id)
        self.every, self.next, self.last, self.env_steps = every, every, None, 0

    def __call__(self, row: dict[str, Any], _: Any) -> None:
        import optuna

        self.env_steps = row["env_steps"]
        value = row.get("charts/episode_return_mean")
        if value is not None and not math.isnan(value):
            self.last = float(value)
        if row["env_steps"] < self.next or self.last is None:
            return
        step = row["env_steps"] // self.every * self.every
        self.next = step + self.every
        self.trial.report(self.last, step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at {step:,} env steps, mean return {self.last:.1f}")


def run_trial(
    graph_path: str, overrides: list[str], run_dir: str, journal: str, number: int, every: int, pruning: bool
) -> dict[str, Any]:
    """Train one trial in this process (a Dask task on a worker), reporting to the study: its summary,
    or ``{"pruned": ...}`` where the study stopped it."""
    import optuna

    from dagrl.app.graphs import load_graph
    from dagrl.app.training import train
    from dagrl.runtime.rundir import RunDir

    reporter = Reporter(journal, number, every, pruning)
    rundir = RunDir(run_dir)
    rundir.path.mkdir(parents=True, exist_ok=True)
    graph = load_graph(graph_path, overrides)
    rundir.write_config(graph.to_dict())
    try:
        return train(graph, rundir=rundir, listeners=[reporter])
    except optuna.TrialPruned as pruned:
        return {"pruned": str(pruned), "mean_return": reporter.last, "env_steps": reporter.env_steps}


def objective(summary: dict[str, Any]) -> float | None:
    """What a finished trial scores: its final greedy evaluation where the graph evaluates, else its final
    mean training return."""
    from dagrl.app.sweep import final_eval

    value = final_eval(summary)
    return value if value is not None else summary.get("mean_return")


def run_search(
    client: Any,
    graph_path: str | Path,
    sets: list[str],
    spaces: list[Space],
    out: Path,
    *,
    sampler: str,
    trials: int,
    parallel: int,
    seed: int,
    every: int,
    pruning: bool,
    resources: dict[str, float] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run ``trials`` trials of the search, ``parallel`` at a time, on ``client``'s cluster; write
    ``trials.jsonl`` as they end, ``results.md``/``.json``/``.html`` at the end; the records, best first."""
    import optuna
    from distributed import wait
    from tqdm import tqdm

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    found = study(out, sampler, seed, pruning)
    journal, path = str(out / "study.journal"), str(Path(graph_path).resolve())
    distributions = {s.key: s.distribution() for s in spaces}
    ended = [t for t in found.trials if t.state.is_finished()]
    for stale in (t for t in found.trials if not t.state.is_finished()):  # a search stopped while it ran
        found.tell(stale.number, state=optuna.trial.TrialState.FAIL)
    records = [_recorded(t, out) for t in ended]
    running: dict[Any, Any] = {}
    t0 = time.monotonic()
    with (
        (out / "trials.jsonl").open("a") as log_file,
        tqdm(
            total=trials,
            initial=min(len(ended), trials),
            desc=f"dagrl sweep ({sampler})",
            unit="trial",
            disable=not progress,
        ) as bar,
    ):
        while len(ended) + len(running) < trials or running:
            while len(running) < parallel and len(ended) + len(running) < trials:
                trial = found.ask(distributions)
                overrides = [*sets, *(f"{k}={v}" for k, v in trial.params.items()), f"seed={seed}", "policy=single"]
                where = trial_dir(out, trial.number)
                args = (path, overrides, str(where.resolve()), journal, trial.number, every, pruning)
                key = f"{where.name}-{out.name}"  # the Task Stream shows each trial by its number
                running[client.submit(run_trial, *args, key=key, pure=False, resources=resources)] = trial
            done, _ = wait(list(running), return_when="FIRST_COMPLETED")
            for future in done:
                trial = running.pop(future)
                rec = _tell(found, trial, future, out)
                records.append(rec)
                ended.append(trial)
                log_file.write(json.dumps(rec) + "\n")
                log_file.flush()
                bar.update(1)
    records.sort(key=lambda r: -math.inf if r["value"] is None else r["value"], reverse=True)
    (out / "results.json").write_text(json.dumps({"trials": records, "wall_s": time.monotonic() - t0}, indent=1))
    (out / "results.md").write_text(markdown(records, [s.key for s in spaces]))
    plot(records, out / "results.html")
    return records


def _tell(found: Any, trial: Any, future: Any, out: Path) -> dict[str, Any]:
    """Tell the study how the trial of ``future`` ended; its record."""
    import optuna

    state, value, summary, error = optuna.trial.TrialState.COMPLETE, None, {}, None
    try:
        summary = future.result()
    except Exception as err:  # one trial's failure is the trial's, not the search's
        error = f"{type(err).__name__}: {err}"
        log.warning("trial %d failed: %s", trial.number, error)
    if error is not None:
        state = optuna.trial.TrialState.FAIL
    elif "pruned" in summary:
        state, value = optuna.trial.TrialState.PRUNED, summary.get("mean_return")
    else:
        value = objective(summary)
        state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
    found.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)
    return _record(trial.number, trial.params, state, value, summary, out, error)


def _recorded(trial: Any, out: Path) -> dict[str, Any]:
    """A trial an earlier search over this directory ended, as :func:`_tell` recorded it."""
    summary = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((trial_dir(out, trial.number) / "summary.json").read_text())
    value = trial.value
    if value is None and trial.intermediate_values:  # pruned: its last report
        value = trial.intermediate_values[max(trial.intermediate_values)]
    return _record(trial.number, trial.params, trial.state, value, summary, out)


def _record(
    number: int, params: dict, state: Any, value: float | None, summary: dict, out: Path, error: str | None = None
) -> dict[str, Any]:
    pruned = state.name == "PRUNED"
    return {
        "trial": number,
        "params": params,
        "state": state.name.lower(),
        "value": value,
        "env_steps": summary.get("env_steps"),
        "stop_reason": "pruned" if pruned else summary.get("stop_reason"),
        "run_dir": str(trial_dir(out, number)),
        **({"error": error} if error else {}),
    }


def trial_dir(out: Path, number: int) -> Path:
    """The run directory of trial ``number`` of the search in ``out``."""
    return out / f"trial-{number:03d}"


def markdown(records: list[dict[str, Any]], keys: list[str]) -> str:
    """The trials, best first: number, state, the drawn values, the objective, env steps, how it stopped."""
    short = [k.rsplit(".", 1)[-1] for k in keys]
    head = ["trial", "state", *short, "return", "env steps", "stopped on"]
    lines = ["| " + " | ".join(head) + " |", "| ---: | --- | " + "---: | " * (len(keys) + 2) + "--- |"]
    for r in records:
        params = [_fmt(r["params"].get(k)) for k in keys]
        value = "-" if r["value"] is None else f"{r['value']:.1f}"
        steps = "-" if r["env_steps"] is None else f"{r['env_steps']:,}"
        lines.append(
            f"| {r['trial']} | {r['state']} | "
            + " | ".join([*params, value, steps, str(r["stop_reason"] or "-")])
            + " |"
        )
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Each trial's return by its number (coloured by how it ended) and the best so far, as one bokeh page."""
    from bokeh.io import save
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    ordered = sorted((r for r in records if r["value"] is not None), key=lambda r: r["trial"])
    fig = figure(
        title="dagrl sweep: return by trial", x_axis_label="trial", y_axis_label="return", width=760, height=380
    )
    colours = {"complete": "#1f77b4", "pruned": "#ff7f0e", "fail": "#d62728"}
    for state, colour in colours.items():
        rows = [r for r in ordered if r["state"] == state]
        if rows:
            source = ColumnDataSource({"trial": [r["trial"] for r in rows], "value": [r["value"] for r in rows]})
            fig.scatter("trial", "value", source=source, size=8, color=colour, legend_label=state)
    complete = [r for r in ordered if r["state"] == "complete"]
    if complete:
        best = [max(r["value"] for r in complete[: i + 1]) for i in range(len(complete))]
        fig.step([r["trial"] for r in complete], best, mode="after", color="black", legend_label="best so far")
    fig.legend.location = "bottom_right"
    save(fig, filename=str(path), resources=INLINE, title="dagrl sweep")
