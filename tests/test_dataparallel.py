"""``dp-learners`` on a real LocalCluster: identical learner replicas, a killed one, a bad algorithm."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.core.schema import ConfigError
from dagrl.policies.dataparallel import ReplicasDiverged
from dagrl.runtime.collective import choose_backend
from dagrl.runtime.iteration import merge_outputs
from tests.test_supervision import Run


@pytest.fixture(scope="module")
def cluster():
    """Four worker processes under nannies: two samplers, two learner replicas, one per process."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0", host="127.0.0.1") as lc,
        Client(lc, direct_to_workers=True) as client,
    ):
        yield client


def _arrays(sd, prefix=""):
    """Every tensor/array of a nested state dict, by path."""
    out = {}
    if isinstance(sd, dict):
        for k, v in sd.items():
            out.update(_arrays(v, f"{prefix}{k}."))
    elif isinstance(sd, list | tuple):
        for i, v in enumerate(sd):
            out.update(_arrays(v, f"{prefix}{i}."))
    elif hasattr(sd, "numpy") or isinstance(sd, np.ndarray):
        out[prefix] = np.asarray(sd)
    return out


def test_learner_replicas_stay_bit_identical_and_learn_from_both_shards(cluster, tmp_path):
    graph = load_graph("graphs/ppo-cartpole-dp.yaml", ["stop.iterations=6", "stop.mean_return=null"])
    run = Run(graph, cluster, tmp_path)
    first = run.policy.hosts["learner"][0].state_dict().result()  # after broadcast: replica 0's initial state
    summary = run.finish()
    assert summary["iterations"] == 6
    # Run.finish closed the policy; the checkpoint holds replica 0 once, and the run checked the others
    from dagrl.runtime.checkpoint import load_checkpoint

    ckpt = load_checkpoint(run.rundir.path)
    assert len(ckpt["roles"]["learner"]) == 1
    assert ckpt["roles"]["learner"][0]["updates"] == 6
    before, after = _arrays(first["agent"]), _arrays(ckpt["roles"]["learner"][0]["agent"])
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # it did learn
    rows = run.rundir.read_metrics()
    # frames of both replicas are summed: 20 epochs x one 128-row minibatch x 2 replicas
    assert rows[-1]["perf/frames"] == 20 * 128 * 2
    assert rows[-1]["env_steps"] == 6 * 2 * 4 * 32


def learner_states(cluster, tmp_path, overrides: list[str], iterations: int) -> list[dict]:
    """Both learner replicas' states after ``iterations`` of ``ppo-cartpole-dp`` with ``overrides``."""
    from dagrl.policies import build_policy

    graph = load_graph("graphs/ppo-cartpole-dp.yaml", [*overrides, f"runs_dir={tmp_path}"])
    cluster.wait_for_workers(4, timeout=60)
    policy = build_policy(graph, cluster)
    try:
        for _ in range(iterations):
            policy.step()
        return [h.state_dict().result() for h in policy.hosts["learner"]]
    finally:
        policy.close()


def test_replicas_fold_identical_normalisation_statistics(cluster, tmp_path):
    states = learner_states(cluster, tmp_path, ["hyperparameters.norm_obs=true", "hyperparameters.norm_reward=true"], 3)
    a, b = _arrays(states[0]["agent"]), _arrays(states[1]["agent"])
    assert all(np.array_equal(a[k], b[k]) for k in a), [k for k in a if not np.array_equal(a[k], b[k])]
    rows_per_iteration = 2 * 4 * 32  # both replicas' rollouts: 2 samplers x 4 envs x 32 steps
    assert float(a["obs_norm.count."]) == 3 * rows_per_iteration
    assert float(a["return_norm.count."]) == 3 * rows_per_iteration


def _in_a_group() -> bool:
    import torch.distributed as dist

    return dist.is_initialized()


def test_a_closed_run_leaves_no_group_for_the_next_run_on_its_workers(cluster, tmp_path):
    """The group is each worker process's default one. Left in place, a later run's learner on such a
    worker averaged its gradients with the gone replicas and waited for them until gloo's timeout."""
    from dagrl.policies import build_policy

    cluster.wait_for_workers(4, timeout=60)
    policy = build_policy(load_graph("graphs/ppo-cartpole-dp.yaml", [f"runs_dir={tmp_path}"]), cluster)
    try:
        policy.step()
        learners = {h.address for h in policy.hosts["learner"]}
        assert all(cluster.run(_in_a_group, workers=list(learners)).values())
    finally:
        policy.close()
    assert not any(cluster.run(_in_a_group).values())
    graph = load_graph("graphs/ppo-cartpole-sync.yaml", ["roles.learner.resources={}", f"runs_dir={tmp_path}"])
    policy = build_policy(graph, cluster)
    try:
        assert policy.step().metrics["losses/value"] > 0  # a learner alone again, wherever it landed
    finally:
        policy.close()


