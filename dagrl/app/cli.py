"""The ``dagrl`` command: ``run``, ``sweep``, ``graph``, ``bench`` and the rest.

Every user mistake (a bad graph or cluster file, an unknown env, a missing run directory) ends in
one line naming the file, the key and the value, with exit code 2, before any cluster starts.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import runpy
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from dagrl.app.catalog import resolve
from dagrl.clusters.spec import SlurmError
from dagrl.core.context import EnvError
from dagrl.core.schema import ConfigError, bounded, changed_keys, closest, read_yaml
from dagrl.replay.schema import ReplayError
from dagrl.runtime.placement import PlacementError
from dagrl.runtime.supervisor import DEBUG_ENV, TrainingError

log = logging.getLogger("dagrl")


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record comes, not as it was when the handler was made
    (``main`` called again in one process, under a test's or a notebook's replaced stderr, would
    otherwise log to a stream closed since)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _setup_logging(quiet: bool) -> None:
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("dagrl: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False


def _load_for_run(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any] | None, Any, bool]:
    """Everything validated before a cluster starts: graph, cluster, checkpoint, run dir (and whether
    this command created it). Nothing in an existing run directory is written before all of it holds.

    ``--run-dir`` into a directory that already holds a run (a SLURM driver job started again after a
    requeue, or a command run twice) continues that run from its newest good checkpoint when the graph is
    the run's own, and is refused in one line when it is not: it never starts again at iteration 1
    over the run's metrics and checkpoints."""
    import torch

    from dagrl.app.graphs import check_memory, check_paths, import_run_modules, load_graph, validate_device_request
    from dagrl.clusters.spec import LocalClusterSpec, check_local, load_cluster
    from dagrl.runtime.rundir import RunDir

    resume = rundir = None
    option = "--resume" if args.resume is not None else "--run-dir"
    graph_path = resolve("graphs", args.graph, "GRAPH")
    if args.resume is not None:
        rundir = RunDir(args.resume)
        if not rundir.config_path.exists():
            raise ConfigError("--resume", "", f"{args.resume} is not a dagrl run directory (no config.yaml)")
        if not rundir.list_checkpoints():  # before its config is read: that is what is missing
            raise ConfigError("--resume", "", f"{args.resume}: no checkpoints in {rundir.path / 'checkpoints'}")
        if graph_path is None:  # the run's own graph: say what it imports from outside dagrl
            graph_path = rundir.config_path
            import_run_modules(graph_path)
    elif args.run_dir is not None:
        rundir = RunDir(args.run_dir)
        if not rundir.path.is_dir():
            raise ConfigError("--run-dir", "", f"{args.run_dir} does not exist")
    if graph_path is None:
        raise ConfigError("dagrl run", "GRAPH", "give a graph file (or --resume RUN_DIR)")
    graph = load_graph(graph_path, args.set)
    cluster = load_cluster(resolve("clusters", args.cluster, "--cluster"), args.scheduler)
    if isinstance(cluster, LocalClusterSpec) or not graph.traits.distributed:
        validate_device_request(graph, torch.cuda.is_available())
        check_paths(graph)
        check_memory(graph)
    if isinstance(cluster, LocalClusterSpec) and graph.traits.distributed:
        check_local(cluster, graph)
    created = rundir is None
    if rundir is None:
        rundir = RunDir.create(graph.spec.runs_dir, graph.name)
    _hold(rundir, option)  # before the first write, and before a run still going is judged
    changes = {}
    try:
        if args.resume is not None or _holds_run(rundir):
            if rundir.config_path.exists():
                changes = changed_keys(read_yaml(rundir.config_path), graph.to_dict())
            if args.resume is None and changes:
                said = bounded(_said(changes), 120)
                raise ConfigError(
                    "--run-dir", "", f"{rundir.path} holds a run of another graph (changed: {said}); "
                    f"continue it with --resume {rundir.path}, or give a directory of its own",
                )  # fmt: skip
            resume = _checkpoint_to_resume(rundir, graph, graph_path, changes, option)
    except BaseException:
        rundir.release()
        raise
    if resume is not None:
        at = resume["counters"]["iteration"]
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if args.resume is None:
            job = os.environ.get("SLURM_JOB_ID")
            again = f"SLURM started job {job} again (restart {restarts}): " if restarts else ""
            log.info("%s%s holds a run: continuing it from iteration %d", again, rundir.path, at)
        if changes:  # a resume that changes the run: say what, and keep it in events.jsonl
            log.info("resuming with changes: %s", _said(changes))
            rundir.append_event({"event": "config_change", "iteration": at, "changes": changes})
        used = Path(resume["path"]).name
        rundir.append_event({"event": "resume", "iteration": at, "checkpoint": used, "slurm_restarts": restarts})
    rundir.write_config(graph.to_dict())
    return graph, cluster, resume, rundir, created


