"""A same-host mailbox for values that tasks of the next iteration already wait for: the weights and
rollouts of ``sync`` and ``dp-learners``.

``sync`` submits iteration ``i + 1`` while ``i`` runs, so Dask starts its ``publish`` the moment
``update`` ends. Through Dask alone, each ``collect`` then starts only after the scheduler learns that
``publish`` ended, sends the task to the sampler's worker and that worker fetches the weights peer to
peer: 14-19 ms per iteration on two cores (BENCHMARKS.md, "`sync`'s time between tasks"), ~15 % of a
CartPole PPO iteration; the rollouts' way to ``update`` costs the same again. With the mailbox,
``collect`` ``i + 1`` is a task that depends on nothing of iteration ``i + 1``: it starts on its
worker as soon as ``collect`` ``i`` ends and waits there for a :class:`Ticket`; ``update`` ``i``
likewise waits for each sampler's rollout. A producer writes its output into the box (a file on
``/dev/shm``) and wakes the waiting tasks, each through a FIFO of its thread (about half a
millisecond). Only the driver's messages still go through Dask.

A box is a directory ``/dev/shm/dagrl-mb-<hex>`` holding a file ``v-<seq>`` per posting (the pickled
value or the producer's error; a producer's next posting removes its previous one), ``aborted`` (the
highest sequence number the driver gave up on), a FIFO ``w-<pid>-<thread>`` per waiting thread and a
marker ``p-<pid>`` per posting process. :func:`sweep` removes the files of processes that are gone (and, at
a run's end, a process's own), and the directory once nothing of a live process is left.

The mailbox is an optimisation, never a requirement: the executor uses it only for a consumer on the
producer's host, on a worker of its own (a task waiting there blocks nothing else), and a waiting task
gives up when the driver aborts its sequence number (the iteration was cancelled) or after its timeout.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import select
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

from distributed.metrics import context_meter

from dagrl.runtime.shm import DIR, alive, entries, room

__all__ = [
    "Aborted", "Late", "NotPosted", "Ticket", "Upstream", "abort", "exists", "post", "post_error", "sweep", "take",
]  # fmt: skip

PREFIX = "dagrl-mb-"
POLL_S = 0.1
"""A waiting task also looks at the box this often (a missed wake-up, an abort, its timeout)."""
STATS: dict[str, int] = {"posted": 0, "taken": 0, "bytes": 0}
"""What this process did: values posted (and their bytes), tickets answered."""


@dataclass(frozen=True)
class Ticket:
    """What a consumer task receives instead of a producer's future: wait for posting ``seq`` of ``box``."""

    box: str
    seq: int
    producer: str
    """The producer's task key (for the error a consumer raises when the producer failed)."""
    timeout_s: float


class Upstream(RuntimeError):
    """The producer of a ticket's value raised; the executor blames the producer, not this consumer."""

    def __init__(self, producer: str, message: str):
        super().__init__(f"{producer} failed: {message}")
        self.producer, self.message = producer, message

    def __reduce__(self) -> tuple:
        return type(self), (self.producer, self.message)


class Late(TimeoutError):
    """No value came from the ticket's producer within the ticket's timeout, which is the run's
    ``hang_timeout_s``: the executor blames the producer if it is still running (it is the hung one)."""

    def __init__(self, producer: str, timeout_s: float):
        super().__init__(f"no value from {producer} in {timeout_s:g} s")
        self.producer, self.timeout_s = producer, timeout_s

    def __reduce__(self) -> tuple:
        return type(self), (self.producer, self.timeout_s)


class NotPosted(LookupError):
    """The producer had no room on ``/dev/shm`` for its value: fetch its output through Dask."""


class Aborted(RuntimeError):
    """The driver gave up on the ticket's iteration (it was cancelled); the task's result is unused."""


def _dir(box: str) -> str:
    return os.path.join(DIR, box)


def _own_dir(path: str) -> None:
    """Make ``path`` (mode 0700), or check that the one there is this user's and no one else's: a box's
    files are unpickled, so one another user made (or can write into) is refused, never used."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"{path}: not a directory of this user's own (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); "
            "a mailbox another user can write into is never read"
        )


def _mark(box: str, kind: str, suffix: str = "") -> str:
    """Create the box if needed and this process's ``kind`` marker in it (``p``, or ``w``: a FIFO)."""
    path = os.path.join(_dir(box), f"{kind}-{os.getpid()}{suffix}")
    if not os.path.exists(path):
        _own_dir(_dir(box))
        if kind == "w":
            os.mkfifo(path)
        else:
            open(path, "wb").close()
    return path


