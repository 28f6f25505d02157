"""Shared fixtures: a real LocalCluster of worker processes (no mocks of Dask)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import pytest

# Keep Dask's config files (dask-jobqueue writes one on import) out of the user's home.
os.environ.setdefault("DASK_CONFIG", tempfile.mkdtemp(prefix="dagrl-dask-config-"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_finish(session):
    """Start the Debian installs the collected tests need (a fresh CI machine has none of them) while the
    tests before them run: SLURM and munge, chromium, EGL, iproute2 for the emulated hosts."""
    from tests import debian, hosts, slurm_node

    files = {item.path.name for item in session.items}
    needs = [
        (
            {"test_slurm.py", "test_slurm_hosts.py", "test_notebooks.py"},
            debian.missing,
            (slurm_node.BINARIES, slurm_node.PACKAGES),
        ),
        ({"test_dashboard.py"}, debian.missing, debian.CHROMIUM),
        ({"test_eval_command.py"}, debian.missing_libraries, debian.EGL),
        ({"test_hosts.py", "test_slurm_hosts.py"}, debian.missing, hosts.TOOLS),
    ]
    packages = [p for users, absent, (have, pkgs) in needs if files & users and absent(have) for p in pkgs]
    debian.install_early(packages)


@pytest.fixture
def dagrl_log(caplog, monkeypatch):
    """``caplog`` that hears the ``dagrl`` logger whatever ran before. dagrl's CLI stops that logger
    from propagating to the root logger, where ``caplog`` listens, so a CLI test earlier in the session
    would hide its records; here the logger hands each record to ``caplog`` once, directly."""
    logger = logging.getLogger("dagrl")
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.fixture(scope="session")
def client():
    """Three worker processes (two samplers and a learner), one thread each, dashboard on a free port,
    started as the README says a user's own cluster should be."""
    from distributed import Client, LocalCluster

    from dagrl.clusters.local import untrimmed

    with (
        untrimmed(),
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0", host="127.0.0.1"
        ) as cluster,
        Client(cluster, direct_to_workers=True) as c,
    ):
        yield c


@pytest.fixture
def graphs_dir():
    return os.path.join(ROOT, "graphs")


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real single-node SLURM (tests/slurm_node.py), shared by the tests that submit jobs."""
    from tests.slurm_node import SlurmNode

    node = SlurmNode(tmp_path_factory.mktemp("slurm")).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Four worker processes under nannies (a killed worker comes back empty, as on a real cluster), with
    a folder for one-shot faults (``DAGRL_FAULT_DIR``, ``tests/faulty.py``) that their processes see."""
    from distributed import Client, LocalCluster

    from dagrl.clusters.local import untrimmed

    os.environ["DAGRL_FAULT_DIR"] = str(tmp_path_factory.mktemp("faults"))
    with (
        untrimmed(),  # else its nannies, made in this process, put Dask's trim threshold in its environment
        LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0", host="127.0.0.1") as lc,
        Client(lc, direct_to_workers=True) as client,
    ):
        yield client


@pytest.fixture
def faults():
    """The fault folder, emptied (each one-shot fault fires again); a hang left behind is released after."""
    path = os.environ["DAGRL_FAULT_DIR"]
    shutil.rmtree(path)
    os.makedirs(path)
    yield path
    open(os.path.join(path, "release-hung"), "w").close()
