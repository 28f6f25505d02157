"""Role actors on SLURM: per-role pools of worker jobs around one Dask scheduler (dask-jobqueue).

Each role of the graph goes to the pool its resource annotations fit (GPU roles to a pool with
``gpus``, the rest to CPU pools first), and each role replica gets a job of its own: one actor per
worker, as on a LocalCluster. Pool workers advertise ``GPU=N`` and a ``pool-<name>`` resource, and
the role is given that resource, so dagrl's placement puts it on its pool and nowhere else.

Every job script goes through :func:`worker_job`, both for ``--dry-run`` and for the real
submission, and every script submitted is kept in ``<run dir>/jobs/``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dask_jobqueue.slurm import SLURMJob

from dagrl.clusters.local import QUIET_CONFIG, STARTED_WORKER_ENVIRON, config_environ, quiet_here
from dagrl.clusters.spec import PoolSpec, SlurmError, SlurmSpec
from dagrl.core.graph import Graph
from dagrl.core.schema import ConfigError
from dagrl.runtime.rundir import RunDir
from dagrl.runtime.workers import workers as live_workers

log = logging.getLogger("dagrl")

SCHEDULER_PLACEHOLDER = "tls://SCHEDULER-ADDRESS:PORT"


def pool_resource(pool: str) -> str:
    return f"pool-{pool}"


def assign_pools(spec: SlurmSpec, roles: dict[str, Any], where: str = "cluster") -> dict[str, str]:
    """Map each role to the pool its resources fit, or raise :class:`ConfigError` naming the role.

    A GPU role takes the pool with the fewest GPUs that still has enough; a CPU role prefers pools
    without GPUs; ``CPU`` is checked against the pool's cores, other resources must be advertised.
    """
    out = {}
    for role, rspec in roles.items():
        need_gpu = float(rspec.resources.get("GPU", 0))
        fits = [name for name, pool in spec.pools.items() if _fits(pool, rspec.resources)]
        if not fits:
            shapes = "; ".join(f"{n}: {_describe(p)}" for n, p in spec.pools.items())
            raise ConfigError(
                where,
                "pools",
                f"role {role} needs {_resources(rspec.resources)} and no pool offers it (pools: {shapes})",
            )
        if need_gpu:
            out[role] = min(fits, key=lambda n: (spec.pools[n].gpus, n))
        else:
            out[role] = min(fits, key=lambda n: (spec.pools[n].gpus > 0, n))
    return out


def _fits(pool: PoolSpec, resources: dict[str, float]) -> bool:
    offered = {**pool.resources, "GPU": float(pool.gpus), "CPU": float(pool.cores)}
    return all(offered.get(k, 0.0) >= v for k, v in resources.items())


def _describe(pool: PoolSpec) -> str:
    return _resources({"CPU": pool.cores, **({"GPU": pool.gpus} if pool.gpus else {}), **pool.resources})


def _resources(res: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in res.items()) or "nothing"


def job_name(run: str, part: str) -> str:
    """Every job of a run is named ``dagrl-<run>-<part>``, so ``dagrl cancel`` finds them all."""
    return f"dagrl-{run}-{part}"


def worker_jobs(spec: SlurmSpec, graph: Graph, pools: dict[str, str]) -> list[tuple[str, str]]:
    """``(worker name, pool)`` for every worker job: one per role replica, named ``<role>-<i>`` (its
    job ``dagrl-<run>-<role>-<i>``), and placement puts replica i of the role there first."""
    return [(f"{role}-{i}", pool) for role, pool in pools.items() for i in range(graph.spec.roles[role].replicas)]


def config_exports(config: dict[str, Any]) -> list[str]:
    """Shell lines that give a job's Dask processes ``config`` (Dask reads ``DASK_A__B_C`` as ``a.b-c``)."""
    return [f"export {name}={shlex.quote(value)}" for name, value in config_environ(config).items()]


