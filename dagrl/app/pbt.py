"""``dagrl pbt``: population-based training on the cluster (Jaderberg et al., 2017).

A population of ``--population`` runs of one graph trains side by side, each member a run directory of
its own (``member-<i>``) and a seed of its own, its hyperparameters drawn from the ``--perturb``
space (:func:`dagrl.app.search.parse_space`: ``KEY=LOW:HIGH[:log]`` or ``KEY=A,B,C``). Training goes
in rounds of ``--interval`` env steps; each member's round is one Dask task on a worker
(:func:`train_round`: policy ``single``, resumed from the member's newest checkpoint). After a round the
members are ranked by their mean return; each of the worst ``--quantile`` of them copies the
checkpoint of one of the best (exploit) and takes that member's hyperparameters, each range's value
multiplied by 0.8 or 1.2 (kept inside the range) and each choice drawn again with chance 0.25
(explore). A member's optimizer state comes with the weights; its learning rate is its own
(:func:`dagrl.nn.optim.load_state`).

The population stops when a member meets the graph's ``stop.mean_return`` (or ``stop.eval_return``),
or when every member has trained the graph's ``stop.env_steps``. ``lineage.jsonl`` records every
member's score and hyperparameters each round and every exploit (who copied whom, from which
checkpoint, the hyperparameters before and after); ``results.md`` lists the members at the end, best
first, and ``results.html`` plots each one's return by round. The workers must share the directory.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagrl.app.search import Space
from dagrl.core.schema import ConfigError

log = logging.getLogger("dagrl")

__all__ = ["Member", "draw", "perturb", "run_pbt", "train_round"]

RESAMPLE = 0.25
"""A choice's chance of being drawn again when a member explores."""
FACTORS = (0.8, 1.2)
"""What a range's value is multiplied by when a member explores (one of the two, at random)."""


@dataclass
class Member:
    index: int
    seed: int
    params: dict[str, Any]
    run_dir: Path
    scores: list[float | None] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        last = self.scores[-1] if self.scores else None
        return -math.inf if last is None or math.isnan(last) else last


def draw(space: Space, rng: random.Random) -> Any:
    """A value of ``space``: uniform over its range (log-uniform on a log scale), or one of its choices."""
    if space.choices:
        return rng.choice(space.choices)
    if space.log:
        value = math.exp(rng.uniform(math.log(space.low), math.log(space.high)))
    else:
        value = rng.uniform(space.low, space.high)
    return round(value) if space.integer else value


def perturb(space: Space, value: Any, rng: random.Random) -> Any:
    """``value`` explored: a range's times 0.8 or 1.2, kept inside it; a choice drawn again with chance 0.25."""
    if space.choices:
        return rng.choice(space.choices) if rng.random() < RESAMPLE else value
    moved = min(max(value * rng.choice(FACTORS), space.low), space.high)
    return round(moved) if space.integer else moved


def train_round(graph_path: str, overrides: list[str], run_dir: str, until: int) -> dict[str, Any]:
    """Train one member up to ``until`` env steps in this process (a Dask task), from its newest
    checkpoint where it has one: its run summary."""
    from dagrl.app.graphs import load_graph
    from dagrl.app.training import train
    from dagrl.runtime.checkpoint import load_checkpoint
    from dagrl.runtime.rundir import RunDir

    graph = load_graph(graph_path, [*overrides, f"stop.env_steps={until}", "stop.wall_time_s=null"])
    rundir = RunDir(run_dir)
    resume = load_checkpoint(rundir.path) if rundir.list_checkpoints() else None
    rundir.path.mkdir(parents=True, exist_ok=True)
    rundir.write_config(graph.to_dict())
    return train(graph, rundir=rundir, resume=resume)


def reached(summary: dict[str, Any]) -> bool:
    """The member met the graph's target (not its env-step budget)."""
    return summary.get("stop_reason") in ("mean_return", "eval_return")