def test_replicas_compared_bit_for_bit_after_updates(cluster, tmp_path):
    """Also under ``anneal_lr``: each replica trains on half of a batch, and both count the whole of it."""
    over = ["stop.iterations=4", "stop.mean_return=null", "hyperparameters.anneal_lr=true", "stop.env_steps=2048"]
    states = learner_states(cluster, tmp_path, over, 4)
    a, b = _arrays(states[0]), _arrays(states[1])
    assert a.keys() == b.keys() and len(a) > 6
    assert all(np.array_equal(a[k], b[k]) for k in a), [k for k in a if not np.array_equal(a[k], b[k])]
    assert states[0]["updates"] == states[1]["updates"] == 4
    assert states[0]["trained_steps"] == states[1]["trained_steps"] == 4 * 256  # 2 samplers x 4 envs x 32
    lrs = [s["optimizer"]["param_groups"][0]["lr"] for s in states]
    assert lrs == [pytest.approx(1e-3 * (1 - 3 * 256 / 2048))] * 2  # the 4th batch's rate


def test_an_algorithm_that_does_not_average_gradients_is_stopped_with_its_name(cluster, tmp_path):
    graph = load_graph(
        "graphs/ppo-cartpole-dp.yaml", ["algorithm=tests.unaveraged", "stop.iterations=3", "stop.mean_return=null"]
    )
    run = Run(graph, cluster, tmp_path)
    with pytest.raises(ReplicasDiverged, match=r"learner replicas 1 differ .*tests.unaveraged.*average_gradients"):
        run.finish()


@pytest.mark.slow
def test_killed_learner_replica_rolls_both_back_and_the_run_reaches_300(cluster, tmp_path):
    """The group learns on after the rollback (to 300: well past the ~100 of iteration 12, and half the
    env steps 475 takes; the graph's own 475 is the untouched runs' in test_learning)."""
    graph = load_graph("graphs/ppo-cartpole-dp.yaml", ["checkpoint.every=5", "stop.mean_return=300"])
    run = Run(graph, cluster, tmp_path)
    summary = run.killed("learner", 12, 1)
    assert summary["stop_reason"] == "mean_return", summary
    restarts = run.events("restart")
    assert [(e["role"], e["index"], e["kind"]) for e in restarts] == [("learner", 1, "lost")], restarts
    (rollback,) = run.events("rollback")
    assert rollback["role"] == "learner" and rollback["to_iteration"] >= 10
    iterations = [r["iteration"] for r in run.rundir.read_metrics()]
    assert iterations == list(range(1, len(iterations) + 1))  # redone iterations replaced their rows


def test_graph_errors_name_the_key():
    single = r"roles\.learner\.replicas.*2: role learner runs as a single instance.*dp-learners"
    with pytest.raises(ConfigError, match=single):
        load_graph("graphs/ppo-cartpole-sync.yaml", ["roles.learner.replicas=2"])
    share = r"roles\.sampler\.replicas.*3: must be a multiple of roles\.learner\.replicas \(2\)"
    with pytest.raises(ConfigError, match=share):
        load_graph("graphs/ppo-cartpole-dp.yaml", ["roles.sampler.replicas=3"])
    with pytest.raises(ConfigError, match=r"roles\.evaluator\.replicas"):
        load_graph("graphs/ppo-cartpole-dp.yaml", ["evaluate.every=5", "roles.evaluator.replicas=2"])
    with pytest.raises(ConfigError, match=r"policy: backend must be one of auto, gloo, nccl, got .mpi."):
        load_graph("graphs/ppo-cartpole-dp.yaml", ["policy.backend=mpi"])