def worker_job_options(
    spec: SlurmSpec, pool_name: str, worker: str, run: str, run_dir: Path, security: Any
) -> dict[str, Any]:
    """Keyword arguments of the job for one worker of ``pool_name`` (all but the scheduler address)."""
    pool = spec.pools[pool_name]
    resources = {**pool.resources, pool_resource(pool_name): 1.0}
    if pool.gpus:
        resources["GPU"] = float(pool.gpus)
    directives = [*([f"--gres=gpu:{pool.gpus}"] if pool.gpus else []), *pool.job_extra]
    return dict(
        name=worker,
        record_dir=run_dir / "jobs",
        cores=pool.cores,
        memory=pool.memory,
        processes=1,
        queue=pool.partition or spec.partition,
        account=pool.account or spec.account,
        walltime=pool.walltime or spec.walltime,
        job_name=job_name(run, worker),
        job_extra_directives=directives,
        job_script_prologue=[
            *spec.prologue,
            # a job inherits the submitter's environment (sbatch --export=ALL), which a plain LocalCluster
            # of that process (a notebook's, the tests') leaves Dask's trim threshold in
            "unset MALLOC_TRIM_THRESHOLD_",
            *(f"export {name}={shlex.quote(value)}" for name, value in STARTED_WORKER_ENVIRON.items()),
            *config_exports(QUIET_CONFIG if spec.quiet else {}),
        ],
        worker_extra_args=[
            "--resources",
            ",".join(f"{k}={v:g}" for k, v in sorted(resources.items())),
            "--preload",
            "dagrl.runtime.preload",
        ],
        log_directory=str(log_directory(spec, run_dir)),
        python=spec.python or sys.executable,
        interface=spec.interface,
        protocol="tls://" if spec.tls else "tcp://",
        security=security,
        death_timeout=120,
        config_name="slurm",
    )


def log_directory(spec: SlurmSpec, run_dir: Path) -> Path:
    return Path(spec.log_directory) if spec.log_directory else run_dir / "logs"


