"""Central batched inference (SEED RL's shape): samplers step envs, one role picks every action.

Three parts:

* :class:`Batcher` (no I/O): requests queue; one forward pass answers a batch as soon as every
  sampler has asked (``expected``) or ``max_wait_s`` after the first request, whichever comes first.
  The forward runs under the inference host's lock, so a weights load never lands mid-batch.
* :class:`BatchServer`, in the ``inference`` role's host: a TCP socket on the worker's address and
  one thread that reads requests from every sampler's connection (``selectors``), runs the batcher
  and writes the answers. Neither the worker's event loop nor the scheduler sees a step.
* :class:`InferenceClient`, what a sampler's :meth:`dagrl.core.context.RoleContext.acting` returns: one
  request per env step on a connection of its own to that socket (never the driver).

Why not an actor call per step: through Dask (the sampler's thread handing the call to its worker's
event loop, Dask's messages both ways, the inference worker's loop) a step's round trip took 3.2 ms
median on a 2-core machine, against ~0.1 ms for a small network's own forward (BENCHMARKS.md);
a plain socket carries the same request in tens of microseconds. A frame is a 4-byte length, then
arrays as dtype, shape and raw bytes (:func:`encode`; never a pickle), or an error's text. A
connection first sends the server's random token (:data:`TOKEN_BYTES`), which only the policy hands
out: anyone else who reaches the port is dropped.

Where the cluster's own comms speak TLS (a ``tls://`` worker address: SLURM's ``tls: true``, or a
scheduler started with TLS), so does this socket, with the worker's own certificates
(:func:`worker_tls`): both ends verify each other against the cluster's CA, and the endpoint says so,
so a sampler never sends observations or the token in the clear to a role that expects TLS.

Numbers the policy reports each iteration (``inference/*`` metrics): rows per forward, requests per
forward, time a request waits in the queue, forward time, the share of wall time spent in forwards
(utilisation) and, from the samplers, the round trip of one step.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import secrets
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BatchServer", "Batcher", "InferenceClient", "InferenceError", "InferenceUnavailable"]

HEADER = struct.Struct("!I")
TOKEN_BYTES = 16
HANDSHAKE_S = 10.0
"""How long the server waits for a connection's TLS handshake before dropping it."""
Endpoint = tuple[str, int, str, bool]
"""Host, port, the hex token a connection opens with, and whether the socket speaks TLS."""


def worker_tls(server: bool) -> ssl.SSLContext | None:
    """The TLS context of this process's Dask worker when its cluster speaks TLS, else ``None``:
    the one Dask itself uses for worker-to-worker comms (``server``: to listen; else to connect)."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except ValueError:  # not in a worker
        return None
    if not str(worker.address).startswith("tls://"):
        return None
    security = worker.security
    args = security.get_listen_args("worker") if server else security.get_connection_args("worker")
    return args.get("ssl_context")


class InferenceUnavailable(RuntimeError):
    """A sampler could not reach the inference role (its worker died, or it did not answer in time)."""


def encode(answer: tuple[np.ndarray, ...] | BaseException) -> bytes:
    """One frame: arrays as dtype, shape and raw bytes (never a pickle: a frame from anyone who
    reaches the socket is only ever data), or an error's text."""
    if isinstance(answer, BaseException):
        body = b"\x01" + f"{type(answer).__name__}: {answer}".encode()
    else:
        parts = [b"\x00", struct.pack("!B", len(answer))]
        for a in answer:
            a = np.ascontiguousarray(a)
            dtype = a.dtype.str.encode()
            parts += [struct.pack("!BB", len(dtype), a.ndim), dtype, struct.pack(f"!{a.ndim}Q", *a.shape), a.data]
        body = b"".join(parts)
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> tuple[np.ndarray, ...] | str:
    """The arrays of a frame (copies), or the text of an error frame."""
    if body[:1] == b"\x01":
        return body[1:].decode(errors="replace")
    (arrays,) = struct.unpack_from("!B", body, 1)
    at, out = 2, []
    for _ in range(arrays):
        n, ndim = struct.unpack_from("!BB", body, at)
        dtype = np.dtype(body[at + 2 : at + 2 + n].decode())
        if dtype.hasobject:
            raise ValueError("object arrays are not accepted")
        at += 2 + n
        shape = struct.unpack_from(f"!{ndim}Q", body, at)
        at += 8 * ndim
        items = int(np.prod(shape, dtype=np.int64))
        out.append(np.frombuffer(body, dtype, count=items, offset=at).reshape(shape).copy())
        size = items * dtype.itemsize
        at += size
    return tuple(out)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the inference role closed the connection")
        got += k
    return bytes(buf)


