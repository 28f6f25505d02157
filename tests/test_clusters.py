"""Cluster files: validation before anything starts, pool choice per role, the desktop GPU layout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagrl.app.graphs import load_graph
from dagrl.clusters.connect import connect
from dagrl.clusters.spec import LocalClusterSpec, load_cluster
from dagrl.core.schema import ConfigError
from dagrl.runtime.workers import workers as live_workers


def write(tmp_path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name", ["local", "desktop-gpu", "slurm", "scheduler"])
def test_shipped_cluster_files_load(name):
    spec = load_cluster(f"clusters/{name}.yaml")
    assert spec.kind in ("local", "slurm", "scheduler")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("kind: slurm\npools: {}\n", "pools"),
        ("kind: slurm\npools: {cpu: {cores: 0}}\n", "pools.cpu: cores"),
        ("kind: slurm\npools: {cpu: {memory: lots}}\n", "pools.cpu: memory"),
        ("kind: slurm\npools: {cpu: {cores: 1}}\nwalltme: 1\n", "walltme"),
        ("kind: pbs\n", "kind"),
        ("kind: local\ngpu_workers: -1\n", "gpu_workers"),
    ],
)
def test_bad_cluster_files_name_file_and_key(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    assert str(err.value).startswith(f"{path}: {key}"), err.value


def test_roles_go_to_the_pool_their_resources_fit(tmp_path):
    from dagrl.clusters.slurm import assign_pools

    spec = load_cluster("clusters/slurm.yaml")
    graph = load_graph("graphs/sac-pendulum-split.yaml")
    pools = assign_pools(spec, graph.active_roles)
    assert pools == {"sampler": "sampler", "replay": "sampler", "critic": "learner", "actor": "learner"}
    with_eval = load_graph("graphs/sac-pendulum-split.yaml", ["evaluate.every=10"])
    assert assign_pools(spec, with_eval.active_roles)["evaluator"] == "sampler"  # a CPU role


def test_a_role_no_pool_fits_is_an_error_naming_it(tmp_path):
    cluster = write(tmp_path, "kind: slurm\npools: {cpu: {cores: 2}}\n")
    out = subprocess.run(
        [sys.executable, "-m", "dagrl", "submit", "graphs/sac-pendulum-split.yaml", "--cluster", cluster, "--dry-run"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"dagrl: error: {cluster}: pools: role critic needs GPU=1 and no pool offers it (pools: cpu: CPU=2)"
    )


def test_dry_run_needs_no_slurm_and_writes_nothing(tmp_path):
    runs = tmp_path / "runs"
    env = dict(os.environ, PATH="/nonexistent")  # no sbatch anywhere
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dagrl",
            "submit",
            "graphs/sac-pendulum-split.yaml",
            "--cluster",
            "clusters/slurm.yaml",
            "--set",
            f"runs_dir={runs}",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("#SBATCH --gres=gpu:1") == 2  # critic and actor jobs
    assert out.stdout.count("(worker job)") == 5 and out.stdout.count("(driver job)") == 1
    assert "#SBATCH -p cpu" in out.stdout and "conda activate dagrl" in out.stdout
    # every worker job keeps Dask's housekeeping quiet, as local workers do (clusters.QUIET_CONFIG)
    assert out.stdout.count("export DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL=1s") == 5
    assert out.stdout.count("export DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING=False") == 5
    assert out.stdout.count("export DASK_DISTRIBUTED__COMM__OFFLOAD=False") == 5
    assert not runs.exists()


def test_submit_wants_a_slurm_cluster():
    out = subprocess.run(
        [sys.executable, "-m", "dagrl", "submit", "graphs/ppo-cartpole.yaml", "--cluster", "clusters/local.yaml"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "clusters/local.yaml: kind: dagrl submit needs a cluster of kind slurm" in out.stderr


def test_desktop_gpu_layout_puts_learners_on_gpu_workers():
    """One worker per GPU (pinned with CUDA_VISIBLE_DEVICES, advertising GPU=1), CPU workers for the rest."""
    from dagrl.policies import build_policy

    graph = load_graph("graphs/sac-pendulum-split.yaml")
    spec = LocalClusterSpec(gpu_workers=2, dashboard_address=":0")
    with connect(spec, graph) as client:
        workers = live_workers(client)
        gpu = {a for a, w in workers.items() if w["resources"].get("GPU")}
        assert len(gpu) == 2 and len(workers) == 5  # one per role replica
        # without Dask's eager malloc trimming, which made torch updates ~2 x slower (clusters.WORKER_ENVIRON_NOTE)
        trim = client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_")
        assert set(trim.values()) == {None}, trim
        assert set(client.run(os.environ.get, "OMP_NUM_THREADS").values()) == {"1"}
        # Dask's housekeeping at dagrl's calmer intervals, GPU workers included (clusters.QUIET_CONFIG)
        assert set(client.run(housekeeping).values()) == {("1s", "500ms", "2s")}
        assert "stealing" not in client.run_on_scheduler(scheduler_extensions)
        # messages serialized on the event loop, not sized for an offload thread first (a module
        # constant Dask reads as it is imported: workers from their environment, the scheduler here)
        assert set(client.run(offload_threshold).values()) == {False}
        assert client.run_on_scheduler(offload_threshold) is False
        policy = build_policy(graph, client)
        try:
            by_role = {(a["role"], a["index"]): a for a in policy.actors()}
        finally:
            policy.close()
    for role in ("critic", "actor"):
        assert by_role[(role, 0)]["address"] in gpu
    assert {
        by_role[("critic", 0)]["env"]["CUDA_VISIBLE_DEVICES"],
        by_role[("actor", 0)]["env"]["CUDA_VISIBLE_DEVICES"],
    } == {
        "0",
        "1",
    }
    for role in ("sampler", "replay"):
        assert by_role[(role, 0)]["address"] not in gpu
        assert "CUDA_VISIBLE_DEVICES" not in by_role[(role, 0)]["env"]


def offload_threshold():
    from distributed.comm import utils

    return utils.OFFLOAD_THRESHOLD


def housekeeping() -> tuple[str, str, str]:
    import dask

    get = dask.config.get
    return (
        get("distributed.admin.tick.interval"),
        get("distributed.worker.memory.monitor-interval"),
        get("distributed.admin.system-monitor.interval"),
    )


def scheduler_extensions(dask_scheduler) -> list[str]:
    return list(dask_scheduler.extensions)


def test_quiet_false_keeps_dasks_own_housekeeping():
    from distributed import Client

    from dagrl.clusters.local import local_cluster

    with local_cluster(LocalClusterSpec(quiet=False, dashboard_address=":0"), 1) as cluster, Client(cluster) as client:
        assert set(client.run(housekeeping).values()) == {("20ms", "100ms", "500ms")}
        assert "stealing" in client.run_on_scheduler(scheduler_extensions)


def test_a_run_on_a_cluster_with_dasks_trim_threshold_says_how_to_start_it(tmp_path):
    """A plain LocalCluster's workers carry MALLOC_TRIM_THRESHOLD_ (as each actor reports it); the
    warning names the roles and the fix, and a cluster started inside ``untrimmed()`` gets none."""
    import json

    from distributed import Client, LocalCluster

    import dagrl
    from dagrl.clusters.local import trim_warning, untrimmed

    graph = load_graph("graphs/ppo-cartpole-sync.yaml", ["stop.iterations=1", f"runs_dir={tmp_path}"])
    import dask

    def dask_default():  # Dask's own default, stated here: a test before may have left the config changed
        return dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": 65536})

    for start, expect in ((dask_default, True), (untrimmed, False)):  # in this order: see untrimmed
        with (
            start(),
            LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=":0", host="127.0.0.1") as cluster,
            Client(cluster) as client,
        ):
            summary = dagrl.train(graph, client, progress=False)
        actors = json.loads((Path(summary["run_dir"]) / "actors.json").read_text())
        warning = trim_warning(actors)
        assert bool(warning) == expect, actors
        if expect:
            assert "learner[0]" in warning and "sampler[1]" in warning and "untrimmed" in warning


def test_the_worker_list_never_reads_empty_under_the_clients_periodic_refresh():
    """The client refreshes its cached scheduler identity with no workers in it; a liveness check that
    read that cache saw every role lost (a SIGKILLed sampler was once blamed on the learner)."""
    import time

    import dask
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}),
        LocalCluster(n_workers=2, processes=False, dashboard_address=None) as lc,
        Client(lc) as client,
    ):
        sizes = set()
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            sizes.add(len(live_workers(client)))
        assert sizes == {2}
        assert all("nthreads" in w for w in live_workers(client).values())
    with pytest.raises(OSError, match="the Dask client is closed"):
        live_workers(client)  # the supervisor keeps its last list on this


def test_roles_sharing_a_gpu_worker_run_their_fragments_at_the_same_time(tmp_path):
    """``split-learner``'s critic and actor on one GPU (``GPU: 0.5`` each) share its worker, which has
    a thread for each: their updates overlap, as they would on a GPU each (CPU fallback here; the
    placement and the overlap are what is checked, from the spans the learner loop puts in Dask's
    Task Stream)."""
    from distributed import get_task_stream

    from dagrl.policies import build_policy
    from dagrl.runtime import spans

    graph = load_graph(
        "graphs/sac-pendulum-split.yaml",
        ["roles.critic.resources.GPU=0.5", "roles.actor.resources.GPU=0.5", "hyperparameters.learning_starts=256",
         "hyperparameters.hidden=32"],
    )  # fmt: skip
    with connect(LocalClusterSpec(gpu_workers=1, dashboard_address=":0"), graph) as client:
        workers = live_workers(client)
        (gpu,) = [a for a, w in workers.items() if w["resources"].get("GPU")]
        assert workers[gpu]["nthreads"] == 2
        assert all(w["nthreads"] == 1 for a, w in workers.items() if a != gpu)
        policy = build_policy(graph, client, run_dir=tmp_path)
        try:
            where = {a["role"]: a["address"] for a in policy.actors()}
            with get_task_stream(client) as ts:
                for _ in range(40):  # 16 of warm-up (256 env steps), then rounds that learn
                    policy.step()
                time.sleep(2 * spans.EVERY_S)  # a loop sends its spans at most every EVERY_S: the last ones
        finally:
            policy.close()
    assert where["critic"] == where["actor"] == gpu
    spans = {"update_critic": [], "update_actor": []}
    for rec in ts.data:
        name = rec["key"].split("-")[0]
        if name in spans and rec["worker"] == gpu:
            spans[name].append((rec["startstops"][0]["start"], rec["startstops"][0]["stop"]))
    assert len(spans["update_critic"]) >= 10, spans
    overlapping = sum(any(a0 < c1 and c0 < a1 for a0, a1 in spans["update_actor"]) for c0, c1 in spans["update_critic"])
    assert overlapping >= 6, spans
