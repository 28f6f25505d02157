"""Hosts emulated on this machine with Linux namespaces, for tests that cross a host boundary.

Each host is a network namespace with its own address in 198.18.0.0/15 (the range reserved for
benchmarking), joined to the others by a bridge, with its own hostname (a UTS namespace) and its own
``/dev/shm`` and ``/tmp`` (a mount namespace with fresh tmpfs mounts; ``/tmp`` stays shared where the
checkout or Python lives under it: :func:`private_tmp`); every other folder is shared, as
a cluster shares home. A process on a host is started inside all three namespaces of that host's
*holder*, a process that only keeps them alive.

* :meth:`EmulatedHosts.crash` SIGKILLs every process of a host at once (its holder too): a power cut.
  :meth:`EmulatedHosts.revive` gives it a fresh holder, with an empty ``/dev/shm`` and ``/tmp``.
* :meth:`EmulatedHosts.partition` takes the host's link down: packets are dropped silently (no RST),
  so its sockets hang as a cut cable leaves them; :meth:`EmulatedHosts.heal` brings it back.

The namespaces have no route anywhere but the bridge and their loopback, so traffic goes only
between the hosts a test made. Where the namespaces cannot be made (not root, no ``ip``, a kernel or a
container that refuses), :func:`require` skips the test and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import wait_for  # noqa: F401 (the host tests and benchmarks/supervision.py take it from here)

TOOLS = (["ip", "unshare", "nsenter"], ["iproute2", "util-linux"])
"""What the hosts are made with: binaries, then the Debian packages that hold them."""
SUBNET = "198.18.0"
IFACE = "eth0"
"""Every host's link is named alike inside its namespace, as a cluster's nodes share an interface name
(``interface: eth0`` in a cluster file)."""
"""Hosts get ``198.18.0.10``, ``.11``, ...: inside 198.18.0.0/15, reserved for benchmarking (RFC 2544)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def private_tmp(shared: Path) -> bool:
    """Whether each host may get a ``/tmp`` of its own: not where this checkout, the Python running it,
    a ``PYTHONPATH`` entry or the shared folder lives under ``/tmp`` (a host would not see them). Where
    one does, the hosts share ``/tmp``, as hosts that mount it from one server would."""
    places = [Path(__file__).resolve(), Path(sys.prefix), Path(sys.executable), shared, Path.cwd()]
    places += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return not any(str(p.resolve()).startswith("/tmp/") or str(p.resolve()) == "/tmp" for p in places)


def why_not() -> str | None:
    """Why emulated hosts cannot be made here; ``None`` if they can (tried, then removed)."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network, mount and UTS namespaces)"
    from tests.debian import ensure

    with contextlib.suppress(Exception):  # a machine without apt: said below
        ensure(*TOOLS)
    for tool in TOOLS[0]:
        if shutil.which(tool) is None:
            return f"emulated hosts need the {tool} command (iproute2, util-linux)"
    probe = f"dgp{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", f"{probe}b", "type", "bridge")
    except subprocess.CalledProcessError as err:
        return f"cannot make a network namespace and a bridge here: {err.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
        _ip("link", "del", f"{probe}b", check=False)
    out = subprocess.run(
        ["unshare", "--mount", "--uts", "sh", "-c", "mount -t tmpfs none /mnt && hostname probe"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if out.returncode != 0:
        return f"cannot make mount and UTS namespaces here: {out.stderr.strip()}"
    return None


def require() -> None:
    """Skip the calling test, with the reason, where emulated hosts cannot be made."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)


@dataclass
class Host:
    name: str
    """Its hostname, e.g. ``host1``."""
    address: str
    ns: str
    """Its network namespace."""
    link: str
    """The bridge's end of its link (down: a partition)."""
    holder: subprocess.Popen | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)


