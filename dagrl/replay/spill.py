"""Spilling a replay store's chunks to zarr, and reading them back (:class:`ChunkStorage`)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dagrl.replay.chunkfiles import chunk_files, sync_dir
from dagrl.replay.schema import ReplayError, Schema

log = logging.getLogger("dagrl")

META = "meta.json"


CHUNK_SEPARATOR = "."
"""Chunk keys ``c.<slot>.0``: every chunk a file of the array's directory, none a directory of its own
(:mod:`dagrl.replay.chunkfiles` says why). A store made with ``/`` keeps its layout when reopened."""


PRIORITIES = "priorities.npy"


def _compressors(codec: str) -> Any:
    from zarr.codecs import BloscCodec, ZstdCodec

    if codec == "none":
        return None
    if codec == "zstd":
        return [ZstdCodec(level=3)]
    cname = codec.split("-", 1)[1]
    return [BloscCodec(cname=cname, clevel=3, shuffle="shuffle")]


CODECS = ("none", "zstd", "blosc-zstd", "blosc-lz4")


LARGE_ROW_BYTES = 4096
"""Rows this large (images) make the process keep freed memory (:mod:`dagrl.replay.malloc`)."""


def default_chunk_rows(row_bytes: int, target_bytes: int = 1 << 20, least: int = 16) -> int:
    """A power of two near ``target_bytes`` per chunk, between ``least`` and 4096 rows."""
    rows = max(1, target_bytes // max(row_bytes, 1))
    return int(min(4096, max(least, 1 << (rows.bit_length() - 1))))


def default_codec(schema: Schema, prioritized: bool) -> str:
    """The codec a store spills with unless told: what its reads need.

    * ``blosc-zstd`` for a uniform store: its draws read whole chunks into a working set, and zstd
      packs them smallest (Atari frames ~200 x);
    * ``none`` for a prioritized store of rows under :data:`LARGE_ROW_BYTES` (not images): a priority
      draw then reads each cold row alone, a few hundred bytes instead of its chunk and the chunk's
      decoding (6.7 x the draws of blosc-zstd; 1.8 x the disk bytes of float vectors);
    * ``blosc-lz4`` for a prioritized store of images: each cold row drawn decodes its 2-row chunk,
      and lz4 decodes ~2 x faster (1.4 x the draws of Pong rows); its chunks, ~1.9 KiB against
      zstd's ~0.6 KiB, still fill one 4 KiB disk block each (BENCHMARKS.md).

    >>> default_codec(Schema({"obs": ("float32", (17,))}), prioritized=True)
    'none'
    >>> default_codec(Schema({"obs": ("uint8", (84, 84, 4))}), prioritized=True)
    'blosc-lz4'
    """
    if not prioritized:
        return "blosc-zstd"
    return "none" if schema.row_bytes < LARGE_ROW_BYTES else "blosc-lz4"


class ChunkStorage:
    """The zarr side of :class:`dagrl.replay.store.ReplayStore`: opening the store, writing spilled
    chunks and the ``meta.json`` that says which rows are durable, restoring from it, and reading cold
    chunks back. A base of the store; it keeps no state of its own."""

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
        # One array of packed rows, so a chunk is one zarr read (six arrays cost ~5x more per chunk).
        self.rows = group.create_array(
            "rows",
            shape=(self.slots * self.chunk_rows, self.schema.row_bytes),
            chunks=(self.chunk_rows, self.schema.row_bytes),
            dtype="uint8",
            compressors=_compressors(self.codec),
            fill_value=0,
            chunk_key_encoding={"name": "default", "separator": CHUNK_SEPARATOR},
            overwrite=True,
        )
        self.files = chunk_files(self.rows, self.codec)
        self._write_meta()

    def _meta(self) -> dict[str, Any]:
        return {
            "format": 2,
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
        with self._storage_errors("metadata"):  # a failed write leaves the previous meta.json in place
            if self.files is not None:
                self.files.sync()  # the chunks it counts are on disk before it says so
            with tmp.open("w") as f:
                f.write(json.dumps(self._meta()))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path / META)
            sync_dir(self.path)
        self.persisted_head = self.head
        self.meta_due = False

    @contextlib.contextmanager
    def _storage_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except OSError as err:
            where = f"replay path {self.path}"
            if err.errno == errno.ENOSPC:
                raise ReplayError(f"{where}: disk full while writing {what}; nothing acknowledged was lost") from None
            raise ReplayError(f"{where}: writing {what} failed ({err})") from None

    def _write_chunk(self, cid: int, meta: bool = True) -> None:
        if self.path is None:
            raise ReplayError("store has no path: cannot spill beyond the memory budget")
        R = self.chunk_rows
        slot = cid % self.slots
        if self.persisted_head < (cid - self.slots + 1) * R:
            self._write_meta()  # the slot's previous chunk must be dropped on disk before we overwrite it
        rows = self._ring_rows(cid)
        try:
            if self.files is not None:
                self.files.write(slot, self._pack(rows))
            else:
                self.rows[slot * R : (slot + 1) * R] = self._pack(rows)
        except OSError as err:
            where = f"replay path {self.path}"
            if err.errno == errno.ENOSPC:
                raise ReplayError(
                    f"{where}: disk full while writing chunk {cid}; nothing acknowledged was lost"
                ) from None
            raise ReplayError(f"{where}: writing chunk {cid} failed ({err})") from None
        self.dirty.discard(cid)
        if cid in self.cached:
            self.free_slots.append(self.cached.pop(cid))
        end = min(self.tail, (cid + 1) * R)
        if cid * R <= self.durable_tail:
            self.durable_tail = max(self.durable_tail, end)
        if meta:
            self._write_meta()

    def flush(self) -> None:
        """Make every stored row durable: write dirty RAM chunks, priorities and metadata."""
        if self.path is None:
            raise ReplayError("store has no path to flush to")
        for cid in sorted(self.dirty):
            self._write_chunk(cid)
        if self.tree is not None:
            tmp = self.path / (PRIORITIES + ".tmp.npy")
            with self._storage_errors("priorities"):
                with tmp.open("wb") as f:
                    np.save(f, self.tree.leaves())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path / PRIORITIES)
        self._write_meta()

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint hook of a replay role: flush (the data stays in the store), return its counts and
        what its draws depend on (the sampling generator, the draws so far)."""
        if self.path is not None:
            self.flush()
        return {**self.stats(), "rng": self.rng.bit_generator.state, "samples_drawn": self.samples_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The rows are the store's own, reopened at its path; its draws go on as they would have. A
        store that holds rows added after the checkpoint (flushed for the next checkpoint, whose file a
        crash cut short) is wound back to the checkpoint's rows where none of those was dropped since;
        where one was, or priorities were flushed since, it goes on as it is, which is said once."""
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        added, rows = state.get("added", self.tail), state.get("rows", len(self))
        if added < self.tail and self.path is not None and self.head <= added - rows:
            self.tail = self.durable_tail = added
            self.samples_drawn = state.get("samples_drawn", self.samples_drawn)
            self._write_meta()
            self._restore(self._meta())
            if self.tree is None:
                return
        if added != self.tail or state.get("samples_drawn", self.samples_drawn) != self.samples_drawn:
            log.info(
                "replay at %s: %d rows added and %d drawn, the checkpoint's %d and %s: its draws go on from "
                "there, not exactly as the run's would have", self.path, self.tail, self.samples_drawn, added,
                state.get("samples_drawn", "?"),
            )  # fmt: skip
        self.samples_drawn = state.get("samples_drawn", self.samples_drawn)

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
        self.rows = zarr.open_group(str(self.path), mode="a")["rows"]
        self.files = chunk_files(self.rows, self.codec)
        if self.files is not None and (left := self.files.sweep()):
            log.info("replay path %s: removed %d unfinished chunk file(s) of a writer that died", self.path, left)
        self.persisted_head = self.head
        self.hot_lo = self.tail // self.chunk_rows
        if self.tail % self.chunk_rows:  # keep filling the last chunk in RAM
            self._read_cold_chunk(self.hot_lo, self.ring, self._ring_rows(self.hot_lo))
        if self.tree is not None:
            saved = self.path / PRIORITIES
            leaves = np.load(saved) if saved.exists() else np.zeros(self.capacity)
            live = np.arange(self.head, self.tail)
            values = leaves[live % self.capacity]
            values[values <= 0] = self.max_priority**self.alpha  # rows spilled after the last flush
            self.tree.set(live % self.capacity, values)

    def _pack(self, rows: slice) -> np.ndarray:
        buf = np.empty((rows.stop - rows.start, int(self.offsets[-1])), np.uint8)  # offsets[-1]: row bytes
        for name, lo, hi in zip(self.schema, self.offsets[:-1], self.offsets[1:], strict=True):
            buf[:, lo:hi] = self.ring[name][rows].reshape(len(buf), -1).view(np.uint8)
        return buf

    def _unpack(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Each field of packed rows as a view into ``buf`` (every caller copies the rows it keeps)."""
        return {
            name: buf[:, lo:hi].view(f.dtype).reshape(len(buf), *f.shape)
            for (name, f), lo, hi in zip(self.schema.items(), self.offsets[:-1], self.offsets[1:], strict=True)
        }

    def _packed_chunk(self, cid: int) -> np.ndarray:
        """Cold chunk ``cid`` as packed rows, ``(chunk_rows, row_bytes)`` uint8."""
        R, slot = self.chunk_rows, cid % self.slots
        if self.files is not None:
            buf = self.files.read(slot)  # None: never written, zarr gives its fill value
            if buf is not None and buf.size == self.chunk_bytes:
                return buf.reshape(R, -1)
        return np.asarray(self.rows[slot * R : (slot + 1) * R])

    def _load_chunk(self, cid: int) -> dict[str, np.ndarray]:
        return self._unpack(self._packed_chunk(cid))

    def _read_cold_chunk(self, cid: int, into: dict[str, np.ndarray], rows: slice) -> None:
        for name, values in self._read_now(cid).items():
            into[name][rows] = values

    def _cache_slot(self, cid: int) -> int:
        """The cache slot holding cold chunk ``cid``, reading it (whole) if needed; LRU eviction."""
        slot = self.cached.get(cid)
        if slot is not None:
            self.cached.move_to_end(cid)
            return slot
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            _, slot = self.cached.popitem(last=False)
        R = self.chunk_rows
        self._read_cold_chunk(cid, self.cache, slice(slot * R, (slot + 1) * R))
        self.cached[cid] = slot
        return slot

    def _read_cold(self, rows: np.ndarray, where: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Cold ``rows`` into ``out[...][where]``.

        Rows of a cached chunk come from the cache. For the others each distinct chunk is read once,
        its wanted rows copied as packed bytes, and the lot unpacked in one copy per field: they do
        not go through the cache, since a priority draw, nearly the only reader, seldom takes the same
        cold chunk twice before the cache would drop it, and a chunk's pass through the cache (a copy
        per field, the LRU's bookkeeping) cost as much as its read and decode (BENCHMARKS.md).
        """
        R = self.chunk_rows
        cids, offsets = np.divmod(rows, R)
        slot = np.array([self.cached.get(c, -1) for c in cids.tolist()], np.int64)
        hit = np.flatnonzero(slot >= 0)
        if len(hit):
            for c in dict.fromkeys(cids[hit].tolist()):
                self.cached.move_to_end(c)
            pos = slot[hit] * R + offsets[hit]
            for name, cache in self.cache.items():
                out[name][where[hit]] = cache[pos]
        miss = np.flatnonzero(slot < 0)
        if not len(miss):
            return
        miss = miss[np.argsort(cids[miss], kind="stable")]
        chunks, starts = np.unique(cids[miss], return_index=True)
        packed = np.empty((len(miss), self.schema.row_bytes), np.uint8)
        rowwise = self.files is not None and self.files.codec is None and hasattr(os, "preadv")  # not on Windows
        for cid, lo, hi in zip(chunks.tolist(), starts.tolist(), [*starts[1:].tolist(), len(miss)], strict=True):
            want = offsets[miss[lo:hi]]
            if not (rowwise and self.files.read_rows(cid % self.slots, want, self.schema.row_bytes, packed[lo:hi])):
                packed[lo:hi] = self._packed_chunk(cid)[want]
        for name, values in self._unpack(packed).items():
            out[name][where[miss]] = values
