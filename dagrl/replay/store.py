"""A transition store: newest rows in a RAM ring of whole chunks, older chunks spilled to zarr.

Rows get a global index in insertion order; rows ``[head, tail)`` are stored, ``head = tail -
capacity`` once full (FIFO across both tiers). Rows are grouped in chunks of ``chunk_rows``: the hot
tier holds the newest chunks in RAM; when it outgrows its share of the memory budget the oldest
whole chunks are written to a zarr store (one array per field, a ring of chunk-sized slots, one
writer) and dropped from RAM.

Crash safety: a ``meta.json`` beside the zarr array says which rows are durable; it is replaced
atomically after chunk data is written (at the end of the ``add`` that spilled, or of ``flush``),
and before a slot still holding a stored chunk would be overwritten. So a process killed at any
point (SIGKILL included) leaves every row that was flushed, or spilled by a completed ``add``,
readable and intact; only rows still in RAM are lost.

Sampling never reads cold rows one by one (a random row costs a whole chunk read in zarr): uniform
sampling draws cold rows from a working set of whole chunks kept in a bounded cache, a few of which
are replaced by random cold chunks at each call. Each row's chance per draw stays the same, hot or
cold; rows within one batch come from a handful of cold chunks. Prioritized sampling (PER) draws
exactly by priority and reads each distinct cold chunk it hits once (rows of chunks the cache holds
from there, the rest straight from their chunk, not cached); its chunks are small (about 64 KiB),
since nearly every cold row it draws costs a chunk read. Uncompressed chunks (a prioritized store's
default for rows that are not images) are not read whole: each wanted row is read at its offset.

Chunk files are read and written directly (:mod:`dagrl.replay.chunkfiles`), in zarr's own format.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dagrl.replay.chunkfiles import ChunkFiles
from dagrl.replay.malloc import keep_freed_memory
from dagrl.replay.schema import ReplayError, Schema
from dagrl.replay.spill import CODECS, LARGE_ROW_BYTES, META, ChunkStorage, default_chunk_rows, default_codec
from dagrl.replay.sumtree import PriorityTree

log = logging.getLogger("dagrl")


PREFETCH_AFTER_S = 2e-3
"""Cold chunks are read in the sample call until such reads take longer than this (a moving average):
then the disk, not decoding, is their cost, and a background thread reads ahead to hide it. Before,
the thread costs more than it hides: it shares the GIL and the cores with the caller. From
page-cached chunk files on 2 cores, 90 %-spilled sampling ran 1.3-1.9 x faster without it for
vector rows (0.63-0.72 x all-in-RAM against 0.37-0.48 x) and 1.0-1.4 x for image rows
(BENCHMARKS.md)."""

Batch = Mapping[str, np.ndarray]


@dataclass
class Sample:
    """A sampled batch: the rows, their global indices (for priority updates) and IS weights."""

    data: dict[str, np.ndarray]
    indices: np.ndarray
    weights: np.ndarray
    shard: int = -1
    """The replay shard that drew it (set by the replay role's ``sample`` fragment)."""
    stored: int = 0
    """Rows the store held when it drew."""
    mass: float = 0.0
    """The sum over stored rows of what each draw is proportional to: ``priority ** alpha`` under PER,
    1 per row otherwise (then ``mass == stored``)."""
    floor: float = 1.0
    """The least stored ``priority ** alpha`` (1 without PER): the weights are ``(floor / p) ** beta``."""
    beta: float = 1.0
    """The importance-weight exponent the weights were drawn with."""
    added: int = 0
    """Rows the store was ever given (its tail): for transitions, the env steps its samplers sent it."""

    def __len__(self) -> int:
        return len(self.indices)


class ReplayStore(ChunkStorage):
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
    cache_bytes
        Part of the budget for cold chunks read back for sampling (default: a quarter).
    chunk_rows
        Rows per chunk (default: about 1 MiB, at most a 16th of the cache, 16 to 4096 rows; for a
        prioritized store about 64 KiB and at least 2 rows; a store reopened at ``path`` keeps its own).
    codec
        ``blosc-zstd``, ``blosc-lz4``, ``zstd`` or ``none``; default: :func:`default_codec`.
    prioritized
        Keep PER priorities (proportional, ``alpha``), with importance weights annealed from
        ``beta`` to 1 over ``beta_steps`` sample calls.
    cold_chunks_per_sample, cold_refresh
        Uniform sampling draws cold rows from a working set of this many cached chunks (default:
        the whole cache), replacing ``cold_refresh`` of them by random cold chunks per call
        (fractions allowed: 0.25 is one chunk every four calls). More refresh: batches closer to
        i.i.d.; less: fewer disk reads. With ``prefetch`` (default) a background thread reads the
        incoming chunks ahead once reading one in the sample call has proved slow (see
        :data:`PREFETCH_AFTER_S`), so a sample call waits on disk only when it falls behind that rate.

    Examples
    --------
    >>> s = Schema({"x": ("int64", ())})
    >>> store = ReplayStore(s, capacity=100, memory_budget=1 << 20)
    >>> store.add({"x": np.arange(150)})
    >>> len(store), int(store.read(np.array([50]))["x"].item())
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
        codec: str | None = None,
        cache_bytes: int | None = None,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int = 100_000,
        cold_chunks_per_sample: int | None = None,
        cold_refresh: float = 0.25,
        prefetch: bool = True,
        seed: int = 0,
    ):
        if capacity < 1:
            raise ReplayError(f"capacity must be >= 1, got {capacity}")
        if codec is None:
            codec = default_codec(schema, prioritized)
        if codec not in CODECS:
            raise ReplayError(f"codec must be one of {CODECS}, got {codec!r}")
        self.schema, self.capacity, self.codec = schema, int(capacity), codec
        self.path = None if path is None else Path(path)
        self.memory_budget = int(memory_budget)
        self.cache_bytes = int(memory_budget // 4 if cache_bytes is None else cache_bytes)
        self.chunk_rows = int(chunk_rows or self._stored_chunk_rows() or self._default_chunk_rows(prioritized))
        self.chunk_bytes = self.chunk_rows * schema.row_bytes
        self.hot_budget = self.memory_budget - self.cache_bytes
        if self.path is not None and not (self.path / META).exists():
            _check_disk(self.path, self.capacity, schema.row_bytes)
        if self.hot_budget < self.chunk_bytes:
            raise ReplayError(
                f"memory budget {self.memory_budget} B (of which {self.cache_bytes} B cache) is smaller than one "
                f"chunk: {self.chunk_rows} rows x {schema.row_bytes} B = {self.chunk_bytes} B"
            )
        self.slots = math.ceil(self.capacity / self.chunk_rows) + 1  # chunks live rows can touch
        if self.path is None and self.hot_budget // self.chunk_bytes < self.slots:
            raise ReplayError(
                f"capacity {self.capacity} rows ({self.slots} chunks of {self.chunk_bytes} B) does not fit the "
                f"memory budget ({self.hot_budget} B besides the cache) and no path was given to spill to"
            )
        self.prioritized, self.alpha, self.beta0, self.beta_steps = prioritized, alpha, beta, beta_steps
        if schema.row_bytes >= LARGE_ROW_BYTES:
            keep_freed_memory()  # each sample is MBs: reuse freed blocks instead of page-faulting new ones
        R = self.chunk_rows
        # RAM: a ring of whole chunks for the newest rows, a cache of cold chunks; each one array per field
        self.ring_chunks = max(1, min(self.hot_budget // self.chunk_bytes, self.slots))
        self.cache_chunks = max(1, self.cache_bytes // self.chunk_bytes)
        self.ring = {k: np.zeros((self.ring_chunks * R, *f.shape), f.dtype) for k, f in schema.items()}
        self.cache = {k: np.zeros((self.cache_chunks * R, *f.shape), f.dtype) for k, f in schema.items()}
        self.cached: collections.OrderedDict[int, int] = collections.OrderedDict()  # chunk id -> cache slot, LRU
        self.free_slots = list(range(self.cache_chunks - 1, -1, -1))  # cache slots holding no chunk
        self.cold_per_sample = min(cold_chunks_per_sample or self.cache_chunks, self.cache_chunks)
        self.cold_refresh = cold_refresh
        self.rng = np.random.default_rng(seed)

        self.tail = 0  # global index of the next row
        self.hot_lo = 0  # first chunk id held in the ring
        self.durable_tail = 0  # rows [head, durable_tail) are safely in zarr
        self.dirty: set[int] = set()
        self.working: list[int] = []  # cold chunk ids uniform sampling draws from
        self.refresh_due = 0.0
        self.persisted_head = 0
        self.meta_due = False
        self.floor = 0
        self.samples_drawn = 0
        self.tree = PriorityTree(self.capacity) if prioritized else None
        self.max_priority = 1.0
        self.rows: Any = None  # the zarr array of packed rows
        self.files: ChunkFiles | None = None  # the chunk files read and written directly (else through zarr)
        self.offsets = np.cumsum([0] + [f.row_bytes for f in schema.values()])
        self.prefetch = prefetch and self.path is not None and self.cache_chunks > 2
        """Whether a background thread may read cold chunks ahead (it starts once reads are slow)."""
        self.read_s = 0.0
        """Seconds a cold chunk read in the caller's thread took: a moving average."""
        self.ready: queue.Queue = queue.Queue(maxsize=2)  # (chunk id, its rows, the newest cold chunk id then)
        self.held: tuple[int, dict[str, np.ndarray], int] | None = None  # a prefetched chunk put back
        self.prefetcher: threading.Thread | None = None
        self.closing = threading.Event()
        if self.path is not None:
            self._open_storage()

    def _stored_chunk_rows(self) -> int | None:
        """The chunk size of a store reopened at its path, whatever today's default would be."""
        meta = None if self.path is None else self.path / META
        try:
            return int(json.loads(meta.read_text())["chunk_rows"]) if meta is not None else None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # no store there yet, or one _restore will refuse with the reason

    def _default_chunk_rows(self, prioritized: bool) -> int:
        if not prioritized:
            # about 1 MiB, but small enough that the cache holds 16 (a varied working set to draw from)
            return default_chunk_rows(self.schema.row_bytes, max(1, min(1 << 20, self.cache_bytes // 16)))
        # A priority draw reads a whole cold chunk for nearly every cold row (priorities keep no working
        # set), so its cost is a file read plus the chunk's decode: about 64 KiB. Pong rows, 90 % cold
        # (BENCHMARKS.md): 16-row chunks drew 2.4k rows/s, 2-row chunks 10.0k; 1-row chunks drew 1.3 x
        # faster than 2-row ones but added rows at 0.56 x their rate, hence at least 2.
        return default_chunk_rows(self.schema.row_bytes, 64 << 10, least=2)

    # -- sizes ------------------------------------------------------------------------------------

    @property
    def head(self) -> int:
        # ``floor``: rows a reopened store knows were dropped on disk, even if its tail is lower now
        return min(self.tail, max(0, self.tail - self.capacity, self.floor))

    def __len__(self) -> int:
        return self.tail - self.head

    def _hot_start(self) -> int:
        return min(self.tail, max(self.head, self.hot_lo * self.chunk_rows))

    @property
    def hot_rows(self) -> int:
        return self.tail - self._hot_start()

    @property
    def cold_rows(self) -> int:
        return len(self) - self.hot_rows

    @property
    def ram_bytes(self) -> int:
        """Bytes of RAM held for rows: the ring and the cold-chunk cache."""
        return (self.ring_chunks + self.cache_chunks) * self.chunk_bytes

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

    def _ring_rows(self, cid: int) -> slice:
        R = self.chunk_rows
        slot = cid % self.ring_chunks
        return slice(slot * R, (slot + 1) * R)

    # -- adding -----------------------------------------------------------------------------------

    def add(self, batch: Batch) -> None:
        """Append a batch of rows (every schema field, same length); spills whole chunks as needed."""
        n = self.schema.validate(batch)
        if n == 0:
            return
        start = 0
        if n > self.capacity:  # only the newest rows can stay anyway
            start = n - self.capacity
            self.tail += start
            self._drop_below_head()
        R = self.chunk_rows
        first = self.tail
        while start < n:
            cid, pos = divmod(self.tail, R)
            if pos == 0:  # a new chunk: make room for it in the ring
                while cid - self.hot_lo >= self.ring_chunks:
                    self._spill_oldest()
            k = min(R - pos, n - start)
            rows = self._ring_rows(cid)
            for name in self.schema:
                self.ring[name][rows.start + pos : rows.start + pos + k] = batch[name][start : start + k]
            self.dirty.add(cid)
            self.tail += k
            start += k
            self._drop_below_head()
        if self.tree is not None:
            new = np.arange(max(first, self.head), self.tail)
            self.tree.set(new % self.capacity, np.full(len(new), self.max_priority**self.alpha))
        if self.meta_due:  # chunks spilled by this call are durable from here on
            self._write_meta()

    def _drop_below_head(self) -> None:
        R, head = self.chunk_rows, self.head
        while self.hot_lo * R + R <= head and self.hot_lo * R < self.tail:
            self.dirty.discard(self.hot_lo)
            self.hot_lo += 1
        for cid in [c for c in self.cached if (c + 1) * R <= head]:
            self.free_slots.append(self.cached.pop(cid))
        self.working = [c for c in self.working if (c + 1) * R > head]

    def _spill_oldest(self) -> None:
        if self.hot_lo in self.dirty:
            self._write_chunk(self.hot_lo, meta=False)
            self.meta_due = True
        self._admit(self.hot_lo)
        self.hot_lo += 1

    def _admit(self, cid: int) -> None:
        """Chunk ``cid``, turning cold, joins the working set with the chance every cold chunk has.

        Rotation brings chunks in a fraction of one per call, so a chunk new to the cold tier would
        otherwise start outside the working set and reach its share only after some ``size /
        cold_refresh`` calls: with rows added between calls, the newest cold rows were drawn at 0.3-0.5
        x the rate of the others (``test_uniform_sampling_is_uniform_over_ages_while_rows_are_added``).
        Its rows are still in the ring, so joining costs one chunk's copy and no read.
        """
        if self.tree is not None or not self.working or cid in self.cached:
            return
        R = self.chunk_rows
        cold_chunks = cid - self.head // R + 1
        size = min(self.cold_per_sample, cold_chunks)
        if len(self.working) < size or self.rng.random() >= size / cold_chunks:
            return  # a short working set is refilled from every cold chunk at the next call
        out = int(self.rng.integers(len(self.working)))
        slot = self.cached.pop(self.working[out])
        ring = self._ring_rows(cid)
        for name, cache in self.cache.items():
            cache[slot * R : (slot + 1) * R] = self.ring[name][ring]
        self.cached[cid] = slot
        self.working[out] = cid

    # -- storage ----------------------------------------------------------------------------------

    # -- reading ----------------------------------------------------------------------------------

    def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Rows by global index (each must be stored): one gather per field from RAM; cold rows from
        the cache where their chunk is there, else from their chunk (:meth:`_read_cold`)."""
        indices = np.asarray(indices, np.int64)
        if len(indices) and (indices.min() < self.head or indices.max() >= self.tail):
            raise ReplayError(f"indices must lie in the stored range [{self.head}, {self.tail})")
        R = self.chunk_rows
        hot = indices >= self._hot_start()
        if hot.all():
            pos = indices % (self.ring_chunks * R)
            return {name: ring[pos] for name, ring in self.ring.items()}
        out = {k: np.empty((len(indices), *f.shape), f.dtype) for k, f in self.schema.items()}
        h = np.flatnonzero(hot)
        pos = indices[h] % (self.ring_chunks * R)
        for name, ring in self.ring.items():
            out[name][h] = ring[pos]
        cold = np.flatnonzero(~hot)
        self._read_cold(indices[cold], cold, out)
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
            indices, weights, beta = self._prioritized(n)
            tree = self.tree
            return Sample(self.read(indices), indices, weights, -1, stored, tree.total, tree.min, beta, self.tail)
        indices, data = self._uniform(n)
        return Sample(data, indices, np.ones(n, np.float32), -1, stored, float(stored), added=self.tail)

    def _uniform(self, n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Uniform draws, gathered straight from where they sit: ring positions and cache slots.

        Cold draws pick one of the working set's chunk-sized slot ranges uniformly, so a chunk only
        partly stored (the head's, rows before ``head`` dropped; a top one not yet full) would have
        its rows drawn more often than the rest. A draw landing on such a gap goes to a random hot row
        instead, and the hot share is lowered by as much: every stored row's chance per draw is then
        exactly ``1 / len(self)`` (``test_rows_of_a_partly_dropped_chunk_are_drawn_as_often``).
        With fewer hot rows than gaps the cold draws fall on the chunks' stored rows only.
        """
        hot_start = self._hot_start()
        n_hot_rows = self.tail - hot_start
        R = self.chunk_rows
        gaps = 0
        if hot_start > self.head:
            gaps = self.head % R + (-hot_start) % R
            if gaps > n_hot_rows:
                gaps = 0
        n_hot = self.rng.binomial(n, (n_hot_rows - gaps) / len(self))
        if n_hot == n:
            hot = self.rng.integers(hot_start, self.tail, n)
            ring_pos = hot % (self.ring_chunks * R)
            return hot, {name: ring[ring_pos] for name, ring in self.ring.items()}
        cold, cache_pos = self._cold_rows(n - n_hot, hot_start, over_gaps=gaps > 0)
        n_hot = n - len(cold)
        hot = self.rng.integers(hot_start, self.tail, n_hot)
        ring_pos = hot % (self.ring_chunks * R)
        data = {}
        for name, f in self.schema.items():
            # gathered straight into the batch: ``out[:k] = a[pos]`` gathers into a temporary and copies
            # it, twice the memory traffic, which is what image rows are bound by (0.36-0.6 x all-in-RAM
            # at 1M Pong rows before, 0.77 after). "clip" keeps np.take from buffering ``out``; every
            # position is in range.
            out = data[name] = np.empty((n, *f.shape), f.dtype)
            np.take(self.ring[name], ring_pos, axis=0, out=out[:n_hot], mode="clip")
            np.take(self.cache[name], cache_pos, axis=0, out=out[n_hot:], mode="clip")
        return np.concatenate([hot, cold]), data

    def _cold_rows(self, n: int, hot_start: int, over_gaps: bool) -> tuple[np.ndarray, np.ndarray]:
        """At most ``n`` cold rows drawn from the working set: global indices and positions in the
        cache. ``over_gaps``: each draw picks a slot of a working-set chunk, and draws falling on rows
        not stored are left out (the caller draws hot rows for them); else all ``n`` fall on stored rows."""
        R = self.chunk_rows
        first, last = self.head // R, (hot_start - 1) // R  # cold chunk ids, inclusive
        size = min(self.cold_per_sample, last - first + 1)
        self.working = [c for c in self.working if first <= c <= last and c in self.cached]
        while len(self.working) < size:  # (re)fill: synchronous reads, at the start only
            cid = int(self.rng.integers(first, last + 1))
            if cid not in self.working:
                self._cache_slot(cid)
                self.working.append(cid)
        self.refresh_due = min(self.refresh_due + self.cold_refresh, size)
        while self.refresh_due >= 1:  # rotate: a random member gives way to a random cold chunk
            # prefetched chunks when ready; more than one rotation behind, read now (the rate is a promise)
            incoming = self._next_cold_chunk(first, last, wait=self.refresh_due >= 2)
            if incoming is None:
                break
            self.refresh_due -= 1
            cid, data = incoming
            if cid in self.cached:
                continue
            out = int(self.rng.integers(len(self.working)))
            slot = self.cached.pop(self.working[out])
            for name, values in data.items():
                self.cache[name][slot * R : (slot + 1) * R] = values
            self.cached[cid] = slot
            self.working[out] = cid
        ws = np.array(self.working)
        slots = np.array([self.cached[c] for c in self.working])
        if over_gaps:
            which, offset = np.divmod(self.rng.integers(0, len(ws) * R, n), R)
            rows = ws[which] * R + offset
            stored = (rows >= self.head) & (rows < hot_start)
            rows, which, offset = rows[stored], which[stored], offset[stored]
            return rows, slots[which] * R + offset
        lo = np.maximum(ws * R, self.head)
        sizes = np.minimum((ws + 1) * R, hot_start) - lo  # edge chunks may be partly dropped or hot
        ends = np.cumsum(sizes)
        u = self.rng.integers(0, ends[-1], n)
        which = np.searchsorted(ends, u, side="right")
        rows = lo[which] + u - (ends[which] - sizes[which])
        return rows, slots[which] * R + rows - ws[which] * R

    def _next_cold_chunk(self, first: int, last: int, wait: bool) -> tuple[int, dict[str, np.ndarray]] | None:
        """A random cold chunk's rows: prefetched if one is ready, else read now if ``wait`` or if no
        prefetcher runs, else None.

        A prefetched chunk was drawn among the chunks cold when it was read, not among those turned
        cold since; left at that, the newest cold rows were drawn at 0.81 x the mean rate while rows
        were added (with admission at birth, :meth:`_admit`). So with the chance that a draw among all
        cold chunks falls on one of those newer ones, one of them is read now instead, and the
        prefetched chunk, still a fair draw among the older ones, waits for the next rotation."""
        while self.prefetcher is not None:
            if self.held is not None:
                item, self.held = self.held, None
            else:
                try:
                    item = self.ready.get_nowait()
                except queue.Empty:
                    break
            cid, data, upto = item
            if not first <= cid <= last:  # dropped since; else still stored and cold, so read intact
                continue
            newer = last - upto
            if newer > 0 and self.rng.random() < newer / (last - first + 1):
                self.held = item
                cid = int(self.rng.integers(upto + 1, last + 1))
                return cid, self._read_now(cid)
            return cid, data
        if not wait and self.prefetcher is not None:
            return None
        cid = int(self.rng.integers(first, last + 1))
        return cid, self._read_now(cid)

    def _prefetch_loop(self) -> None:
        """Read random cold chunks ahead of need, so sampling never waits on disk."""
        rng = np.random.default_rng(int(self.rng.integers(2**63)))
        R = self.chunk_rows
        while not self.closing.is_set():
            first, last = self.head // R, (self._hot_start() - 1) // R
            if last < first:
                self.closing.wait(0.05)
                continue
            cid = int(rng.integers(first, last + 1))
            try:
                item = (cid, self._load_chunk(cid), last)
            except Exception:  # a slot being rewritten as the chunk drops out: pick another
                continue
            while not self.closing.is_set():
                try:
                    self.ready.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def close(self) -> None:
        """Stop the prefetch thread (the store stays readable; flush first to keep unflushed rows)."""
        self.closing.set()
        if self.prefetcher is not None:
            self.prefetcher.join(timeout=5)
            self.prefetcher = None

    def _prioritized(self, n: int) -> tuple[np.ndarray, np.ndarray, float]:
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
        return indices, weights, beta

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

    def _read_now(self, cid: int) -> dict[str, np.ndarray]:
        """Cold chunk ``cid``'s rows, read in this thread and timed; slow reads start the prefetcher."""
        t0 = time.perf_counter()
        data = self._load_chunk(cid)
        took = time.perf_counter() - t0
        self.read_s = took if not self.read_s else 0.8 * self.read_s + 0.2 * took
        if self.prefetch and self.prefetcher is None and self.read_s > PREFETCH_AFTER_S:
            self.prefetcher = threading.Thread(target=self._prefetch_loop, name="dagrl-replay-prefetch", daemon=True)
            self.prefetcher.start()
        return data


def _check_disk(path: Path, capacity: int, row_bytes: int) -> None:
    """Refuse, before a file is written, a new store whose full capacity (rows as stored, before
    compression) could never fit the free space of the disk it spills to."""
    import shutil

    from dagrl.core.schema import format_bytes

    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return
    need, free = capacity * row_bytes, shutil.disk_usage(existing).free
    if need > free:
        raise ReplayError(
            f"replay path {path}: capacity {capacity} rows x {row_bytes} B is {format_bytes(need)}, more than the "
            f"{format_bytes(free)} free on its disk (lower the algorithm's buffer_size, or set the role's path)"
        )
