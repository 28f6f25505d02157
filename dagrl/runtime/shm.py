"""Same-host shared memory for the large arrays of fragment outputs.

A fragment output that holds arrays of at least ``min_bytes`` (a rollout of image observations)
leaves :func:`~dagrl.runtime.host.run_fragment` inside a :class:`Shared` envelope. Dask serializes
the envelope with :func:`_dumps`, which sees who receives it (Dask passes the comm's sender and
recipient addresses): when both are on this host and ``/dev/shm`` has room, each large array is
copied once into a new POSIX shared-memory segment and only the segment's name travels over the
comm; the receiver maps the segment, unlinks it at once (the mapping stays valid) and gets arrays
backed by it, without another copy. Across hosts, when Dask spills the value to disk, or when
``/dev/shm`` is short, the arrays travel as ordinary frames. Either way the receiver gets the plain
value, never the envelope; a consumer on the producing worker unwraps it itself (:func:`unwrap`).

Segments are named ``dagrl-shm-<creator pid>-<random>``. The receiver unlinks a segment as soon as
it has mapped it, so one that outlives a run was written for a transfer that never completed (its
sender or receiver was killed): :func:`sweep` removes those whose creator is gone, and the
creator's own when the run ends.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import mmap
import os
import uuid
from typing import Any

import numpy as np

__all__ = ["DIR", "MIN_BYTES", "PREFIX", "STATS", "Shared", "sweep", "unwrap", "wrap"]

DIR = "/dev/shm"
PREFIX = "dagrl-shm-"
MIN_BYTES = 1 << 20
"""Arrays smaller than this travel as ordinary frames (a segment costs a few system calls)."""
STATS: dict[str, int] = {"shm_arrays": 0, "shm_bytes": 0, "framed_values": 0}
"""What this process sent: arrays (and their bytes) through segments, envelopes sent as frames."""


class Shared:
    """A fragment output whose large arrays may cross to a same-host worker through shared memory."""

    __slots__ = ("min_bytes", "value")

    def __init__(self, value: Any, min_bytes: int = MIN_BYTES):
        self.value, self.min_bytes = value, min_bytes


def wrap(value: Any, min_bytes: int = MIN_BYTES) -> Any:
    """``value`` in a :class:`Shared` envelope if it holds an array of ``min_bytes`` or more, else as is."""
    return Shared(value, min_bytes) if any(a.nbytes >= min_bytes for a in _arrays(value)) else value


def unwrap(value: Any) -> Any:
    """The value inside an envelope (also inside lists, as a gathered input arrives); the rest as is."""
    if isinstance(value, Shared):
        return value.value
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


def _arrays(value: Any) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    _walk(value, lambda v: out.append(v) if isinstance(v, np.ndarray) and v.dtype != object else None)
    return out


def _walk(value: Any, leaf: Any) -> Any:
    """``value`` rebuilt with each leaf ``v`` replaced by ``leaf(v)`` where that is not ``None``,
    through dataclasses, dicts, lists and tuples (the containers fragment outputs are made of)."""
    out = leaf(value)
    if out is not None:
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        new = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(new, f.name, _walk(getattr(value, f.name), leaf))
        return new
    if isinstance(value, dict):
        return type(value)((k, _walk(v, leaf)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_walk(v, leaf) for v in value)
    return value


@dataclasses.dataclass(frozen=True)
class _Segment:
    """Where one array went: a segment name, its dtype and shape (the placeholder left in the value)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def _same_host(context: dict | None) -> bool:
    from distributed.comm.addressing import get_address_host, parse_address

    try:
        sender, recipient = context["sender"]["address"], context["recipient"]["address"]
        if parse_address(sender)[0] != "tcp" and parse_address(recipient)[0] != "tcp":
            return False
        return get_address_host(sender) == get_address_host(recipient)
    except (KeyError, TypeError, ValueError):  # no context: spilling to disk, or an unknown comm
        return False


def _room(nbytes: int) -> bool:
    try:
        st = os.statvfs(DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize > 2 * nbytes + (64 << 20)


def _write(arr: np.ndarray) -> _Segment:
    arr = np.ascontiguousarray(arr)
    name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:16]}"
    path = os.path.join(DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, arr.nbytes)  # no room fails here (ENOSPC), not later as SIGBUS
        with mmap.mmap(fd, arr.nbytes) as mm:
            dst = np.frombuffer(mm, np.uint8)
            dst[:] = arr.reshape(-1).view(np.uint8)
            del dst  # release the export before the mapping closes
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return _Segment(name, arr.dtype.str, tuple(arr.shape))


def _put(value: Any, min_bytes: int, written: list[_Segment]) -> _Segment | None:
    if isinstance(value, np.ndarray) and value.dtype != object and value.nbytes >= min_bytes:
        written.append(_write(value))
        return written[-1]
    return None


def _read(seg: _Segment) -> np.ndarray:
    path = os.path.join(DIR, seg.name)
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
        os.unlink(path)  # mapped: the memory lives as long as the array, the name goes now
    return np.frombuffer(mm, np.dtype(seg.dtype)).reshape(seg.shape)


def _dumps(x: Shared, context: dict | None = None) -> tuple[dict, list]:
    from distributed.protocol import serialize

    if _same_host(context) and _room(sum(a.nbytes for a in _arrays(x.value))):
        written: list[_Segment] = []
        try:
            skeleton = _walk(x.value, lambda v: _put(v, x.min_bytes, written))
        except OSError:  # /dev/shm filled up meanwhile: send bytes
            for seg in written:
                _unlink(seg.name)
        else:
            header, frames = serialize(skeleton, on_error="raise")
            STATS["shm_arrays"] += len(written)
            STATS["shm_bytes"] += sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in written)
            return {"shm": True, "sub": header}, frames
    STATS["framed_values"] += 1
    header, frames = serialize(x.value, on_error="raise")
    return {"shm": False, "sub": header}, frames


def _loads(header: dict, frames: list) -> Any:
    from distributed.protocol import deserialize

    value = deserialize(header["sub"], frames)
    return _walk(value, lambda v: _read(v) if isinstance(v, _Segment) else None) if header["shm"] else value


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(DIR, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(own: bool = False) -> int:
    """Remove segments whose creating process is gone (and, with ``own``, this process's); how many."""
    try:
        names = [n for n in os.listdir(DIR) if n.startswith(PREFIX)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        try:
            pid = int(name[len(PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if (own and pid == os.getpid()) or not _alive(pid):
            _unlink(name)
            removed += 1
    return removed


def _register() -> None:
    from dask.sizeof import sizeof
    from distributed.protocol.serialize import dask_deserialize, dask_serialize

    dask_serialize.register(Shared)(_dumps)
    dask_deserialize.register(Shared)(_loads)

    @sizeof.register(Shared)
    def _sizeof(x: Shared) -> int:
        return sizeof(x.value)


_register()
