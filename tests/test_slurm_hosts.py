"""`dagrl submit` to a SLURM cluster of several nodes: one slurmd per host emulated with Linux namespaces
(``tests/hosts.py``, ``tests/slurm_node.py``'s :class:`SlurmOnHosts`). The worker jobs land on several
nodes; a node that dies mid-run (its slurmd and its jobs SIGKILLed) has its jobs resubmitted on the
others, and the run finishes."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.hosts import ROOT, EmulatedHosts, require, shared_folder, wait_for
from tests.slurm_node import SlurmOnHosts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CLUSTER = """kind: slurm
partition: debug
walltime: "00:15:00"
interface: eth0
tls: true
dashboard_address: 127.0.0.1:0
start_timeout_s: 120
driver: {cores: 1, memory: 1GiB}
pools:
  cpu: {cores: 3, memory: 1GiB}
"""


@pytest.fixture
def slurm_hosts():
    """The head (slurmctld) and three nodes of 8 CPUs; jobs go to the least loaded node (``LLN``)."""
    require()
    with shared_folder("slurm-hosts") as shared, EmulatedHosts(4, shared) as hosts:
        slurm = SlurmOnHosts(hosts, cpus=8)
        try:
            yield slurm.start()
        finally:
            slurm.stop()


def test_worker_jobs_spread_over_nodes_and_a_dead_nodes_jobs_are_resubmitted(slurm_hosts):
    slurm, shared = slurm_hosts, slurm_hosts.hosts.shared
    cluster = shared / "cluster.yaml"
    cluster.write_text(CLUSTER)
    graph = str(ROOT / "graphs" / "ppo-cartpole-sync.yaml")
    overrides = ["stop.iterations=120", "stop.mean_return=null", "checkpoint.every=5", f"runs_dir={shared / 'runs'}"]
    argv = [sys.executable, "-m", "dagrl", "submit", graph, "--cluster", str(cluster)]
    for item in overrides:
        argv += ["--set", item]
    out = slurm.run(argv, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    run = shared / "runs" / re.search(r"run directory \S*/(\S+)", out.stdout).group(1)

    wait_for(lambda: (run / "actors.json").exists() and (run / "metrics.jsonl").exists(), 180, "training")
    jobs = slurm.jobs()
    driver = next(nodes for name, state, nodes in jobs.values() if name.endswith("-driver"))
    workers = {name: nodes for name, state, nodes in jobs.values() if not name.endswith("-driver")}
    assert len(set(workers.values())) >= 2, jobs  # the worker jobs run on several nodes
    victim = next(node for node in sorted(set(workers.values())) if node != driver)
    lost = sorted(name for name, node in workers.items() if node == victim)
    slurm.hosts.crash(next(h for h in slurm.nodes if h.name == victim))  # slurmd and every job on it

    wait_for(lambda: (run / "summary.json").exists(), 300, "the run to finish after the node died")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "iterations", summary
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["iteration"] == 120
    actors = json.loads((run / "actors.json").read_text())
    assert victim not in {a["host"] for a in actors}, actors  # nothing of the run left on the dead node
    for job in lost:  # each job of the dead node was submitted again, and SLURM ran it on a live node
        worker = job.rsplit("-", 2)[-2] + "-" + job.rsplit("-", 1)[-1]  # <run>-sampler-0 -> sampler-0
        assert (run / "jobs" / f"{worker}-r1.sh").exists(), sorted(p.name for p in (run / "jobs").iterdir())
    log = "".join(p.read_text() for p in (run / "logs").glob("*driver*"))
    assert re.search(r"left the cluster; resubmitted its job as \S+-r1", log), log[-3000:]
    wait_for(lambda: slurm.states()[victim].startswith("down"), 60, f"SLURM to mark {victim} down")
