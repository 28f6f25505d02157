"""The driver loop: iterations, counters, stop conditions, metrics, checkpoints and progress."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dagrl.graph import Graph
from dagrl.runtime.checkpoint import load_checkpoint, non_finite, save_checkpoint
from dagrl.runtime.progress import Progress
from dagrl.runtime.rundir import RunDir
from dagrl.runtime.supervisor import CrashLoop, RoleFailure

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


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a loss became NaN); the last good checkpoint is kept."""


class Trainer:
    """Runs a policy's iterations until a stop condition holds, recording everything in a run dir.

    Examples
    --------
    >>> from dagrl.graph import load_graph
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
    ):
        self.graph, self.policy, self.rundir = graph, policy, rundir
        self.progress = progress or Progress()
        self.stop = graph.spec.stop
        self.counters = Counters()
        self.listeners: list[Any] = []
        """Called with each metrics row and the iteration's StepResult (the dashboard feed, notebooks)."""
        self.recent: collections.deque[float] = collections.deque(maxlen=self.stop.window)
        if resume is not None:
            self.counters = Counters(**resume["counters"])
            self.recent.extend(resume.get("recent", []))
            policy.load_state_dict(resume["roles"])
            rundir.truncate_metrics(self.counters.iteration)

    def mean_return(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None

    def stop_reason(self) -> str | None:
        c, s = self.counters, self.stop
        ret = self.mean_return()
        if s.mean_return is not None and len(self.recent) >= s.window and ret is not None and ret >= s.mean_return:
            return "mean_return"
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
        payload = {"counters": dataclasses.asdict(self.counters), "recent": list(self.recent), "roles": roles}
        save_checkpoint(self.rundir, self.counters.iteration, payload, self.graph.spec.checkpoint.keep)

    def restore(self, failure: RoleFailure) -> None:
        """A learner (single-instance role) failed: replace it and roll the run back to the last checkpoint.

        Every learner-side role is restored together (so a critic and an actor stay consistent);
        replay shards reopen their stores; counters go back to the checkpoint's, never further.
        """
        supervisor = self.policy.supervisor
        if supervisor is None:
            raise TrainingError(str(failure)) from failure.cause
        supervisor.replace(failure)
        ckpt = load_checkpoint(self.rundir.path)
        before = dataclasses.replace(self.counters)
        elapsed = self.counters.elapsed_s
        self.counters = Counters(**{**ckpt["counters"], "elapsed_s": elapsed})
        self.recent.clear()
        self.recent.extend(ckpt.get("recent", []))
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

    def _on_restart(self, event: Any) -> None:
        self.rundir.append_event({"event": "restart", "iteration": self.counters.iteration, **vars(event)})

    def run(self) -> dict[str, Any]:
        """Train until a stop condition; returns (and writes) the run summary."""
        reason = self.stop_reason()
        every = self.graph.spec.checkpoint.every
        start = time.perf_counter() - self.counters.elapsed_s
        if self.policy.supervisor is not None:
            self.policy.supervisor.listeners.append(self._on_restart)
        if not self.rundir.list_checkpoints():
            self.checkpoint()  # iteration 0: what a learner that dies before the first checkpoint goes back to
        with _stop_on_sigint() as stop_requested:
            try:
                while reason is None:
                    try:
                        res = self.policy.step()
                        evaluate = self.graph.spec.evaluate.every
                        if evaluate and (self.counters.iteration + 1) % evaluate == 0:
                            res.metrics.update(self.policy.evaluate())
                        self._count(res, start)
                        last_row = self._row(res)
                        self.rundir.log(last_row)
                        self.progress.update(last_row)
                        for listener in self.listeners:
                            listener(last_row, res)
                        if every and self.counters.iteration % every == 0:
                            self.checkpoint()
                    except RoleFailure as failure:
                        self.restore(failure)
                        continue
                    reason = "interrupted" if stop_requested.is_set() else self.stop_reason()
            except CrashLoop as err:  # from a policy replacing a sampler, or from restore()
                raise TrainingError(f"crash loop: {err}; last good checkpoint kept") from None
            except KeyboardInterrupt:  # a second Ctrl-C: abort mid-iteration, keep the periodic checkpoint
                log.warning("aborted; the last periodic checkpoint is kept")
                raise
            finally:
                self.progress.close()
        try:
            self.checkpoint()
        except (RoleFailure, CrashLoop) as err:
            raise TrainingError(f"final checkpoint: {err}; the last periodic checkpoint is kept") from None
        summary = {
            "stop_reason": reason,
            "iterations": self.counters.iteration,
            "env_steps": self.counters.env_steps,
            "episodes": self.counters.episodes,
            "mean_return": self.mean_return(),
            "elapsed_s": self.counters.elapsed_s,
            "run_dir": str(self.rundir.path),
        }
        try:
            self.rundir.write_summary(summary)
            self.rundir.plot()
        except OSError as err:  # the run itself is done and checkpointed: say what is missing, do not fail
            log.warning("could not write %s (%s); the checkpoints are complete", err.filename or "run files", err)
        return summary

    def _count(self, res: Any, start: float) -> None:
        c = self.counters
        c.iteration += 1
        c.env_steps += res.env_steps
        c.episodes += len(res.episodes)
        c.frames += int(res.metrics.get("perf/frames", 0))
        c.elapsed_s = time.perf_counter() - start
        self.recent.extend(res.episodes.returns.tolist())
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


@contextlib.contextmanager
def _stop_on_sigint() -> Iterator[threading.Event]:
    """First Ctrl-C: finish the iteration, checkpoint, stop. Second: ``KeyboardInterrupt`` at once."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum: int, frame: Any) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        log.warning("Ctrl-C: stopping after this iteration (again to abort)")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)
