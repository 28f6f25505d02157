"""The replay's chunk files read and written directly, beside zarr's array API.

Through zarr's array API a chunk costs about 1 ms to read and 3 ms to write whatever its size (each
call is handed to zarr's event-loop thread and waited for). The file itself, encoded or decoded with
numcodecs, which is what zarr runs for these codecs, costs 0.01-0.6 ms for 1 to 16 image rows. So
the store reads and writes its chunk files itself, in exactly the bytes zarr would (a test checks
both ways), and zarr keeps the array's metadata and stays able to read every chunk.

Only for the layouts :class:`~dagrl.replay.store.ReplayStore` creates: a local directory store with
``c.<slot>.0`` chunk keys (zarr's default encoding with ``.`` as separator: every chunk a file of the
array's own directory), or ``c/<slot>/0`` (the default ``/``: a directory per chunk, which stores made
before the flat layout have). Any other store goes through zarr (:func:`chunk_files` returns None).

Why flat: a prioritized store keeps 2-row chunks, so a 1M-row Atari store is 500k chunks; a directory
per chunk doubled the disk blocks of such a store (4 KiB for the file, 4 KiB for its directory) and
rows were added 1.45 x slower (``dagrl bench replay-layout``, BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np


class ChunkFiles:
    """Chunk ``slot`` of a ``(slots x chunk_rows, row_bytes)`` uint8 array: one file, one codec.

    A chunk is written to ``<array>/.partial/<slot>.<pid>`` and renamed over its file, so a writer
    killed mid-write leaves the old chunk intact and its unfinished file in that one directory, which
    the next writer to open the store empties (:meth:`sweep`).
    """

    def __init__(self, root: Path, codec: Any, separator: str = "."):
        self.root, self.separator = str(root), separator
        self.partial = str(root / ".partial")
        self.codec = codec  # a numcodecs codec, or None: raw bytes
        self.made: set[int] = set()  # slots whose directory exists (``/`` layout)
        self.unsynced: set[str] = set()
        """Chunk files written since the last :meth:`sync`."""
        os.makedirs(self.partial, exist_ok=True)

    def sweep(self) -> int:
        """Remove the unfinished chunk files of writers that died mid-write; how many there were.
        Only for the store's one writer, when it opens the store (no write of its own in flight)."""
        gone = 0
        for entry in os.scandir(self.partial):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                gone += 1
        return gone

    def path(self, slot: int) -> str:
        sep = self.separator
        return f"{self.root}/c{sep}{slot}{sep}0"

    def read(self, slot: int) -> np.ndarray | None:
        """The chunk's decoded bytes, or None if it was never written (zarr's fill value)."""
        try:
            with open(self.path(slot), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        data = raw if self.codec is None else self.codec.decode(raw)
        return np.frombuffer(data, np.uint8)

    def read_rows(self, slot: int, rows: np.ndarray, row_bytes: int, out: np.ndarray) -> bool:
        """Rows ``rows`` of an uncompressed chunk into ``out`` (``(len(rows), row_bytes)`` uint8), each read
        on its own at its offset: a priority draw wants one or two rows of a cold chunk, and reading
        ~170 bytes instead of the whole chunk is what makes such draws fast. False if the chunk file is
        missing or shorter than a row asked for: the caller then reads the chunk whole, as before."""
        assert self.codec is None
        try:
            fd = os.open(self.path(slot), os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            for i, row in enumerate(rows.tolist()):
                got = os.preadv(fd, [out[i]], row * row_bytes)
                if got != row_bytes:
                    return False
        finally:
            os.close(fd)
        return True

    def write(self, slot: int, rows: np.ndarray) -> None:
        """Replace the chunk's file atomically (a new file renamed over the old, as zarr does)."""
        data = rows.tobytes() if self.codec is None else self.codec.encode(np.ascontiguousarray(rows))
        path = self.path(slot)
        if self.separator == "/" and slot not in self.made:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.made.add(slot)
        tmp = f"{self.partial}/{slot}.{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            self.unsynced.add(path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def sync(self) -> None:
        """Make every chunk written since durable, its bytes and its name, before the store's metadata
        says their rows are stored: a host that loses power never comes back with metadata counting a
        chunk whose file is empty or still the slot's previous one. Once per metadata write, not per
        chunk (a chunk written but not yet counted may be lost: its rows were never acknowledged)."""
        for path in sorted(self.unsynced):
            with contextlib.suppress(FileNotFoundError):  # replaced meanwhile by a later write of its slot
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        for directory in sorted({os.path.dirname(p) for p in self.unsynced}):
            sync_dir(directory)
        self.unsynced.clear()


def sync_dir(directory: str | Path) -> None:
    """``fsync`` a directory: the names created or renamed in it survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def chunk_files(rows: Any, codec: str) -> ChunkFiles | None:
    """Direct file access for the zarr array ``rows`` written with ``codec``, or None to use zarr."""
    import numcodecs
    from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding
    from zarr.storage import LocalStore

    encoding = rows.metadata.chunk_key_encoding
    if not isinstance(rows.store, LocalStore) or encoding not in (
        DefaultChunkKeyEncoding("."),
        DefaultChunkKeyEncoding("/"),
    ):
        return None
    root, sep = Path(rows.store.root) / rows.path, encoding.separator
    if codec == "none":
        return ChunkFiles(root, None, sep)
    if codec == "zstd":
        return ChunkFiles(root, numcodecs.Zstd(level=3), sep)
    cname = codec.split("-", 1)[1]
    return ChunkFiles(root, numcodecs.Blosc(cname=cname, clevel=3, shuffle=numcodecs.Blosc.SHUFFLE), sep)
