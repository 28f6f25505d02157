"""Start and stop cost: a 2,000-step run of the main graph, command to exit, under `single` and on the LocalCluster.

Each round runs ``dagrl run ppo-cartpole --set stop.env_steps=2000 --quiet`` as a user types it, once
with ``--set policy=single`` and once with the graph's own policy (an embedded LocalCluster), and times
the process from start to exit; ``python -c "import dagrl.app.cli"`` is timed beside them, so the part
that is imports alone shows. The rounds alternate, so a busy spell of the machine touches both.

    dagrl bench startup --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from _common import emit, table

TARGETS_S = {"single": 3.0, "local": 6.0}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--env-steps", type=int, default=2000)
    args = ap.parse_args()
    runs_dir = tempfile.mkdtemp(prefix="dagrl-startup-")
    run = [sys.executable, "-m", "dagrl", "run", "ppo-cartpole", "--quiet", "--set", f"runs_dir={runs_dir}"]
    run += ["--set", f"stop.env_steps={args.env_steps}"]
    setups = {
        "imports": [sys.executable, "-c", "import dagrl.app.cli"],
        "single": [*run, "--set", "policy=single"],
        "local": run,
    }
    times: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(args.rounds):
        for name, cmd in setups.items():
            times[name].append(timed(cmd))
    rows = [
        {
            "setup": name,
            "median s": statistics.median(ts),
            "min s": min(ts),
            "target s": TARGETS_S.get(name, ""),
            "rounds": " ".join(f"{t:.2f}" for t in ts),
        }
        for name, ts in times.items()
    ]
    print(table(rows, ["setup", "median s", "min s", "target s", "rounds"]))
    emit("startup", {"env_steps": args.env_steps, "rows": rows})


if __name__ == "__main__":
    main()
