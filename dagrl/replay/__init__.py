"""Replay storage: a hot ring in RAM that spills whole chunks to zarr; uniform and prioritized sampling.

Design notes
------------

Rows have a global index in insertion order; ``[head, tail)`` is stored, ``head = tail - capacity`` once full
(FIFO across tiers). Rows are grouped in chunks of ``chunk_rows``.

```
              RAM (memory_budget)                    disk (zarr: blosc-zstd, blosc-lz4 or raw)
  +------------------------------------------+       +------------------------------------+
  | ring: newest chunks, one array per field |--spill-> rows: one uint8 array of packed   |
  |   (3/4 of the budget)                    | whole  |   rows, a ring of ``slots`` chunk-   |
  | cache: cold chunks read back, one array  | chunks |   sized slots (single writer,      |
  |   per field (1/4), LRU + working set     |<-read--|   chunk-aligned)                   |
  +------------------------------------------+ whole  | meta.json: head, durable tail, ... |
    ^ prefetch thread, if reads are slow       chunks | priorities.npy (PER, at flush)     |
                                                      +------------------------------------+
```

* Crash safety: chunk data first, then ``meta.json`` replaced atomically (at the end of an ``add`` that spilled,
  at ``flush``); before a slot is reused, the meta must already say its old chunk is dropped. After SIGKILL,
  reopening gives every row that was flushed or spilled, bit-exact (tested with a real kill past the
  capacity). A chunk file is written under ``<array>/.partial/`` and renamed into place; the unfinished file of
  a writer killed between the two is removed when the store is next opened (tested with a SIGKILL there).
* Chunk files are flat: ``<array>/c.<slot>.0``, all in one directory (zarr's default key encoding with ``.`` as
  separator), not a directory per chunk, which doubled the disk blocks of small chunks; a store made with
  ``c/<slot>/0`` keys reopens and goes on in that layout.
* Uniform sampling: hot rows from the ring; cold rows from a working set of cached whole chunks,
  ``cold_refresh`` of which are swapped per call for random cold chunks, read in the call while that is cheap,
  by a thread reading ahead once reads average over 2 ms (``PREFETCH_AFTER_S``; from page- cached files the
  thread cost vector rows 1.3-1.9 x in GIL and core sharing on 2 cores). A chunk turning cold joins the
  working set with the chance each cold chunk has of being in it (its rows are still in RAM: one copy, no
  read); a prefetched chunk, drawn among the chunks cold when it was read, gives way (kept for the next
  rotation) with the chance that a draw among all cold chunks falls on one turned cold since, which is read
  instead; and a draw that lands on a partly stored chunk's gap goes to a hot row instead. So every stored row
  has the same chance per draw, while rows are added too (tested: Hotelling's T-squared over batch means, the
  newest cold rows' rate under steady adds, a partly dropped head chunk's rate). Rows in one batch come from a
  few chunks, a trade of independence for never reading rows one by one.
* Prioritized sampling: a sum/min tree over ``capacity`` slots (``index % capacity``), stratified proportional
  draws, importance weights ``(N P(i))^-beta / max``, beta annealed to 1. Exact draws hit arbitrary cold chunks;
  each is read once per call, rows of chunks the cache holds from there, the rest copied as packed bytes
  straight from their chunk and unpacked once per batch (not cached: a cold chunk is seldom drawn twice before
  the cache would drop it). Since nearly every cold row drawn costs a chunk read, a prioritized store's chunks
  default to ~64 KiB (at least 2 rows: 2 for Atari frames, 256-512 for vector rows) instead of ~1 MiB. For
  rows that are not images (under 4 KiB) a prioritized store's chunks are also uncompressed by default, and a
  cold row drawn is read alone at its offset in its chunk file (one ``preadv``), not with its chunk: 0.32 x
  all-in-RAM against 0.05 with blosc-zstd chunks read whole, for 1.8 x the disk bytes of float vectors. A
  prioritized image store spills with blosc-lz4 instead, ~2 x faster to decode, its 2-row chunks still one 4
  KiB block each (1.4 x the draws on Pong rows; BENCHMARKS.md).
* Chunk files are read and written by the store itself (``dagrl/replay/chunkfiles.py``: the file, encoded or
  decoded with numcodecs, atomically replaced as zarr does) in exactly zarr's format; zarr keeps the array's
  metadata and reads every chunk (tested both ways). Through zarr's array API a chunk cost ~1 ms to read and
  ~3 ms to write whatever its size, which capped adds of one- or two-row chunks at a few hundred rows/s.
* n-step returns are folded on the sampler side (``dagrl.replay.NStep``), where env order is known.
* Sequences (R2D2, ``dagrl/replay/sequences.py``): a row can be a whole stretch of one env's episode.
  ``SequenceRecorder`` cuts each env's episodes on the sampler into rows of ``burn_in + seq_len`` steps
  (overlapping by ``overlap``, never crossing an episode's end; the last row of an episode is padded and says
  its length) with the LSTM state before the row's first slot; the store sees fixed-shape fields, so spilling,
  priorities (one per sequence) and sharding are the transitions' own. The recorder keeps per env only the
  steps a row still to come needs (``burn_in + seq_len`` at most).
* Order: a shard stores each sampler's rollouts in the order that sampler collected them. Dask alone does not
  promise it: calls submitted within 100 ms share a priority (ties broken by their random keys), and tasks
  waiting for the same input from another worker start in any order once it arrives. Fragment calls get a
  falling priority (first submitted, first run among ready tasks); on the streams each sampler's loop calls
  its ``add``s one after another (``dagrl/runtime/loops.py``; tested with two samplers streaming into one shard).
* Memory: a store of image rows (4 KiB or more a row) sets its process's glibc malloc to keep freed blocks
  (``dagrl/replay/malloc.py``): every sample is a batch of MBs, and with glibc's defaults each one came back as
  fresh pages to fault in (Pong rows: 47k rows/s in RAM by default, 139k kept).
* As a role: an algorithm declares ``@role("replay", many=True)`` returning a store; its checkpoint
  (``state_dict``) flushes. ``replicas: K`` shards it through the lockstep shard rule.
* Sharded draws (``dagrl/replay/role.py``): each ``Sample`` carries its shard's size, priority mass, least
  priority and ``beta``. A learner that answers through ``reprioritize`` (DQN, R2D2) puts in its ``UpdateResult``
  the rows each shard draws next, ``shard_draws``: the rows drawn this time split by mass (largest remainders,
  at least one row each, so every shard keeps reporting), and it weighs the pooled rows with ``pooled_weights``,
  each shard's weights rescaled to the least priority of all. A row's chance per draw and its weight are then
  those of one replay holding every shard's rows (tested against one store), up to the change in sizes between
  the draw that reported them and the next. With one shard, or ``dp-learners`` (learner k sees shard k only),
  nothing changes. SAC and TD3 have no edge from the learner back to replay, so their shards draw equal counts
  and the graph check warns of unequal feeding (``graph._warn_unequal_shards``).
"""

from __future__ import annotations

from dagrl.replay.nstep import NStep
from dagrl.replay.role import ReplayState, Transitions, replay_state
from dagrl.replay.schema import Field, ReplayError, Schema
from dagrl.replay.store import ReplayStore, Sample
from dagrl.replay.synthetic import random_sample

__all__ = [
    "Field",
    "NStep",
    "ReplayError",
    "ReplayState",
    "ReplayStore",
    "Sample",
    "Schema",
    "Transitions",
    "random_sample",
    "replay_state",
]
