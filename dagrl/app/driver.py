"""The driver loop: iterations, counters, stop conditions, metrics, checkpoints and progress.

Evaluation: design notes
------------------------

An algorithm may define one ``@evaluation`` function, traced like the iteration. Roles that only it uses
(``evaluator``) are *evaluation-only*: started only when the graph sets ``evaluate.every``, replaced in place when
they fail (never a rollback). The driver runs the evaluation graph in lockstep between two iterations
(``Policy.evaluate``), so a learner's ``publish`` never overlaps its ``update``, and adds its ``eval/*`` metrics to
that iteration's row. It blocks training while it runs.

``evaluate: {every: N, concurrent: true}`` runs it beside training instead (``runtime/driver.py``, ``Evaluation``):
after iteration N the driver starts the same evaluation graph from a thread of its own and goes on with
iteration N+1. Its ``publish`` is a fragment on the learner like any other, so it takes the learner host's lock
and sees the weights of one whole update (those after iteration N, or a later one if the learner's worker had
queued the next update first); the ``evaluate`` fragment runs on the evaluator's own worker, so training waits
for neither. The row of the iteration during which it finished gets its ``eval/*`` metrics and `eval/iteration:
N``; one runs at a time (a due one is skipped while the previous runs, counted in ``eval/skipped`); one still
running at the stop is waited for and written to ``summary.json`` as ``eval``. Under ``single`` the thread shares
the process, and training's numbers stay bit-identical to a run without evaluation (tested).

After a run, ``dagrl eval RUN`` (``dagrl/app/evaluate.py``) runs the same evaluation graph on a checkpoint with no
cluster: the run's ``config.yaml`` is re-resolved under ``single`` with evaluation on, only the evaluation graph's
roles are built (in-process, on the CPU) and loaded from the checkpoint, and the executor runs `publish ->
evaluate` once. The evaluator keeps the returns and lengths of the episodes it played
(``EpisodeRunner.last_returns``), which the command prints and writes to ``RUN/eval/``. With ``--video``, its one
env is wrapped in gymnasium's ``RecordVideo`` inside the sync vector env, so each file is one whole episode: the
vector env resets that env right after its last step, which closes the file with the last frame in it (a
vector-level recorder in same-step autoreset mode loses it).

``dagrl export RUN`` (``dagrl/app/export.py``) builds the same roles the same way, but its ``EpisodeRunner`` is put
in capture mode: the ``evaluate`` fragment loads the weights and hands over its action function (argmax of Q,
the most likely action, the squashed mean) instead of playing. That function, with its network and the
clipping to a ``Box`` space, is exported with ``torch.export`` (batch dimension dynamic, observations in the
space's own dtype), saved with a ``dagrl.json`` of provenance, read back and compared with the evaluator on
observations from the env. No algorithm has an export path of its own: what the evaluator acts with is, by
construction, what is exported.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dagrl.app.progress import Progress
from dagrl.app.signals import StopRequest, stop_signals
from dagrl.core.graph import Graph
from dagrl.runtime.checkpoint import load_checkpoint, non_finite, save_checkpoint
from dagrl.runtime.rundir import RunDir
from dagrl.runtime.supervisor import CrashLoop, RoleFailure, TrainingError

if TYPE_CHECKING:  # the runtime never imports the policies; they hand themselves in
    from dagrl.policies.base import Policy

log = logging.getLogger("dagrl")


@dataclass
class Counters:
    iteration: int = 0
    env_steps: int = 0
    episodes: int = 0
    frames: int = 0
    """Samples consumed by gradient updates."""
    elapsed_s: float = 0.0
    """Training seconds, summed over resumed sessions."""


class Trainer:
    """Runs a policy's iterations until a stop condition holds, recording everything in a run dir.

    Examples
    --------
    >>> from dagrl.app.graphs import load_graph
    >>> from dagrl.policies import build_policy
    >>> g = load_graph("graphs/ppo-cartpole-single.yaml", ["stop.iterations=2"])
    >>> rd = RunDir.create("/tmp/dagrl-doctest", g.name)
    >>> Trainer(g, build_policy(g), rd, progress=Progress(enabled=False)).run()["iterations"]
    2
    """

    def __init__(
        self,
        graph: Graph,
        policy: Policy,
        rundir: RunDir,
        *,
        resume: dict[str, Any] | None = None,
        progress: Progress | None = None,
        curve_later: bool = False,
        stop: StopRequest | None = None,
    ):
        self.graph, self.policy, self.rundir = graph, policy, rundir
        self.stop_request = stop
        """Set by a stop signal (:mod:`dagrl.app.signals`); ``None``: :meth:`run` listens for them itself."""
        self.curve_later = curve_later
        """Write ``curve.html`` from a process of its own after this one exits (the command line's exit
        does not wait on bokeh); else before :meth:`run` returns."""
        self.progress = progress or Progress()
        self.stop = graph.spec.stop
        self.counters = Counters()
        self._most_env_steps = 0
        """The most env steps one iteration has counted (what :meth:`horizon` expects of the next at
        most: a streaming policy's iterations count what arrived, which varies)."""
        self.listeners: list[Any] = []
        """Called with each metrics row and the iteration's StepResult (the dashboard feed, notebooks)."""
        self.before_summary: list[Callable[[], None]] = []
        """Called once the final checkpoint is written and before ``summary.json`` is: what the run
        directory must hold once a watcher sees that the run has ended (``actors.json``'s final account)."""
        self.after_restart: list[Callable[[], None]] = []
        """Called from the training loop once after the iterations in which supervision replaced a role
        (``actors.json`` rewritten: where the replacement runs)."""
        self._restarted = False
        self.recent: collections.deque[float] = collections.deque(maxlen=self.stop.window)
        self.last_eval: float | None = None
        """``eval/return_mean`` of the newest evaluation that finished (``stop.eval_return``)."""
        self.evaluation = Evaluation(policy, graph.spec.evaluate)
        if resume is not None:
            self.counters = Counters(**resume["counters"])
            self.recent.extend(resume.get("recent", []))
            self.last_eval = resume.get("last_eval")
            policy.load_state_dict(resume["roles"])
            policy.resumed(self.counters.env_steps)
            rundir.truncate_metrics(self.counters.iteration)

    def mean_return(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None

    def stop_reason(self) -> str | None:
        c, s = self.counters, self.stop
        ret = self.mean_return()
        if s.mean_return is not None and len(self.recent) >= s.window and ret is not None and ret >= s.mean_return:
            return "mean_return"
        if s.eval_return is not None and self.last_eval is not None and self.last_eval >= s.eval_return:
            return "eval_return"
        if s.env_steps is not None and c.env_steps >= s.env_steps:
            return "env_steps"
        if s.iterations is not None and c.iteration >= s.iterations:
            return "iterations"
        if s.wall_time_s is not None and c.elapsed_s >= s.wall_time_s:
            return "wall_time"
        return None

    def checkpoint(self) -> None:
        """Write a checkpoint, unless some weight is NaN or inf: then stop, keeping the last good one."""
        roles = self.policy.state_dict()
        bad = [f"{role}.{key}" for role, states in roles.items() for key in non_finite(states)]
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise TrainingError(
                f"iteration {self.counters.iteration}: non-finite weights in {shown}; last good checkpoint kept"
            )
        payload = {
            "counters": dataclasses.asdict(self.counters),
            "recent": list(self.recent),
            "last_eval": self.last_eval,
            "roles": roles,
        }
        save_checkpoint(self.rundir, self.counters.iteration, payload, self.graph.spec.checkpoint.keep)

    def _first_checkpoint(self) -> None:
        """The checkpoint of iteration 0, what a learner that dies before the first periodic one goes back
        to. A learner whose worker is lost before it is written is replaced by a fresh one: nothing is
        trained yet, so nothing is lost."""
        while True:
            try:
                return self.checkpoint()
            except RoleFailure as failure:
                if self.policy.supervisor is None:
                    raise TrainingError(str(failure)) from failure.cause
                try:
                    self.policy.recovery.renew(failure)
                except CrashLoop as err:
                    raise TrainingError(f"crash loop: {err}") from None
                log.warning("%s[%d] replaced before the first checkpoint", failure.handle.role, failure.handle.index)

    def restore(self, failure: RoleFailure) -> None:
        """A learner (single-instance role) failed: replace it and roll the run back to the last checkpoint.

        Every learner-side role is restored together (so a critic and an actor stay consistent);
        replay shards reopen their stores; counters go back to the checkpoint's, never further.
        """
        supervisor = self.policy.supervisor
        if supervisor is None:
            raise TrainingError(str(failure)) from failure.cause
        self.policy.recovery.renew(failure)
        ckpt = load_checkpoint(self.rundir.path)
        before = dataclasses.replace(self.counters)
        elapsed = self.counters.elapsed_s
        self.counters = Counters(**{**ckpt["counters"], "elapsed_s": elapsed})
        self.recent.clear()
        self.recent.extend(ckpt.get("recent", []))
        self.last_eval = ckpt.get("last_eval")
        roles = self.graph.algorithm.roles
        self.policy.restore({r: s for r, s in ckpt["roles"].items() if not roles[r].many})
        self.rundir.truncate_metrics(self.counters.iteration)
        log.warning(
            "%s[%d] restored from the checkpoint of iteration %d (%d iterations, %d env steps redone)",
            failure.handle.role,
            failure.handle.index,
            self.counters.iteration,
            before.iteration - self.counters.iteration,
            before.env_steps - self.counters.env_steps,
        )
        self.rundir.append_event(
            {
                "event": "rollback",
                "role": failure.handle.role,
                "to_iteration": self.counters.iteration,
                "iterations_lost": before.iteration - self.counters.iteration,
                "env_steps_lost": before.env_steps - self.counters.env_steps,
            }
        )

    def _call_after_restart(self) -> None:
        if self._restarted:
            self._restarted = False
            for call in self.after_restart:
                call()

    def _on_restart(self, event: Any) -> None:
        record = dict(vars(event))
        self.rundir.append_event({"event": record.pop("action"), "iteration": self.counters.iteration, **record})
        self._restarted = True  # the hooks run in the training loop: this may be the supervisor's thread

    def run(self) -> dict[str, Any]:
        """Train until a stop condition; returns (and writes) the run summary."""
        reason = self.stop_reason()
        start = time.perf_counter() - self.counters.elapsed_s
        supervisor = self.policy.supervisor
        if supervisor is not None and self._on_restart not in supervisor.listeners:
            supervisor.listeners.append(self._on_restart)
        if not self.rundir.list_checkpoints():
            self._first_checkpoint()
        stopped_at = self._stop_row() if reason is not None else None
        with contextlib.ExitStack() as stack:
            stop = self.stop_request or stack.enter_context(stop_signals(self.graph.spec.checkpoint.stop_wait_s))
            if reason is None and stop.is_set():  # asked to stop while the cluster started
                reason, stopped_at = "interrupted", self._stop_row()
            try:
                while reason is None or self.policy.pending:  # an iteration submitted ahead still counts
                    try:
                        self.policy.horizon = self.horizon()
                        res = self.policy.step(ahead=reason is None and self.policy.horizon > 1)
                        self._record(res, start)
                    except RoleFailure as failure:
                        self.restore(failure)
                        reason = None  # rolled back: the stop is decided again
                    if reason is None:
                        reason = "interrupted" if stop.is_set() else self.stop_reason()
                        stopped_at = self._stop_row() if reason is not None else None
            except CrashLoop as err:  # from a policy replacing a sampler, or from restore()
                raise TrainingError(f"crash loop: {err}; last good checkpoint kept") from None
            except KeyboardInterrupt as err:  # a second signal: abort mid-iteration, keep the periodic checkpoint
                why = f" ({err.why})" if hasattr(err, "why") else ""
                log.warning("aborted%s; the last periodic checkpoint is kept", why)
                raise
            finally:
                self.progress.close()
            stop.finished.set()  # what is left is bounded: the final checkpoint and the summary
        final_eval = self.evaluation.close(wait_s=5.0 if stop.is_set() else 300.0)
        try:
            self.checkpoint()
        except RoleFailure as failure:  # a learner lost after the last iteration: train on from the checkpoint
            try:
                self.restore(failure)
            except CrashLoop as err:
                raise TrainingError(f"final checkpoint: {err}; the last periodic checkpoint is kept") from None
            self.evaluation = Evaluation(self.policy, self.graph.spec.evaluate)
            return self.run()
        except CrashLoop as err:
            raise TrainingError(f"final checkpoint: {err}; the last periodic checkpoint is kept") from None
        summary = {
            "stop_reason": reason,
            "iterations": self.counters.iteration,
            "env_steps": self.counters.env_steps,
            "episodes": self.counters.episodes,
            "mean_return": self.mean_return(),
            "eval_return": self.last_eval,
            "elapsed_s": self.counters.elapsed_s,
            "stopped_at": stopped_at,
            "run_dir": str(self.rundir.path),
        }
        if reason == "interrupted":
            summary["signal"] = stop.name  # SIGINT, SIGTERM or SIGUSR1: what the exit code (128 + it) says
        if final_eval:
            summary["eval"] = final_eval  # an evaluation still running at the stop, waited for
        self._call_after_restart()  # a replacement after the last iteration
        for call in self.before_summary:
            call()
        try:
            self.rundir.write_summary(summary)
            if self.curve_later:
                self.rundir.plot_later()
            else:
                self.rundir.plot()
        except OSError as err:  # the run itself is done and checkpointed: say what is missing, do not fail
            log.warning("could not write %s (%s); the checkpoints are complete", err.filename or "run files", err)
        return summary

    def _stop_row(self) -> dict[str, Any]:
        """The counters when the stop condition held. An iteration submitted ahead of that moment still
        finishes and is counted, so the summary's totals (and its ``mean_return`` window) can move past
        these: a ``mean_return`` stop at 475 may end with a window of 470."""
        c = self.counters
        return {
            "iteration": c.iteration,
            "env_steps": c.env_steps,
            "mean_return": self.mean_return(),
            "eval_return": self.last_eval,
            "elapsed_s": c.elapsed_s,
        }

    def _record(self, res: Any, start: float) -> None:
        """Count, log and show one finished iteration; checkpoint when one is due."""
        evaluated = self.evaluation.after(self.counters.iteration + 1)
        res.metrics.update(evaluated)
        self._count(res, start)
        if "eval/return_mean" in evaluated:
            self.last_eval = evaluated["eval/return_mean"]
        elif self.stop.eval_return is not None and any(k != "eval/skipped" for k in evaluated):
            raise TrainingError(
                f"stop.eval_return: the evaluation of {self.graph.spec.algorithm} returned no eval/return_mean "
                f"(it returned {', '.join(sorted(evaluated))})"
            )
        row = self._row(res)
        self.rundir.log(row)
        self._call_after_restart()
        self.progress.update(row)
        for listener in self.listeners:
            listener(row, res)
        every = self.graph.spec.checkpoint.every
        if every and self.counters.iteration % every == 0:
            self.checkpoint()

    def horizon(self) -> int:
        """How many iterations, the next one included, may end before the driver must act between two:
        a checkpoint, a blocking evaluation, or a stop it can foresee (``iterations``; ``env_steps``, at
        the largest iteration's count so far). A policy whose learner runs without the driver (``async``)
        runs no further, so a checkpoint holds exactly the iterations its counters say; above 1, a lockstep
        policy may submit the next iteration with this one. A stop it cannot foresee (``mean_return``,
        ``eval_return``, ``wall_time_s``, Ctrl-C) lets the iterations already under way finish, and counts them."""
        c, s = self.counters, self.stop
        ends = []
        every = self.graph.spec.checkpoint.every
        if every:
            ends.append(every - c.iteration % every)
        if self.evaluation.pool is None and self.evaluation.every:
            ends.append(self.evaluation.every - c.iteration % self.evaluation.every)
        if s.iterations is not None:
            ends.append(s.iterations - c.iteration)
        if s.env_steps is not None:
            most = self._most_env_steps
            ends.append(math.ceil((s.env_steps - c.env_steps) / most) if most > 0 else 1)
        return max(1, min(ends, default=1 << 30))

    def _count(self, res: Any, start: float) -> None:
        c = self.counters
        c.iteration += 1
        c.env_steps += res.env_steps
        self._most_env_steps = max(self._most_env_steps, res.env_steps)
        c.episodes += len(res.episodes)
        c.frames += int(res.metrics.get("perf/frames", 0))
        if self.policy.supervisor is not None:
            self.policy.supervisor.env_steps = c.env_steps  # where a replacement's schedules start
        c.elapsed_s = time.perf_counter() - start
        self.recent.extend(res.episodes.window_returns().tolist())
        bad = [k for k, v in res.metrics.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise TrainingError(f"iteration {c.iteration}: non-finite {', '.join(bad)}; last good checkpoint kept")

    def _row(self, res: Any) -> dict[str, Any]:
        c = self.counters
        row: dict[str, Any] = {
            "iteration": c.iteration,
            "env_steps": c.env_steps,
            "episodes": c.episodes,
            "time_s": round(c.elapsed_s, 4),
            "charts/episode_return_mean": self.mean_return(),
        }
        if len(res.episodes):
            row["charts/episode_return"] = float(np.mean(res.episodes.returns))
            row["charts/episode_length"] = float(np.mean(res.episodes.lengths))
        # throughput: env steps per second of wall time, as the row's own env_steps and time_s give it
        row["perf/env_steps_per_s"] = c.env_steps / c.elapsed_s if c.elapsed_s > 0 else 0.0
        # rates per busy second: of the iteration's sampling, and of its update (frames learnt from)
        row["perf/sample_hz"] = res.env_steps / res.sample_time if res.sample_time > 0 else 0.0
        frames = res.metrics.get("perf/frames", 0.0)
        row["perf/update_hz"] = frames / res.update_time if res.update_time > 0 else 0.0
        row["perf/sample_time_s"] = res.sample_time
        row["perf/update_time_s"] = res.update_time
        row.update(res.metrics)
        if self.policy.supervisor is not None:
            restarts = self.policy.supervisor.restarts()
            row["sup/restarts"] = float(sum(restarts.values()))
            for role, n in sorted(restarts.items()):
                row[f"sup/restarts/{role}"] = float(n)
        return row


class Evaluation:
    """When the algorithm's ``@evaluation`` runs: between iterations (blocking), or beside training
    in a thread of the driver (``evaluate.concurrent``), its fragments on their own roles' hosts.

    A concurrent evaluation's ``publish`` takes the learner's lock like any fragment, so it sees the
    weights of one whole update; the evaluator is its own role, so training never waits for it.
    """

    def __init__(self, policy: Policy, spec: Any):
        self.policy, self.every, self.concurrent = policy, spec.every, spec.concurrent
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="dagrl-eval") if self.every and self.concurrent else None
        self.running: tuple[int, Future] | None = None
        self.skipped = 0

    def due(self, iteration: int) -> bool:
        """Whether an evaluation is due after ``iteration``."""
        return bool(self.every) and iteration % self.every == 0

    def blocks(self, iteration: int) -> bool:
        """Whether an evaluation runs between ``iteration`` and the next, training waiting for it."""
        return self.pool is None and self.due(iteration)

    def after(self, iteration: int) -> dict[str, float]:
        """Metrics for the row of ``iteration``, which just finished: an evaluation run now (blocking)
        or a concurrent one that finished meanwhile; starts a concurrent one when it is due."""
        due = self.due(iteration)
        if self.pool is None:
            return self.policy.evaluate() if due else {}
        out = self._finished()
        if due:
            if self.running is None:
                self.running = (iteration, self.pool.submit(self.policy.evaluate))
            else:
                self.skipped += 1
                log.debug("evaluation due at iteration %d skipped: the previous one still runs", iteration)
        out["eval/skipped"] = float(self.skipped)
        return out

    def _finished(self, wait_s: float = 0.0) -> dict[str, float]:
        if self.running is None:
            return {}
        iteration, future = self.running
        try:
            metrics = future.result(timeout=wait_s)
        except FutureTimeout:
            return {}
        except Exception as err:  # a learner lost under it: the training loop handles that learner itself
            log.warning("evaluation of iteration %d failed: %s", iteration, err)
            metrics = {}
        self.running = None
        return {**metrics, "eval/iteration": float(iteration)} if metrics else {}

    def close(self, wait_s: float = 300.0) -> dict[str, float]:
        """At the end of training: wait for a running evaluation and return its metrics."""
        if self.pool is None:
            return {}
        out = self._finished(wait_s)
        self.pool.shutdown(wait=False, cancel_futures=True)
        return out
