"""``dagrl submit | status | logs | cancel``: training that outlives the login session, and its walltime.

``submit`` checks everything (graph, cluster file, pools, and every job script through
``sbatch --test-only``), creates the run directory, and submits one *driver job* that runs
``dagrl run`` on a compute node; the driver starts the Dask scheduler there and submits the worker
jobs itself. It returns at once with the job id and the run directory, which holds everything the
other commands need:

* ``submit.json``: driver job id, login host, user, command;
* ``cluster.json``: scheduler and dashboard address, worker job ids (written by the driver);
* ``actors.json``: where every role actor runs; ``metrics.jsonl``, ``checkpoints/``, ``logs/``, ``jobs/``.

The driver job outlives its allocation. It asks SLURM for ``SIGUSR1`` ``signal_lead_s`` before its
walltime; the driver then finishes its iteration, checkpoints, stops its worker jobs and queues itself
again (``scontrol requeue``). With ``--requeue`` SLURM also queues it again after a node failure or a
preemption. However it comes back, the job's command (``dagrl run --run-dir RUN``) finds the run in its
directory and continues it from the newest good checkpoint, with iterations that never go back.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dagrl.core.graph import Graph
from dagrl.core.schema import ConfigError, read_yaml
from dagrl.runtime.rundir import RunDir

REQUEUE_ENV = "DAGRL_REQUEUE"
"""Set in a driver job that may queue itself again (``requeue: true``): :func:`requeue_after` then does."""

DRIVER_END_S = 180
"""How long ``dagrl cancel`` waits for the driver job to end before it cancels the worker jobs anyway:
more than SLURM's ``KillWait`` (30 s by default) plus the driver's closing."""

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}


def driver_script(spec: Any, run_dir: Path, workdir: Path) -> str:
    """The sbatch script of the driver job (absolute paths: it runs on another node)."""
    from dagrl.clusters.slurm import job_name, log_directory

    run_dir = run_dir.resolve()
    logs = log_directory(spec, run_dir)
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH -J {job_name(run_dir.name, 'driver')}",
        f"#SBATCH -o {logs}/driver-%j.log",
        f"#SBATCH -e {logs}/driver-%j.log",
        f"#SBATCH -D {workdir.resolve()}",
    ]
    if spec.partition:
        lines.append(f"#SBATCH -p {spec.partition}")
    if spec.account:
        lines.append(f"#SBATCH -A {spec.account}")
    lines += [
        "#SBATCH -n 1",
        f"#SBATCH --cpus-per-task={spec.driver.cores}",
        f"#SBATCH --mem={_slurm_memory(spec.driver.memory)}",
        f"#SBATCH -t {spec.driver.walltime or spec.walltime}",
        "#SBATCH --open-mode=append",  # a requeued job writes on in its log, not over it
    ]
    if spec.signal_lead_s:  # to the batch shell, which is the driver itself (exec below)
        lines.append(f"#SBATCH --signal=B:USR1@{spec.signal_lead_s}")
    lines.append("#SBATCH --requeue" if spec.requeue else "#SBATCH --no-requeue")
    lines += [
        "",
        *spec.prologue,
        "export PYTHONUNBUFFERED=1",
        *([f"export {REQUEUE_ENV}=1"] if spec.requeue else []),
        " ".join(
            shlex.quote(str(a))
            for a in (
                "exec",
                spec.python or sys.executable,
                "-m",
                "dagrl",
                "run",
                run_dir / "config.yaml",
                "--cluster",
                run_dir / "cluster.yaml",
                "--run-dir",
                run_dir,
            )
        ),
        "",
    ]
    return "\n".join(lines)


def requeue_after(summary: dict[str, Any], started_at: int) -> bool:
    """In a driver job stopped by SLURM's walltime warning (``SIGUSR1``), queue the job again, so that it
    continues the run in a new allocation; whether it was queued. Not where the job may not requeue
    (``requeue: false``), nor where this allocation made no progress since iteration ``started_at``
    (a lead time too short for one iteration would otherwise requeue it forever)."""
    import logging

    log = logging.getLogger("dagrl")
    job = os.environ.get("SLURM_JOB_ID")
    if summary.get("signal") != "SIGUSR1" or not job or not os.environ.get(REQUEUE_ENV):
        return False
    if summary["iterations"] <= started_at:
        log.warning("no iteration finished in this allocation: job %s is not queued again", job)
        return False
    out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        log.warning("could not queue job %s again: %s", job, (out.stderr or out.stdout).strip() or "scontrol failed")
        return False
    log.warning("walltime near: job %s queued again; it continues from iteration %d", job, summary["iterations"])
    return True


def _slurm_memory(text: str) -> str:
    from dagrl.clusters.spec import parse_memory

    return f"{max(1, parse_memory(text) // 2**20)}M"


def submit(graph: Graph, graph_path: str, cluster_path: str, dry_run: bool = False) -> int:
    """``dagrl submit``: the driver as a SLURM job of its own, its run directory made here; with
    ``dry_run`` every sbatch script is printed and nothing submitted. ``graph`` is loaded and checked."""
    import yaml

    from dagrl.clusters import slurm
    from dagrl.clusters.spec import SlurmSpec, load_cluster

    spec = load_cluster(cluster_path)
    if not isinstance(spec, SlurmSpec):
        raise ConfigError(cluster_path, "kind", f"dagrl submit needs a cluster of kind slurm, got {spec.kind!r}")
    slurm.assign_pools(spec, graph.active_roles, where=cluster_path)
    run = RunDir.new_path(graph.spec.runs_dir, graph.name)
    run_dir = run.path.resolve()
    scripts = {"driver": driver_script(spec, run_dir, Path.cwd())}
    scripts.update(slurm.worker_scripts(spec, graph, run_dir.name, run_dir))
    if dry_run:
        for name, text in scripts.items():
            print(f"# ---- {name}.sh ({'driver job' if name == 'driver' else 'worker job'}) ----")
            print(text.rstrip())
            print()
        print(f"# dry run: nothing submitted; the run directory would be {run_dir}")
        return 0
    for text in scripts.values():
        slurm.check_submittable(text)
    run.path.mkdir(parents=True)
    run.write_config(graph.to_dict())
    (run.path / "cluster.yaml").write_text(yaml.safe_dump(read_yaml(cluster_path)))
    (run.path / "jobs").mkdir()
    slurm.log_directory(spec, run_dir).mkdir(parents=True, exist_ok=True)
    script = run.path / "jobs" / "driver.sh"
    script.write_text(scripts["driver"])
    job = slurm.sbatch(script)
    run.write_json(
        "submit.json",
        {
            "driver_job": job,
            "login_host": socket.getfqdn(),
            "user": getpass.getuser(),
            "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "graph": str(graph_path),
            "cluster": str(cluster_path),
        },
    )
    print(f"submitted job {job}")
    print(f"run directory {run.path}")
    print(f"  dagrl status {run.path}    dagrl logs {run.path}    dagrl cancel {run.path}")
    return 0


def _open_run(path: str) -> tuple[RunDir, dict[str, Any]]:
    run = RunDir(path)
    submitted = run.read_json("submit.json") if run.path.is_dir() else None
    if submitted is None:
        raise ConfigError(path, "", "not a run directory made by dagrl submit (no submit.json)")
    return run, submitted


def run_jobs(run: RunDir) -> dict[str, dict[str, str]]:
    """Every job of the run still known to squeue: id -> {name, state, time, node}."""
    from dagrl.clusters.slurm import job_name

    prefix = job_name(run.path.resolve().name, "")
    out = _slurm(["squeue", "-h", "-o", "%i|%j|%T|%M|%N"])
    jobs = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5 and parts[1].startswith(prefix):
            jobs[parts[0]] = {"name": parts[1], "state": parts[2], "time": parts[3], "node": parts[4]}
    return jobs


def driver_state(job_id: str) -> str:
    """The driver job's state from squeue, else from scontrol (finished jobs linger there a while)."""
    out = _slurm(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).strip()
    if out:
        return out
    out = _slurm(["scontrol", "show", "job", job_id], check=False)
    for word in out.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return "UNKNOWN"


