"""Replay store: bit-exact round trips past the memory budget, sampling statistics, bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats

import dagrl.replay.spill as spill_module
import dagrl.replay.store as store_module
from dagrl.replay import NStep, ReplayError, ReplayStore, Schema
from tests.helpers import tmpfs

SCHEMA = Schema({"obs": ("float32", (17,)), "action": ("int64", ()), "reward": ("float32", ()), "done": ("bool", ())})


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    """Rows whose content is a function of their global index, with random-looking bits."""
    idx = np.arange(start, start + n)
    rng = np.random.default_rng(idx[0] if n else 0)
    obs = rng.standard_normal((n, 17)).astype(np.float32)
    obs[:, 0] = idx  # exact in float32 below 2**24
    return {"obs": obs, "action": idx, "reward": (idx * 0.5).astype(np.float32), "done": idx % 7 == 0}


def fill(store: ReplayStore, total: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Add ``total`` rows in irregular batches; return everything added, concatenated."""
    rng = np.random.default_rng(seed)
    added, start = [], store.tail
    while start < store.tail + 0 or sum(len(a["action"]) for a in added) < total:
        n = int(min(rng.integers(1, 3000), total - sum(len(a["action"]) for a in added)))
        batch = rows(start, n)
        store.add(batch)
        added.append(batch)
        start += n
    return {k: np.concatenate([a[k] for a in added]) for k in SCHEMA}


def assert_holds(store: ReplayStore, reference: dict[str, np.ndarray], first_index: int = 0) -> None:
    got = store.read(np.arange(store.head, store.tail))
    lo, hi = store.head - first_index, store.tail - first_index
    for k in SCHEMA:
        np.testing.assert_array_equal(got[k], reference[k][lo:hi], err_msg=k)


