"""Same-host shared memory for the large arrays of fragment outputs.

A fragment output that holds arrays of at least ``min_bytes`` (a rollout of image observations)
leaves :func:`~dagrl.runtime.host.run_fragment` inside a :class:`Shared` envelope. Dask serializes
the envelope with :func:`_dumps`, which sees who receives it (Dask passes the comm's sender and
recipient addresses). When both are on this host, the large arrays are copied into a *slot*: a
segment of ``/dev/shm`` that the sending process keeps mapped and reuses, and only the slot's name
and the arrays' offsets travel over the comm. The receiver maps the slot (once: it keeps a few
mappings) and gets arrays that are views of it; when the last of them is garbage, the slot's first
byte marks it free, so the sender's next transfer reuses it. A transfer costs one copy, by the
sender, instead of a socket's two kernel copies, the protocol work and the receiver's fresh
allocation (a fresh segment per transfer, or a receiver copying out of the slot, cost as much in
page faults as the socket it replaced). Across hosts, when Dask spills the value to
disk, when ``/dev/shm`` is short, or when all of a sender's :data:`MAX_SLOTS` slots are still being
read, the arrays travel as ordinary frames. Either way the receiver gets the plain value, never the
envelope; a consumer on the producing worker unwraps it itself (:func:`unwrap`).

Slots are named ``dagrl-shm-<sender pid>-<random>`` and live until :func:`sweep` removes them: a
run's end sweeps every worker's own slots, and anyone's sweep removes those whose sender is gone
(a killed worker). A slot whose receiver died, or still holds the arrays, stays busy; the sender
uses its other slots, then frames. ``posix_fallocate`` reserves a slot's pages when it is made, so a
full ``/dev/shm`` is an error there (and a fallback to frames), never a SIGBUS later.
``shared_memory: false`` in a graph turns all of it off.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import mmap
import os
import threading
import uuid
import weakref
from typing import Any

import numpy as np

__all__ = ["DIR", "MIN_BYTES", "PREFIX", "STATS", "Shared", "alive", "entries", "room", "sweep", "unwrap", "wrap"]

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
    """The numpy arrays inside ``value`` (as :func:`_walk` finds them), without rebuilding anything:
    every fragment output passes through here."""
    if isinstance(value, np.ndarray):
        return [value] if value.dtype != object else []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items: Any = (getattr(value, f.name) for f in dataclasses.fields(value))
    elif isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        items = value
    else:
        return []
    return [a for v in items for a in _arrays(v)]


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
    """Where one array went (the placeholder left in the value): slot name, offset, dtype, shape."""

    name: str
    offset: int
    dtype: str
    shape: tuple[int, ...]


def _same_host(context: dict | None) -> bool:
    from distributed.comm.addressing import get_address_host, parse_address

    try:
        sender, recipient = context["sender"]["address"], context["recipient"]["address"]
        if parse_address(sender)[0] != "tcp" or parse_address(recipient)[0] != "tcp":
            return False
        return get_address_host(sender) == get_address_host(recipient)
    except (KeyError, TypeError, ValueError):  # no context: spilling to disk, or an unknown comm
        return False


def room(nbytes: int) -> bool:
    """Whether ``/dev/shm`` holds ``nbytes`` with room to spare (a container's is often 64 MB)."""
    try:
        st = os.statvfs(DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize > 2 * nbytes + (64 << 20)


HEADER = 64
"""Bytes before a slot's data; byte 0 is 1 while the slot is written or a receiver holds its arrays."""
MAX_SLOTS = 4
"""Slots one sending process keeps; a transfer finding all of them busy goes as frames."""
ALIGN = 64


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Slot:
    def __init__(self, size: int):
        self.name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:16]}"
        path = os.path.join(DIR, self.name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # all pages now: a full /dev/shm is ENOSPC here, never SIGBUS later
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.size = size

    @property
    def free(self) -> bool:
        return self.mm[0] == 0


_SLOTS: list[_Slot] = []
"""This process's slots (sending side)."""
_MAPS: dict[str, mmap.mmap] = {}
"""Slots of other processes this one has mapped (receiving side), oldest first."""
MAX_MAPS = 32
_LOCK = threading.Lock()


def _acquire(nbytes: int) -> _Slot | None:
    """A free slot of at least ``nbytes`` (a new one while under :data:`MAX_SLOTS`), marked busy."""
    with _LOCK:  # Dask may serialize on its offload thread and the event loop at once
        return _acquire_locked(HEADER + nbytes)


def _acquire_locked(need: int) -> _Slot | None:
    fits = [s for s in _SLOTS if s.free and s.size >= need]
    if fits:
        slot = min(fits, key=lambda s: s.size)
    else:
        free = [s for s in _SLOTS if s.free]
        if len(_SLOTS) >= MAX_SLOTS and free:  # replace the smallest free slot by a bigger one
            old = min(free, key=lambda s: s.size)
            _SLOTS.remove(old)
            old.mm.close()
            _unlink(old.name)
        if len(_SLOTS) >= MAX_SLOTS or not room(need):
            return None
        slot = _Slot(max(need, 1 << 20) + (need >> 3))  # some slack: rollouts vary a little
        _SLOTS.append(slot)
    slot.mm[0] = 1
    return slot


def _put_all(value: Any, min_bytes: int) -> Any | None:
    """``value`` with its large arrays copied into one slot and replaced by :class:`_Segment`s, or
    ``None`` when no slot can take them."""
    big = [a for a in _arrays(value) if a.nbytes >= min_bytes]
    offsets, at = {}, HEADER
    for a in big:
        offsets[id(a)] = at
        at = _aligned(at + a.nbytes)
    try:
        slot = _acquire(at - HEADER)
    except OSError:  # /dev/shm filled up meanwhile
        return None
    if slot is None:
        return None

    def put(v: Any) -> _Segment | None:
        if not (isinstance(v, np.ndarray) and id(v) in offsets):
            return None
        off = offsets[id(v)]
        dst = np.frombuffer(slot.mm, v.dtype, v.size, off).reshape(v.shape)
        dst[...] = v
        del dst  # release the export of the mapping
        return _Segment(slot.name, off, v.dtype.str, tuple(v.shape))

    skeleton = _walk(value, put)
    STATS["shm_arrays"] += len(big)
    STATS["shm_bytes"] += sum(a.nbytes for a in big)
    return skeleton


def _mapping(name: str) -> mmap.mmap:
    with _LOCK:
        return _mapping_locked(name)


def _mapping_locked(name: str) -> mmap.mmap:
    mm = _MAPS.pop(name, None)
    if mm is None:
        fd = os.open(os.path.join(DIR, name), os.O_RDWR)
        try:
            mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        while len(_MAPS) >= MAX_MAPS:  # the oldest mapping goes (its sender may be long gone)
            old = _MAPS.pop(next(iter(_MAPS)))
            with contextlib.suppress(BufferError):
                old.close()
    _MAPS[name] = mm  # newest last
    return mm


def _take_all(value: Any) -> Any:
    """``value`` with every :class:`_Segment` replaced by its array, a view of the slot (no copy).

    The slot is marked free once every array taken from it is gone: a ``weakref.finalize`` on one
    array spanning the mapping, which all the arrays are views of."""
    spans: dict[str, np.ndarray] = {}

    def take(v: Any) -> np.ndarray | None:
        if not isinstance(v, _Segment):
            return None
        span = spans.get(v.name)
        if span is None:
            mm = _mapping(v.name)
            span = spans[v.name] = np.frombuffer(mm, np.uint8)
            weakref.finalize(span, _release, mm)
        dtype = np.dtype(v.dtype)
        nbytes = int(np.prod(v.shape)) * dtype.itemsize
        return span[v.offset : v.offset + nbytes].view(dtype).reshape(v.shape)

    return _walk(value, take)


def _release(mm: mmap.mmap) -> None:
    with contextlib.suppress(ValueError):  # the mapping was closed meanwhile
        mm[0] = 0  # every array is gone: the sender may reuse the slot


def _dumps(x: Shared, context: dict | None = None) -> tuple[dict, list]:
    from distributed.protocol import serialize

    if _same_host(context):
        skeleton = _put_all(x.value, x.min_bytes)
        if skeleton is not None:
            header, frames = serialize(skeleton, on_error="raise")
            return {"shm": True, "sub": header}, frames
    STATS["framed_values"] += 1
    header, frames = serialize(x.value, on_error="raise")
    return {"shm": False, "sub": header}, frames


def _loads(header: dict, frames: list) -> Any:
    from distributed.protocol import deserialize

    value = deserialize(header["sub"], frames)
    return _take_all(value) if header["shm"] else value


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(DIR, name))


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (anyone's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def entries(prefix: str) -> list[str]:
    """Names in ``/dev/shm`` starting with ``prefix`` (none if it cannot be read)."""
    try:
        return [n for n in os.listdir(DIR) if n.startswith(prefix)]
    except OSError:
        return []


def sweep(own: bool = False) -> int:
    """Remove segments whose creating process is gone (and, with ``own``, this process's); how many."""
    removed = 0
    for name in entries(PREFIX):
        try:
            pid = int(name[len(PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if (own and pid == os.getpid()) or not alive(pid):
            _unlink(name)
            removed += 1
    if own:
        with _LOCK:
            for slot in _SLOTS:
                with contextlib.suppress(BufferError):
                    slot.mm.close()
            _SLOTS.clear()
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
