"""Runs across hosts emulated with Linux namespaces (``tests/hosts.py``): a scheduler and the driver on a
head host, `dagrl worker` on three others, as a user starts them on a cluster. Algorithms reach their
targets with roles spread over the hosts; shared memory is used only within a host; a host that crashes
or is cut off mid-run has its roles moved, and the run still reaches its target."""

from __future__ import annotations

import contextlib
import json
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hosts import EmulatedHosts, Host, python, require, shared_folder, wait_for

ROOT = Path(__file__).resolve().parent.parent
PORT = 8786
QUICK = ["supervision.poll_s=0.5", "supervision.respawn_after_s=5"]


@dataclass
class Run:
    actors: list[dict]
    rows: list[dict]


@dataclass
class Cluster:
    hosts: EmulatedHosts
    shared: Path
    address: str

    @property
    def head(self) -> Host:
        return self.hosts.hosts[0]

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts.hosts if h.name == name)

    def start_run(self, graph: str, overrides: list[str]):
        args = ["-m", "dagrl", "run", str(ROOT / "graphs" / f"{graph}.yaml"), "--scheduler", self.address, "--quiet"]
        for item in [f"runs_dir={self.shared / 'runs'}", *overrides]:
            args += ["--set", item]
        return self.hosts.spawn(self.head, python(*args), self.shared / "driver.log")

    def run(self, graph: str, overrides: list[str], timeout: float = 240) -> tuple[dict, Run]:
        proc = self.start_run(graph, overrides)
        return self.finish(proc, timeout)

    def finish(self, proc, timeout: float = 240) -> tuple[dict, Run]:
        """The run's summary and what it wrote (read now: the shared folder goes with the cluster)."""
        rc = proc.wait(timeout)
        log = (self.shared / "driver.log").read_text()
        assert rc == 0, log[-3000:]
        path = self.run_dir()
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        return json.loads((path / "summary.json").read_text()), Run(actors(path), rows)

    def run_dir(self) -> Path:
        (run,) = list((self.shared / "runs").iterdir())
        return run

    def rows(self) -> int:
        with contextlib.suppress(StopIteration, FileNotFoundError, ValueError):
            return len((self.run_dir() / "metrics.jsonl").read_text().splitlines())
        return 0

    def on_workers(self, source: str) -> dict:
        """``source`` (defining ``probe() -> JSON-able``) run on every worker; by worker name."""
        script = self.shared / "probe.py"
        script.write_text(
            textwrap.dedent(source)
            + textwrap.dedent(f"""
            import json
            from distributed import Client
            with Client({self.address!r}, timeout=20) as client:
                named = {{a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}}
                out = client.run(probe)
            print(json.dumps({{named[a]: v for a, v in out.items()}}))
            """)
        )
        proc = self.hosts.spawn(self.head, python(str(script)), self.shared / "probe.log")
        assert proc.wait(60) == 0, (self.shared / "probe.log").read_text()[-2000:]
        return json.loads((self.shared / "probe.log").read_text().strip().splitlines()[-1])


@contextlib.contextmanager
def cluster(workers: list[tuple[str, str]]) -> Iterator[Cluster]:
    """Hosts ``host0`` (the scheduler and the driver) to ``host3``, and ``dagrl worker`` processes:
    ``(host name, resources)`` each, named ``<host>-w<k>``."""
    require()
    with shared_folder("hosts") as shared, EmulatedHosts(4, shared) as hosts:
        setup = Cluster(hosts, shared, f"tcp://{hosts.hosts[0].address}:{PORT}")
        scheduler = ["-m", "distributed.cli.dask_scheduler", "--host", setup.head.address, "--port", str(PORT)]
        hosts.spawn(setup.head, python(*scheduler, "--dashboard-address", ":0", "--no-show"), shared / "scheduler.log")
        logs = []
        for k, (name, resources) in enumerate(workers):
            host = setup.host(name)
            log = shared / f"{name}-w{k}.log"
            cmd = ["-m", "dagrl", "worker", setup.address, "--nworkers", "1", "--nthreads", "2", "--host", host.address]
            cmd += ["--resources", resources, "--no-dashboard", "--name", f"{name}-w{k}", "--death-timeout", "60"]
            hosts.spawn(host, python(*cmd), log)
            logs.append(log)
        for log in logs:
            wait_for(lambda log=log: "Registered to:" in log.read_text(), 90, f"{log.stem} to join the scheduler")
        yield setup