def _write(box: str, name: str, *parts: Any) -> None:
    """Replace file ``name`` of the box at once: a reader opens the old contents or the new, whole."""
    path = os.path.join(_dir(box), name)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part)
    os.replace(tmp, path)


def _wake(box: str) -> None:
    """A byte into every waiting thread's FIFO (one with no reader open, or full, is skipped)."""
    with contextlib.suppress(OSError):
        names = [n for n in os.listdir(_dir(box)) if n.startswith("w-")]
        for name in names:
            try:
                fd = os.open(os.path.join(_dir(box), name), os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            with contextlib.suppress(OSError):
                os.write(fd, b"!")
            os.close(fd)


_POSTED: dict[tuple[str, str], int] = {}
"""(box, producer) -> that producer's last posting in the box: removed when the same producer posts
there again. Keyed by producer, not by process: a process may hold several role replicas (a learner
replica beside a sampler under ``dp-learners``), and one's posting must not remove another's that a
consumer has yet to read."""


ALIGN = 64


def _post(box: str, seq: int, producer: str, *parts: Any) -> None:
    """Write posting ``seq`` and wake the waiters; drop ``producer``'s previous posting in ``box``.

    A producer posts again only in a later iteration, which starts after every consumer of its
    previous posting ended (each iteration's calls wait for the previous one's on their role); a
    consumer still holding arrays of it keeps its mapping, which outlives the file."""
    _mark(box, "p")
    _write(box, f"v-{seq}", *parts)
    previous = _POSTED.get((box, producer))
    _POSTED[(box, producer)] = seq
    if previous is not None and previous != seq:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(_dir(box), f"v-{previous}"))
    _wake(box)


def post(box: str, seq: int, value: Any, *, producer: str) -> None:
    """Make ``value`` posting ``seq`` of ``box`` and wake its waiters (the producer's task, on its worker).
    ``producer`` names who posts (a role replica's fragment): its next posting in ``box`` replaces this one.

    Arrays travel out of band (pickle protocol 5): the file holds the pickle, then each array's bytes
    at an aligned offset, so a reader maps the file and gets arrays that are views of it (one copy in
    all, the writer's). Without room on ``/dev/shm`` the posting says so, and the waiters fetch the
    value through Dask instead (:class:`NotPosted`)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = [r.nbytes for r in raws]
    if not room(len(head) + sum(sizes)):
        _post(box, seq, producer, b"d")
        return
    meta = len(head).to_bytes(8, "little") + len(sizes).to_bytes(8, "little")
    meta += b"".join(n.to_bytes(8, "little") for n in sizes)
    parts: list[Any] = [b"v", meta, head]
    at = 1 + len(meta) + len(head)
    for raw in raws:
        pad = -at % ALIGN
        parts += [bytes(pad), raw]
        at += pad + raw.nbytes
    _post(box, seq, producer, *parts)
    STATS["posted"] += 1
    STATS["bytes"] += at


def post_error(box: str, seq: int, err: BaseException, *, producer: str) -> None:
    """The producer of posting ``seq`` raised ``err``: its waiters raise :class:`Upstream`."""
    _post(box, seq, producer, b"e" + f"{type(err).__name__}: {err}".encode())


def exists(box: str) -> bool:
    """Whether ``box`` is on this host (its directory in ``/dev/shm``)."""
    return os.path.isdir(_dir(box))


def abort(box: str, seq: int) -> None:
    """Give up on postings up to ``seq`` (an iteration cancelled): their waiters raise :class:`Aborted`.
    Run where the box is: by the driver on the consumers' host, else on their workers (``Client.run``)."""
    if not exists(box):
        return
    if _aborted(box) < seq:
        _write(box, "aborted", seq.to_bytes(8, "little"))
    _wake(box)


def _aborted(box: str) -> int:
    try:
        with open(os.path.join(_dir(box), "aborted"), "rb") as f:
            return int.from_bytes(f.read(8), "little")
    except (FileNotFoundError, ValueError):
        return 0


