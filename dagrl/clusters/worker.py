"""``dagrl worker SCHEDULER [dask worker's options]``: a Dask worker started by hand (or by a job script)
set up as dagrl's own clusters set theirs, so it runs torch as fast as a LocalCluster's worker.

What it adds to ``dask worker``:

* no ``MALLOC_TRIM_THRESHOLD_`` (Dask's nanny sets it; torch updates then run up to 2 x slower:
  :data:`dagrl.clusters.local.WORKER_ENVIRON_NOTE`);
* ``--preload dagrl.runtime.preload`` (workers ignore a terminal's Ctrl-C, which is for the driver);
* Dask's profiler off, and the quieter periodic callbacks of :data:`dagrl.clusters.local.QUIET_CONFIG`
  (``--no-quiet`` keeps Dask's own);
* ``--resources GPU=<devices>`` where this machine has CUDA devices and no ``--resources`` names GPU;
* it joins again when the scheduler dropped it for missing heartbeats (a host cut off by a partition
  and back: dagrl replaced its roles meanwhile, and Dask's worker shuts itself down then). The worker
  it starts is fresh, spare capacity for the run. Any other end of the worker ends ``dagrl worker``
  with the worker's exit status.

Everything else is passed to ``dask worker`` as it is (``--nworkers``, ``--nthreads``, ``--name``,
``--resources``, ``--memory-limit``, ...).
"""

from __future__ import annotations

import os
import sys

from dagrl.clusters.local import QUIET_CONFIG, STARTED_WORKER_ENVIRON, config_environ, cuda_count


def worker_command(args: list[str], quiet: bool = True, gpus: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The ``dask worker`` command line and the environment for ``dagrl worker args``.

    >>> cmd, env = worker_command(["tcp://10.0.0.1:8786", "--nthreads", "2"], gpus=0)
    >>> cmd[1:4], cmd[-2:], env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"]
    (['-m', 'distributed.cli.dask_worker', 'tcp://10.0.0.1:8786'], ['--preload', 'dagrl.runtime.preload'], 'False')
    >>> worker_command(["sched:8786"], gpus=2)[0][-4:-2]
    ['--resources', 'GPU=2']
    """
    args = list(args)
    if "--preload" not in args:
        args += ["--preload", "dagrl.runtime.preload"]
    gpus = cuda_count() if gpus is None else gpus
    named = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--resources"]
    if gpus and not any("GPU" in r for r in named):
        if named:
            i = args.index("--resources")
            args[i + 1] = f"{args[i + 1]},GPU={gpus}"
        else:
            args[-2:-2] = ["--resources", f"GPU={gpus}"]
    env = {**os.environ, **STARTED_WORKER_ENVIRON}
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    if quiet:
        env.update(config_environ(QUIET_CONFIG))
    return [sys.executable, "-m", "distributed.cli.dask_worker", *args], env


DROPPED = "worker-heartbeat-missing"
"""How Dask's worker and nanny say the scheduler no longer knew the worker (they then shut down)."""
REJOIN_PAUSE_S = 2.0


def run_worker(args: list[str], quiet: bool = True, rejoin: int = 100) -> int:
    """Run the worker; start it again (up to ``rejoin`` times) when the scheduler dropped it for missing
    heartbeats. Its output passes through; SIGINT and SIGTERM go to it. Returns its exit status."""
    import signal
    import subprocess
    import time

    cmd, env = worker_command(args, quiet)
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: object) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    for attempt in range(rejoin + 1):
        child = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
        dropped = False
        for line in child.stderr:  # Dask logs to stderr: pass it on, and hear why the worker ends
            sys.stderr.write(line)
            dropped |= DROPPED in line
        status = child.wait()
        if not dropped or attempt == rejoin:
            return status
        sys.stderr.write(f"dagrl worker: the scheduler dropped this worker ({DROPPED}); joining again\n")
        time.sleep(REJOIN_PAUSE_S)
    return status