def _holds_run(rundir: Any) -> bool:
    """Whether a directory given as ``--run-dir`` holds a run already (a checkpoint, or metrics)."""
    return bool(rundir.list_checkpoints()) or rundir.last_metrics() is not None


def _checkpoint_to_resume(rundir: Any, graph: Any, graph_path: Any, changes: dict, option: str) -> dict[str, Any]:
    """The newest good checkpoint of ``rundir``, checked against ``graph`` and the run's metrics, or a
    one-line :class:`ConfigError` naming what does not fit."""
    from dagrl.runtime.checkpoint import CheckpointError, load_checkpoint
    from dagrl.runtime.hosts import check_fits
    from dagrl.runtime.rundir import MetricsError

    try:
        resume = load_checkpoint(rundir.path)
    except (FileNotFoundError, CheckpointError) as err:
        raise ConfigError(option, "", str(err)) from None
    try:
        check_fits(graph, resume["roles"], str(rundir.path))
    except ValueError as err:
        used = Path(resume["path"]).name
        fits = f"checkpoint {used} does not fit graph {Path(graph_path).name}"
        said = f"(changed: {bounded(_said(changes), 100)})"
        raise ConfigError(option, "", f"{fits}: {bounded(str(err), 280 - len(fits) - len(said))} {said}") from None
    try:
        rundir.metrics_cut(resume["counters"]["iteration"], warn=False)
    except MetricsError as err:
        raise ConfigError(option, "", str(err)) from None
    return resume


def _hold(rundir: Any, option: str) -> None:
    """Take the run directory before anything is written in it (:meth:`RunDir.hold`)."""
    from dagrl.runtime.rundir import RunDirInUse

    try:
        rundir.hold()
    except RunDirInUse as err:
        raise ConfigError(option, "", str(err)) from None


def _said(changes: dict[str, tuple[Any, Any]]) -> str:
    return "; ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items()) or "nothing"


def cmd_run(args: argparse.Namespace) -> int:
    from dagrl.app.training import train

    graph, cluster, resume, rundir, created = _load_for_run(args)
    try:
        summary = train(graph, cluster=cluster, rundir=rundir, resume=resume, progress=not args.quiet, curve_later=True)
    except BaseException:
        if created and not rundir.list_checkpoints():  # never started (no cluster, no placement): leave nothing
            shutil.rmtree(rundir.path, ignore_errors=True)
        raise
    finally:
        rundir.release()
    if summary["stop_reason"] == "interrupted":
        signum = getattr(signal, summary.get("signal") or "SIGINT")
        log.warning(
            "stopped by %s at iteration %d: checkpoint written to %s",
            summary.get("signal") or "SIGINT", summary["iterations"], rundir.checkpoints,
        )  # fmt: skip
        if os.environ.get("DAGRL_REQUEUE"):  # a driver job of dagrl submit, at its walltime warning
            from dagrl.clusters.submit import requeue_after

            requeue_after(summary, started_at=resume["counters"]["iteration"] if resume else 0)
        return 128 + signum
    evaluated = "" if summary.get("eval_return") is None else f", evaluation return {summary['eval_return']:.1f}"
    at = summary.get("stopped_at") or {}
    if at and at["iteration"] != summary["iterations"]:  # the iteration submitted ahead finished after the stop
        held = "-" if at["mean_return"] is None else f"{at['mean_return']:.1f}"
        evaluated += f" (the stop held at iteration {at['iteration']}, mean return {held})"
    log.info(
        "done (%s): %d iterations, %d env steps, mean return %s%s, %.1f s; see %s",
        summary["stop_reason"],
        summary["iterations"],
        summary["env_steps"],
        "-" if summary["mean_return"] is None else f"{summary['mean_return']:.1f}",
        evaluated,
        summary["elapsed_s"],
        rundir.path,
    )
    return 0


def sweep_cluster(args: argparse.Namespace) -> tuple[Any, str | None, dict[str, float] | None]:
    """The cluster spec of ``--cluster``/``--scheduler``, the SLURM pool of the trials' jobs, and what each
    trial asks of a job (one trial per job at a time)."""
    from dagrl.clusters.spec import SlurmSpec, load_cluster

    if args.workers is not None and args.workers < 1:
        raise ConfigError("--workers", "", f"must be >= 1, got {args.workers}")
    cluster = load_cluster(resolve("clusters", args.cluster, "--cluster"), args.scheduler)
    if args.pool is not None and (not isinstance(cluster, SlurmSpec) or args.pool not in cluster.pools):
        known = ", ".join(cluster.pools) if isinstance(cluster, SlurmSpec) else "none: not a SLURM cluster file"
        raise ConfigError("--pool", "", f"{args.pool!r} is not a pool of the cluster file ({known})")
    if not isinstance(cluster, SlurmSpec):
        return cluster, None, None
    from dagrl.clusters.slurm import pool_resource

    need_jobqueue("dagrl sweep --cluster")
    pool = args.pool or next(iter(cluster.pools))
    return cluster, pool, {pool_resource(pool): 1.0}


