"""A transition store: newest rows in a RAM ring of whole chunks, older chunks spilled to zarr.

Rows get a global index in insertion order; rows ``[head, tail)`` are stored, ``head = tail -
capacity`` once full (FIFO across both tiers). Rows are grouped in chunks of ``chunk_rows``: the hot
tier holds the newest chunks in RAM; when it outgrows its share of the memory budget the oldest
whole chunks are written to a zarr store (one array per field, a ring of chunk-sized slots, one
writer) and dropped from RAM.

Crash safety: a ``meta.json`` beside the zarr arrays says which rows are durable; it is replaced
atomically *after* a chunk's data is written, and before a slot still holding a stored chunk would
be overwritten. So a process killed at any point (SIGKILL included) leaves every row that was
flushed or spilled readable and intact; only rows added since are lost.

Sampling never reads cold rows one by one (a random row costs a whole chunk read in zarr): uniform
sampling draws cold rows from a working set of whole chunks kept in a bounded cache, a few of which
are replaced by random cold chunks at each call. Each row's chance per draw stays the same, hot or
cold; rows within one batch come from a handful of cold chunks. Prioritized sampling (PER) draws
exactly by priority and reads each distinct cold chunk it hits once, through the same cache.
"""

from __future__ import annotations

import collections
import errno
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dagrl.replay.schema import ReplayError, Schema
from dagrl.replay.sumtree import PriorityTree

META = "meta.json"
PRIORITIES = "priorities.npy"
CODECS = ("none", "zstd", "blosc-zstd", "blosc-lz4")

Batch = Mapping[str, np.ndarray]


@dataclass
class Sample:
    """A sampled batch: the rows, their global indices (for priority updates) and IS weights."""

    data: dict[str, np.ndarray]
    indices: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)