class InferenceError(RuntimeError):
    """The inference role's forward raised; the message is its exception's type and text."""


class InferenceClient:
    """A sampler's connection to the inference role; ``attach`` points it at the role's socket (again
    after a replacement: the next step connects there)."""

    def __init__(self, owner: str, timeout_s: float = 60.0, tls: ssl.SSLContext | None = None):
        self.owner, self.timeout_s = owner, timeout_s
        self.tls = tls
        """The context for a TLS endpoint; ``None``: this process's Dask worker's (:func:`worker_tls`)."""
        self.endpoint: Endpoint | None = None
        self._sock: socket.socket | None = None
        self._connected_to: Endpoint | None = None
        self._calls, self._wait_s = 0, 0.0
        self._sent: collections.deque[float] = collections.deque()
        """When each request still waiting for its answer was sent, oldest first."""

    def attach(self, endpoint: Endpoint) -> None:
        self.endpoint = (str(endpoint[0]), int(endpoint[1]), str(endpoint[2]), bool(endpoint[3]))

    def _connection(self) -> socket.socket:
        if self.endpoint is None:
            raise InferenceUnavailable(f"{self.owner}: no inference role attached (policy central-inference)")
        if self._sock is None or self._connected_to != self.endpoint:
            self._close()
            host, port, token, tls = self.endpoint
            context = (self.tls or worker_tls(server=False)) if tls else None
            if tls and context is None:
                raise InferenceError(
                    f"{self.owner}: the inference role at {host}:{port} speaks TLS, but this process has no TLS "
                    "context (it is not a worker of a TLS cluster)"
                )
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock = context.wrap_socket(sock)
            sock.sendall(bytes.fromhex(token))
            self._sock, self._connected_to = sock, self.endpoint
        return self._sock

    def close(self) -> None:
        """Close the connection (the role state is ending); a later call would connect again."""
        self._close()

    def _close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = self._connected_to = None

    def __call__(self, obs: np.ndarray, *extra: np.ndarray) -> tuple[np.ndarray, ...]:
        """The inference role's answer for ``obs`` (and any ``extra`` arrays of the same first axis the
        role's acting object takes, as a recurrent policy's state)."""
        self.send(obs, *extra)
        return self.receive()

    def send(self, obs: np.ndarray, *extra: np.ndarray) -> None:
        """Ask for the answer to ``obs`` without waiting for it: :meth:`receive` gives the answers in the
        order asked (a double-buffered sampler steps one group of envs while the other's request is out:
        :mod:`dagrl.envs.double_buffer`; the role answers a connection's requests in order)."""
        with self._unreachable():
            self._connection().sendall(encode((obs, *extra)))
        self._sent.append(time.perf_counter())

    def receive(self) -> tuple[np.ndarray, ...]:
        """The answer to the oldest request :meth:`send` made that has none yet."""
        if not self._sent:
            raise InferenceError(f"{self.owner}: nothing was asked of the inference role")
        sent = self._sent.popleft()
        with self._unreachable():
            if self._sock is None:
                raise ConnectionError("the connection closed before the answer came")
            sock = self._sock
            (n,) = HEADER.unpack(_recv_exactly(sock, HEADER.size))
            reply = decode(_recv_exactly(sock, n))
        if isinstance(reply, str):
            raise InferenceError(f"the inference role's forward raised {reply}")
        self._calls += 1
        self._wait_s += time.perf_counter() - sent
        return reply

    @contextlib.contextmanager
    def _unreachable(self) -> Any:
        """An ``OSError`` inside (refused, reset, closed, timed out) becomes :class:`InferenceUnavailable`,
        the connection dropped (the next request connects again)."""
        try:
            yield
        except OSError as err:
            self._close()
            self._sent.clear()
            where = None if self.endpoint is None else self.endpoint[:2]
            raise InferenceUnavailable(
                f"{self.owner} could not reach the inference role at {where}: {type(err).__name__}: {err}"
            ) from None

    def load(self, weights: Any) -> None:
        """Nothing: the inference role receives the learner's weights itself."""

    def stats(self) -> tuple[int, float]:
        """Calls and seconds spent in them since the last time asked."""
        out = (self._calls, self._wait_s)
        self._calls, self._wait_s = 0, 0.0
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sock": None, "_connected_to": None, "tls": None, "_sent": collections.deque()}