class RecordingSLURMJob(SLURMJob):
    """A SLURMJob that keeps a copy of each script it submits and reports sbatch's refusal in one line."""

    def __init__(self, *args: Any, record_dir: Path, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.record_dir = Path(record_dir)

    async def _submit_job(self, script_filename: str) -> str:
        self.record_dir.mkdir(parents=True, exist_ok=True)
        (self.record_dir / f"{self.name}.sh").write_text(Path(script_filename).read_text())
        try:
            return await super()._submit_job(script_filename)
        except RuntimeError as err:
            raise SlurmError(sbatch_message(str(err))) from None


def sbatch_message(output: str) -> str:
    """SLURM's own reasons from sbatch's output (``sbatch: error: ...`` lines), joined on one line.

    >>> sbatch_message("sbatch: error: invalid partition specified: x\\nallocation failure: Invalid partition name")
    'invalid partition specified: x; allocation failure: Invalid partition name'
    """
    reasons: list[str] = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("sbatch: error:") or "failure" in line or "failed" in line:
            reason = re.sub(r"^sbatch: error: ", "", line)
            if reason and reason not in reasons:
                reasons.append(reason)
    return "; ".join(reasons) or output.strip().replace("\n", " ")


def tls_security(run_dir: Path, write: bool = True) -> Any:
    """Per-run TLS: a temporary certificate in ``<run dir>/tls`` (owner-only), used by every party.

    ``write=False`` gives the same Security without creating files (for ``--dry-run``).
    """
    from distributed.security import Security

    tls = run_dir / "tls"
    cert, key = tls / "cert.pem", tls / "key.pem"
    if write and not cert.exists():
        tls.mkdir(parents=True, exist_ok=True, mode=0o700)
        temp = Security.temporary()
        for path, text in ((cert, temp.tls_ca_file), (key, temp.tls_scheduler_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    files = {"tls_ca_file": str(cert)}
    for part in ("scheduler", "worker", "client"):
        files[f"tls_{part}_cert"] = str(cert)
        files[f"tls_{part}_key"] = str(key)
    return Security(require_encryption=True, **files)


def worker_scripts(
    spec: SlurmSpec, graph: Graph, run: str, run_dir: Path, scheduler: str = SCHEDULER_PLACEHOLDER
) -> dict[str, str]:
    """Every worker job script of a run, by worker name, without SLURM (``--dry-run``)."""
    return _scripts(spec, worker_jobs(spec, graph, assign_pools(spec, graph.active_roles)), run, run_dir, scheduler)


def _scripts(
    spec: SlurmSpec, jobs: list[tuple[str, str]], run: str, run_dir: Path, scheduler: str = SCHEDULER_PLACEHOLDER
) -> dict[str, str]:
    security = tls_security(run_dir, write=False) if spec.tls else None
    logs = log_directory(spec, run_dir)
    missing = [p for p in (logs, *logs.parents) if not p.exists()]
    try:
        return {
            w: RecordingSLURMJob(scheduler, **worker_job_options(spec, pool, w, run, run_dir, security)).job_script()
            for w, pool in jobs
        }
    finally:  # dask-jobqueue creates the log directory when it builds a job; a dry run leaves nothing
        for path in missing:
            with contextlib.suppress(OSError):
                path.rmdir()


def check_submittable(script: str) -> None:
    """``sbatch --test-only``: SLURM checks partition, account and limits without queueing anything."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(script)
    try:
        out = _sbatch(["--test-only", f.name])
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise SlurmError(sbatch_message(out.stderr + out.stdout))


def _sbatch(args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["sbatch", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError("sbatch not found: is this a SLURM login node (or is SLURM's client on PATH)?") from None


def sbatch(script_path: Path) -> str:
    """Submit a script; return the job id, or raise :class:`SlurmError` with SLURM's message."""
    out = _sbatch(["--parsable", str(script_path)])
    if out.returncode != 0:
        raise SlurmError(sbatch_message(out.stderr + out.stdout))
    return out.stdout.strip().split(";")[0]


@contextlib.contextmanager
def cluster(spec: SlurmSpec, graph: Graph, run_dir: str | Path | None) -> Iterator[Any]:
    """A Dask scheduler here and one SLURM job per role replica; yields a connected client."""
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="dagrl-slurm-"))
    pools = assign_pools(spec, graph.active_roles)
    jobs = worker_jobs(spec, graph, pools)
    for role, pool in pools.items():  # placement then keeps each role on its pool's workers
        graph.spec.roles[role].resources.setdefault(pool_resource(pool), 1.0)
    with jobs_cluster(spec, jobs, run_dir) as client:
        yield client


@contextlib.contextmanager
def jobs_cluster(spec: SlurmSpec, jobs: list[tuple[str, str]], run_dir: Path) -> Iterator[Any]:
    """A Dask scheduler here and one SLURM job per ``(worker name, pool)`` of ``jobs``, each checked
    with ``sbatch --test-only`` first; a job that leaves is resubmitted. Yields a connected client."""
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    run = run_dir.name
    cancel_stale_jobs(run_dir)
    scripts = _scripts(spec, jobs, run, run_dir)
    for w, _ in jobs:  # one refused pool refuses the run before any job is queued
        check_submittable(scripts[w])
    security = tls_security(run_dir) if spec.tls else None
    if not spec.tls:
        log.warning(
            "SLURM: tls: false: the scheduler takes plain-TCP connections from anyone who can reach its node, "
            "and runs what they send; keep tls: true on a shared cluster"
        )
    options: dict[str, Any] = {"dashboard_address": spec.dashboard_address}
    if spec.interface is None:  # the host name's address, not every interface of the node
        options["host"] = socket.gethostbyname(socket.gethostname())
    log.info("SLURM: %d worker jobs in pools %s", len(jobs), ", ".join(sorted({pool for _, pool in jobs})))
    options["preload"] = list(spec.scheduler_preload)  # the RL page: imported before the dashboard starts
    first = spec.pools[next(iter(spec.pools))]
    with quiet_here(QUIET_CONFIG if spec.quiet else {}):  # the scheduler's periodic callbacks
        slurm = SLURMCluster(
            n_workers=0,
            cores=first.cores,
            memory=first.memory,
            processes=1,
            interface=spec.interface,
            security=security,
            protocol="tls://" if spec.tls else "tcp://",
            scheduler_options=options,
            log_directory=str(log_directory(spec, run_dir)),
            python=spec.python or sys.executable,
        )
    try:
        for w, pool in jobs:
            options = worker_job_options(spec, pool, w, run, run_dir, security)
            slurm.worker_spec[w] = {"cls": RecordingSLURMJob, "options": options}
        try:
            slurm.sync(slurm._correct_state)
        except SlurmError:
            raise
        except RuntimeError as err:
            raise SlurmError(sbatch_message(str(err))) from None
        write_cluster_info(run_dir, slurm, jobs)
        with Client(slurm, security=security, direct_to_workers=True) as client:
            _wait_for_workers(client, slurm, len(jobs), spec.start_timeout_s)
            keeper = Resubmitter(slurm, client, run_dir, jobs).start()
            try:
                yield client
            finally:
                keeper.stop()
    finally:
        submitted = [str(job.job_id) for job in list(slurm.workers.values()) if getattr(job, "job_id", None)]
        slurm.close()
        _until_gone(submitted)


def _until_gone(job_ids: list[str], timeout_s: float = 30.0) -> None:
    """Wait (at most ``timeout_s``) for the cancelled worker jobs to leave the queue, so that a command
    that returns leaves none of its jobs behind (a job ending shows in ``squeue`` a moment longer)."""
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(Exception):  # squeue missing or slow: the jobs end on their own
        while job_ids and job_states(job_ids) and time.monotonic() < deadline:
            time.sleep(0.5)


class Resubmitter:
    """Resubmits the job of a worker that left the cluster (preempted, cancelled, out of walltime).

    Dask's nanny restarts a worker *process* inside its job; when the job itself is gone nothing
    comes back, so this thread watches the scheduler's worker names: one missing for ``grace_s``
    gets a fresh job of the same pool (``<name>-r<k>``), at most ``max_resubmits`` times per worker.
    The supervisor then places the lost role on the new worker (see ``runtime/supervisor.py``).
    """

    def __init__(
        self,
        slurm: Any,
        client: Any,
        run_dir: Path,
        jobs: list[tuple[str, str]],
        grace_s: float = 3.0,
        interval_s: float = 1.0,
        max_resubmits: int = 3,
    ):
        self.slurm, self.client, self.run_dir = slurm, client, run_dir
        self.names = dict(jobs)  # current worker name -> pool
        self.origin = {w: w for w in self.names}
        self.resubmits: collections.Counter[str] = collections.Counter()
        self.missing_since: dict[str, float] = {}
        self.grace_s, self.interval_s, self.max_resubmits = grace_s, interval_s, max_resubmits
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="dagrl-resubmit", daemon=True)

    def start(self) -> Resubmitter:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                self.check()
            except Exception as err:  # keep watching; a failed resubmission is retried next round
                log.warning("SLURM resubmission: %s", err)

    def check(self) -> None:
        info = live_workers(self.client)
        live = {w.get("name") for w in info.values()}
        now = time.monotonic()
        for name, pool in list(self.names.items()):
            if name in live:
                self.missing_since.pop(name, None)
                continue
            if now - self.missing_since.setdefault(name, now) >= self.grace_s and not self.stopping.is_set():
                self.resubmit(name, pool)

    def resubmit(self, name: str, pool: str) -> None:
        origin = self.origin[name]
        if self.resubmits[origin] >= self.max_resubmits:
            return
        self.resubmits[origin] += 1
        old_job = getattr(self.slurm.workers.get(name), "job_id", None)
        entry = self.slurm.worker_spec.pop(name)
        new = f"{origin}-r{self.resubmits[origin]}"
        self.slurm.worker_spec[new] = {"cls": entry["cls"], "options": {**entry["options"], "name": new}}
        self.slurm.sync(self.slurm._correct_state)  # cancels what is left of the old job, submits the new one
        del self.names[name]
        self.missing_since.pop(name, None)
        self.names[new], self.origin[new] = pool, origin
        log.warning("worker %s (job %s) left the cluster; resubmitted its job as %s", name, old_job, new)
        write_cluster_info(self.run_dir, self.slurm, list(self.names.items()))


