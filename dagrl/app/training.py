"""One entry point for a training run: ``dagrl run``, notebooks and tests all come through :func:`train`."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dagrl.clusters.local import trim_warning
from dagrl.core.graph import Graph
from dagrl.runtime.rundir import RunDir

log = logging.getLogger("dagrl")

__all__ = ["train"]


def train(
    graph: Graph | str | Path,
    client: Any = None,
    *,
    overrides: Sequence[str] = (),
    live: bool = False,
    curve_later: bool = False,
    cluster: Any = None,
    rundir: RunDir | None = None,
    resume: dict[str, Any] | None = None,
    progress: bool | None = None,
    listeners: Iterable[Callable[[dict[str, Any], Any], None]] = (),
) -> dict[str, Any]:
    """Train ``graph`` until a stop condition holds; return the run summary (``summary["run_dir"]``).

    ``graph`` is a loaded :class:`~dagrl.core.graph.Graph`, or a graph file's path or name (``dagrl
    graphs``), loaded here with ``overrides`` (``["hyperparameters.lr=3e-4"]``, as ``--set`` takes them).
    With ``live``, a notebook cell shows the learning curve, redrawn as it trains.

    ``client`` is a ``distributed.Client`` to run on; without one, a distributed policy starts the
    cluster of ``cluster`` (a :mod:`dagrl.clusters.spec` spec; default an embedded LocalCluster) and
    stops it at the end. ``single`` runs in this process whatever is given. ``progress``: a live
    progress line (``None``, the default: tqdm's bar in a notebook, nothing elsewhere). ``rundir``
    defaults to a new ``<runs_dir>/<name>-<timestamp>``; ``resume`` is a checkpoint to continue from.
    Each metrics row is passed to ``listeners`` (and to the RL dashboard page when on a cluster).

    Examples
    --------
    >>> from dagrl.app.graphs import load_graph
    >>> g = load_graph("graphs/ppo-cartpole-single.yaml", ["stop.iterations=2", "runs_dir=/tmp/dagrl-doctest"])
    >>> train(g)["iterations"]
    2
    """
    from dagrl.app.driver import Trainer
    from dagrl.app.inspect import observations

    if not isinstance(graph, Graph):
        from dagrl.app.catalog import resolve
        from dagrl.app.graphs import load_graph

        graph = load_graph(resolve("graphs", str(graph), "graph"), list(overrides))
    elif overrides:
        raise TypeError("train: overrides apply to a graph file; a loaded Graph already has its values")
    curve = None
    if live:
        from dagrl.app.notebook import LiveCurve

        curve = LiveCurve(f"{graph.name}: {graph.spec.policy}")
        listeners = [*listeners, curve]
    from dagrl.app.progress import progress_display
    from dagrl.app.signals import stop_signals
    from dagrl.policies import build_policy

    if rundir is None:
        rundir = RunDir.create(graph.spec.runs_dir, graph.name)
        rundir.write_config(graph.to_dict())
    took = rundir.hold()  # one process trains into a run directory at a time
    spec = graph.spec
    log.info("run %s: %s on %s, policy %s -> %s", graph.name, spec.algorithm, spec.env.id, spec.policy, rundir.path)
    log.info("observations: %s", observations(graph.observation_space, graph.env_observation_space))
    if resume is not None:
        c = resume["counters"]
        log.info("resuming at iteration %d, %d env steps", c["iteration"], c["env_steps"])
    distributed = graph.traits.distributed
    with contextlib.ExitStack() as stack:
        if took:
            stack.callback(rundir.release)
        # from here a stop signal (SIGTERM from SLURM, Ctrl-C) ends the run cleanly, even while the cluster starts
        stop = stack.enter_context(stop_signals(spec.checkpoint.stop_wait_s))
        wandb_log = None
        if spec.wandb.project is not None:  # first: a W&B run that cannot start stops the run before a cluster does
            from dagrl.app.wandb_log import WandbLog

            wandb_log = WandbLog(spec.wandb, rundir.path, graph.to_dict(), where=graph.path)
            stack.push(lambda failed, *_: wandb_log.close(failed=failed is not None))
        if not distributed:
            client = None
        elif client is None:
            from dagrl.clusters.connect import connect
            from dagrl.clusters.spec import LocalClusterSpec

            cluster = cluster or LocalClusterSpec()
            local = isinstance(cluster, LocalClusterSpec)
            if local and cluster.pack_samplers:
                from dagrl.app.packing import packed_samplers
                from dagrl.clusters.local import usable_cores

                graph = packed_samplers(graph, usable_cores())
            if progress and local and sys.stderr.isatty():  # workers share this terminal: keep them off the line
                stack.enter_context(worker_logs(rundir.path / "logs"))
            client = stack.enter_context(connect(cluster, graph, rundir.path))
        if client is not None:
            log.info("dashboard: %s (RL page: %s)", client.dashboard_link, rl_page(client.dashboard_link))
        offset = resume["counters"]["iteration"] if resume else 0
        steps = resume["counters"]["env_steps"] if resume else 0
        policy = build_policy(graph, client, seed_offset=offset, run_dir=rundir.path, env_steps=steps)
        stack.callback(policy.close)
        actors = policy.actors()
        rundir.write_json("actors.json", actors)
        for a in actors:
            envs = f", {a['envs']} envs" if a.get("envs", 1) > 1 else ""
            log.info("  %s[%d] on %s (%s%s)", a["role"], a["index"], a["address"], a["device"], envs)
        if warning := trim_warning(actors):
            log.warning(warning)
        trainer = Trainer(
            graph,
            policy,
            rundir,
            resume=resume,
            progress=progress_display(progress, graph.name, spec.stop.env_steps),
            curve_later=curve_later,
            stop=stop,
        )
        trainer.listeners.extend(listeners)
        if spec.tensorboard:
            from dagrl.app.tensorboard import TensorBoardLog

            board = TensorBoardLog(rundir.path / "tensorboard", resumed_at=steps if resume else None)
            stack.callback(board.close)
            trainer.listeners.append(board.on_row)
        if wandb_log is not None:
            trainer.listeners.append(wandb_log.on_row)
        if client is not None:
            from dagrl.dashboard.feed import Feed

            feed = Feed(client, policy, rundir.path.name).start()
            stack.callback(feed.close)
            trainer.listeners.append(feed.on_row)
        started = time.perf_counter()
        trainer.after_restart.append(lambda: write_actors(policy, rundir))
        trainer.before_summary.append(lambda: time_in_roles(policy, rundir, time.perf_counter() - started))
        summary = trainer.run()
        if curve is not None:
            curve.draw()
        if wandb_log is not None:
            wandb_log.on_end(summary)
        return summary


def write_actors(policy: Any, rundir: RunDir) -> list[dict[str, Any]] | None:
    """``actors.json`` anew: where each role instance runs now (after supervision replaced one, the
    replacement's worker, host and pid). ``None``, and the file left as it was, where an actor does not
    answer: an account of the run never fails the run."""
    try:
        actors = policy.actors()
    except Exception as err:
        log.debug("actors: %s", err)
        return None
    rundir.write_json("actors.json", actors)
    return actors


def time_in_roles(policy: Any, rundir: RunDir, wall_s: float) -> None:
    """At a run's end: ``actors.json`` again, now with each role instance's seconds in its fragments
    (``busy_s``) and inside its envs' ``step`` (``env_s``), and one log line per role: how much of the
    run's ``wall_s`` its instances were busy, and for a role with envs what share of that the envs took
    (what bounds the samplers: the simulator, or the rest: acting, recording, transfers). Where one role
    was busy nearly all the run and no other was, a last line names it: the others waited on it."""
    from dagrl.runtime.report import bounding, busy_share, in_env, role_time

    actors = write_actors(policy, rundir)
    if actors is None:
        return
    busy: dict[str, float] = {}
    for role in dict.fromkeys(a["role"] for a in actors):
        summed = role_time(actors, role)
        n, busy[role] = summed["instances"], busy_share(summed, wall_s)
        run = f"busy {100 * busy[role]:.0f} % of the run" + (" (mean of its instances)" if n > 1 else "")
        share = in_env(summed)
        if share is None:
            log.info("%s: %s", role, run)
            continue
        busy_s = sum(summed["busy_s"].values())
        where = f"{summed['env_s']:.1f} of {busy_s:.1f} s" + (f", summed over {n}" if n > 1 else "")
        threaded = sum("threads" in (a.get("vector") or ()) for a in actors if a["role"] == role)
        if threaded:  # not stepped in turn: say so, the share inside env.step then overlaps
            run += f"; envs on threads in {threaded} of {n}" if n > 1 else "; envs on threads"
        log.info("%s: %.0f %% of its fragment time inside env.step (%s); %s", role, 100 * share, where, run)
    role = bounding(busy)
    if role is not None and len(busy) > 1:
        log.info("%s set the run's pace (no other role was busy 90 %% of it)", role)


@contextlib.contextmanager
def worker_logs(directory: Path) -> Iterator[None]:
    """Local workers started meanwhile write their stderr under ``directory`` (see ``runtime/preload.py``)."""
    from dagrl.runtime.preload import LOGS_ENV

    log.info("worker logs: %s/worker-<pid>.log", directory)
    os.environ[LOGS_ENV] = str(directory)
    try:
        yield
    finally:
        os.environ.pop(LOGS_ENV, None)


def rl_page(dashboard_link: str) -> str:
    """The RL page's address next to the dashboard's ``.../status``, or why there is none.

    dagrl's own clusters register the page; a scheduler started by hand has it only with
    ``--preload dagrl.dashboard`` (asked of its ``/individual-plots.json``).
    """
    import json
    import urllib.request

    base = dashboard_link.rsplit("/", 1)[0]
    try:
        with urllib.request.urlopen(f"{base}/individual-plots.json", timeout=5) as r:
            pages = json.loads(r.read())
    except (OSError, ValueError):
        return f"{base}/individual-dagrl (could not ask the dashboard whether it has it)"
    if "/individual-dagrl" in pages.values():
        return f"{base}/individual-dagrl"
    return "not on this scheduler; start it with `dask scheduler --preload dagrl.dashboard`"