_FIFOS: dict[tuple[str, int], int] = {}
_FIFOS_LOCK = threading.Lock()


def _fifo(box: str) -> int:
    """This thread's FIFO in ``box`` (a wake-up is one byte, which one reader drains), open for
    reading; also open for writing, so that a waker closing its end never leaves it at end-of-file
    (which would make every wait return at once)."""
    key = (box, threading.get_ident())
    with _FIFOS_LOCK:
        fd = _FIFOS.get(key)
        if fd is None:
            fd = _FIFOS[key] = os.open(_mark(box, "w", f"-{key[1]}"), os.O_RDWR | os.O_NONBLOCK)
        return fd


def _read(box: str, seq: int) -> mmap.mmap | None:
    """Posting ``seq``, mapped copy-on-write (arrays read from it are writable, the file untouched),
    if the box holds it now."""
    try:
        with open(os.path.join(_dir(box), f"v-{seq}"), "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        return None


def _load(mm: mmap.mmap) -> Any:
    """The value of a ``v`` posting: its pickle, with the arrays as views of the mapping."""
    view = memoryview(mm)
    head_len, count = int.from_bytes(view[1:9], "little"), int.from_bytes(view[9:17], "little")
    sizes = [int.from_bytes(view[17 + 8 * i : 25 + 8 * i], "little") for i in range(count)]
    at = 17 + 8 * count
    head = view[at : at + head_len]
    at += head_len
    buffers = []
    for n in sizes:
        at += -at % ALIGN
        buffers.append(view[at : at + n])
        at += n
    return pickle.loads(head, buffers=buffers)


def take(ticket: Ticket) -> Any:
    """The value posted under ``ticket`` (waiting for it); :class:`Upstream` if its producer raised,
    :class:`NotPosted` if it had no room, :class:`Aborted` if the driver gave up on it,
    :class:`Late` after ``ticket.timeout_s``.

    Inside a Dask task the wait and the read are metered apart (``mailbox-wait``, ``mailbox-read``):
    the dashboard's Fine Performance Metrics then show them for the task's prefix, and they leave
    its ``thread-noncpu`` and ``thread-cpu`` (the Task Stream's bar still spans the whole task)."""
    with context_meter.meter("mailbox-wait"):
        mm = _wait(ticket)
    kind = mm[:1]
    if kind == b"e":
        raise Upstream(ticket.producer, mm[1:].decode(errors="replace"))
    if kind == b"d":
        raise NotPosted(ticket.producer)
    STATS["taken"] += 1
    with context_meter.meter("mailbox-read"):
        return _load(mm)


def _wait(ticket: Ticket) -> mmap.mmap:
    """The posting of ``ticket``, mapped, once it is there; raises on an abort or at the timeout."""
    fd = _fifo(ticket.box)  # before the first look: a posting after it wakes us
    deadline = time.monotonic() + ticket.timeout_s
    while True:
        mm = _read(ticket.box, ticket.seq)
        if mm is not None:
            return mm
        if _aborted(ticket.box) >= ticket.seq:
            raise Aborted(f"{ticket.producer}: its iteration was cancelled")
        left = deadline - time.monotonic()
        if left <= 0:
            raise Late(ticket.producer, ticket.timeout_s)
        select.select([fd], [], [], min(POLL_S, left))
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 4096)


def sweep(own: bool = False) -> int:
    """Remove the markers and FIFOs of processes that are gone (with ``own``: this process's too) and
    every box left without a live process's; how many boxes were removed."""
    if own:
        with _FIFOS_LOCK:
            for fd in _FIFOS.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            _FIFOS.clear()
    removed = 0
    for box in entries(PREFIX):
        try:
            names = os.listdir(_dir(box))
        except OSError:
            continue
        live = False
        for name in names:
            kind, _, rest = name.partition("-")
            pid = rest.split("-")[0]
            if kind not in ("p", "w") or not pid.isdigit():
                continue
            if (own and int(pid) == os.getpid()) or not alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(_dir(box), name))
            else:
                live = True
        if not live:
            with contextlib.suppress(OSError):
                for name in os.listdir(_dir(box)):
                    os.unlink(os.path.join(_dir(box), name))
                os.rmdir(_dir(box))
                removed += 1
    return removed