def _wait_for_workers(client: Any, slurm: Any, n: int, timeout: float) -> None:
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError:
        states = job_states([j.job_id for j in slurm.workers.values() if j.job_id])
        raise SlurmError(
            f"only {len(live_workers(client))} of {n} worker jobs started in "
            f"{timeout:g} s (start_timeout_s); job states: {states or 'none known'}"
        ) from None


def cancel_stale_jobs(run_dir: Path) -> None:
    """Cancel the worker jobs an earlier allocation of this run's driver left queued or running (its
    ``cluster.json``): a driver killed, or requeued, before it could close its cluster. Their workers
    would wait for a scheduler that is gone until their ``death_timeout``, holding nodes meanwhile."""
    info = RunDir(run_dir).read_json("cluster.json") or {}
    old = [str(j) for j in (info.get("worker_jobs") or {}).values() if j]
    left = sorted(job_states(old))
    if left:
        subprocess.run(["scancel", *left], capture_output=True, text=True, timeout=60)
        log.info("SLURM: cancelled %d worker job(s) of the run's earlier allocation: %s", len(left), ", ".join(left))


def job_states(job_ids: list[str]) -> dict[str, str]:
    if not job_ids:
        return {}
    out = subprocess.run(
        ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T %R"], capture_output=True, text=True, timeout=30
    )
    return {ln.split()[0]: " ".join(ln.split()[1:]) for ln in out.stdout.splitlines() if ln.strip()}


def write_cluster_info(run_dir: Path, slurm: Any, jobs: list[tuple[str, str]]) -> None:
    """``<run dir>/cluster.json``: where the scheduler and dashboard are, and every worker job id."""
    port = slurm.scheduler.services["dashboard"].port if "dashboard" in slurm.scheduler.services else None
    info = {
        "scheduler": slurm.scheduler.address,
        "dashboard_port": port,
        "dashboard_host": _dashboard_host(slurm),
        "node": socket.gethostname(),
        "driver_job": os.environ.get("SLURM_JOB_ID"),
        "worker_jobs": {w: slurm.workers[w].job_id for w, _ in jobs if w in slurm.workers},
        "pools": {w: pool for w, pool in jobs},
    }
    RunDir(run_dir).write_json("cluster.json", info)


def _dashboard_host(slurm: Any) -> str:
    link = slurm.dashboard_link or ""
    match = re.match(r"https?://([^:/]+)", link)
    return match.group(1) if match else "127.0.0.1"