def run_pbt(
    client: Any,
    graph_path: str | Path,
    sets: list[str],
    spaces: list[Space],
    out: Path,
    *,
    population: int,
    interval: int,
    budget: int,
    quantile: float,
    seed: int,
    resources: dict[str, float] | None = None,
    progress: bool = True,
) -> list[Member]:
    """Train the population (see the module's text) on ``client``'s cluster; the members, best first."""
    from distributed import wait
    from tqdm import tqdm

    rng = random.Random(seed)
    path = str(Path(graph_path).resolve())
    members = [
        Member(i, seed + i, {s.key: draw(s, rng) for s in spaces}, out / f"member-{i}") for i in range(population)
    ]
    rounds = math.ceil(budget / interval)
    lineage = (out / "lineage.jsonl").open("w")
    t0 = time.monotonic()
    try:
        with tqdm(total=rounds, desc="dagrl pbt", unit="round", disable=not progress) as bar:
            for r in range(1, rounds + 1):
                until = min(r * interval, budget)
                futures = {
                    client.submit(
                        train_round, path, overrides(m, sets), str(m.run_dir.resolve()), until,
                        key=f"pbt-{out.name}-member-{m.index}-round-{r}", pure=False, resources=resources,
                    ): m
                    for m in members
                }  # fmt: skip
                wait(list(futures))
                for future, m in futures.items():
                    m.summary = future.result()  # a member that fails ends the population: its error is raised
                    m.scores.append(m.summary.get("mean_return"))
                    _write(lineage, {"round": r, "event": "ready", "member": m.index, "score": m.scores[-1],
                                     "env_steps": m.summary["env_steps"], "params": m.params})  # fmt: skip
                bar.update(1)
                if any(reached(m.summary) for m in members) or until >= budget:
                    break
                exploit(members, quantile, spaces, rng, r, lineage)
    finally:
        lineage.close()
    ranked = sorted(members, key=lambda m: m.score, reverse=True)
    wall = time.monotonic() - t0
    (out / "results.json").write_text(json.dumps({"members": [_row(m) for m in ranked], "wall_s": wall}, indent=1))
    (out / "results.md").write_text(markdown(ranked, [s.key for s in spaces]))
    plot(members, out / "results.html")
    return ranked


def overrides(member: Member, sets: list[str]) -> list[str]:
    return [*sets, *(f"{k}={v}" for k, v in member.params.items()), f"seed={member.seed}", "policy=single"]


def exploit(members: list[Member], quantile: float, spaces: list[Space], rng: random.Random, r: int, lineage) -> None:
    """Each of the worst ``quantile`` members copies the newest checkpoint of one of the best and explores
    its hyperparameters (:func:`perturb`); each copy recorded in ``lineage``."""
    from dagrl.runtime.rundir import RunDir

    ranked = sorted(members, key=lambda m: m.score, reverse=True)
    n = max(1, math.floor(len(members) * quantile))
    best, worst = ranked[:n], ranked[-n:]
    for loser in worst:
        if loser in best:
            continue
        winner = rng.choice(best)
        source = RunDir(winner.run_dir).list_checkpoints()[-1]
        target = RunDir(loser.run_dir)
        for old in target.list_checkpoints():
            old.unlink()
        shutil.copy2(source, target.checkpoints / source.name)
        before = loser.params
        loser.params = {s.key: perturb(s, winner.params[s.key], rng) for s in spaces}
        _write(lineage, {
            "round": r, "event": "exploit", "member": loser.index, "from": winner.index,
            "checkpoint": str(source), "score": loser.score, "from_score": winner.score,
            "before": before, "after": loser.params,
        })  # fmt: skip
        log.info(
            "pbt round %d: member %d (%.1f) copies member %d (%.1f)", r, loser.index, loser.score, winner.index,
            winner.score,
        )  # fmt: skip


def _write(lineage: Any, row: dict[str, Any]) -> None:
    lineage.write(json.dumps(row) + "\n")
    lineage.flush()


def _row(m: Member) -> dict[str, Any]:
    s = m.summary
    score = m.scores[-1] if m.scores else None
    return {"member": m.index, "params": m.params, "score": score, "env_steps": s.get("env_steps"),
            "stop_reason": s.get("stop_reason"), "run_dir": str(m.run_dir)}  # fmt: skip


def markdown(ranked: list[Member], keys: list[str]) -> str:
    """The members, best first: their hyperparameters now, last mean return, env steps, how they stopped."""
    from dagrl.app.search import _fmt

    head = ["member", *(k.rsplit(".", 1)[-1] for k in keys), "return", "env steps", "stopped on"]
    lines = ["| " + " | ".join(head) + " |", "| ---: | " + "---: | " * (len(keys) + 2) + "--- |"]
    for m in ranked:
        row = _row(m)
        score = "-" if row["score"] is None else f"{row['score']:.1f}"
        cells = [
            str(m.index),
            *(_fmt(m.params[k]) for k in keys),
            score,
            f"{row['env_steps']:,}",
            str(row["stop_reason"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(members: list[Member], path: Path) -> None:
    """Each member's mean return by round, one bokeh page."""
    from bokeh.io import save
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    fig = figure(title="dagrl pbt: mean return by round", x_axis_label="round", y_axis_label="return", width=760)
    for m in members:
        rounds = [i + 1 for i, s in enumerate(m.scores) if s is not None]
        values = [s for s in m.scores if s is not None]
        fig.line(rounds, values, color=Category10_10[m.index % 10], legend_label=f"member {m.index}")
    fig.legend.location = "bottom_right"
    save(fig, filename=str(path), resources=INLINE, title="dagrl pbt")


def check_options(population: int, interval: int, quantile: float) -> None:
    if population < 2:
        raise ConfigError("--population", "", f"must be >= 2 (members to compare), got {population}")
    if interval < 1:
        raise ConfigError("--interval", "", f"must be >= 1 env step, got {interval}")
    if not 0 < quantile <= 0.5:
        raise ConfigError("--quantile", "", f"must be in (0, 0.5], got {quantile}")
