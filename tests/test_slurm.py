"""``dagrl submit | status | logs | cancel`` against a real single-node SLURM (tests/slurm_node.py).

The SLURM node has one fake GPU (gres backed by /dev/null): a job that asked for it sees
``SLURM_JOB_GPUS``; the learner still runs on the CPU (no CUDA here) and says so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.slurm

CLUSTER = """kind: slurm
partition: {partition}
walltime: "00:15:00"
interface: lo
tls: true
dashboard_address: 127.0.0.1:0
start_timeout_s: 120
driver: {{cores: 1, memory: 1GiB}}
pools:
  gpu: {{cores: 1, memory: 1GiB, gpus: 1}}
  cpu: {{cores: 1, memory: 1GiB}}
"""

TINY = ["--set", "roles.learner.resources={GPU: 1}", "--set", "checkpoint.every=2"]


def cluster_file(tmp_path: Path, partition: str = "debug") -> str:
    """A cluster file for the test node: loopback, TLS, a GPU pool and a CPU pool."""
    path = tmp_path / f"slurm-{partition}.yaml"
    path.write_text(CLUSTER.format(partition=partition))
    return str(path)


def dagrl(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dagrl", *args], capture_output=True, text=True, timeout=timeout, env=os.environ, cwd=cwd
    )


def submit(
    tmp_path: Path, *extra: str, partition: str = "debug", graph: str = "graphs/ppo-cartpole-sync.yaml"
) -> tuple[subprocess.CompletedProcess, Path | None]:
    out = dagrl(
        "submit",
        graph,
        "--cluster",
        cluster_file(tmp_path, partition),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        *TINY,
        *extra,
    )
    match = re.search(r"run directory (\S+)", out.stdout)
    return out, Path(match.group(1)) if match else None


def status(run: Path) -> str:
    out = dagrl("status", str(run))
    assert out.returncode == 0, out.stderr
    return out.stdout


def driver_state(run: Path) -> str:
    return re.search(r"driver +job \d+: (\S+)", status(run)).group(1)


NOT_ENDED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")
"""The driver job's states before its last: COMPLETING while SLURM ends the job's processes."""


def driver_end(run: Path, timeout: float = 240) -> str:
    """The driver job's state once it has ended."""
    return wait_for(lambda: (s := driver_state(run)) not in NOT_ENDED and s, timeout, "end")


def normalise(text: str, run: Path, scheduler: str | None = None) -> str:
    text = text.replace(str(run), "RUN").replace(run.name, "RUN")
    return text.replace(scheduler, "SCHEDULER") if scheduler else text


def dry_run_scripts(stdout: str) -> dict[str, str]:
    parts = re.split(r"^# ---- (\S+)\.sh \(.*\) ----$", stdout, flags=re.M)
    scripts = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    scripts = {k: v.split("\n# dry run:")[0].strip() for k, v in scripts.items()}
    return scripts


