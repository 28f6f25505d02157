"""Does the RL page slow training? Env steps/s of async PPO with the page open in a browser vs closed.

    dagrl bench dashboard [--repeats 3] [--iterations 150]

Four conditions, interleaved, on one LocalCluster: the dashboard feed off (no events at all), the
feed on with no page open, the page held open by a bokeh client session (the server builds and
updates it, nothing renders it: the scheduler-side cost), and the page open in headless Chromium on
the same machine (its plots refreshing every second). Each trains ``ppo-cartpole-async`` for a
fixed number of iterations; throughput is env steps / training seconds. Needs Debian's chromium
(``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile

from _common import emit, table

from dagrl.app.driver import Trainer
from dagrl.app.graphs import load_graph
from dagrl.app.progress import Progress
from dagrl.clusters.local import local_cluster
from dagrl.clusters.spec import LocalClusterSpec
from dagrl.dashboard.feed import Feed
from dagrl.policies import build_policy
from dagrl.runtime.rundir import RunDir
from tests.debian import HEADLESS_CHROMIUM_FLAGS  # dagrl bench puts the repository root on sys.path


def one(client, condition: str, iterations: int, root: str) -> float:
    graph = load_graph("graphs/ppo-cartpole-async.yaml", [f"stop.iterations={iterations}", "stop.mean_return=null"])
    rundir = RunDir.create(root, graph.name)
    policy = build_policy(graph, client, run_dir=rundir.path)
    trainer = Trainer(graph, policy, rundir, progress=Progress(enabled=False))
    feed = browser = session = None
    if condition != "feed off":
        feed = Feed(client, policy, rundir.path.name).start()
        trainer.listeners.append(feed.on_row)
    if condition == "page open":
        url = client.dashboard_link.rsplit("/", 1)[0] + "/individual-dagrl"
        profile = tempfile.mkdtemp()
        browser = subprocess.Popen(
            [
                shutil.which("chromium"),
                *HEADLESS_CHROMIUM_FLAGS,
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    if condition == "page served, no browser":
        from bokeh.client import pull_session

        url = client.dashboard_link.rsplit("/", 1)[0] + "/individual-dagrl"
        session = pull_session(url=url)  # the server builds and updates the page; nothing renders it
    try:
        summary = trainer.run()
    finally:
        if session is not None:
            session.close()
        if feed is not None:
            feed.close()
        if browser is not None:
            browser.kill()
            browser.wait()
        policy.close()
    return summary["env_steps"] / summary["elapsed_s"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=150)
    args = p.parse_args()
    if shutil.which("chromium") is None:
        raise SystemExit("needs Debian's chromium: apt-get install chromium")
    conditions = ["feed off", "page closed", "page served, no browser", "page open"]
    hz: dict[str, list[float]] = {c: [] for c in conditions}
    with (
        tempfile.TemporaryDirectory() as root,
        local_cluster(LocalClusterSpec(dashboard_address="127.0.0.1:0"), 3) as cluster,
    ):
        from distributed import Client

        with Client(cluster, direct_to_workers=True) as client:
            for r in range(args.repeats):
                for c in conditions:
                    hz[c].append(one(client, c, args.iterations, root))
                    print(f"repeat {r + 1} {c}: {hz[c][-1]:,.0f} env steps/s", flush=True)
    closed = statistics.median(hz["page closed"])
    rows = [
        {"condition": c, "median steps/s": statistics.median(v), "vs page closed": statistics.median(v) / closed}
        for c, v in hz.items()
    ]
    print(table(rows, ["condition", "median steps/s", "vs page closed"]))
    emit("dashboard", {"iterations": args.iterations, "repeats": args.repeats, "hz": hz, "rows": rows})


if __name__ == "__main__":
    main()