def sweep_dir(args: argparse.Namespace, base: Any, marker: str) -> Path:
    """``--out`` (default a new ``runs_dir/sweep-<graph>-<time>``), made; refused where it holds
    something other than a sweep (no ``marker`` file)."""
    from dagrl.runtime.rundir import RunDir

    out = Path(args.out) if args.out else RunDir.new_path(base.spec.runs_dir, f"sweep-{base.name}").path
    out = out.resolve()  # job scripts and workers elsewhere read it
    if out.exists() and any(out.iterdir()) and not (out / marker).exists():
        raise ConfigError("--out", "", f"{out} exists and holds no sweep of this kind (no {marker})")
    out.mkdir(parents=True, exist_ok=True)
    return out


def cmd_search(args: argparse.Namespace, graph_path: Path) -> int:
    from dagrl.app.search import check, markdown, parse_space, report_every, run_search
    from dagrl.app.sweep import sweep_client
    from dagrl.runtime.workers import workers as live_workers

    if args.grid:
        raise ConfigError("--grid", "", f"--search {args.search} draws from --space; --grid is the grid search's")
    try:
        import optuna  # noqa: F401  (both searches are Optuna's samplers)
    except ImportError:
        raise ConfigError("--search", args.search, "needs optuna: pip install 'dagrl[search]'") from None
    spaces = parse_space(args.space)
    trials = 20 if args.trials is None else args.trials
    if trials < 1:
        raise ConfigError("--trials", "", f"must be >= 1, got {trials}")
    base = check(graph_path, args.set, spaces)
    every = report_every(base, args.report_every)
    cluster, pool, one_per_job = sweep_cluster(args)
    out = sweep_dir(args, base, "study.journal")
    pruning = args.search == "optuna" and not args.no_prune
    log.info("sweep: %s search, %d trials of %s -> %s", args.search, trials, ", ".join(s.key for s in spaces), out)
    with sweep_client(cluster, trials, args.workers, out, pool) as client:
        log.info("dashboard: %s", client.dashboard_link)
        # SLURM: as many jobs as were asked, started or not; else the workers there are
        parallel = args.workers or (trials if pool is not None else max(1, len(live_workers(client))))
        records = run_search(
            client, graph_path, args.set, spaces, out, sampler=args.search, trials=trials, parallel=parallel,
            seed=args.seeds[0], every=every, pruning=pruning, resources=one_per_job, progress=not args.quiet,
        )  # fmt: skip
    print(markdown(records, [s.key for s in spaces]), end="")
    print(f"wrote {out / 'results.md'} and {out / 'results.html'}")
    return 1 if any(r["state"] == "fail" for r in records) else 0


