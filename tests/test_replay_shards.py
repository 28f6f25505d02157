"""Sharded replay draws as one replay holding every shard's rows would: the learner sizes each shard's
next draw by what it holds (its priority mass under PER) and puts the shards' weights on one scale."""

from __future__ import annotations

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.policies import build_policy
from dagrl.replay import ReplayStore, Schema
from dagrl.replay.role import ReplayState, UpdateResult, pooled_weights, reprioritize, sample, shard_draws
from dagrl.replay.store import Sample

SCHEMA = Schema({"x": ("float32", ()), "reward": ("float32", ())})


def store(tmp_path, name: str, rows: int, prioritized: bool = False, priorities=None) -> ReplayStore:
    s = ReplayStore(SCHEMA, 10_000, 1 << 24, str(tmp_path / name), seed=len(name), prioritized=prioritized, beta=0.5)
    x = np.arange(rows, dtype=np.float32)
    s.add({"x": x, "reward": x})
    if priorities is not None:
        s.update_priorities(np.arange(rows), priorities)
    return s


def stats(shard: int, rows: int, mass: float, drawn: int = 64) -> Sample:
    return Sample({}, np.zeros(drawn, np.int64), np.ones(drawn, np.float32), shard, rows, mass)


def test_draws_split_what_was_drawn_by_each_shards_mass():
    assert shard_draws([stats(0, 3000, 3000.0), stats(1, 1000, 1000.0)]) == {0: 96, 1: 32}
    assert shard_draws([stats(0, 1, 1.0), None, stats(2, 2, 2.0)]) == {0: 43, 2: 85}  # 42.67, 85.33
    three = shard_draws([stats(i, 100, m) for i, m in enumerate((1.0, 1.0, 1.0))])
    assert sum(three.values()) == 192 and max(three.values()) - min(three.values()) <= 1
    assert shard_draws([stats(0, 10**6, 1e6), stats(1, 10, 10.0)]) == {0: 127, 1: 1}  # each keeps reporting
    assert shard_draws([stats(0, 500, 500.0)]) == {}  # one shard: its own draw stands
    assert shard_draws([Sample({}, np.zeros(4), np.ones(4)), stats(1, 9, 9.0)]) == {}  # no shard stats


def test_uneven_shards_draw_each_row_equally_often_once_the_learner_answers(tmp_path):
    """3,000 rows in shard 0 and 1,000 in shard 1: drawing 64 rows each, a row of shard 1 is drawn 3 x as
    often; after one answer through ``reprioritize`` the shards draw 96 and 32, the same rate per row."""
    states = [
        ReplayState(store(tmp_path, "a", 3000), 64, 1, 0, shard=0),
        ReplayState(store(tmp_path, "bb", 1000), 64, 1, 0, shard=1),
    ]
    rates = []
    for _ in range(3):
        samples = [sample(s, 0) for s in states]
        rates.append([len(s) / s.stored for s in samples])
        result = UpdateResult({"loss": 1.0}, draws=shard_draws(samples))
        assert [reprioritize(s, result) for s in states] == [{"loss": 1.0}] * 2
    assert rates[0] == pytest.approx([64 / 3000, 64 / 1000])
    assert rates[1] == rates[2] == pytest.approx([128 / 4000] * 2)
    assert [s.stats()["draws"] for s in states] == [96, 32]


def test_prioritized_shards_pooled_draw_as_one_prioritized_replay(tmp_path):
    """Each row's chance per pooled draw and its importance weight equal those of one store holding
    both shards' rows with the same priorities."""
    rng = np.random.default_rng(0)
    pa, pb = rng.uniform(0.1, 3.0, 300), rng.uniform(0.5, 9.0, 100)
    a = store(tmp_path, "a", 300, True, pa)
    b = store(tmp_path, "bb", 100, True, pb)
    one = ReplayStore(SCHEMA, 10_000, 1 << 24, str(tmp_path / "one"), prioritized=True, beta=0.5)
    x = np.arange(400, dtype=np.float32)
    one.add({"x": x, "reward": x})
    one.update_priorities(np.arange(400), np.concatenate([pa, pb]))

    samples = [a.sample(64), b.sample(64)]
    for i, s in enumerate(samples):
        s.shard = i
    draws = shard_draws(samples)
    total = sum(draws.values())
    share = one.probabilities(np.arange(300)).sum()  # shard a's part of all the priority mass
    assert abs(draws[0] - total * share) < 1 and abs(draws[1] - total * (1 - share)) < 1
    np.testing.assert_allclose(share * a.probabilities(np.arange(300)), one.probabilities(np.arange(300)))
    np.testing.assert_allclose((1 - share) * b.probabilities(np.arange(100)), one.probabilities(np.arange(300, 400)))

    weights = pooled_weights(samples)
    rows = np.concatenate([samples[0].indices, 300 + samples[1].indices])
    p = one.probabilities(rows)
    least = one.probabilities(np.arange(400)).min()
    np.testing.assert_allclose(weights, (least / p) ** samples[0].beta, rtol=1e-5)  # both drew once: one beta
    assert not np.allclose(np.concatenate([s.weights for s in samples]), weights)  # per shard: other scales


def test_apex_dqn_shards_fed_unequally_draw_by_what_they_hold(client, graphs_dir, tmp_path):
    """Ape-X DQN with 3 samplers into 2 shards on a LocalCluster: shard 0 takes two samplers' rollouts
    and shard 1 one sampler's, and each shard's share of the learner's draws follows its share of the
    rows. How far the rows split depends on the samplers' speeds (on a loaded 2-core machine shard 0
    has held 57-68 %); the draws lag the sizes by a round or two, which 60 rounds make small."""
    g = load_graph(
        f"{graphs_dir}/dqn-cartpole-apex.yaml",
        [
            "roles.sampler.replicas=3", "roles.replay.replicas=2", "hyperparameters.learning_starts=256",
            "hyperparameters.gradient_steps=4", "hyperparameters.steps=16", f"runs_dir={tmp_path}",
        ],
    )  # fmt: skip
    policy = build_policy(g, client)
    try:
        for _ in range(60):
            policy.step()
        beats = [h.heartbeat().result()["stats"] for h in policy.hosts["replay"]]
    finally:
        policy.close()
    rows = np.array([b["rows"] for b in beats], float)
    draws = np.array([b["draws"] for b in beats], float)
    assert draws.sum() == 2 * 64 * 4
    held, drawn, tolerance = rows[0] / rows.sum(), draws[0] / draws.sum(), 0.025
    # Equal draws (0.5 each) must be told apart from draws by size: the rows split unevenly enough.
    assert abs(held - 0.5) > 2 * tolerance, f"rows {rows} split too evenly to tell"
    assert drawn == pytest.approx(held, abs=tolerance), f"rows {rows}, draws {draws}"