def test_submit_runs_learner_on_gpu_job_and_samplers_on_cpu_jobs(slurm, tmp_path, monkeypatch):
    # as a process that ran a plain LocalCluster leaves it (its nannies set it in their own process): the
    # jobs inherit the submitter's environment, and the workers must run without it all the same
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    dry = dagrl(
        "submit",
        "graphs/ppo-cartpole-sync.yaml",
        "--cluster",
        cluster_file(tmp_path),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        *TINY,
        "--set",
        "stop.iterations=4",
        "--dry-run",
    )
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "a dry run wrote files"
    dry_run = Path(re.search(r"run directory would be (\S+)", dry.stdout).group(1))
    planned = dry_run_scripts(dry.stdout)
    assert set(planned) == {"driver", "learner-0", "sampler-0", "sampler-1"}  # worker jobs named after roles
    assert "--gres=gpu:1" in planned["learner-0"] and "--gres" not in planned["sampler-0"]

    t0 = time.monotonic()
    out, run = submit(tmp_path, "--set", "stop.iterations=4")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 30, "submit must return at once, not wait for training"
    assert re.search(r"submitted job \d+", out.stdout)

    state = driver_end(run)
    log = dagrl("logs", str(run), "--no-follow").stdout
    assert state == "COMPLETED", f"driver ended {state}:\n{log}"
    assert "done (iterations)" in log

    # metrics and a checkpoint, written by the driver job into the run directory
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.pt"))
    assert "iteration 4" in status(run)

    # where each role really ran, as its own process saw it
    actors = json.loads((run / "actors.json").read_text())
    submitted = json.loads((run / "submit.json").read_text())
    jobs = {a["env"]["SLURM_JOB_ID"] for a in actors}
    assert len(jobs) == 3 and submitted["driver_job"] not in jobs, "one job per actor, none in the driver's job"
    for a in actors:
        if a["role"] == "learner":
            assert a["env"]["SLURM_JOB_NAME"].endswith("-learner-0") and a["env"]["SLURM_JOB_GPUS"] == "0", a
        else:
            name = a["env"]["SLURM_JOB_NAME"]
            assert name.endswith(f"-sampler-{a['index']}") and "SLURM_JOB_GPUS" not in a["env"], a
        assert a["address"].startswith("tls://"), "TLS was asked for"
        assert "MALLOC_TRIM_THRESHOLD_" not in a["env"], "torch runs ~2 x slower with Dask's trim threshold"

    # --dry-run printed exactly what was submitted (modulo run directory and scheduler address)
    scheduler = json.loads((run / "cluster.json").read_text())["scheduler"]
    for name, text in planned.items():
        sent = (run / "jobs" / f"{name}.sh").read_text().strip()
        sent = normalise(sent, run, scheduler)
        expected = normalise(text, dry_run).replace("tls://SCHEDULER-ADDRESS:PORT", "SCHEDULER")
        assert sent == expected, f"{name}.sh differs from the dry run"
    assert not slurm.jobs(), "jobs left behind after a finished run"


def _restart_now(job: str, restarts: int) -> None:
    """Wait for the driver job to be queued again (its ``restart_cnt``), then let it start in 2 s: SLURM
    holds a requeued job back for 120 s (its BeginTime), which is a wait on a real cluster and only time here."""

    def queued() -> bool:
        out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        count = re.search(r"Restarts=(\d+)", out)
        return bool(count) and int(count.group(1)) >= restarts and "JobState=PENDING" in out

    wait_for(queued, 120, f"job {job} queued again ({restarts})")
    # not at once: slurmd refuses a credential issued in the second it revoked the job's last one
    # ("Killing non-startable batch job: Job credential revoked"), and the job would end there
    begin = subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+2"], capture_output=True, text=True)
    assert begin.returncode == 0, begin.stderr