def _slurm(cmd: list[str], check: bool = True) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError(cmd[0], "", "not found: is SLURM's client on PATH?") from None
    if check and out.returncode != 0:
        raise ConfigError(cmd[0], "", out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    return out.stdout


def cmd_status(args: Any) -> int:
    run, submitted = _open_run(args.run)
    job = submitted["driver_job"]
    state = driver_state(job)
    summary = run.read_json("summary.json")
    print(f"run      {run.path}")
    print(f"driver   job {job}: {state}")
    for jid, j in sorted(run_jobs(run).items()):
        if jid != job:
            print(f"worker   job {jid} {j['name']}: {j['state']} {j['time']} on {j['node'] or '-'}")
    last = run.last_metrics()
    if last is not None:
        ret = last.get("charts/episode_return_mean")
        print(
            f"progress iteration {last.get('iteration')}, {last.get('env_steps')} env steps, "
            f"mean return {'-' if ret is None else f'{ret:.1f}'}"
        )
    else:
        print("progress no metrics yet")
    if summary and summary.get("stop_reason") == "interrupted":
        again = " (queued again: it goes on)" if state in ACTIVE else ""
        print(f"stopped  by {summary.get('signal')} at iteration {summary.get('iterations')}{again}")
    elif summary:
        print(f"finished {summary.get('stop_reason')} after {summary.get('elapsed_s', 0):.0f} s")
    info = run.read_json("cluster.json")
    if info and info.get("dashboard_port") and state in ACTIVE:
        port, node = info["dashboard_port"], info["node"]
        host = info.get("dashboard_host", "127.0.0.1")
        print(f"dashboard http://{host}:{port}/status on {node}")
        jump = f" -J {submitted['user']}@{submitted['login_host']}" if submitted.get("login_host") else ""
        print(f"  tunnel: ssh -N -L 8787:{host}:{port}{jump} {submitted['user']}@{node}")
        print("  then open http://localhost:8787/status (RL page: http://localhost:8787/individual-dagrl)")
    return 0


def driver_log(run: RunDir, job: str) -> Path:
    found = sorted(run.path.glob(f"**/driver-{job}.log"))
    return found[0] if found else run.path / "logs" / f"driver-{job}.log"


def cmd_logs(args: Any) -> int:
    run, submitted = _open_run(args.run)
    job = submitted["driver_job"]
    if args.workers:
        for path in sorted((run.path / "logs").glob("*")):
            if path.name.startswith("driver-"):
                continue
            print(f"==> {path} <==")
            print(path.read_text(errors="replace").rstrip())
        return 0
    path = driver_log(run, job)
    pos = 0
    while True:
        if path.exists():
            with open(path, errors="replace") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        if not args.follow or driver_state(job) not in ACTIVE:
            if path.exists() and os.path.getsize(path) > pos:
                continue  # read what was written before the job ended
            return 0
        time.sleep(1.0)


def cmd_cancel(args: Any) -> int:
    """Cancel the driver job first and wait for it to end: SLURM sends it ``SIGTERM``, on which it finishes
    its iteration, writes a checkpoint and closes its worker jobs (``KillWait`` later SLURM kills what is
    left). Then whatever worker job is still listed. The run can be continued with ``--resume``."""
    run, submitted = _open_run(args.run)
    job = submitted["driver_job"]
    ids = sorted({job, *run_jobs(run)})
    _slurm(["scancel", job], check=False)
    end = time.monotonic() + DRIVER_END_S
    while job in run_jobs(run) and time.monotonic() < end:  # its workers serve its last iteration
        time.sleep(0.5)
    workers = sorted(run_jobs(run))
    if workers:
        _slurm(["scancel", *workers], check=False)
    end = time.monotonic() + 60
    while run_jobs(run) and time.monotonic() < end:
        time.sleep(0.5)
    left = run_jobs(run)
    if left:
        print(f"dagrl: warning: still listed after 60 s: {', '.join(sorted(left))}", file=sys.stderr)
        return 1
    print(f"cancelled {len(ids)} job(s): {', '.join(ids)}")
    summary = run.read_json("summary.json") or {}
    if summary.get("stop_reason") == "interrupted":
        at = summary.get("iterations")
        print(f"checkpoint of iteration {at} written; continue with dagrl run --resume {run.path}")
    return 0