Reply = Callable[[Any], None]
"""Hands one request its answer: a tuple of arrays, or the exception the forward raised."""


class Batcher:
    """Batches requests for ``forward`` (the inference role's acting object, run under ``lock``)."""

    def __init__(self, forward: Any, lock: threading.RLock, expected: int, max_wait_s: float):
        self.forward, self.lock = forward, lock
        self.expected, self.max_wait_s = max(1, expected), max_wait_s
        self.pending: list[tuple[tuple[np.ndarray, ...], Reply, float]] = []
        self.counting = threading.Lock()  # the server's thread counts, the host's actor thread reads
        self._reset_stats()

    def add(self, request: np.ndarray | tuple[np.ndarray, ...], reply: Reply) -> None:
        """Queue one sampler's observations (or a tuple: the observations, then the other arrays the
        acting object takes, each stacked on the same first axis); a full batch is answered at once."""
        request = request if isinstance(request, tuple) else (request,)
        self.pending.append((request, reply, time.perf_counter()))
        if len(self.pending) >= self.expected:
            self.flush()

    def wait_s(self) -> float | None:
        """Seconds until the queued requests are answered anyway (``None``: nothing queued)."""
        if not self.pending:
            return None
        return max(0.0, self.pending[0][2] + self.max_wait_s - time.perf_counter())

    def flush(self) -> None:
        batch, self.pending = self.pending, []
        if not batch:
            return
        start = time.perf_counter()
        try:
            if len({len(b[0]) for b in batch}) > 1:
                raise ValueError(f"requests of {sorted({len(b[0]) for b in batch})} arrays in one batch")
            inputs = [np.concatenate(arrays) for arrays in zip(*(b[0] for b in batch), strict=True)]
            with self.lock:
                outs = self.forward(*inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
        except Exception as err:
            for _, reply, _ in batch:
                reply(err)
            return
        with self.counting:
            self.busy_s += time.perf_counter() - start
            self.batches += 1
            self.rows += len(inputs[0])
            self.requests += len(batch)
            self.queued_s += sum(start - t for _, _, t in batch)
        at = 0
        for request, reply, _ in batch:
            n = len(request[0])
            reply(tuple(np.ascontiguousarray(o[at : at + n]) for o in outs))
            at += n

    def _reset_stats(self) -> None:
        self.since = time.perf_counter()
        self.batches = self.rows = self.requests = 0
        self.busy_s = self.queued_s = 0.0

    def stats(self) -> dict[str, float]:
        """``inference/*`` metrics since the last call (then reset)."""
        with self.counting:
            wall = max(time.perf_counter() - self.since, 1e-9)
            n = max(self.batches, 1)
            out = {
                "inference/forwards": float(self.batches),
                "inference/batch_rows": self.rows / n,
                "inference/batch_requests": self.requests / n,
                "inference/queue_ms": 1e3 * self.queued_s / max(self.requests, 1),
                "inference/forward_ms": 1e3 * self.busy_s / n,
                "inference/utilisation": self.busy_s / wall,
            }
            self._reset_stats()
        return out


class BatchServer:
    """A TCP socket on ``host`` answered by one thread running ``batcher``; ``endpoint`` is its address.

    Each connection carries one sampler's requests, answered in the order they came (a sampler has
    one out at a time, or one per group of its envs when it double-buffers).
    A connection that closes (a sampler replaced) is dropped; a request it left queued is answered
    into the void. :meth:`close` stops the thread and closes every socket. With ``tls`` every
    connection is TLS: its handshake runs without blocking the thread (one that does not finish in
    :data:`HANDSHAKE_S` is dropped), then it is served like a plain one.
    """

    def __init__(self, batcher: Batcher, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None):
        self.batcher, self.tls = batcher, tls
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.listener = socket.create_server((host, 0))
        self.listener.setblocking(False)
        self.endpoint: Endpoint = (host, self.listener.getsockname()[1], self.token.hex(), tls is not None)
        self.opened: set[socket.socket] = set()  # connections that sent the token
        self.handshaking: dict[ssl.SSLSocket, float] = {}  # TLS connections not yet through, by deadline
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.buffers: dict[socket.socket, bytearray] = {}
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="dagrl-inference", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while not self.closed.is_set():
                wait = self.batcher.wait_s()
                for key, _ in self.selector.select(0.5 if wait is None else wait):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj in self.handshaking:
                        self._handshake(key.fileobj)
                    else:
                        self._read(key.fileobj)
                if (wait := self.batcher.wait_s()) is not None and wait <= 0:
                    self.batcher.flush()
                now = time.monotonic()
                for conn in [c for c, deadline in self.handshaking.items() if deadline < now]:
                    self._drop(conn)
        except OSError:
            if not self.closed.is_set():
                raise
        finally:
            self._close_all()

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _ = self.listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                conn.setblocking(False)
                conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                self.handshaking[conn] = time.monotonic() + HANDSHAKE_S
            else:
                conn.setblocking(True)
            self.buffers[conn] = bytearray()
            self.selector.register(conn, selectors.EVENT_READ)

    def _handshake(self, conn: ssl.SSLSocket) -> None:
        try:
            conn.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return  # more of it to come
        except OSError:  # not a peer with this cluster's certificate
            self._drop(conn)
            return
        del self.handshaking[conn]
        conn.setblocking(True)

    def _read(self, conn: Any) -> None:
        try:
            data = conn.recv(1 << 20)
            while isinstance(conn, ssl.SSLSocket) and conn.pending():  # decrypted bytes select cannot see
                data += conn.recv(conn.pending())
        except OSError:
            data = b""
        if not data:  # the sampler went away
            self._drop(conn)
            return
        buf = self.buffers[conn]
        buf += data
        if conn not in self.opened:
            if len(buf) < TOKEN_BYTES:
                return
            if not hmac.compare_digest(bytes(buf[:TOKEN_BYTES]), self.token):
                self._drop(conn)  # not one of this run's samplers
                return
            del buf[:TOKEN_BYTES]
            self.opened.add(conn)
        while len(buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(buf)
            if len(buf) < HEADER.size + n:
                break
            try:
                request = decode(bytes(buf[HEADER.size : HEADER.size + n]))
                if isinstance(request, str) or not request:
                    raise ValueError("no arrays")
            except (ValueError, TypeError, struct.error):
                self._drop(conn)  # not a frame a sampler sends
                return
            del buf[: HEADER.size + n]
            self.batcher.add(request, self._replier(conn))

    def _replier(self, conn: socket.socket) -> Reply:
        def reply(answer: Any) -> None:
            with contextlib.suppress(OSError):  # the sampler went away meanwhile
                conn.sendall(encode(answer))

        return reply

    def _drop(self, conn: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        self.buffers.pop(conn, None)
        self.opened.discard(conn)
        self.handshaking.pop(conn, None)
        with contextlib.suppress(OSError):
            conn.close()

    def _close_all(self) -> None:
        for conn in list(self.buffers):
            self._drop(conn)
        with contextlib.suppress(OSError):
            self.listener.close()
        self.selector.close()

    def close(self) -> None:
        self.closed.set()
        self.thread.join(timeout=5.0)
