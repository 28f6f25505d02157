"""Update speed on hand-started workers (`dagrl worker`, `dask worker`) against the LocalCluster's.

    dagrl bench workers [--rounds 3] [--iterations 60]

Each round trains ``ppo-cartpole`` (``async``, its defaults) for ``--iterations`` iterations three ways,
in turn: on the LocalCluster ``dagrl run`` starts, and on a scheduler started here with three hand-started
workers on this machine, either ``dagrl worker`` or ``dask worker`` (whose nanny sets
``MALLOC_TRIM_THRESHOLD_``: torch's updates then ran up to 2 x slower). The measure is the learner's
update rate (``perf/update_hz``: frames per second of update time, the median over the rows after the
first five), as a ratio to the LocalCluster's of the same round.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from _common import emit, table

import dagrl
from dagrl.app.graphs import load_graph
from dagrl.runtime.rundir import RunDir

WORKERS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def hand_started(kind: str) -> Iterator[str]:
    """A scheduler and ``WORKERS`` workers started as commands (``dagrl worker`` or ``dask worker``)."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port)]
    procs = [subprocess.Popen([*scheduler, "--dashboard-address", ":0", "--no-show"], stderr=subprocess.DEVNULL)]
    worker = (
        [sys.executable, "-m", "dagrl", "worker"]
        if kind == "dagrl"
        else [sys.executable, "-m", "distributed.cli.dask_worker"]
    )
    for _ in range(WORKERS):
        cmd = [*worker, address, "--nthreads", "1", "--no-dashboard"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(WORKERS, timeout=60)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)


def update_hz(runs: str, iterations: int, scheduler: str | None) -> float:
    graph = load_graph(
        "graphs/ppo-cartpole.yaml", [f"stop.iterations={iterations}", "stop.mean_return=null", f"runs_dir={runs}"]
    )
    if scheduler is None:
        summary = dagrl.train(graph)
    else:
        from distributed import Client

        with Client(scheduler, direct_to_workers=True) as client:
            summary = dagrl.train(graph, client)
    rows = RunDir(summary["run_dir"]).read_metrics()[5:]
    return statistics.median(r["perf/update_hz"] for r in rows if r.get("perf/update_hz"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=60)
    args = ap.parse_args()
    runs = tempfile.mkdtemp(prefix="dagrl-workers-")
    ratios: dict[str, list[float]] = {"dagrl worker": [], "dask worker": []}
    local: list[float] = []
    for _ in range(args.rounds):
        base = update_hz(runs, args.iterations, None)
        local.append(base)
        for label, kind in (("dagrl worker", "dagrl"), ("dask worker", "dask")):
            with hand_started(kind) as address:
                ratios[label].append(update_hz(runs, args.iterations, address) / base)
    rows = [{"workers": "LocalCluster", "update frames/s (median)": statistics.median(local), "/ LocalCluster": 1.0,
             "rounds": ""}]  # fmt: skip
    for label, rs in ratios.items():
        rows.append({
            "workers": label, "update frames/s (median)": "", "/ LocalCluster": statistics.median(rs),
            "rounds": " ".join(f"{r:.2f}" for r in rs),
        })  # fmt: skip
    print(table(rows, ["workers", "update frames/s (median)", "/ LocalCluster", "rounds"]))
    emit("workers", {"iterations": args.iterations, "rows": rows})


if __name__ == "__main__":
    main()
