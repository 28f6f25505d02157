"""Replay add/sample throughput and bytes on disk: dagrl's store vs a numpy ring and np.memmap.

    dagrl bench replay [--vector-rows 400000] [--image-rows 6000] [--seconds 3]
                       [--image-scale-rows 1000000 --image-scale-budget 2GiB]

Two kinds of rows: vector observations (17 float32, HalfCheetah-sized) and image observations
(84x84x4 uint8 real Pong frames: ALE grayscale, resized, 4 stacked; ``pip install ale-py``).
Each row holds obs, action, reward, next_obs, terminated, truncated. Setups, side by side:

* numpy ring: preallocated arrays, ``arr[idx]`` per field (the upper bound);
* np.memmap: the same arrays in files, random rows read from them (page cache warm);
* dagrl, all in RAM: ReplayStore whose budget holds everything;
* dagrl, 90 % spilled: a budget of 10 % of the data (a quarter of it cold-chunk cache), the
  rest in zarr (blosc-zstd); sampled with the default working-set rotation (0.25 cold chunks
  replaced per call) and with a 5x slower one (0.05), which trades batch variety for speed.
* prioritized draws (PER, each batch's priorities updated after it): all in RAM, and 90 % spilled
  with the prioritized store's default (small) chunks beside the uniform store's chunk size, and its
  default codec (vector rows: none, each cold row read on its own; images: blosc-lz4) beside
  blosc-zstd, with the bytes on disk per row (file sizes; disk blocks can hold more).

Adds come in batches of 256 rows and are timed on a second pass over the data (the buffer full and
wrapping around, as it is for most of a run); sampling draws batches of 256 uniformly.

``--image-scale-rows N`` adds a run at Atari-replay scale: N image rows (1M rows are 56 GB raw, more
than this machine's RAM, so the rows cycle through the ``--image-rows`` real frames generated) into a
store with a ``--image-scale-budget`` memory budget, added once and sampled uniformly; compared with
the all-in-RAM store of the generated frames (the largest that fits side by side).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from _common import emit, table

from dagrl.replay import ReplayStore, Schema
from dagrl.replay.spill import default_codec

BATCH = 256


def vector_rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = np.cumsum(rng.standard_normal((n + 1, 17)).astype(np.float32) * 0.1, axis=0)  # smooth, like a body's state
    return {
        "obs": obs[:-1],
        "action": rng.uniform(-1, 1, (n, 6)).astype(np.float32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": obs[1:],
        "terminated": np.zeros(n, bool),
        "truncated": (np.arange(n) % 1000) == 999,
    }


def image_rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", obs_type="grayscale", frameskip=4, repeat_action_probability=0.0)
    rows_idx, cols_idx = np.linspace(0, 209, 84).astype(int), np.linspace(0, 159, 84).astype(int)

    def small(frame: np.ndarray) -> np.ndarray:
        return frame[rows_idx][:, cols_idx]

    frame, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    stack = [small(frame)] * 4
    frames = np.zeros((n + 1, 84, 84, 4), np.uint8)
    frames[0] = np.stack(stack, -1)
    actions, rewards, terms, truncs = (
        np.zeros(n, np.int64),
        np.zeros(n, np.float32),
        np.zeros(n, bool),
        np.zeros(n, bool),
    )
    for t in range(n):
        actions[t] = env.action_space.sample()
        frame, rewards[t], terms[t], truncs[t], _ = env.step(actions[t])
        if terms[t] or truncs[t]:
            frame, _ = env.reset()
        stack = [*stack[1:], small(frame)]
        frames[t + 1] = np.stack(stack, -1)
    return {
        "obs": frames[:-1],
        "action": actions,
        "reward": rewards,
        "next_obs": frames[1:],
        "terminated": terms,
        "truncated": truncs,
    }


def schema_of(data: dict[str, np.ndarray]) -> Schema:
    return Schema({k: (v.dtype, v.shape[1:]) for k, v in data.items()})


def ring_writer(arrays: dict[str, np.ndarray], n: int) -> Callable[[dict[str, np.ndarray]], None]:
    """An ``add`` that writes each batch into ``arrays`` (``n`` rows each) at a position going round."""
    pos = 0

    def add(b: dict[str, np.ndarray]) -> None:
        nonlocal pos
        k = len(b["reward"])
        for f, v in b.items():
            arrays[f][pos : pos + k] = v
        pos = (pos + k) % n

    return add


def timed_adds(add, data: dict[str, np.ndarray]) -> float:
    """Rows/s of the second pass over ``data``: a full buffer wrapping around (steady state). The
    first pass fills fresh memory, and page faults cost every setup about the same there."""
    n = len(data["reward"])
    for _ in range(2):
        t0 = time.perf_counter()
        for s in range(0, n, BATCH):
            add({k: v[s : s + BATCH] for k, v in data.items()})
    return n / (time.perf_counter() - t0)


def timed_samples(sample, seconds: float) -> float:
    sample()  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sample()
        done += BATCH
    return done / (time.perf_counter() - t0)


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """``os.fsync`` a no-op meanwhile (this process only): the spill as it ran before it was durable."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