def _iterations(run: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_walltime_warning_and_preemption_requeue_the_driver_and_the_run_reaches_its_target(slurm, tmp_path):
    """SLURM's two ways to stop a driver job and start it again: the walltime warning (``SIGUSR1`` to the
    batch shell, as ``--signal=B:USR1@N`` delivers it) queues the job again after a checkpoint; a preemption
    (``scontrol requeue``: ``SIGTERM``, then the job back in the queue) does too. Each start continues the run
    where it stopped, and the third trains it to the graph's own target (mean return 475)."""
    out, run = submit(tmp_path, "--set", "stop.wall_time_s=900")
    assert out.returncode == 0, out.stderr
    job = json.loads((run / "submit.json").read_text())["driver_job"]
    script = (run / "jobs" / "driver.sh").read_text()
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --requeue" in script

    wait_for(lambda: (run / "metrics.jsonl").exists() and _iterations(run)[-1] >= 3, 120, "three iterations")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)  # the walltime warning
    _restart_now(job, 1)
    first = json.loads((run / "summary.json").read_text())
    assert (first["signal"], first["stop_reason"]) == ("SIGUSR1", "interrupted")
    assert f"ckpt-{first['iterations']:08d}.pt" in {p.name for p in (run / "checkpoints").iterdir()}

    wait_for(lambda: _iterations(run)[-1] >= first["iterations"] + 3, 180, "iterations after the first restart")
    subprocess.run(["scontrol", "requeue", job], check=True)  # a preemption
    _restart_now(job, 2)
    second = json.loads((run / "summary.json").read_text())
    assert second["signal"] == "SIGTERM" and second["iterations"] > first["iterations"]

    wait_for(lambda: _iterations(run)[-1] >= second["iterations"] + 1, 180, "iterations after the second restart")
    text = status(run)
    assert len(re.findall(r"worker +job \d+ .*: RUNNING", text)) == 3, text  # the first allocations' are gone

    state = driver_end(run, timeout=300)
    log = dagrl("logs", str(run), "--no-follow").stdout
    assert state == "COMPLETED", f"driver ended {state}:\n{log}"
    last = json.loads((run / "summary.json").read_text())
    assert last["stop_reason"] == "mean_return" and last["mean_return"] >= 475, last
    iterations = _iterations(run)
    assert iterations == list(range(1, last["iterations"] + 1)), "iterations went back, or one is missing"
    resumes = [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["event"] == "resume"]
    assert [(e["iteration"], e["slurm_restarts"]) for e in resumes] == [
        (first["iterations"], 1),
        (second["iterations"], 2),
    ]
    assert f"SLURM started job {job} again (restart 2)" in log, log
    assert "queued again" in log
    assert not slurm.jobs(), "jobs left behind after a finished run"


def test_status_and_cancel_a_running_job_which_checkpoints_its_last_iteration(slurm, tmp_path):
    """``dagrl cancel`` lets the driver checkpoint before the worker jobs go (``SIGTERM`` first)."""
    out, run = submit(tmp_path, "--set", "stop.iterations=100000", "--set", "stop.wall_time_s=600")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: (run / "metrics.jsonl").exists() and _iterations(run)[-1] >= 2, 120, "two iterations")
    text = status(run)
    assert re.search(r"driver +job \d+: RUNNING", text), text
    assert re.search(r"progress iteration \d+", text)
    assert re.search(r"ssh -N -L 8787:127\.0\.0\.1:\d+ ", text), text
    assert len(re.findall(r"worker +job \d+ .*: RUNNING", text)) == 3, text

    cancel = dagrl("cancel", str(run), timeout=300)
    assert cancel.returncode == 0, cancel.stderr
    assert not slurm.jobs(), "cancel left jobs behind"
    assert driver_state(run) == "CANCELLED"
    last = json.loads((run / "summary.json").read_text())
    assert last["signal"] == "SIGTERM" and f"checkpoint of iteration {last['iterations']} written" in cancel.stdout
    assert f"ckpt-{last['iterations']:08d}.pt" in {p.name for p in (run / "checkpoints").iterdir()}
    assert _iterations(run) == list(range(1, last["iterations"] + 1))


def test_bad_partition_is_one_line_from_slurm_and_leaves_nothing(slurm, tmp_path):
    out, run = submit(tmp_path, "--set", "stop.iterations=2", partition="nosuchpartition")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Invalid partition name specified" in lines[0]
    assert run is None and not (tmp_path / "runs").exists()
    assert not slurm.jobs()


def test_a_cancelled_worker_job_is_resubmitted_and_the_run_finishes(slurm, tmp_path):
    """SLURM preemption, as far as a run can tell: a worker's job ends under it."""
    out, run = submit(tmp_path, "--set", "stop.iterations=200", "--set", "stop.mean_return=null")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: (run / "actors.json").exists() and (run / "metrics.jsonl").exists(), 120, "training")
    sampler = next(a for a in json.loads((run / "actors.json").read_text()) if a["role"] == "sampler")
    subprocess.run(["scancel", sampler["env"]["SLURM_JOB_ID"]], check=True)

    state = driver_end(run)
    log = dagrl("logs", str(run), "--no-follow").stdout
    assert state == "COMPLETED", log
    assert "done (iterations)" in log
    assert re.search(r"worker sampler-\d \(job \d+\) left the cluster; resubmitted its job as sampler-\d-r1", log), log
    (restart,) = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert (restart["role"], restart["kind"]) == ("sampler", "lost")
    assert restart["new_worker"] != sampler["address"]
    assert sorted(p.name for p in (run / "jobs").glob("sampler-*-r1.sh")), "the new job's script is kept"
    assert not slurm.jobs()