def actors(run: Path) -> list[dict]:
    return json.loads((run / "actors.json").read_text())


SPREAD = [("host1", "CPU=2"), ("host2", "CPU=2"), ("host3", "CPU=2")]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["async", "sync"])
def test_ppo_reaches_its_target_with_roles_on_three_hosts(policy):
    with cluster(SPREAD) as c:
        summary, run = c.run(f"ppo-cartpole-{policy}", ["roles.sampler.replicas=3", "stop.wall_time_s=180"])
    assert summary["stop_reason"] == "mean_return", summary
    samplers = {a["host"] for a in run.actors if a["role"] == "sampler"}
    assert samplers == {"host1", "host2", "host3"}  # placement spreads them over the least loaded workers


@pytest.mark.slow
def test_dqn_apex_reaches_its_target_with_roles_on_three_hosts():
    with cluster(SPREAD) as c:
        summary, run = c.run("dqn-cartpole-apex", ["stop.wall_time_s=240"], timeout=300)
    assert summary["stop_reason"] == "mean_return", summary
    hosts = {a["host"] for a in run.actors}
    assert len(hosts) >= 2 and "host0" not in hosts, run.actors


SHM_STATS = """
def probe():
    from dagrl.runtime import shm
    return dict(shm.STATS)
"""


def test_shared_memory_only_between_processes_of_one_host():
    """The learner's worker and one sampler's share host1; the other sampler is on host2. Rollouts of
    images (1.8 MB) from host1's sampler cross through /dev/shm; host2's go as frames over TCP."""
    workers = [("host1", "LEARN=1"), ("host1", "SAMPLE=1"), ("host2", "SAMPLE=1")]
    overrides = ["policy=async", "roles.learner.resources={LEARN: 1}", "roles.sampler.resources={SAMPLE: 1}"]
    overrides += ["hyperparameters.num_steps=64"]
    overrides += ["stop.iterations=8", "stop.mean_return=null"]
    with cluster(workers) as c:
        summary, run = c.run("ppo-brighthalf", overrides)
        stats = c.on_workers(SHM_STATS)
    placed = {(a["role"], a["host"]) for a in run.actors}
    assert placed == {("learner", "host1"), ("sampler", "host1"), ("sampler", "host2")}
    assert stats["host1-w1"]["shm_arrays"] > 0 and stats["host1-w1"]["framed_values"] == 0, stats
    assert stats["host2-w2"]["shm_arrays"] == 0 and stats["host2-w2"]["framed_values"] > 0, stats


LEARNER_MAY_MOVE = [("host1", "LEARN=1"), ("host2", "LEARN=1"), ("host3", "SAMPLE=1")]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["crash", "partition"])
def test_a_host_lost_mid_run_has_its_learner_moved_and_the_run_reaches_its_target(fault):
    """Two hosts can hold the learner. The one holding it crashes (every process SIGKILLed) or is cut
    off (its link down) after some rows; the learner restarts on the other from its checkpoint, the
    samplers lost with the host are replaced, and the run reaches its target."""
    overrides = ["roles.learner.resources={LEARN: 1}", "roles.sampler.replicas=2", "checkpoint.every=5"]
    overrides += ["stop.wall_time_s=200", *QUICK]
    with cluster(LEARNER_MAY_MOVE) as c:
        proc = c.start_run("ppo-cartpole-async", overrides)
        wait_for(lambda: c.rows() >= 12, 120, "12 metrics rows before the fault")
        (first,) = [a["host"] for a in actors(c.run_dir()) if a["role"] == "learner"]
        other = {"host1": "host2", "host2": "host1"}[first]
        lost = c.host(first)
        (c.hosts.crash if fault == "crash" else c.hosts.partition)(lost)
        summary, run = c.finish(proc, 300)
        if fault == "partition":
            c.hosts.heal(lost)
    assert summary["stop_reason"] == "mean_return", summary
    assert [a["host"] for a in run.actors if a["role"] == "learner"] == [other], run.actors
    assert first not in {a["host"] for a in run.actors}, run.actors
    assert max(r.get("sup/restarts", 0) for r in run.rows) >= 1
