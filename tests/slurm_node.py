"""A real SLURM for the tests, Debian's slurm-wlm and munge as root: one node on loopback
(:class:`SlurmNode`), or one node per emulated host (:class:`SlurmOnHosts`).

``SlurmNode(tmp).start()`` installs the packages where they are missing, writes a configuration
(one node, more CPUs than the machine has through ``config_overrides``, one fake GPU backed by
``/dev/null``), starts munged, slurmctld and slurmd, and waits until the node is idle.
``stop()`` cancels every job and stops the daemons. ``SLURM_CONF`` points commands (and the jobs
they submit) at this configuration.

Also usable by hand to try ``dagrl submit`` on one machine::

    python tests/slurm_node.py /tmp/slurm     # starts it, prints the export line
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ["slurm-wlm", "slurm-client", "munge"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "munged"]
NODE_CPUS = 8
NODE_MEMORY_MB = 16000


SETTINGS = """ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
"""
TAIL = """JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=5
InactiveLimit=0
"""
"""slurm.conf lines both test clusters share (processes tracked without cgroups, cores as the unit, no
accounting); a node's own lines go between them."""


def start_munged(root: Path) -> tuple[subprocess.Popen, Path]:
    """munged with its socket, keys and log under ``root``; the process and its socket, once it exists."""
    sock, m = root / "munge" / "munge.socket.2", root / "munge"
    log = open(root / "log" / "munged.out", "ab")  # noqa: SIM115 (lives with the daemon)
    proc = subprocess.Popen(
        ["munged", "--force", "--foreground", f"--socket={sock}", f"--pid-file={m}/munged.pid",
         f"--log-file={root}/log/munged.log", f"--seed-file={m}/munged.seed"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    SlurmNode._wait(lambda: sock.exists(), 10, "munged did not create its socket")
    return proc, sock


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def install() -> None:
    """apt-get the SLURM and munge packages unless their daemons are already on PATH."""
    try:
        from tests.debian import ensure
    except ImportError:  # run as a script: python tests/slurm_node.py
        from debian import ensure
    ensure(BINARIES, PACKAGES)


class SlurmNode:
    def __init__(self, root: str | Path, cpus: int = NODE_CPUS):
        self.root = Path(root)
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for d in ("state", "spool", "log", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        r = self.root
        self.conf.write_text(
            f"""ClusterName=dagrltest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
{SETTINGS}GresTypes=gpu
{TAIL}SlurmdTimeout=60
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={NODE_MEMORY_MB} Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
"""
        )
        (self.root / "gres.conf").write_text(f"NodeName={self.host} Name=gpu File=/dev/null\n")

    def start(self, timeout: float = 60.0) -> SlurmNode:
        install()
        self.write_config()
        os.environ.update(self.env)
        munged, sock = start_munged(self.root)
        self.procs.append(munged)
        # slurm's auth plugin finds munged through AuthInfo; point it at our socket
        text = self.conf.read_text().replace("AuthType=auth/munge", f"AuthType=auth/munge\nAuthInfo=socket={sock}")
        self.conf.write_text(text)
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn(["slurmd", "-D", "-f", str(self.conf)])
        self._wait(self._idle, timeout, "the SLURM node did not become idle")
        return self

    def _spawn(self, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.out", "ab")  # noqa: SIM115 (lives with the daemon)
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _idle(self) -> bool:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode}; see {self.root}/log")
        out = _run(["sinfo", "-h", "-N", "-o", "%t"], env={**os.environ, **self.env})
        return out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc")

    @staticmethod
    def _wait(ready, timeout: float, message: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ready():
                return
            time.sleep(0.25)
        raise RuntimeError(message)

    def jobs(self) -> list[str]:
        """Ids of jobs still pending or running."""
        out = _run(["squeue", "-h", "-o", "%i %T"], env={**os.environ, **self.env})
        return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]

    def stop(self) -> None:
        _run(["scancel", "--full", "--user=root"], env={**os.environ, **self.env})
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.procs.clear()


class SlurmOnHosts:
    """A SLURM cluster over emulated hosts (``tests/hosts.py``): slurmctld on the first host, one slurmd
    per other host (its NodeName is its hostname, its NodeAddr its address), munged's socket in the
    shared folder. SLURM's commands run on the first host (:meth:`run`); ``SlurmdTimeout`` is short,
    so a node that dies is marked down, and its jobs failed, within seconds."""

    def __init__(self, hosts, cpus: int = 4, slurmd_timeout: int = 10):
        self.hosts, self.cpus, self.timeout = hosts, cpus, slurmd_timeout
        self.root = hosts.shared / "slurm"
        self.conf = self.root / "slurm.conf"
        self.head, self.nodes = hosts.hosts[0], hosts.hosts[1:]
        self.munged: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self, sock: Path) -> None:
        for d in ("state", "spool", "log", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        r, names = self.root, ",".join(n.name for n in self.nodes)
        nodes = "\n".join(
            f"NodeName={n.name} NodeAddr={n.address} CPUs={self.cpus} RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
            for n in self.nodes
        )
        self.conf.write_text(
            f"""ClusterName=dagrlhosts
SlurmctldHost={self.head.name}({self.head.address})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
{SETTINGS}{TAIL}SlurmdTimeout={self.timeout}
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP LLN=YES
"""
        )

    def start(self, timeout: float = 90.0) -> SlurmOnHosts:
        install()
        self.write_config(self.root / "munge" / "munge.socket.2")
        self.munged, _ = start_munged(self.root)
        out = self.root / "log"
        self.hosts.spawn(self.head, ["slurmctld", "-D", "-i", "-f", str(self.conf)], out / "slurmctld.out", self.env)
        for node in self.nodes:
            (self.root / "spool" / node.name).mkdir(parents=True, exist_ok=True)
            cmd = ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)]
            self.hosts.spawn(node, cmd, out / f"slurmd-{node.name}.out", self.env)
        SlurmNode._wait(self._idle, timeout, f"the SLURM nodes did not become idle; see {out}")
        return self

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """A command on the head host, where slurmctld answers."""
        return self.hosts.run(self.head, argv, timeout, self.env)

    def states(self) -> dict[str, str]:
        """Node name -> its state as ``sinfo`` says it (``idle``, ``alloc``, ``down*``...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def _idle(self) -> bool:
        states = self.states()
        return len(states) == len(self.nodes) and all(s in ("idle", "mix", "alloc") for s in states.values())

    def jobs(self) -> dict[str, tuple[str, str, str]]:
        """Job id -> (name, state, node list), pending and running."""
        out = self.run(["squeue", "-h", "-o", "%i %j %T %N"]).stdout
        return {
            p[0]: (p[1], p[2], p[3] if len(p) > 3 else "") for p in (line.split() for line in out.splitlines()) if p
        }

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run(["scancel", "--full", "--user=root"], timeout=20)
        if self.munged is not None and self.munged.poll() is None:
            os.killpg(self.munged.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.munged.wait(10)


if __name__ == "__main__":
    node = SlurmNode(sys.argv[1] if len(sys.argv) > 1 else "/tmp/dagrl-slurm").start()
    print(f"SLURM is up; in your shell: export SLURM_CONF={node.conf}")
    print("Ctrl-C stops it")
    try:
        signal.pause()
    except KeyboardInterrupt:
        node.stop()