def test_central_inference_on_a_tls_cluster_speaks_tls_too(slurm, tmp_path):
    """The samplers' per-step socket to the inference role is not a plain-TCP hole in a TLS cluster."""
    out, run = submit(tmp_path, "--set", "stop.iterations=3", graph="graphs/ppo-cartpole-seed.yaml")
    assert out.returncode == 0, out.stderr
    state = driver_end(run)
    log = dagrl("logs", str(run), "--no-follow").stdout
    assert state == "COMPLETED", log
    assert re.search(r"inference role: 2 samplers act through [\d.]+:\d+ \(TLS\)", log), log
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["inference/batch_rows"] > 0 for r in rows), rows  # it acted, over TLS
    assert not slurm.jobs()


def test_a_sweep_runs_its_trials_in_slurm_jobs_of_the_pool_asked_for(slurm, tmp_path):
    out = tmp_path / "sweep"
    done = dagrl(
        "sweep", "ppo-cartpole-single", "--cluster", cluster_file(tmp_path), "--pool", "cpu",
        "--grid", "hyperparameters.lr=1e-3,3e-3", "--seeds", "1", "--set", "stop.iterations=3", "--out", str(out),
        "--quiet", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| lr=1e-3 | 1 | 0 |" in done.stdout and "| lr=3e-3 | 1 | 0 |" in done.stdout
    scripts = sorted(p.name for p in (out / "jobs").glob("trial-*.sh"))
    assert scripts == ["trial-0.sh", "trial-1.sh"]  # one job per trial
    assert all("--gres" not in (out / "jobs" / s).read_text() for s in scripts)  # the cpu pool, not the gpu one
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert sorted(r["summary"]["iterations"] for r in records) == [3, 3]
    assert not slurm.jobs()


def test_an_algorithm_of_the_users_own_beside_the_graph_runs_in_slurm_jobs(slurm, tmp_path):
    """A user's module in the directory ``dagrl submit`` runs from (``algorithm: my_a2c``, not installed
    anywhere): the driver job starts there, and so do the worker jobs it submits, whose processes import
    the module as the driver does."""
    work = tmp_path / "work"
    work.mkdir()
    repo = Path(__file__).resolve().parent.parent
    (work / "my_a2c.py").write_text((repo / "examples" / "a2c.py").read_text())
    graph = (repo / "examples" / "a2c-cartpole.yaml").read_text()
    graph = graph.replace("algorithm: examples.a2c", "algorithm: my_a2c")
    assert "algorithm: my_a2c" in graph
    (work / "my-graph.yaml").write_text(graph)
    out = dagrl(
        "submit", "my-graph.yaml", "--cluster", cluster_file(tmp_path), "--set", f"runs_dir={tmp_path / 'runs'}",
        "--set", "stop.iterations=3", "--set", "checkpoint.every=3", cwd=work,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    run = Path(re.search(r"run directory (\S+)", out.stdout).group(1))
    state = driver_end(run)
    log = dagrl("logs", str(run), "--no-follow").stdout
    assert state == "COMPLETED", log
    assert "done (iterations)" in log
    actors = json.loads((run / "actors.json").read_text())
    assert {a["role"] for a in actors} == {"sampler", "learner"}
    assert len({a["env"]["SLURM_JOB_ID"] for a in actors}) == 3  # each in a worker job of its own
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3] and "losses/policy" in rows[-1]  # A2C's own metrics
    assert not slurm.jobs()