def measure(name: str, data: dict[str, np.ndarray], seconds: float, root: Path) -> dict:
    n = len(data["reward"])
    schema = schema_of(data)
    raw_bytes = n * schema.row_bytes
    rng = np.random.default_rng(0)
    out: dict = {"rows": n, "row_bytes": schema.row_bytes}

    ring = {k: np.zeros(v.shape, v.dtype) for k, v in data.items()}
    out["numpy ring"] = {"add": timed_adds(ring_writer(ring, n), data)}
    out["numpy ring"]["sample"] = timed_samples(
        lambda: {f: a[rng.integers(0, n, BATCH)] for f, a in ring.items()}, seconds
    )

    mm_dir = root / f"{name}-memmap"
    mm_dir.mkdir()
    mm = {f: np.lib.format.open_memmap(mm_dir / f"{f}.npy", "w+", v.dtype, v.shape) for f, v in data.items()}
    out["np.memmap"] = {"add": timed_adds(ring_writer(mm, n), data)}
    for a in mm.values():
        a.flush()
    out["np.memmap"]["sample"] = timed_samples(
        lambda: {f: a[np.sort(rng.integers(0, n, BATCH))] for f, a in mm.items()}, seconds
    )

    ram = ReplayStore(schema, n, 2 * raw_bytes + (64 << 20))
    out["dagrl, all in RAM"] = {"add": timed_adds(ram.add, data)}
    out["dagrl, all in RAM"]["sample"] = timed_samples(lambda: ram.sample(BATCH), seconds)
    ram = None  # free it before the next setup

    path = root / f"{name}-zarr"
    spilled = ReplayStore(schema, n, raw_bytes // 10, path)
    out["dagrl, 90 % spilled"] = {"add": timed_adds(spilled.add, data)}
    out["dagrl, 90 % spilled"]["sample"] = timed_samples(lambda: spilled.sample(BATCH), seconds)
    spilled.cold_refresh = 0.05  # the same store, its working set rotating 5x slower
    out["dagrl, 90 % spilled, refresh 0.05"] = {"add": float("nan")}
    out["dagrl, 90 % spilled, refresh 0.05"]["sample"] = timed_samples(lambda: spilled.sample(BATCH), seconds)
    spilled.close()
    with no_fsync():  # the same spill, its chunks and metadata not forced to disk: what durability costs
        unsynced = ReplayStore(schema, n, raw_bytes // 10, root / f"{name}-zarr-unsynced")
        out["dagrl, 90 % spilled, no fsync"] = {"add": timed_adds(unsynced.add, data), "sample": float("nan")}
        unsynced.close()
    out["fsync_add_ratio"] = out["dagrl, 90 % spilled"]["add"] / out["dagrl, 90 % spilled, no fsync"]["add"]
    out["chunk_rows"] = spilled.chunk_rows
    out["cache_chunks"] = spilled.cache_chunks
    spilled.flush()
    disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    on_disk_rows = spilled.durable_tail - spilled.head
    out["cold_fraction"] = spilled.cold_rows / len(spilled)
    out["disk_bytes_per_row"] = disk / on_disk_rows
    out["compression"] = schema.row_bytes / out["disk_bytes_per_row"]
    out["ram_bytes"] = spilled.ram_bytes
    return out


def measure_prioritized(data: dict[str, np.ndarray], seconds: float, root: Path, uniform_chunk_rows: int) -> dict:
    """Prioritized (PER) draws, with a priority update after each like a learner's: all in RAM, and 90 %
    spilled with the prioritized store's default chunks vs the uniform store's (``uniform_chunk_rows``)."""
    n = len(data["reward"])
    schema = schema_of(data)
    rng = np.random.default_rng(0)

    def draws(store: ReplayStore) -> float:
        def one() -> None:
            got = store.sample(BATCH)
            store.update_priorities(got.indices, rng.random(BATCH))

        return timed_samples(one, seconds)

    ram = ReplayStore(schema, n, 2 * n * schema.row_bytes + (64 << 20), prioritized=True)
    ram.add(data)
    out: dict = {"dagrl, all in RAM": {"add": float("nan"), "sample": draws(ram)}}
    ram = None
    setups = [("default chunks", None, None), ("uniform's chunks", uniform_chunk_rows, None)]
    if default_codec(schema, prioritized=True) != "blosc-zstd":  # the prioritized default vs the uniform one
        setups.insert(1, ("default chunks", None, "blosc-zstd"))
    for i, (label, chunk_rows, codec) in enumerate(setups):
        path = root / f"prioritized-{i}"
        store = ReplayStore(
            schema, n, n * schema.row_bytes // 10, path, prioritized=True, chunk_rows=chunk_rows, codec=codec
        )
        setup = f"dagrl, 90 % spilled, {label} ({store.chunk_rows} rows, {store.codec})"
        out[setup] = {"add": timed_adds(store.add, data), "sample": draws(store)}
        store.close()
        out[setup]["disk_bytes_per_row"] = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / n
        shutil.rmtree(path)
    return out


def measure_at_scale(data: dict[str, np.ndarray], rows: int, budget: int, seconds: float, root: Path) -> dict:
    """``rows`` rows cycling through ``data``, into a store with ``budget`` bytes of RAM; sampled uniformly."""
    n = len(data["reward"])
    schema = schema_of(data)
    ram = ReplayStore(schema, n, 2 * n * schema.row_bytes + (64 << 20))
    ram.add(data)
    in_ram = timed_samples(lambda: ram.sample(BATCH), seconds)
    ram = None
    store = ReplayStore(schema, rows, budget, root / "scale-zarr")
    t0, added = time.perf_counter(), 0
    while added < rows:
        s = added % n
        k = min(BATCH, n - s, rows - added)
        store.add({f: v[s : s + k] for f, v in data.items()})
        added += k
    add_rate = rows / (time.perf_counter() - t0)
    sample = timed_samples(lambda: store.sample(BATCH), seconds)
    store.cold_refresh = 0.05
    sample_slow = timed_samples(lambda: store.sample(BATCH), seconds)
    store.flush()
    disk = sum(p.stat().st_size for p in (root / "scale-zarr").rglob("*") if p.is_file())
    out = {
        "rows": rows,
        "raw_bytes": rows * schema.row_bytes,
        "budget_bytes": budget,
        "cold_fraction": store.cold_rows / len(store),
        "ram_bytes": store.ram_bytes,
        "disk_bytes": disk,
        "add": add_rate,
        "sample": sample,
        "sample_refresh_0.05": sample_slow,
        "all_in_ram_sample": in_ram,
        "ratio": sample / in_ram,
        "ratio_refresh_0.05": sample_slow / in_ram,
    }
    store.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vector-rows", type=int, default=400_000)
    p.add_argument("--image-rows", type=int, default=6_000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--image-scale-rows", type=int, default=0, help="also an Atari-scale image replay (e.g. 1000000)")
    p.add_argument("--image-scale-budget", default="2GiB", help="its memory budget")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dagrl-bench-replay-"))
    results = {}
    try:
        vectors = vector_rows(args.vector_rows)
        results["vector"] = measure("vector", vectors, args.seconds, root)
        images = image_rows(args.image_rows)
        results["image"] = measure("image", images, args.seconds, root)
        for kind, data in (("vector", vectors), ("image", images)):
            chunk_rows = results[kind]["chunk_rows"]
            results[kind]["prioritized"] = measure_prioritized(data, args.seconds, root, chunk_rows)
        if args.image_scale_rows:
            from dask.utils import parse_bytes

            budget = parse_bytes(args.image_scale_budget)
            results["image_scale"] = measure_at_scale(images, args.image_scale_rows, budget, args.seconds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    setups = [
        "numpy ring",
        "np.memmap",
        "dagrl, all in RAM",
        "dagrl, 90 % spilled",
        "dagrl, 90 % spilled, refresh 0.05",
        "dagrl, 90 % spilled, no fsync",
    ]
    for kind, r in results.items():
        if kind == "image_scale":
            print(
                f"\nimage rows at scale: {r['rows']:,} rows ({r['raw_bytes'] / 2**30:.0f} GiB raw), "
                f"budget {r['budget_bytes'] / 2**30:.1f} GiB, {r['cold_fraction']:.1%} spilled, "
                f"{r['disk_bytes'] / 2**20:,.0f} MiB on disk; add {r['add']:,.0f} rows/s; "
                f"sample {r['sample']:,.0f} rows/s = {r['ratio']:.2f} x all-in-RAM "
                f"(rotation 0.05: {r['ratio_refresh_0.05']:.2f} x; target >= 0.5)"
            )
            continue
        print(
            f"\n{kind} rows: {r['rows']:,} x {r['row_bytes']:,} B; batches of {BATCH}; "
            f"chunks of {r['chunk_rows']} rows, {r['cache_chunks']} cached"
        )
        base = r["numpy ring"]["sample"]
        rows = [
            {
                "setup": s,
                "add rows/s": r[s]["add"],
                "sample rows/s": r[s]["sample"],
                "sample vs ring": r[s]["sample"] / base,
            }
            for s in setups
        ]
        print(table(rows, ["setup", "add rows/s", "sample rows/s", "sample vs ring"]))
        ram, spill = r["dagrl, all in RAM"]["sample"], r["dagrl, 90 % spilled"]["sample"]
        print(
            f"all-in-RAM sampling {ram / base:.2f} x the numpy ring (target >= 0.9); "
            f"{r['cold_fraction']:.0%} spilled: {spill / ram:.2f} x all-in-RAM (target >= 0.5); "
            f"on disk {r['disk_bytes_per_row']:,.0f} B/row, {r['compression']:.1f} x smaller than raw; "
            f"spilled adds with fsync at {r['fsync_add_ratio']:.2f} x the rate without"
        )
        per = r["prioritized"]
        ram = per["dagrl, all in RAM"]["sample"]
        rows = [
            {
                "setup": s,
                "add rows/s": v["add"],
                "sample rows/s": v["sample"],
                "vs all-in-RAM": v["sample"] / ram,
                "disk B/row": v.get("disk_bytes_per_row", float("nan")),
            }
            for s, v in per.items()
        ]
        print(f"prioritized draws, {kind} rows (each batch's priorities updated):")
        print(table(rows, ["setup", "add rows/s", "sample rows/s", "vs all-in-RAM", "disk B/row"]))
    emit("replay", results)


if __name__ == "__main__":
    main()