def cmd_pbt(args: argparse.Namespace) -> int:
    from dagrl.app.pbt import check_options, markdown, run_pbt
    from dagrl.app.search import check, parse_space
    from dagrl.app.sweep import sweep_client

    graph_path = resolve("graphs", args.graph, "GRAPH")
    if graph_path is None:
        raise ConfigError("dagrl pbt", "GRAPH", "give a graph file or name")
    check_options(args.population, args.interval, args.quantile)
    spaces = parse_space(args.perturb)
    base = check(graph_path, args.set, spaces)
    budget = base.spec.stop.env_steps
    if budget is None:
        raise ConfigError(base.path, "stop.env_steps", "dagrl pbt needs each member's budget of env steps")
    cluster, pool, one_per_job = sweep_cluster(args)
    out = sweep_dir(args, base, "lineage.jsonl")
    log.info(
        "pbt: %d members, rounds of %s env steps up to %s, perturbing %s -> %s", args.population,
        f"{args.interval:,}", f"{budget:,}", ", ".join(s.key for s in spaces), out,
    )  # fmt: skip
    with sweep_client(cluster, args.population, args.workers, out, pool) as client:
        log.info("dashboard: %s", client.dashboard_link)
        ranked = run_pbt(
            client, graph_path, args.set, spaces, out, population=args.population, interval=args.interval,
            budget=budget, quantile=args.quantile, seed=args.seed, resources=one_per_job, progress=not args.quiet,
        )  # fmt: skip
    print(markdown(ranked, [s.key for s in spaces]), end="")
    print(f"wrote {out / 'lineage.jsonl'}, {out / 'results.md'} and {out / 'results.html'}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from dagrl.app.sweep import markdown, plan, run_sweep, sweep_client

    graph_path = resolve("graphs", args.graph, "GRAPH")
    if graph_path is None:
        raise ConfigError("dagrl sweep", "GRAPH", "give a graph file or name")
    if args.search != "grid":
        return cmd_search(args, graph_path)
    if args.space or args.trials is not None:
        raise ConfigError("--space" if args.space else "--trials", "", "takes --search random or --search optuna")
    base, trials = plan(graph_path, args.set, args.grid, args.seeds)
    cluster, pool, one_per_job = sweep_cluster(args)
    out = sweep_dir(args, base, "trials.jsonl")
    if base.traits.distributed:
        log.info("each trial runs in one process (policy single), not under %s", base.spec.policy)
    settings = len({t.setting for t in trials})
    log.info("sweep: %d trials (%d settings x %d seeds) -> %s", len(trials), settings, len(args.seeds), out)
    with sweep_client(cluster, len(trials), args.workers, out, pool) as client:
        log.info("dashboard: %s", client.dashboard_link)
        rows = run_sweep(client, graph_path, trials, out, progress=not args.quiet, resources=one_per_job)
    print(markdown(rows), end="")
    failed = sum(r["failed"] for r in rows)
    if failed:
        log.warning("%d of %d trials failed; see %s", failed, len(trials), out / "trials.jsonl")
    return 1 if failed else 0


def cmd_eval(args: argparse.Namespace) -> int:
    from dagrl.app.evaluate import evaluate_checkpoint, write_result

    result = evaluate_checkpoint(args.run, args.episodes, args.seed, args.set, args.video, not args.stochastic)
    run = Path(result.checkpoint).parent.parent
    out = write_result(run, result)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    print(result.line())
    for video in result.videos:
        print(f"  video: {video}")
    print(f"  wrote {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from dagrl.app.export import export_policy

    print(export_policy(args.run, args.out, args.set, args.group, args.format).line())
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    from dagrl.app.graphs import load_graph
    from dagrl.app.inspect import describe, to_dot, to_task_dot

    if args.from_zoo:
        return cmd_from_zoo(args)
    if args.graph is None:
        raise ConfigError("dagrl graph", "GRAPH", "name a graph file or name, or give --from-zoo ALGO ENV_ID")
    graph = load_graph(resolve("graphs", args.graph, "GRAPH"), args.set)
    print(describe(graph))
    if args.dot:
        Path(args.dot).write_text(to_dot(graph))
        print(f"wrote {args.dot} (render with: dot -Tpng {args.dot} -o graph.png)")
    if args.tasks:
        Path(args.tasks).write_text(to_task_dot(graph))
        print(f"wrote {args.tasks}: one iteration's Dask tasks (render with: dot -Tsvg {args.tasks} -o tasks.svg)")
    return 0


def cmd_from_zoo(args: argparse.Namespace) -> int:
    """Write the zoo's graph (to ``--out`` or stdout), checked as any graph is; name what did not carry."""
    import tempfile

    from dagrl.app.graphs import load_graph
    from dagrl.app.zoo import convert

    if args.graph is not None:
        raise ConfigError("dagrl graph", "--from-zoo", f"writes a new graph: give no GRAPH (got {args.graph})")
    converted = convert(*args.from_zoo)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.out or Path(tmp) / f"{converted.algo}-{converted.env_id}-zoo.yaml".lower())
        path.write_text(converted.text)
        load_graph(path, args.set)  # what the converter wrote is a graph dagrl runs
        if not args.out:
            print(converted.text, end="")
    if converted.dropped:
        print(f"dagrl: no equivalent in dagrl: {', '.join(converted.dropped)}", file=sys.stderr)
    if args.out:
        print(f"wrote {args.out}: run it with `dagrl run {args.out}`")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Measure, predict, verify; write the tuned graph and print predicted vs achieved."""
    import json
    import shlex

    from dagrl.app.graphs import load_graph
    from dagrl.app.tune import Measurements, shape_of, tune, write_tuned
    from dagrl.clusters.spec import LocalClusterSpec, check_local, load_cluster
    from dagrl.core.schema import apply_overrides

    path = resolve("graphs", args.graph, "GRAPH")
    graph = load_graph(path, args.set)
    shape_of(graph)  # refuses a graph with nothing to tune, before anything starts
    cluster = load_cluster(resolve("clusters", args.cluster, "--cluster"), args.scheduler)
    if isinstance(cluster, LocalClusterSpec):
        check_local(cluster, graph)
    if args.budget_s <= 0:
        raise ConfigError("dagrl tune", "--budget-s", f"must be > 0, got {args.budget_s}")
    measured = None
    if args.from_measurements:
        try:
            measured = Measurements.from_dict(json.loads(Path(args.from_measurements).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(args.from_measurements, "", f"not a measurements file of dagrl tune ({err})") from None
    data = apply_overrides(read_yaml(path), list(args.set))
    out = Path(args.out or f"{Path(path).stem}-tuned.yaml")
    tuning = tune(
        graph, data, cluster, budget_s=args.budget_s, n_verify=args.verify, max_samplers=args.max_samplers,
        measurements=measured, progress=not args.quiet,
    )  # fmt: skip
    if args.measurements:
        Path(args.measurements).write_text(json.dumps(tuning.measurements.to_dict(), indent=1) + "\n")
    command = shlex.join(["dagrl", "tune", *(args.argv or [])])
    write_tuned(tuning, data, command, out, str(path))
    print(_tune_report(tuning))
    print(f"wrote {out}")
    return 0


def _tune_report(tuning: Any) -> str:
    lines = ["predicted  achieved  env steps/s"]
    for c, p in tuning.ranked[:5]:
        lines.append(f"{p.steps_s:9.0f}  {'':>8}  {c.describe()}")
    if tuning.verified:
        lines = ["predicted  achieved  env steps/s (short real runs)"]
        for r in tuning.verified:
            pred = "-" if r.predicted is None else f"{r.predicted.steps_s:.0f}"
            got = "-" if r.achieved is None else f"{r.achieved:.0f}"
            lines.append(f"{pred:>9}  {got:>8}  {r.label(tuning)}")
    return "\n".join(lines)


def cmd_list(kind: str) -> int:
    """``dagrl graphs`` / ``dagrl clusters``: every file usable by name, with its first comment line."""
    from dagrl.app import catalog

    found = catalog.entries(kind)
    width = max((len(n) for n in found), default=0)
    for name, path in found.items():
        print(f"{name:<{width}}  {catalog.describe(path)}")
    where = ", ".join(str(d) for d in catalog.search_dirs(kind))
    print(f"({len(found)} {kind}, by name from: {where})", file=sys.stderr)
    return 0


def benchmarks_dir() -> Path:
    here = Path(__file__).resolve().parents[2] / "benchmarks"
    return here if here.is_dir() else Path.cwd() / "benchmarks"


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    if args.name is None:
        return cmd_bench_list()
    script = benchmarks_dir() / f"{args.name.replace('-', '_')}.py"
    if not script.exists():
        hint = closest(args.name, benchmarks(), "`dagrl bench`")
        raise ConfigError("dagrl bench", "NAME", f"unknown benchmark {args.name!r} ({hint})")
    sys.argv = [str(script), *rest]
    sys.path[:0] = [str(script.parent), str(script.parent.parent)]  # _common, and tests/ helpers
    runpy.run_path(str(script), run_name="__main__")
    return 0


def runs_on_a_cluster(command: argparse.ArgumentParser, what: str) -> None:
    """The options of a command whose ``what`` are runs side by side on a cluster (``sweep``, ``pbt``)."""
    command.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a graph field")
    where = command.add_mutually_exclusive_group()
    where.add_argument("--cluster", help="a cluster file or name (local, scheduler or slurm)")
    where.add_argument("--scheduler", help="attach to a running Dask scheduler (workers sharing this filesystem)")
    command.add_argument(
        "--workers",
        type=int,
        help=f"local worker processes (default: one per core) or SLURM jobs (one per {what[:-1]})",
    )
    command.add_argument("--pool", help=f"the SLURM cluster file's pool for the {what}' jobs (default: its first)")
    command.add_argument("--out", help=f"directory for the {what}' runs and the results (default: runs_dir/sweep-...)")
    command.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")


def parser() -> argparse.ArgumentParser:
    from dagrl import __version__

    p = argparse.ArgumentParser(
        prog="dagrl",
        description="Distributed reinforcement learning on Dask: an algorithm written once as fragments, "
        "run under the distribution policy its graph file names.",
        epilog="example: dagrl run ppo-cartpole    (`dagrl COMMAND -h` shows a command's options and an example)",
    )
    p.add_argument("--version", action="version", version=f"dagrl {__version__}")
    p.add_argument(
        "--debug", action="store_true", help="print the traceback behind an error (an env's, a role's), not one line"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        """A subcommand: its line in ``dagrl -h``, the same as its ``-h`` description, and an example."""
        return sub.add_parser(name, help=help, description=help, epilog=f"example: {EXAMPLES[name]}")

    run = command("run", help="train the algorithm of a graph file")
    run.add_argument("graph", nargs="?", help="a graph file or name (`dagrl graphs`; optional with --resume)")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a graph field, e.g. hyperparameters.lr=3e-4",
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument("--cluster", help="a cluster file or name (`dagrl clusters`; default: an embedded LocalCluster)")
    where.add_argument("--scheduler", help="attach to a running Dask scheduler, e.g. tcp://10.0.0.1:8786")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    run.add_argument("--quiet", action="store_true", help="no progress line, warnings only")
    run.add_argument("--run-dir", help="write into this existing run directory (used by dagrl submit)")

    submit = command("submit", help="train on SLURM in the background: returns a job id and run directory")
    submit.add_argument("graph", help="a graph file or name")
    submit.add_argument("--cluster", required=True, help="a cluster file or name of kind slurm (e.g. slurm)")
    submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a graph field")
    submit.add_argument("--dry-run", action="store_true", help="print every sbatch script; submit nothing")

    status = command("status", help="state, progress and dashboard tunnel of a submitted run")
    status.add_argument("run", metavar="RUN_DIR")
    logs = command("logs", help="follow the driver log of a submitted run")
    logs.add_argument("run", metavar="RUN_DIR")
    logs.add_argument("--no-follow", dest="follow", action="store_false", help="print what is there and exit")
    logs.add_argument("--workers", action="store_true", help="print the worker jobs' logs instead")
    cancel = command("cancel", help="cancel every SLURM job of a submitted run")
    cancel.add_argument("run", metavar="RUN_DIR")

    sweep = command("sweep", help="run hyperparameter settings x seeds side by side, a whole run per task")
    sweep.add_argument("graph", help="a graph file or name")
    sweep.add_argument(
        "--grid", action="append", default=[], metavar="KEY=V1,V2",
        help="values to try, e.g. hyperparameters.lr=1e-3,3e-4",
    )  # fmt: skip
    sweep.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3],
        help="seeds of every setting (default 1 2 3); a search's trials run the first",
    )  # fmt: skip
    sweep.add_argument(
        "--search", choices=["grid", "random", "optuna"], default="grid",
        help="grid: every --grid setting; random or optuna (dagrl[search]): --trials settings drawn from --space",
    )  # fmt: skip
    sweep.add_argument(
        "--space", action="append", default=[], metavar="KEY=LOW:HIGH[:log]|A,B",
        help="a search's range or choices, e.g. hyperparameters.lr=1e-4:1e-2:log",
    )  # fmt: skip
    sweep.add_argument("--trials", type=int, help="settings a search draws (default 20)")
    sweep.add_argument(
        "--report-every", type=int, metavar="STEPS",
        help="env steps between a trial's reports to the pruner (default: a tenth of stop.env_steps)",
    )  # fmt: skip
    sweep.add_argument("--no-prune", action="store_true", help="optuna: run every trial to its stop")
    runs_on_a_cluster(sweep, "trials")

    pbt = command("pbt", help="population-based training: members side by side, the worst copying the best")
    pbt.add_argument("graph", help="a graph file or name")
    pbt.add_argument(
        "--perturb", action="append", default=[], metavar="KEY=LOW:HIGH[:log]|A,B",
        help="a hyperparameter members draw and explore, e.g. hyperparameters.lr=1e-4:1e-2:log",
    )  # fmt: skip
    pbt.add_argument("--population", type=int, default=4, help="members (default 4)")
    pbt.add_argument(
        "--interval", type=int, default=10_000, help="env steps per member between exploits (default 10,000)"
    )
    pbt.add_argument("--quantile", type=float, default=0.25, help="share of members that copy the best (default 0.25)")
    pbt.add_argument("--seed", type=int, default=1, help="member i's seed is SEED + i; draws are seeded by SEED")
    runs_on_a_cluster(pbt, "members")

    ev = command(
        "eval", help="play greedy (or --stochastic) episodes with a run's checkpoint: returns, lengths, videos"
    )
    ev.add_argument("run", metavar="RUN", help="a run directory (its newest checkpoint) or one checkpoint file")
    ev.add_argument("--episodes", type=int, default=10, help="whole episodes to play (default 10)")
    ev.add_argument("--seed", type=int, help="seed of the evaluation envs (default: the run's)")
    ev.add_argument("--video", metavar="DIR", help="also record every episode as an MP4 here (needs dagrl[video])")
    ev.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field of the run's graph"
    )
    ev.add_argument(
        "--stochastic",
        action="store_true",
        help="sample the policy's actions (value-based: epsilon-greedy at the last epsilon)",
    )
    ev.add_argument("--json", action="store_true", help="print the result as one JSON line")

    ex = command("export", help="save a run's greedy policy as a torch.export program (or ONNX), to act without dagrl")
    ex.add_argument("run", metavar="RUN", help="a run directory (its newest checkpoint) or one checkpoint file")
    ex.add_argument("--out", metavar="FILE", help="where to write it (default: RUN/export/<checkpoint>.pt2 or .onnx)")
    ex.add_argument(
        "--format", choices=["torch", "onnx"], default="torch", help="torch.export (default) or ONNX (dagrl[onnx])"
    )
    ex.add_argument("--group", metavar="NAME", help="a multi-agent run: only this group's policy (its agents' rows in)")
    ex.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field of the run's graph"
    )

    graph = command("graph", help="print a graph's spaces and encoder, roles, replicas, fragments and edges")
    graph.add_argument("graph", nargs="?", help="a graph file or name (`dagrl graphs`)")
    graph.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a graph field")
    graph.add_argument(
        "--from-zoo", nargs=2, metavar=("ALGO", "ENV_ID"),
        help="write a graph with the rl-zoo's hyperparameters for ALGO (ppo, dqn, sac, td3) on ENV_ID, converted "
        "(the zoo extra)",
    )  # fmt: skip
    graph.add_argument("--out", metavar="FILE", help="with --from-zoo: the graph file to write (default: stdout)")
    graph.add_argument("--dot", metavar="FILE", help="also write the fragment graph as Graphviz DOT")
    graph.add_argument(
        "--tasks", metavar="FILE", help="also write one iteration's Dask tasks (per replica, per worker) as DOT"
    )

    tune = command(
        "tune",
        help="choose parallelism, not hyperparameters (those: dagrl sweep --search optuna, dagrl pbt): measure "
        "this cluster and write a graph with samplers, envs and policy chosen",
    )
    tune.add_argument("graph", help="a graph file or name")
    tune.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a graph field")
    where = tune.add_mutually_exclusive_group()
    where.add_argument("--cluster", help="a cluster file or name (default: an embedded LocalCluster)")
    where.add_argument("--scheduler", help="tune on a running Dask scheduler")
    tune.add_argument("--budget-s", type=float, default=120.0, help="seconds to spend measuring and verifying")
    tune.add_argument("--out", help="the tuned graph to write (default: GRAPH-tuned.yaml here)")
    tune.add_argument("--verify", type=int, default=3, help="best predictions to check by short real runs (0: none)")
    tune.add_argument(
        "--max-samplers", type=int, help="most samplers a candidate may have (default: 4 per core, <= 16)"
    )
    tune.add_argument("--measurements", metavar="FILE", help="also save what was measured (JSON)")
    tune.add_argument(
        "--from", dest="from_measurements", metavar="FILE", help="use saved measurements; measure nothing"
    )
    tune.add_argument("--quiet", action="store_true")

    command("graphs", help="list the graph files usable by name (dagrl run NAME)")
    command("clusters", help="list the cluster files usable by name (--cluster NAME)")

    worker = command(
        "worker", help="a Dask worker for a scheduler you started, set up as dagrl's own (no malloc trim, preload)"
    )
    worker.add_argument("--no-quiet", dest="quiet", action="store_false", help="keep Dask's periodic callbacks")
    worker.add_argument("scheduler", help="the scheduler's address, e.g. tcp://10.0.0.1:8786")
    worker.add_argument("dask_args", nargs=argparse.REMAINDER, help="passed to `dask worker` as they are")

    bench = command("bench", help="run a benchmark from benchmarks/; without a name, list them")
    bench.add_argument("name", nargs="?")
    return p


EXAMPLES = {
    "run": "dagrl run ppo-cartpole --set policy=async --set roles.sampler.replicas=4",
    "submit": "dagrl submit ppo-cartpole --cluster slurm",
    "status": "dagrl status runs/ppo-cartpole-20260101-120000",
    "logs": "dagrl logs runs/ppo-cartpole-20260101-120000 --no-follow",
    "cancel": "dagrl cancel runs/ppo-cartpole-20260101-120000",
    "sweep": "dagrl sweep ppo-cartpole --grid hyperparameters.lr=1e-3,3e-4 --seeds 1 2 3",
    "pbt": "dagrl pbt ppo-cartpole-single --perturb hyperparameters.lr=1e-4:3e-3:log --population 4",
    "eval": "dagrl eval runs/ppo-cartpole-20260101-120000 --episodes 20 --json",
    "export": "dagrl export runs/ppo-cartpole-20260101-120000 --out policy.pt2",
    "graph": "dagrl graph ppo-cartpole --dot graph.dot",
    "tune": "dagrl tune ppo-cartpole --budget-s 60",
    "graphs": "dagrl graphs",
    "clusters": "dagrl clusters",
    "bench": "dagrl bench ppo-cartpole",
    "worker": "dagrl worker tcp://10.0.0.1:8786 --nworkers 4 --nthreads 1",
}
"""One example per command, shown at the end of its ``-h``."""


def benchmarks() -> dict[str, str]:
    """Every benchmark of ``dagrl bench``: name -> the first line of its docstring."""
    import ast

    out = {}
    for script in sorted(benchmarks_dir().glob("*.py")):
        if script.stem.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
        out[script.stem.replace("_", "-")] = doc.strip().splitlines()[0] if doc.strip() else ""
    return out


def cmd_bench_list() -> int:
    found = benchmarks()
    width = max(map(len, found), default=0)
    for name, what in found.items():
        print(f"{name.ljust(width)}  {what}")
    return 0


SUBMIT_COMMANDS = ("submit", "status", "logs", "cancel")


def cmd_submit(args: Any) -> int:
    from dagrl.app.graphs import load_graph
    from dagrl.clusters.submit import submit

    args.graph = resolve("graphs", args.graph, "GRAPH")
    args.cluster = resolve("clusters", args.cluster, "--cluster")
    return submit(load_graph(args.graph, args.set), args.graph, args.cluster, args.dry_run)


def need_jobqueue(where: str) -> None:
    """Refuse a SLURM command or cluster without dask-jobqueue installed, naming the extra to install."""
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        raise ConfigError(where, "", "needs the slurm extra: pip install 'dagrl[slurm]'") from None


def os_error(err: OSError) -> str:
    """One line for an error of the machine: what failed and where."""
    text = " ".join(str(err).split())
    if err.filename and str(err.filename) not in text:
        text = f"{err.filename}: {text}"
    return text


def _import_from_working_directory() -> None:
    """Let a graph name modules beside it, as ``python -m dagrl`` does (``algorithm: my_algo``,
    ``env.id: my_envs:Corridor-v0``); last on the path, so a file there cannot shadow a package. The
    embedded cluster's workers start with this path too (multiprocessing's spawn passes it on)."""
    here = str(Path.cwd())
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def command() -> int:
    """The ``dagrl`` command (and ``python -m dagrl``): :func:`main`, then the process exits without
    the collector walking torch's objects once more on the way out (``gc.freeze``), 0.3-0.4 s of a
    short run's exit on these CPUs. Callers of :func:`main` inside a longer process keep a normal
    collector."""
    code = main()
    gc.freeze()
    return code


def _command(args: argparse.Namespace, argv: list[str] | None, rest: list[str]) -> int:
    """Run the command ``args`` names; its exit status."""
    if args.command in SUBMIT_COMMANDS:
        need_jobqueue(f"dagrl {args.command}")
        from dagrl.clusters import submit

        if args.command == "submit":
            return cmd_submit(args)
        return getattr(submit, f"cmd_{args.command}")(args)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "worker":
        from dagrl.clusters.worker import run_worker

        return run_worker([args.scheduler, *args.dask_args], args.quiet)
    if args.command == "graph":
        return cmd_graph(args)
    if args.command == "eval":
        return cmd_eval(args)
    if args.command == "pbt":
        return cmd_pbt(args)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "sweep":
        return cmd_sweep(args)
    if args.command == "tune":
        args.argv = list(argv if argv is not None else sys.argv[1:])[1:]
        return cmd_tune(args)
    if args.command in ("graphs", "clusters"):
        return cmd_list(args.command)
    return cmd_bench(args, rest)


def main(argv: list[str] | None = None) -> int:
    args, rest = parser().parse_known_args(argv)
    _import_from_working_directory()
    if rest and args.command != "bench":
        overrides = [a for a in rest if "=" in a and not a.startswith("-")]
        hint = f" (a graph field is set with --set, e.g. --set {overrides[0]})" if overrides else ""
        parser().error(f"unrecognized arguments: {' '.join(rest)}{hint}")
    _setup_logging(getattr(args, "quiet", False))
    debug_before = os.environ.get(DEBUG_ENV)
    if args.debug:
        os.environ[DEBUG_ENV] = "1"  # worker processes started from here inherit it
    try:
        code = _command(args, argv, rest)
        sys.stdout.flush()  # here, where a reader that has gone is caught, not at exit
        return code
    except ConfigError as err:
        print(f"dagrl: error: {err}", file=sys.stderr)
        return 2
    except PlacementError as err:
        print(f"dagrl: error: placement: {err}", file=sys.stderr)
        return 2
    except SlurmError as err:
        print(f"dagrl: error: SLURM: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dagrl graphs | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor a flush at exit complains
        return 141  # 128 + SIGPIPE, as a shell reports a process a pipe stopped
    except OSError as err:  # the machine: a full disk, permissions, a refused connection
        print(f"dagrl: error: {os_error(err)}", file=sys.stderr)
        return 2
    except TrainingError as err:
        print(f"dagrl: training stopped: {err}", file=sys.stderr)
        return 1
    except (EnvError, ReplayError) as err:  # under ``single``, where no supervisor stands between
        if args.debug:
            raise
        print(f"dagrl: training stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # a second stop signal (dagrl.app.signals.Aborted), or one outside a run
        print("dagrl: interrupted", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    finally:
        if debug_before is None:  # main() called in a process that goes on (a notebook, the tests)
            os.environ.pop(DEBUG_ENV, None)


if __name__ == "__main__":
    sys.exit(main())
