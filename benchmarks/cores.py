"""Do this machine's cores compute apart? One gradient step alone and beside a process spinning on another core.

    dagrl bench cores [--steps 1000] [--repeats 3]

A learner-sized torch step (an MLP of two 256-unit layers, batch 128, Adam, one torch thread) is timed
pinned to core 0, alone, then while a plain Python loop spins pinned to core 1, alternating ``--repeats``
times. On cores that compute apart the ratio is ~1.0; where two vCPUs share a physical core (SMT
siblings, or a host that overcommits them) a learner slows whenever anything else runs, and no
scheduling of dagrl's processes can give it back. It reads the ratios of the policies' benchmarks on
this machine: a learner-bound run under ``single`` has the second core idle, under the streams it does not.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch
from _common import emit, table
from torch import nn


def spin(seconds: float) -> None:
    os.sched_setaffinity(0, {1})
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def step_ms(steps: int) -> float:
    """Milliseconds per gradient step, on core 0, one torch thread."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    x, y = torch.randn(128, 6), torch.randn(128, 3)
    t0 = 0.0
    for i in range(steps + 200):  # the first 200 warm up
        if i == 200:
            t0 = time.perf_counter()
        loss = ((net(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps * 1000


def main() -> None:
    ap = argparse.ArgumentParser(prog="dagrl bench cores", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("dagrl bench cores needs two cores")
    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    rows = []
    for _ in range(args.repeats):
        alone = step_ms(args.steps)
        spinner = mp.get_context("spawn").Process(target=spin, args=(60.0,))
        spinner.start()
        time.sleep(0.5)
        beside = step_ms(args.steps)
        spinner.terminate()
        spinner.join()
        rows.append({"alone_ms": alone, "beside_ms": beside, "ratio": beside / alone})
        print(f"alone {alone:.2f} ms, beside a spinning core {beside:.2f} ms ({beside / alone:.2f} x)", flush=True)
    summary = {k: statistics.median(r[k] for r in rows) for k in ("alone_ms", "beside_ms", "ratio")}
    print(table([summary], ["alone_ms", "beside_ms", "ratio"]))
    emit("cores", {"rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
