"""The replay role on a real LocalCluster: samplers add over Dask, a learner samples; counts add up."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.app.graphs import resolve_graph
from dagrl.policies import build_policy
from dagrl.runtime.hosts import role_context
from tests.replay_algo import replay

ITERATIONS, SAMPLERS, ENVS, STEPS = 6, 2, 2, 25


def graph(tmp_path, shards: int, policy: str = "sync"):
    return resolve_graph(
        {
            "algorithm": "tests.replay_algo",
            "env": {"id": "CartPole-v1"},
            "policy": policy,
            "roles": {
                "sampler": {"replicas": SAMPLERS, "envs": ENVS},
                "replay": {"replicas": shards, "path": str(tmp_path / "replay")},
            },
            "hyperparameters": {"steps": STEPS},
        },
        "test",
    )


@pytest.mark.parametrize("shards", [1, 2])
def test_samplers_add_learner_samples_counts_add_up(client, tmp_path, shards):
    g = graph(tmp_path, shards)
    policy = build_policy(g, client)
    try:
        for _ in range(ITERATIONS):
            metrics = policy.step().metrics
        replay_states = policy.state_dict()["replay"]  # checkpoint: flushes every shard
    finally:
        policy.close()
    per_sampler = ITERATIONS * ENVS * STEPS
    per_shard_each_iteration = ENVS * STEPS * SAMPLERS // shards
    expected_seen = sum(min(64, t * per_shard_each_iteration) for t in range(1, ITERATIONS + 1)) * shards
    assert metrics["learner/seen"] == expected_seen
    assert metrics["learner/shards"] == shards
    assert sum(s["rows"] for s in replay_states) == SAMPLERS * per_sampler
    assert all(s["durable_rows"] == s["rows"] for s in replay_states)
    sources = []
    for i in range(shards):  # reopen each shard's zarr store in this process: what the actors wrote
        store = replay(_ctx(g, i, tmp_path), g.config)
        rows = store.read(np.arange(store.head, store.tail))
        assert store.cold_rows > 0  # the memory budget made it spill
        sources.append(rows["source"])
    all_sources = np.concatenate(sources)
    assert np.bincount(all_sources).tolist() == [per_sampler] * SAMPLERS
    if shards == 2:  # sharded: sampler i feeds shard i
        assert [set(s.tolist()) for s in sources] == [{0}, {1}]


def _ctx(g, index, tmp_path):
    ctx = role_context(g, "replay", index)
    assert ctx.path == str(tmp_path / "replay" / str(index))
    return ctx


def test_single_and_sync_fill_replay_identically(client, tmp_path):
    stores = []
    for policy in ("single", "sync"):
        g = graph(tmp_path / policy, 1, policy)
        pol = build_policy(g, client if policy == "sync" else None)
        try:
            for _ in range(3):
                pol.step()
            pol.state_dict()
        finally:
            pol.close()
        store = replay(role_context(g, "replay", 0), g.config)
        stores.append(store.read(np.arange(store.head, store.tail)))
    for k in stores[0]:
        np.testing.assert_array_equal(stores[0][k], stores[1][k])


@pytest.mark.parametrize(
    ("graph", "samplers", "warned"),
    [("sac-pendulum-apex", 3, True), ("sac-pendulum-apex", 4, False), ("sac-pendulum-apex", 1, False),
     ("dqn-cartpole-apex", 3, False)],
)  # fmt: skip
def test_replay_shards_fed_unequally_are_warned_unless_the_learner_sizes_draws(
    graphs_dir, caplog, monkeypatch, graph, samplers, warned
):
    """3 samplers into 2 shards: shard 0 gets two samplers' rows. SAC's shards draw the same number of
    rows each, so shard 1's rows are drawn twice as often until both are full: warned. DQN's learner
    sizes each shard's draw through ``reprioritize`` (tests/test_replay_shards.py): not warned. One
    sampler feeds shard 0 alone: that is not a share, so no warning."""
    import logging

    from dagrl.app.graphs import load_graph

    logger = logging.getLogger("dagrl")  # as a test before may have left it after `dagrl` set its handler
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    with caplog.at_level("WARNING", logger="dagrl"):
        load_graph(f"{graphs_dir}/{graph}.yaml", [f"roles.sampler.replicas={samplers}", "roles.replay.replicas=2"])
    message = f"roles.sampler.replicas {samplers} is not a multiple of roles.replay.replicas 2"
    assert (message in caplog.text) == warned, caplog.text