def default_chunk_rows(row_bytes: int, target_bytes: int = 1 << 20) -> int:
    """A power of two near ``target_bytes`` per chunk, between 16 and 4096 rows."""
    rows = max(1, target_bytes // max(row_bytes, 1))
    return int(min(4096, max(16, 1 << (rows.bit_length() - 1))))


def _compressors(codec: str) -> Any:
    from zarr.codecs import BloscCodec, ZstdCodec

    if codec == "none":
        return None
    if codec == "zstd":
        return [ZstdCodec(level=3)]
    cname = codec.split("-", 1)[1]
    return [BloscCodec(cname=cname, clevel=3, shuffle="shuffle")]


class ReplayStore:
    """Transitions in RAM up to a memory budget, the rest in zarr on local disk.

    Parameters
    ----------
    schema
        Named fields of a row (:class:`~dagrl.replay.schema.Schema`).
    capacity
        Rows kept at most; older rows are dropped first.
    memory_budget
        Bytes of RAM for rows: the hot ring plus the cache of cold chunks (``cache_bytes``).
    path
        Directory of the zarr store and its ``meta.json``; ``None`` keeps everything in RAM (then
        the whole capacity must fit the budget). An existing store at ``path`` is reopened.
    chunk_rows
        Rows per chunk (default: about 1 MiB per chunk).
    codec
        ``blosc-zstd`` (default: good on float vectors and on images), ``blosc-lz4``, ``zstd`` or ``none``.
    prioritized
        Keep PER priorities (proportional, ``alpha``), with importance weights annealed from
        ``beta`` to 1 over ``beta_steps`` sample calls.

    Examples
    --------
    >>> s = Schema({"x": ("int64", ())})
    >>> store = ReplayStore(s, capacity=100, memory_budget=1 << 20)
    >>> store.add({"x": np.arange(150)})
    >>> len(store), int(store.read(np.array([50]))["x"][0])
    (100, 50)
    """

    def __init__(
        self,
        schema: Schema,
        capacity: int,
        memory_budget: int,
        path: str | os.PathLike | None = None,
        *,
        chunk_rows: int | None = None,
        codec: str = "blosc-zstd",
        cache_bytes: int | None = None,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int = 100_000,
        cold_chunks_per_sample: int = 8,
        cold_refresh: int = 2,
        seed: int = 0,
    ):
        if capacity < 1:
            raise ReplayError(f"capacity must be >= 1, got {capacity}")
        if codec not in CODECS:
            raise ReplayError(f"codec must be one of {CODECS}, got {codec!r}")
        self.schema, self.capacity, self.codec = schema, int(capacity), codec
        self.path = None if path is None else Path(path)
        self.chunk_rows = int(chunk_rows or default_chunk_rows(schema.row_bytes))
        self.chunk_bytes = self.chunk_rows * schema.row_bytes
        self.memory_budget = int(memory_budget)
        self.cache_bytes = int(memory_budget // 4 if cache_bytes is None else cache_bytes)
        self.hot_budget = self.memory_budget - self.cache_bytes
        if self.hot_budget < self.chunk_bytes:
            raise ReplayError(
                f"memory budget {self.memory_budget} B (of which {self.cache_bytes} B cache) is smaller than one "
                f"chunk: {self.chunk_rows} rows x {schema.row_bytes} B = {self.chunk_bytes} B"
            )
        if self.path is None and self.capacity * schema.row_bytes > self.hot_budget + self.chunk_bytes:
            raise ReplayError(
                f"capacity {self.capacity} rows x {schema.row_bytes} B does not fit the memory budget "
                f"{self.hot_budget} B and no path was given to spill to"
            )
        self.slots = math.ceil(self.capacity / self.chunk_rows) + 1
        self.prioritized, self.alpha, self.beta0, self.beta_steps = prioritized, alpha, beta, beta_steps
        self.cold_per_sample, self.cold_refresh = max(1, cold_chunks_per_sample), max(1, cold_refresh)
        self.cache_chunks = max(1, self.cache_bytes // max(self.chunk_bytes, 1))
        self.rng = np.random.default_rng(seed)

        self.tail = 0  # global index of the next row
        self.durable_tail = 0  # rows [head, durable_tail) are safely in zarr
        self.hot: collections.OrderedDict[int, dict[str, np.ndarray]] = collections.OrderedDict()
        self.dirty: set[int] = set()
        self.cache: collections.OrderedDict[int, dict[str, np.ndarray]] = collections.OrderedDict()
        self.working: list[int] = []  # cold chunk ids uniform sampling draws from
        self.persisted_head = 0
        self.floor = 0
        self.samples_drawn = 0
        self.tree = PriorityTree(self.capacity) if prioritized else None
        self.max_priority = 1.0
        self.arrays: dict[str, Any] = {}
        if self.path is not None:
            self._open_storage()

    # -- sizes ------------------------------------------------------------------------------------

    @property
    def head(self) -> int:
        # ``floor``: rows a reopened store knows were dropped on disk, even if its tail is lower now
        return min(self.tail, max(0, self.tail - self.capacity, self.floor))

    def __len__(self) -> int:
        return self.tail - self.head

    @property
    def hot_rows(self) -> int:
        return self.tail - self._hot_start()

    @property
    def cold_rows(self) -> int:
        return len(self) - self.hot_rows

    @property
    def ram_bytes(self) -> int:
        return (len(self.hot) + len(self.cache)) * self.chunk_bytes

    def _hot_start(self) -> int:
        return max(self.head, next(iter(self.hot)) * self.chunk_rows) if self.hot else self.tail

    def stats(self) -> dict[str, int]:
        """Rows stored, in RAM and on disk; bytes in RAM; rows durable."""
        return {
            "rows": len(self),
            "hot_rows": self.hot_rows,
            "cold_rows": self.cold_rows,
            "ram_bytes": self.ram_bytes,
            "durable_rows": max(0, self.durable_tail - self.head),
            "added": self.tail,
        }

    # -- adding -----------------------------------------------------------------------------------

    def add(self, batch: Batch) -> None:
        """Append a batch of rows (every schema field, same length); spills whole chunks as needed."""
        n = self.schema.validate(batch)
        if n == 0:
            return
        start = 0
        if n > self.capacity:  # only the newest rows could stay anyway
            start = n - self.capacity
            self.tail += start
            self.hot.clear()
            self.dirty.clear()
        R = self.chunk_rows
        first = self.tail
        while start < n:
            cid, pos = divmod(self.tail, R)
            chunk = self.hot.get(cid)
            if chunk is None:
                chunk = self.hot[cid] = {k: np.zeros((R, *f.shape), f.dtype) for k, f in self.schema.items()}
            k = min(R - pos, n - start)
            for name in self.schema:
                chunk[name][pos : pos + k] = batch[name][start : start + k]
            self.dirty.add(cid)
            self.tail += k
            start += k
        if self.tree is not None:
            new = np.arange(max(first, self.head), self.tail)
            self.tree.set(new % self.capacity, np.full(len(new), self.max_priority**self.alpha))
        self._drop_below_head()
        self._spill()

    def _drop_below_head(self) -> None:
        R, head = self.chunk_rows, self.head
        for cid in [c for c in self.hot if (c + 1) * R <= head]:
            del self.hot[cid]
            self.dirty.discard(cid)
        for cid in [c for c in self.cache if (c + 1) * R <= head]:
            del self.cache[cid]
        self.working = [c for c in self.working if (c + 1) * R > head]

    def _spill(self) -> None:
        while len(self.hot) * self.chunk_bytes > self.hot_budget and len(self.hot) > 1:
            cid = next(iter(self.hot))
            if cid in self.dirty:
                self._write_chunk(cid)
            del self.hot[cid]

    # -- storage ----------------------------------------------------------------------------------

    def _open_storage(self) -> None:
        import zarr

        assert self.path is not None
        meta_path = self.path / META
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise ReplayError(f"replay path {self.path}: not writable ({err.strerror})") from None
        if meta_path.exists():
            self._restore(json.loads(meta_path.read_text()))
            return
        group = zarr.open_group(str(self.path), mode="a")
        for name, f in self.schema.items():
            self.arrays[name] = group.create_array(
                name,
                shape=(self.slots * self.chunk_rows, *f.shape),
                chunks=(self.chunk_rows, *f.shape),
                dtype=f.dtype,
                compressors=_compressors(self.codec),
                fill_value=0,
                overwrite=True,
            )
        self._write_meta()

    def _meta(self) -> dict[str, Any]:
        return {
            "format": 1,
            "schema": self.schema.to_json(),
            "capacity": self.capacity,
            "chunk_rows": self.chunk_rows,
            "slots": self.slots,
            "codec": self.codec,
            "head": self.head,
            "durable_tail": self.durable_tail,
            "prioritized": self.prioritized,
            "alpha": self.alpha,
            "max_priority": self.max_priority,
            "samples_drawn": self.samples_drawn,
        }

    def _write_meta(self) -> None:
        assert self.path is not None
        tmp = self.path / (META + ".tmp")
        tmp.write_text(json.dumps(self._meta()))
        os.replace(tmp, self.path / META)
        self.persisted_head = self.head

    def _write_chunk(self, cid: int) -> None:
        if self.path is None:
            raise ReplayError("store has no path: cannot spill beyond the memory budget")
        R = self.chunk_rows
        slot = cid % self.slots
        if self.persisted_head < (cid - self.slots + 1) * R:
            self._write_meta()  # the slot's previous chunk must be dropped on disk before we overwrite it
        chunk = self.hot[cid]
        try:
            for name, arr in self.arrays.items():
                arr[slot * R : (slot + 1) * R] = chunk[name]
        except OSError as err:
            where = f"replay path {self.path}"
            if err.errno == errno.ENOSPC:
                raise ReplayError(
                    f"{where}: disk full while writing chunk {cid}; nothing acknowledged was lost"
                ) from None
            raise ReplayError(f"{where}: writing chunk {cid} failed ({err})") from None
        self.dirty.discard(cid)
        self.cache.pop(cid, None)
        end = min(self.tail, (cid + 1) * R)
        if cid * R <= self.durable_tail:
            self.durable_tail = max(self.durable_tail, end)
        self._write_meta()

    def flush(self) -> None:
        """Make every stored row durable: write dirty RAM chunks, priorities and metadata."""
        if self.path is None:
            raise ReplayError("store has no path to flush to")
        for cid in sorted(self.dirty):
            self._write_chunk(cid)
        if self.tree is not None:
            tmp = self.path / (PRIORITIES + ".tmp.npy")
            np.save(tmp, self.tree.leaves())
            os.replace(tmp, self.path / PRIORITIES)
        self._write_meta()

    def _restore(self, meta: dict[str, Any]) -> None:
        import zarr

        schema = Schema.from_json(meta["schema"])
        for key, mine in (("capacity", self.capacity), ("chunk_rows", self.chunk_rows)):
            if meta[key] != mine:
                raise ReplayError(f"replay path {self.path}: stored {key} is {meta[key]}, asked for {mine}")
        if schema != self.schema:
            raise ReplayError(f"replay path {self.path}: stored schema {schema} differs from {self.schema}")
        self.slots, self.codec = meta["slots"], meta["codec"]
        self.tail = self.durable_tail = meta["durable_tail"]
        self.floor = meta["head"]
        self.max_priority = meta.get("max_priority", 1.0)
        self.samples_drawn = meta.get("samples_drawn", 0)
        group = zarr.open_group(str(self.path), mode="a")
        self.arrays = {name: group[name] for name in self.schema}
        self.persisted_head = self.head
        partial = self.tail % self.chunk_rows
        if partial:  # keep filling the last chunk in RAM
            cid = self.tail // self.chunk_rows
            self.hot[cid] = self._read_cold_chunk(cid)
        if self.tree is not None:
            saved = self.path / PRIORITIES
            leaves = np.load(saved) if saved.exists() else np.zeros(self.capacity)
            live = np.arange(self.head, self.tail)
            values = leaves[live % self.capacity]
            values[values <= 0] = self.max_priority**self.alpha  # rows spilled after the last flush
            self.tree.set(live % self.capacity, values)

    # -- reading ----------------------------------------------------------------------------------

    def _read_cold_chunk(self, cid: int) -> dict[str, np.ndarray]:
        R, slot = self.chunk_rows, cid % self.slots
        return {name: np.asarray(arr[slot * R : (slot + 1) * R]) for name, arr in self.arrays.items()}

    def _chunk(self, cid: int) -> dict[str, np.ndarray]:
        chunk = self.hot.get(cid)
        if chunk is not None:
            return chunk
        chunk = self.cache.get(cid)
        if chunk is None:
            chunk = self.cache[cid] = self._read_cold_chunk(cid)
            while len(self.cache) > self.cache_chunks:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(cid)
        return chunk

    def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Rows by global index (each must be stored), reading each chunk involved once."""
        indices = np.asarray(indices, np.int64)
        if len(indices) and (indices.min() < self.head or indices.max() >= self.tail):
            raise ReplayError(f"indices must lie in the stored range [{self.head}, {self.tail})")
        out = {k: np.empty((len(indices), *f.shape), f.dtype) for k, f in self.schema.items()}
        cids, offsets = np.divmod(indices, self.chunk_rows)
        for cid in np.unique(cids):
            sel = np.flatnonzero(cids == cid)
            chunk = self._chunk(int(cid))
            for name in self.schema:
                out[name][sel] = chunk[name][offsets[sel]]
        return out

    # -- sampling ---------------------------------------------------------------------------------

    def sample(self, n: int) -> Sample:
        """``n`` rows, uniformly or by priority; see the module docstring for how cold rows are read."""
        stored = len(self)
        if stored == 0:
            raise ReplayError("cannot sample from an empty store")
        if n > stored:
            raise ReplayError(f"cannot sample {n} rows: only {stored} stored")
        if n < 1:
            raise ReplayError(f"sample size must be >= 1, got {n}")
        self.samples_drawn += 1
        if self.tree is not None:
            indices, weights = self._prioritized(n)
        else:
            indices, weights = self._uniform(n), np.ones(n, np.float32)
        return Sample(self.read(indices), indices, weights)

    def _uniform(self, n: int) -> np.ndarray:
        hot_start = self._hot_start()
        n_hot = self.rng.binomial(n, self.hot_rows / len(self))
        picks = [self.rng.integers(hot_start, self.tail, n_hot)]
        n_cold = n - n_hot
        if n_cold:
            picks.append(self._cold_rows(n_cold, hot_start))
        return np.concatenate(picks)

    def _cold_rows(self, n: int, hot_start: int) -> np.ndarray:
        R = self.chunk_rows
        first, last = self.head // R, (hot_start - 1) // R  # cold chunk ids, inclusive
        n_chunks = last - first + 1
        size = min(self.cold_per_sample, n_chunks, self.cache_chunks)
        self.working = [c for c in self.working if first <= c <= last]
        if len(self.working) >= size:  # rotate: replace a few members by random cold chunks
            for i in self.rng.choice(len(self.working), min(self.cold_refresh, size), replace=False):
                self.working[i] = -1
            self.working = [c for c in self.working if c >= 0]
        while len(self.working) < size:
            cid = int(self.rng.integers(first, last + 1))
            if cid not in self.working:
                self.working.append(cid)
        ws = np.array(self.working)
        lo = np.maximum(ws * R, self.head)
        hi = np.minimum((ws + 1) * R, hot_start)
        which = self.rng.choice(len(ws), n, p=(hi - lo) / (hi - lo).sum())
        return lo[which] + (self.rng.random(n) * (hi - lo)[which]).astype(np.int64)

    def _prioritized(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        tree = self.tree
        assert tree is not None
        total = tree.total
        bounds = np.linspace(0.0, total, n + 1)
        prefix = bounds[:-1] + self.rng.random(n) * (bounds[1:] - bounds[:-1])
        slots = tree.find(prefix)
        base = self.tail - self.capacity
        indices = base + (slots - base) % self.capacity
        beta = self.beta0 + (1.0 - self.beta0) * min(1.0, self.samples_drawn / max(self.beta_steps, 1))
        stored = len(self)
        probs = tree.get(slots) / total
        max_weight = (stored * tree.min / total) ** -beta
        weights = ((stored * probs) ** -beta / max_weight).astype(np.float32)
        return indices, weights

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities (e.g. |TD error|) for sampled rows; rows dropped since are skipped."""
        if self.tree is None:
            raise ReplayError("update_priorities needs a prioritized store")
        indices = np.asarray(indices, np.int64)
        priorities = np.asarray(priorities, np.float64)
        if indices.shape != priorities.shape:
            raise ReplayError(f"{len(indices)} indices but {len(priorities)} priorities")
        if not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
            raise ReplayError("priorities must be finite and >= 0")
        live = (indices >= self.head) & (indices < self.tail)
        p = priorities[live] + 1e-6
        if len(p):
            self.max_priority = max(self.max_priority, float(p.max()))
            self.tree.set(indices[live] % self.capacity, p**self.alpha)

    def probabilities(self, indices: np.ndarray) -> np.ndarray:
        """The chance of each stored row per prioritized draw (for tests and diagnostics)."""
        if self.tree is None:
            return np.full(len(indices), 1.0 / len(self))
        return self.tree.get(np.asarray(indices) % self.capacity) / self.tree.total
