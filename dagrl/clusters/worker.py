"""``dagrl worker SCHEDULER [dask worker's options]``: a Dask worker started by hand (or by a job script)
set up as dagrl's own clusters set theirs, so it runs torch as fast as a LocalCluster's worker.

What it adds to ``dask worker``:

* no ``MALLOC_TRIM_THRESHOLD_`` (Dask's nanny sets it; torch updates then run up to 2 x slower:
  :data:`dagrl.clusters.local.WORKER_ENVIRON_NOTE`);
* ``--preload dagrl.runtime.preload`` (workers ignore a terminal's Ctrl-C, which is for the driver);
* Dask's profiler off, and the quieter periodic callbacks of :data:`dagrl.clusters.local.QUIET_CONFIG`
  (``--no-quiet`` keeps Dask's own);
* ``--resources GPU=<devices>`` where this machine has CUDA devices and no ``--resources`` names GPU.

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


def run_worker(args: list[str], quiet: bool = True) -> None:
    """Replace this process with the worker (signals, exit status and output are the worker's own)."""
    cmd, env = worker_command(args, quiet)
    os.execve(cmd[0], cmd, env)