class EmulatedHosts:
    """``n`` hosts on one bridge (module docstring); a context manager that removes everything it made."""

    def __init__(self, n: int, shared: Path):
        tag = uuid.uuid4().hex[:5]
        self.bridge = f"dgb{tag}"
        self.shared = shared
        self.hosts = [Host(f"host{i}", f"{SUBNET}.{10 + i}", f"dagrl-{tag}-{i}", f"dg{tag}{i}r") for i in range(n)]

    def __enter__(self) -> EmulatedHosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                self._make(host)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self, host: Host) -> None:
        inside = host.link[:-1] + "h"
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", host.ns)
        _ip("link", "set", host.link, "master", self.bridge)
        _ip("link", "set", host.link, "up")
        for args in (("link", "set", inside, "name", IFACE), ("addr", "add", f"{host.address}/24", "dev", IFACE),
                     ("link", "set", IFACE, "up"), ("link", "set", "lo", "up")):  # fmt: skip
            _ip("netns", "exec", host.ns, "ip", *args)
        self._hold(host)

    def _hold(self, host: Host) -> None:
        tmp = "mount -t tmpfs dagrl-tmp /tmp && " if private_tmp(self.shared) else ""
        script = (
            f"mount -t tmpfs -o size=1g dagrl-shm /dev/shm && {tmp}"
            f"hostname {host.name} && echo ready && exec sleep infinity"
        )
        host.holder = subprocess.Popen(
            # nsenter, not `ip netns exec`: that one remounts /sys, and cgroups with it (slurmd needs them)
            ["nsenter", f"--net=/run/netns/{host.ns}", "unshare", "--mount", "--uts", "--propagation", "private",
             "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = host.holder.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{host.name}'s namespaces: {host.holder.stderr.read().strip()}")

    def spawn(self, host: Host, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (in the shared folder), its output to ``log``."""
        out = open(log, "ab")  # noqa: SIM115 (the child keeps it; closed with the process)
        proc = subprocess.Popen(
            ["nsenter", "-t", str(host.holder.pid), "-n", "-m", "-u", "--", *argv],
            cwd=self.shared, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        out.close()
        host.procs.append(proc)
        return proc

    def run(self, host: Host, argv: Sequence[str], timeout: float = 60, env: dict[str, str] | None = None):
        """Run ``argv`` on ``host`` to its end; its ``CompletedProcess`` (output captured as text)."""
        return subprocess.run(
            ["nsenter", "-t", str(host.holder.pid), "-n", "-m", "-u", "--", *argv],
            cwd=self.shared, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def pids(self, host: Host) -> list[int]:
        """Every process in the host's network namespace."""
        out = _ip("netns", "pids", host.ns, check=False).stdout
        return [int(p) for p in out.split()]

    def crash(self, host: Host) -> None:
        """SIGKILL every process of ``host`` at once, its holder too (its tmpfs go with it)."""
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in [*host.procs, host.holder]:
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        host.procs.clear()
        host.holder = None

    def revive(self, host: Host) -> None:
        """A crashed host boots again: fresh ``/dev/shm`` and ``/tmp``, nothing running."""
        self._hold(host)

    def partition(self, host: Host) -> None:
        _ip("link", "set", host.link, "down")

    def heal(self, host: Host) -> None:
        _ip("link", "set", host.link, "up")

    def close(self) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                self.crash(host)
            _ip("netns", "del", host.ns, check=False)
            _ip("link", "del", host.link, check=False)
        _ip("link", "del", self.bridge, check=False)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


@contextlib.contextmanager
def shared_folder(name: str) -> Iterator[Path]:
    """A folder every host sees (outside ``/tmp``, which each host has its own of), removed after."""
    path = Path("/var/tmp") / f"dagrl-{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# A Dask cluster over the hosts, and dagrl runs on it
# ---------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
"""The repository: graph files are taken from its ``graphs/``."""
PORT = 8786
QUICK = ["supervision.poll_s=0.5", "supervision.respawn_after_s=5"]


@dataclass
class Run:
    """What a finished run wrote: ``actors.json``, ``metrics.jsonl``, ``events.jsonl`` (restarts)."""

    actors: list[dict]
    rows: list[dict]
    events: list[dict]


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

    def start_worker(self, name: str, resources: str, k: int) -> Path:
        """``dagrl worker`` on host ``name``, named ``<name>-w<k>``; its log."""
        host = self.host(name)
        log = self.shared / f"{name}-w{k}.log"
        cmd = ["-m", "dagrl", "worker", self.address, "--nworkers", "1", "--nthreads", "2", "--host", host.address]
        cmd += ["--resources", resources, "--no-dashboard", "--name", f"{name}-w{k}", "--death-timeout", "60"]
        self.hosts.spawn(host, python(*cmd), log)
        return log

    def start_run(self, graph: str, overrides: list[str]):
        args = ["-m", "dagrl", "run", str(ROOT / "graphs" / f"{graph}.yaml"), "--scheduler", self.address, "--quiet"]
        for item in [f"runs_dir={self.shared / 'runs'}", *overrides]:
            args += ["--set", item]
        return self.hosts.spawn(self.head, python(*args), self.shared / "driver.log")

    def run(self, graph: str, overrides: list[str], timeout: float = 240) -> tuple[dict, Run]:
        proc = self.start_run(graph, overrides)
        return self.finish(proc, timeout)

    def finish(self, proc, timeout: float = 240, stop: bool = False) -> tuple[dict, Run]:
        """The run's summary and what it wrote (read now: the shared folder goes with the cluster). ``stop``:
        end it now, as SLURM or a user would (``SIGTERM``: the driver checkpoints and exits 128 + 15)."""
        if stop:
            proc.send_signal(signal.SIGTERM)  # nsenter without a pid namespace execs: this is the driver
        rc = proc.wait(timeout)
        log = (self.shared / "driver.log").read_text()
        if rc != (128 + signal.SIGTERM if stop else 0):
            raise AssertionError(f"dagrl run exited {rc}:\n{log[-3000:]}")
        path = self.run_dir()
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        events_file = path / "events.jsonl"
        events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
        return json.loads((path / "summary.json").read_text()), Run(actors(path), rows, events)

    def run_dir(self) -> Path:
        (run,) = list((self.shared / "runs").iterdir())
        return run

    def rows(self) -> int:
        with contextlib.suppress(StopIteration, FileNotFoundError, ValueError):
            return len((self.run_dir() / "metrics.jsonl").read_text().splitlines())
        return 0

    def last_row(self) -> dict:
        """The run's last metrics row so far (empty before the first)."""
        with contextlib.suppress(StopIteration, FileNotFoundError, ValueError, IndexError):
            return json.loads((self.run_dir() / "metrics.jsonl").read_text().splitlines()[-1])
        return {}

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
        logs = [setup.start_worker(name, resources, k) for k, (name, resources) in enumerate(workers)]
        for log in logs:
            wait_for(lambda log=log: "Registered to:" in log.read_text(), 90, f"{log.stem} to join the scheduler")
        yield setup


def actors(run: Path) -> list[dict]:
    return json.loads((run / "actors.json").read_text())