@pytest.mark.parametrize("codec", ["blosc-zstd", "zstd", "none"])
@pytest.mark.parametrize("writer", ["files", "zarr"])
def test_chunk_files_hold_exactly_what_zarr_reads_and_writes(tmp_path, codec, writer):
    """The store reads and writes its chunk files itself (numcodecs), skipping zarr's array API: zarr
    reads back what the store wrote, the store reads what zarr wrote, and both are the rows added."""
    store = ReplayStore(SCHEMA, 40_000, 2**20, tmp_path / "r", chunk_rows=512, codec=codec)
    files = store.files
    assert files is not None
    if writer == "zarr":
        store.files = None
    added = fill(store, 30_000)
    cold = range(store.head // 512, store._hot_start() // 512)
    assert len(cold) > 40
    store.files = None
    through_zarr = [store._load_chunk(c) for c in cold]
    store.files = files
    for c, zarrs in zip(cold, through_zarr, strict=True):
        for k, mine in store._load_chunk(c).items():
            np.testing.assert_array_equal(mine, zarrs[k], err_msg=f"chunk {c} {k}")
            np.testing.assert_array_equal(mine, added[k][c * 512 : (c + 1) * 512], err_msg=f"chunk {c} {k}")


def test_chunks_are_files_of_the_array_directory_not_a_directory_each(tmp_path):
    store = ReplayStore(SCHEMA, 40_000, 2**20, tmp_path / "r", chunk_rows=64)
    fill(store, 30_000)
    store.flush()
    array = tmp_path / "r" / "rows"
    chunks = sorted(p.name for p in array.iterdir() if p.name.startswith("c"))
    assert len(chunks) >= 30_000 // 64 and all(re.fullmatch(r"c\.\d+\.0", c) for c in chunks)
    assert not any(p.is_dir() for p in array.iterdir() if p.name.startswith("c"))


def test_a_store_with_a_directory_per_chunk_reopens_and_goes_on_in_its_layout(tmp_path, monkeypatch):
    """Stores made before chunks were flat files (``c/<slot>/0``) read back every row and keep writing
    in their own layout."""
    monkeypatch.setattr(spill_module, "CHUNK_SEPARATOR", "/")
    old = ReplayStore(SCHEMA, 20_000, 2**20, tmp_path / "r", chunk_rows=64)
    ref = fill(old, 15_000)
    old.flush()
    assert (tmp_path / "r" / "rows" / "c" / "0" / "0").is_file()
    monkeypatch.setattr(spill_module, "CHUNK_SEPARATOR", ".")
    reopened = ReplayStore(SCHEMA, 20_000, 2**20, tmp_path / "r", chunk_rows=64)
    assert reopened.files is not None and reopened.files.separator == "/"
    assert reopened.cold_rows > 0 and len(reopened) == 15_000
    assert_holds(reopened, ref)
    more = fill(reopened, 10_000, seed=1)  # wraps around the ring, in the old layout
    assert not list((tmp_path / "r" / "rows").glob("c.*"))
    np.testing.assert_array_equal(reopened.read(np.arange(reopened.tail - 10_000, reopened.tail))["obs"], more["obs"])


def test_ten_times_the_memory_budget_comes_back_bit_exact(tmp_path):
    budget = 3 * 2**20  # 3 MiB of RAM
    capacity = 10 * budget // SCHEMA.row_bytes  # 30 MiB of rows
    store = ReplayStore(SCHEMA, capacity, budget, tmp_path / "r", chunk_rows=1024)
    ref = fill(store, int(capacity * 1.7))  # wraps around: the oldest 0.7 x capacity are dropped
    assert len(store) == capacity and store.head == int(capacity * 0.7)
    assert store.ram_bytes <= budget
    assert store.cold_rows > 0.85 * capacity
    assert_holds(store, ref)
    store.flush()
    reopened = ReplayStore(SCHEMA, capacity, budget, tmp_path / "r", chunk_rows=1024)
    assert (reopened.head, reopened.tail) == (store.head, store.tail)
    assert_holds(reopened, ref)
    more = rows(reopened.tail, 5000)  # and it goes on from the insert position
    reopened.add(more)
    np.testing.assert_array_equal(reopened.read(np.arange(reopened.tail - 5000, reopened.tail))["obs"], more["obs"])


def test_reads_mixing_ram_cached_and_unread_cold_chunks_return_each_row_as_added(tmp_path):
    store = ReplayStore(SCHEMA, 20_000, 200_000, tmp_path / "r", chunk_rows=64, prefetch=False, seed=1)
    ref = fill(store, 26_000)
    for _ in range(5):
        store.sample(256)  # uniform draws fill the cold-chunk cache
    assert store.cached and store.cold_rows > 0.8 * len(store)
    rng = np.random.default_rng(3)
    for _ in range(20):  # unsorted, repeated rows; hot, cached and uncached chunks in one call
        idx = rng.integers(store.head, store.tail, 300)
        idx[:20] = idx[20:40]
        got = store.read(idx)
        for k in SCHEMA:
            np.testing.assert_array_equal(got[k], ref[k][idx], err_msg=k)
    cached = [c for c in store.cached]
    idx = np.array([cached[0] * 64 + 5, store.tail - 1, cached[-1] * 64])
    np.testing.assert_array_equal(store.read(idx)["action"], ref["action"][idx])


def test_ram_only_store_and_oversized_batches():
    store = ReplayStore(SCHEMA, 1000, 2**20, chunk_rows=64)
    ref = fill(store, 3500)
    assert len(store) == 1000
    assert_holds(store, ref)
    big = rows(store.tail, 2500)  # larger than the capacity: its newest 1000 rows stay
    store.add(big)
    np.testing.assert_array_equal(store.read(np.arange(store.head, store.tail))["action"], big["action"][-1000:])


def batch_means_pvalue(per_call: np.ndarray, expected: np.ndarray, groups: int = 60) -> float:
    """Hotelling's T-squared of the bins' mean frequency over groups of calls against ``expected``.

    Draws inside one call are not independent (cold rows come from a few cached chunks), so the
    multinomial chi-square does not apply; the frequencies of groups of calls are close to
    independent and normal, with a covariance estimated from them (the last bin, fixed by the others,
    left out). Calibrated on 527 runs of the test below: p < 0.05 in 3-6 % of them, < 0.01 in under 1 %,
    never < 0.003.
    """
    g = per_call[: len(per_call) // groups * groups].reshape(groups, -1, per_call.shape[1]).sum(1)
    freq = (g / g.sum(1, keepdims=True))[:, :-1]
    d = freq.mean(0) - expected[:-1]
    k = len(d)
    t2 = groups * d @ np.linalg.solve(np.cov(freq, rowvar=False), d)
    return float(stats.f.sf((groups - k) / (k * (groups - 1)) * t2, k, groups - k))


@pytest.mark.parametrize("prefetch_after_s", [0.0, 60.0], ids=["prefetcher", "reads-in-call"])
def test_uniform_sampling_is_uniform_over_hot_and_cold(tmp_path, monkeypatch, prefetch_after_s):
    """Over 1,800 calls whose working set of four chunks turns over at each call, every tenth of the
    stored rows is drawn as often, and hot rows as often as their share."""
    monkeypatch.setattr(store_module, "PREFETCH_AFTER_S", prefetch_after_s)
    store = ReplayStore(SCHEMA, 20_000, 400_000, tmp_path / "u", chunk_rows=256, cold_refresh=4.0, seed=1)
    fill(store, 26_000)
    assert store.cold_rows > 10_000 and store.hot_rows > 500 and store.cold_per_sample == 4
    bins = 10
    per_call = np.zeros((1800, bins))
    hot_start = store.tail - store.hot_rows
    hot_draws = 0
    for i in range(len(per_call)):
        s = store.sample(256)
        per_call[i] = np.bincount((s.indices - store.head) * bins // len(store), minlength=bins)
        hot_draws += int((s.indices >= hot_start).sum())
        np.testing.assert_array_equal(s.data["action"], s.indices)  # the rows are the rows sampled
    uniform = np.full(bins, 1 / bins)
    assert batch_means_pvalue(per_call, uniform) > 1e-4, per_call.sum(0)
    assert abs(hot_draws / per_call.sum() - store.hot_rows / len(store)) < 0.01
    # the test has teeth: a sampler that favours the newest half of the rows by 15 % fails it (p below
    # 2.2e-7 in every one of the 527 runs)
    tilted = per_call.copy()
    tilted[:, bins // 2 :] *= 1.15
    assert batch_means_pvalue(tilted, uniform) < 1e-5
    assert (store.prefetcher is not None) == (prefetch_after_s == 0.0)
    store.close()


def chunked_store(path, capacity: int, R: int, budget_chunks: int, cache_chunks: int, **kwargs) -> ReplayStore:
    """A store whose memory budget and cache are whole numbers of ``R``-row chunks (prefetch off unless given)."""
    kwargs.setdefault("prefetch", False)
    row = SCHEMA.row_bytes
    return ReplayStore(
        SCHEMA, capacity, budget_chunks * R * row, path, chunk_rows=R, cache_bytes=cache_chunks * R * row, **kwargs
    )


def test_rows_of_a_partly_dropped_chunk_are_drawn_as_often(tmp_path):
    """The head's chunk holds 16 of its 64 rows; drawn by chunk slots within a working set of 4
    chunks, its rows came up 1.16 x as often as the others (3 x 64 + 16 rows beside 4 x 64 when it is
    a member). Every row's rate, the head chunk's, the other cold rows' and the hot rows', is the mean."""
    R, rates = 64, []
    for seed in range(16):
        store = chunked_store(tmp_path / str(seed), 1000, R, 8, 4, seed=seed, cold_refresh=1.0)
        store.add(rows(0, 1048))
        assert (store.head, store.cold_per_sample) == (48, 4) and store.cold_rows > 3 * store.hot_rows > 0
        counts = np.zeros(store.tail, np.int64)
        for _ in range(3000):
            np.add.at(counts, store.sample(64).indices, 1)
        hot_start = store.tail - store.hot_rows
        mean = counts[store.head :].mean()
        rates.append([counts[a:b].mean() / mean for a, b in [(48, 64), (64, hot_start), (hot_start, store.tail)]])
    # per store the head chunk's rate spreads by about 0.045, so its mean over 16 by about 0.011
    np.testing.assert_allclose(np.mean(rates, axis=0), 1.0, atol=0.05)


@pytest.mark.parametrize(
    ("prefetch", "stores", "bound"), [(False, 16, 0.15), (True, 32, 0.1)], ids=["reads-in-call", "prefetcher"]
)
def test_uniform_sampling_is_uniform_over_ages_while_rows_are_added(tmp_path, monkeypatch, prefetch, stores, bound):
    """64 rows added before each draw of 256, as samplers feed a learner: the newest 2,048 cold rows
    (those that left RAM last) are drawn as often as the mean row, and so are the hot ones. When
    chunks only entered the working set by rotation, that band came up at 0.48 x the mean; with
    admission at birth but prefetched chunks drawn among the chunks cold when read, at 0.81-0.84 x."""
    monkeypatch.setattr(store_module, "PREFETCH_AFTER_S", 0.0)  # the prefetcher from the first read
    R, rates = 256, []
    for seed in range(stores):
        store = chunked_store(tmp_path / str(seed), 20_000, R, 16, 8, seed=seed, prefetch=prefetch)
        store.add(rows(0, 25_000))
        band = hot = expected = 0.0
        for _ in range(1000):
            store.add(rows(store.tail, 64))
            age = store.tail - 1 - store.sample(256).indices
            h = store.hot_rows
            band += np.count_nonzero((age >= h) & (age < h + 2048)) / 2048
            hot += np.count_nonzero(age < h) / h
            expected += 256 / len(store)
        rates.append((band / expected, hot / expected))
        assert (store.prefetcher is not None) == prefetch
        store.close()
    assert store.cold_refresh == 0.25 and store.cold_per_sample == 8 and store.cold_rows > 8 * store.hot_rows
    # per store the band's rate spreads by about 0.15 over 1,000 calls: its mean over 16 by about 0.04,
    # over 32 by about 0.027 (the prefetcher's timing makes that variant differ from run to run)
    band, hot = np.mean(rates, axis=0)
    assert abs(band - 1) < bound and abs(hot - 1) < 0.02, rates


def test_the_prefetcher_starts_once_cold_reads_are_slow(tmp_path, monkeypatch):
    """Cold chunks are read in the sample call while that is cheap; a slow disk gets a thread reading ahead."""
    store = ReplayStore(SCHEMA, 20_000, 400_000, tmp_path / "p", chunk_rows=256, cold_refresh=1.0, seed=1)
    fill(store, 26_000)
    monkeypatch.setattr(store_module, "PREFETCH_AFTER_S", 60.0)  # no read is that slow
    for _ in range(50):
        s = store.sample(256)
        np.testing.assert_array_equal(s.data["action"], s.indices)
    assert store.prefetcher is None and 0 < store.read_s < 60.0
    monkeypatch.setattr(store_module, "PREFETCH_AFTER_S", 2e-3)
    load = store._load_chunk

    def slow(cid):  # the chunk files 5 ms away
        time.sleep(0.005)
        return load(cid)

    monkeypatch.setattr(store, "_load_chunk", slow)
    for _ in range(50):
        s = store.sample(256)
        np.testing.assert_array_equal(s.data["action"], s.indices)  # prefetched rows are the rows too
    assert store.prefetcher is not None and store.prefetcher.is_alive() and store.read_s > 2e-3
    store.close()
    assert store.prefetcher is None


def test_prioritized_sampling_follows_priorities_with_correct_weights(tmp_path):
    store = ReplayStore(SCHEMA, 5000, 200_000, tmp_path / "p", chunk_rows=256, prioritized=True, alpha=1.0,
                        beta=0.5, beta_steps=10**9, seed=2)  # fmt: skip
    fill(store, 6000)
    live = np.arange(store.head, store.tail)
    priority = (live % 10 + 1).astype(float)  # class c has priority c + 1
    store.update_priorities(live, priority)
    counts = np.zeros(10)
    for _ in range(150):
        s = store.sample(256)
        counts += np.bincount(s.indices % 10, minlength=10)
        p = store.probabilities(s.indices)
        p_min = (1 + 1e-6) / store.tree.total  # class 0: priority 1 (+ the store's epsilon), alpha 1
        np.testing.assert_allclose(s.weights, (len(store) * p) ** -0.5 / (len(store) * p_min) ** -0.5, rtol=1e-5)
    share = np.bincount(live % 10, weights=priority, minlength=10)
    assert stats.chisquare(counts, share / share.sum() * counts.sum()).pvalue > 1e-3
    assert abs(s.weights[s.indices % 10 == 0].max(initial=1.0) - 1.0) < 1e-5  # min priority gets weight 1


def test_priorities_survive_reopen(tmp_path):
    store = ReplayStore(SCHEMA, 2000, 100_000, tmp_path / "q", chunk_rows=128, prioritized=True)
    fill(store, 1500)
    store.update_priorities(np.array([3, 700]), np.array([50.0, 0.0]))
    store.flush()
    again = ReplayStore(SCHEMA, 2000, 100_000, tmp_path / "q", chunk_rows=128, prioritized=True)
    np.testing.assert_allclose(again.probabilities(np.array([3, 700])), store.probabilities(np.array([3, 700])))


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({**rows(0, 4), "extra": np.zeros(4)}, "unexpected ['extra']"),
        ({k: v for k, v in rows(0, 4).items() if k != "reward"}, "missing ['reward']"),
        ({**rows(0, 4), "reward": np.zeros(4)}, "field reward: expected dtype float32, got float64"),
        ({**rows(0, 4), "obs": np.zeros((4, 16), np.float32)}, "field obs: expected shape (N, 17)"),
        ({**rows(0, 4), "action": np.arange(3)}, "field action: 3 rows"),
    ],
)
def test_bad_batches_are_refused_and_leave_the_store_consistent(batch, message):
    store = ReplayStore(SCHEMA, 100, 2**20, chunk_rows=16)
    store.add(rows(0, 10))
    with pytest.raises(ReplayError, match=re.escape(message)):
        store.add(batch)
    assert len(store) == 10
    store.add(rows(10, 5))
    np.testing.assert_array_equal(store.read(np.arange(15))["action"], np.arange(15))


def test_bad_sampling_and_sizes(tmp_path):
    store = ReplayStore(SCHEMA, 100, 2**20, chunk_rows=16)
    with pytest.raises(ReplayError, match="empty"):
        store.sample(1)
    store.add(rows(0, 10))
    with pytest.raises(ReplayError, match="only 10 stored"):
        store.sample(11)
    with pytest.raises(ReplayError, match="smaller than one chunk"):
        ReplayStore(SCHEMA, 10_000, 1000, tmp_path / "x", chunk_rows=64)
    with pytest.raises(ReplayError, match="no path was given"):
        ReplayStore(SCHEMA, 10**6, 2**20, chunk_rows=64)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReplayError, match="not writable"):
        ReplayStore(SCHEMA, 100, 2**20, blocker / "sub", chunk_rows=16)
    with pytest.raises(ReplayError, match="stored capacity"):
        ReplayStore(SCHEMA, 100, 2**20, tmp_path / "y", chunk_rows=16).flush()
        ReplayStore(SCHEMA, 200, 2**20, tmp_path / "y", chunk_rows=16)


@pytest.fixture
def tiny_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        yield disk


def test_a_capacity_beyond_the_disks_free_space_is_refused_before_a_file_is_written(tiny_disk):
    with pytest.raises(ReplayError, match=r"capacity 50000 rows x 81 B is 3.86 MiB, more than the .* free on its disk"):
        ReplayStore(SCHEMA, 50_000, 200_000, tiny_disk / "r", chunk_rows=512, codec="none")
    assert not (tiny_disk / "r").exists()


def test_full_disk_is_a_clear_error_and_loses_nothing_acknowledged(tiny_disk):
    store = ReplayStore(SCHEMA, 10_000, 200_000, tiny_disk / "r", chunk_rows=512, codec="none")
    (tiny_disk / "other").write_bytes(b"x" * 500_000)  # what other processes write there meanwhile
    ref_batches, start, flushed = [], 0, 0
    with pytest.raises(ReplayError, match="disk full"):
        while True:
            b = rows(start, 500)
            store.add(b)
            ref_batches.append(b)
            start += 500
            store.flush()
            flushed = start
    ref = {k: np.concatenate([b[k] for b in ref_batches]) for k in SCHEMA}
    reopened = ReplayStore(SCHEMA, 10_000, 200_000, tiny_disk / "r", chunk_rows=512, codec="none")
    assert reopened.tail >= flushed > 0
    assert_holds(reopened, ref)


def test_nstep_matches_a_hand_computation():
    ns = NStep(n=3, gamma=0.9, num_envs=2)
    out = []
    rewards = [[1, 10], [2, 20], [3, 30], [4, 40]]
    ends = [[False, False], [False, True], [False, False], [False, False]]
    for t in range(4):
        out.append(ns.push(np.full((2, 1), t), np.array([t, t]), np.array(rewards[t], float), np.full((2, 1), t + 1),
                           np.array(ends[t]), np.zeros(2, bool)))  # fmt: skip
    env0 = [o for o in out if len(o["reward"])]
    r = np.concatenate([o["reward"] for o in env0])
    # t=1: env 1 ends -> (10 + .9*20) and 20;  t=2: env 0's first 3-step row 1 + .9*2 + .81*3;
    # t=3: env 0 from t=1: 2 + .9*3 + .81*4, and env 1 (new episode from t=2) not yet 3 long
    np.testing.assert_allclose(sorted(r), sorted([28.0, 20.0, 5.23, 7.94]), rtol=1e-6)
    d = np.concatenate([o["discount"] for o in env0])
    assert sorted(np.round(d, 3)) == sorted([0.81, 0.9, 0.729, 0.729])


def test_recorder_folds_n_steps_per_env_across_calls():
    """CartPole pays 1 a step, so a row that folds m steps has reward (1 - g^m) / (1 - g) and
    discount g^m; rows still open at the end of a call come out in the next."""
    from dagrl.core.context import RoleContext
    from dagrl.replay.record import Recorder

    envs = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", num_envs=2).make_envs()
    rec, (obs, _) = Recorder(2, n_step=3, gamma=0.5), envs.reset(seed=0)
    rng, taken = np.random.default_rng(0), []
    for _ in range(3):
        for _ in range(40):
            obs = rec.step(envs, obs, rng.integers(0, 2, 2))
        taken.append(rec.take(envs))
    assert [t.env_steps for t in taken] == [80, 80, 80]
    data = {k: np.concatenate([t.data[k] for t in taken]) for k in taken[0].data}
    pending = sum(len(q) for q in rec.nstep.pending)
    assert len(data["reward"]) == 240 - pending and pending <= 4
    m = np.round(np.log(data["discount"]) / np.log(0.5)).astype(int)
    assert set(m) <= {1, 2, 3} and (m == 3).mean() > 0.5
    np.testing.assert_allclose(data["reward"], (1 - 0.5**m) / 0.5, rtol=1e-6)
    ended = data["terminated"] | data["truncated"]
    assert ended[m < 3].all()  # a row folds fewer than 3 steps only when its episode ended
    assert data["obs"].shape == data["next_obs"].shape == (len(m), 4)


def test_a_sigkilled_writer_loses_nothing_it_flushed(tmp_path):
    """A real SIGKILL while the writer is adding and spilling; everything flushed before is intact."""
    script = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
from tests.test_replay_store import SCHEMA, rows
from dagrl.replay import ReplayStore
store = ReplayStore(SCHEMA, 40_000, 300_000, {str(tmp_path / "k")!r}, chunk_rows=512)
start = 0
print("ring", store.ring_chunks * store.chunk_rows, flush=True)
while True:
    store.add(rows(start, 700))
    start += 700
    if start % 4900 == 0:
        store.flush()
        print("flushed", start, flush=True)
    else:
        print("added", start, flush=True)
"""
    proc = subprocess.Popen(["python", "-c", script], stdout=subprocess.PIPE, text=True)
    flushed = added = ring_rows = 0
    for line in proc.stdout:
        what, count = line.split()
        if what == "ring":
            ring_rows = int(count)
            continue
        added = int(count)
        flushed = added if what == "flushed" else flushed
        if added >= 60_000 and what == "added":  # past the capacity: slots are being reused
            break
    proc.kill()  # SIGKILL, mid-add or mid-spill
    proc.wait()
    store = ReplayStore(SCHEMA, 40_000, 300_000, tmp_path / "k", chunk_rows=512)
    assert store.tail >= flushed
    assert store.tail >= added - ring_rows  # at most the RAM part of acknowledged adds is gone
    got = store.read(np.arange(store.head, store.tail))
    np.testing.assert_array_equal(got["action"], np.arange(store.head, store.tail))
    for start in range(store.head - store.head % 700, store.tail, 700):  # content, not just indices
        expect = rows(start, 700)
        lo, hi = max(start, store.head), min(start + 700, store.tail)
        np.testing.assert_array_equal(
            got["obs"][lo - store.head : hi - store.head], expect["obs"][lo - start : hi - start]
        )


MAPPED_BLOCKS_OF_A_20MB_ARRAY = """
import ctypes, sys
import numpy as np
from dagrl.replay import ReplayStore, Schema

class MallInfo(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo
store = ReplayStore(Schema({"obs": ("uint8", tuple(int(d) for d in sys.argv[1].split("x")))}), 64, 64 << 20)
before = libc.mallinfo2().hblks
block = np.ones(20 << 20, np.uint8)  # a batch of 360 Atari rows
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33")
def test_a_store_of_image_rows_keeps_large_blocks_on_the_heap():
    """Image-row batches are MBs: in a process holding a store of such rows a 20 MB block comes from
    the heap (freed memory reused), not from a fresh mmap that each sample call page-faults again
    (what glibc does by default, as in a process with a store of small rows)."""

    def mapped(shape: str) -> int:
        code = MAPPED_BLOCKS_OF_A_20MB_ARRAY
        out = subprocess.run([sys.executable, "-c", code, shape], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    assert mapped("84x84x4") == 0
    assert mapped("4") == 1


def test_prioritized_stores_get_small_chunks_and_a_reopened_store_keeps_its_own(tmp_path):
    """Priority draws read a whole cold chunk per row, so their default chunks are small; a store
    reopened where the default has changed keeps the chunk size it was written with."""
    image = Schema({"obs": ("uint8", (84, 84, 4)), "next_obs": ("uint8", (84, 84, 4)), "reward": ("float32", ())})
    assert ReplayStore(image, 1000, 64 << 20, tmp_path / "u").chunk_rows == 16
    assert ReplayStore(image, 1000, 64 << 20, tmp_path / "p", prioritized=True).chunk_rows == 2
    vectors = ReplayStore(SCHEMA, 10_000, 2**20, tmp_path / "v", prioritized=True)
    assert vectors.chunk_rows >= 16 and vectors.chunk_bytes <= 64 << 10

    store = ReplayStore(SCHEMA, 5000, 100_000, tmp_path / "s", chunk_rows=32, prioritized=True)
    added = fill(store, 3000)
    store.flush()
    again = ReplayStore(SCHEMA, 5000, 100_000, tmp_path / "s", prioritized=True)
    assert again.chunk_rows == 32
    assert_holds(again, added)
    got = again.sample(256)
    np.testing.assert_array_equal(got.data["obs"][:, 0], got.indices)  # every row is the one drawn


KILLED_MID_WRITE = """
import os, signal, sys
import numpy as np
from dagrl.replay import ReplayStore
from dagrl.replay import chunkfiles
from tests.test_replay_store import SCHEMA, rows

store = ReplayStore(SCHEMA, 20_000, 2**18, sys.argv[1], chunk_rows=256)
store.add(rows(0, 5_000))
store.flush()  # acknowledged: every row on disk
print(store.durable_tail, flush=True)
chunkfiles.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die between write and rename
store.add(rows(5_000, 5_000))
store.flush()
"""


def test_a_writer_killed_mid_chunk_write_loses_no_acknowledged_row_and_leaves_no_file(tmp_path):
    """SIGKILL between a chunk file's write and its rename: the old chunk stays, the next writer to
    open the store removes the unfinished file, and every row flushed before reads back."""
    path = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(path)], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    durable = int(proc.stdout.split()[0])
    assert durable == 5_000
    partial = path / "rows" / ".partial"
    assert len(os.listdir(partial)) == 1  # the unfinished chunk file

    store = ReplayStore(SCHEMA, 20_000, 2**18, path, chunk_rows=256)
    assert os.listdir(partial) == []
    assert store.tail >= durable
    got = store.read(np.arange(0, durable))
    for k, v in rows(0, durable).items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    import zarr

    on_disk = zarr.open_group(str(path), mode="r")["rows"][: durable // 256 * 256]  # zarr reads it all
    assert on_disk.shape == (durable // 256 * 256, SCHEMA.row_bytes)


def test_priority_draws_read_each_cold_row_alone_from_uncompressed_chunks_and_get_the_rows_drawn(tmp_path):
    """A prioritized store of vector rows keeps its chunks uncompressed by default and reads a cold row
    drawn at its offset in the chunk file, not the whole chunk; images and uniform stores stay compressed,
    and a store reopened keeps the codec it was written with."""
    image = Schema({"obs": ("uint8", (84, 84, 4)), "reward": ("float32", ())})
    assert ReplayStore(image, 100, 64 << 20, tmp_path / "i", prioritized=True).codec == "blosc-lz4"
    assert ReplayStore(image, 100, 64 << 20, tmp_path / "j").codec == "blosc-zstd"
    assert ReplayStore(SCHEMA, 100, 2**20, tmp_path / "u").codec == "blosc-zstd"

    store = ReplayStore(SCHEMA, 20_000, 200_000, tmp_path / "p", prioritized=True, seed=3)
    assert store.codec == "none"
    added = fill(store, 25_000)
    assert store.cold_rows > 0.8 * len(store)
    reads = []
    whole = store._packed_chunk
    store._packed_chunk = lambda cid: reads.append(cid) or whole(cid)  # a chunk read whole
    for _ in range(20):
        got = store.sample(256)
        for k in SCHEMA:
            np.testing.assert_array_equal(got.data[k], added[k][got.indices], err_msg=k)
        store.update_priorities(got.indices, np.random.default_rng(0).random(256) + 0.1)
    assert not reads  # every cold row came from its own read
    store._packed_chunk = whole
    assert_holds(store, added)
    store.close()

    compressed = ReplayStore(SCHEMA, 20_000, 200_000, tmp_path / "z", prioritized=True, codec="blosc-zstd")
    fill(compressed, 25_000)
    compressed.close()
    again = ReplayStore(SCHEMA, 20_000, 200_000, tmp_path / "z", prioritized=True)
    assert again.codec == "blosc-zstd" and again.sample(256).data["obs"].shape == (256, 17)


@pytest.mark.parametrize("slots", [1, 2, 3, 5, 8, 1000])
def test_the_priority_tree_keeps_the_sum_and_the_least_positive_priority_of_its_leaves(slots):
    """Batches of updates with repeated slots (the later wins) and zeros (out of sampling), checked
    against the leaves summed and searched directly; every prefix finds the leaf holding it."""
    from dagrl.replay.sumtree import PriorityTree

    rng = np.random.default_rng(slots)
    tree, leaves = PriorityTree(slots), np.zeros(slots)
    for _ in range(200):
        k = int(rng.integers(1, 40))
        where, values = rng.integers(0, slots, k), rng.random(k) * (rng.random(k) > 0.3)
        tree.set(where, values)
        for i, v in zip(where.tolist(), values.tolist(), strict=True):
            leaves[i] = v
        assert tree.total == pytest.approx(leaves.sum(), rel=1e-12, abs=1e-12)
        assert tree.min == leaves[leaves > 0].min(initial=np.inf)
        if tree.total > 0:
            bounds = np.cumsum(leaves)
            prefix = rng.random(64) * tree.total
            found = tree.find(prefix)
            assert (leaves[found] > 0).all()
            np.testing.assert_array_equal(found, np.searchsorted(bounds, prefix, side="right").clip(max=slots - 1))