def test_merge_and_backend_rules():
    merged = merge_outputs([{"losses/v": 1.0, "perf/frames": 8.0}, {"losses/v": 3.0, "perf/frames": 8.0}])
    assert merged == {"losses/v": 2.0, "perf/frames": 16.0}
    assert merge_outputs([{"a": 1.0}]) == {"a": 1.0}
    two_gpus = [{"device": "cuda", "gpu": "a"}, {"device": "cuda", "gpu": "b"}]
    assert choose_backend("auto", two_gpus) == "nccl"
    assert choose_backend("auto", [{"device": "cuda", "gpu": "a"}] * 2) == "gloo"  # one GPU shared: no NCCL
    assert choose_backend("auto", [{"device": "cpu", "gpu": None}] * 2) == "gloo"
    assert choose_backend("gloo", two_gpus) == "gloo"


@pytest.mark.parametrize("prioritized", [False, True])
def test_dqn_learner_replicas_stay_identical_with_replay_shards(cluster, tmp_path, prioritized):
    """Off-policy: 2 samplers -> 2 replay shards -> 2 learner replicas (shards share 4 workers)."""
    from dagrl.policies import build_policy

    graph = load_graph("graphs/dqn-cartpole-dp.yaml", [f"hyperparameters.prioritized={str(prioritized).lower()}"])
    cluster.wait_for_workers(4, timeout=60)
    policy = build_policy(graph, cluster, run_dir=str(tmp_path))
    try:
        rows = [policy.step() for _ in range(6)]  # a shard holds 128 rows per iteration: learning from the 4th
        assert [r.metrics["perf/frames"] for r in rows] == [0.0] * 3 + [2 * 32 * 64] * 3
        learners = policy.hosts["learner"]
        assert len({h.address for h in learners}) == 2
        states = [h.state_dict().result() for h in learners]
        assert states[0]["gradient_steps"] == states[1]["gradient_steps"] == 3 * 32
        a, b = _arrays(states[0]), _arrays(states[1])
        assert all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        policy.close()


@pytest.mark.slow
def test_dqn_under_dp_learners_reaches_195(tmp_path):
    from tests.helpers import train

    summary, _ = train("graphs/dqn-cartpole-dp.yaml", tmp_path)
    assert summary["stop_reason"] == "mean_return", summary


def test_the_groups_rendezvous_and_connections_listen_on_dasks_interface_only(cluster, tmp_path):
    """A data-parallel group's store (rank 0) and gloo's pairs keep to the interface the workers' Dask
    address is on (here loopback): nothing of the group listens on every interface of a shared node."""
    import os

    import psutil

    graph = load_graph("graphs/ppo-cartpole-dp.yaml", ["stop.iterations=2", "stop.mean_return=null"])
    run = Run(graph, cluster, tmp_path)
    try:
        pids = cluster.run(os.getpid).values()
        listening = {
            (pid, c.laddr.ip, c.laddr.port)
            for pid in pids
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        learners = {h.address for h in run.policy.hosts["learner"]}
        assert len(learners) == 2
        assert listening and all(ip == "127.0.0.1" for _, ip, _ in listening), sorted(listening)
    finally:
        summary = run.finish()
    assert summary["iterations"] == 2


def _rank(rank: int, ports, out, path: str) -> None:
    """One replica's process: join a group of two, let it go as a later join would, then take a descriptor
    (the number the store's socket had, the lowest free) and leave as a new host's start does."""
    import os

    import torch.distributed as dist

    from dagrl.runtime import collective

    port = collective.reserve_port("127.0.0.1") if rank == 0 else None
    if rank == 0:
        ports.put(port)
    collective.join("gloo", "127.0.0.1", port or ports.get(timeout=30), rank, 2, 30.0, "127.0.0.1")
    dist.destroy_process_group()  # the store and its socket go
    with open(path, "rb") as f:
        try:
            collective.leave()
            os.fstat(f.fileno())
            out.put((rank, "kept"))
        except OSError as err:
            out.put((rank, f"{type(err).__name__}: {err}"))


def test_leaving_a_group_never_closes_a_descriptor_the_store_already_closed(tmp_path):
    """Rank 0's store serves on the socket reserve_port made and closes it when the group goes; leave()
    closing it again closed whatever had reused the number (a replay shard's zarr event loop, which
    then hung every read of the shard)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ports, out = ctx.Queue(), ctx.Queue()
    path = tmp_path / "held"
    path.write_bytes(b"x")
    procs = [ctx.Process(target=_rank, args=(r, ports, out, str(path))) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert got == {0: "kept", 1: "kept"}
