"""The data plane's server side (:class:`FrameServer`): a thread per connection reads its
calls and answers each with the handler, now or later (:meth:`FrameContext.defer`).

A server authenticates before it allocates: the meta (with the caller's token) comes before
the parts, and is checked before a byte of them is read. Its receive buffer grows with the
bytes that arrived, never with what a header declares, and all frames still arriving share one
budget (:class:`~edgesplit.transport.limits.PendingBudget`); a connection silent between calls,
or slow within one, is closed (:class:`~edgesplit.transport.limits.ConnectionLimits`).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from edgesplit.transport.auth import AuthThrottle, sent_bearer
from edgesplit.transport.frames.codec import (
    _IOV_MAX,
    CALL,
    Buffer,
    Frame,
    FrameRefused,
    FrameTooLarge,
    _buffers,
    _Closed,
    _Inbox,
    _send_rest,
    failure,
    read_frame,
    write_frame,
)
from edgesplit.transport.frames.sockets import _close, _context
from edgesplit.transport.limits import ConnectionLimits, PendingBudget
from edgesplit.transport.loopback import LoopbackContext
from edgesplit.transport.tls import TlsFiles

__all__ = ["DEFERRED", "IDLE_S", "FrameContext", "FrameServer", "Handler"]

IDLE_S = 300.0  # a server closes a connection that sends nothing for this long


class FrameContext(LoopbackContext):
    """gRPC's ``ServicerContext`` for a call that came in as a frame: metadata, the caller's
    deadline, and whether the caller is still there (its connection still open). A handler
    may answer later, from another thread (:meth:`defer`)."""

    def __init__(self, sock: socket.socket, metadata: Sequence[tuple[str, str]],
                 timeout: float | None, server: FrameServer | None = None,
                 inbox: _Inbox | None = None) -> None:
        super().__init__(metadata, timeout)
        self._sock = sock
        self._arrived = time.monotonic()
        self._server, self._inbox = server, inbox

    def defer(self) -> Callable[[Frame], None] | None:
        """How to answer this call later: a handler that returns :data:`DEFERRED` must call
        the function this gives once, from any thread, with the answer; it writes it (without
        waiting on a caller slow to read it) and ends the call. The connection reads its next
        frame meanwhile, so whatever the answer needs must not be a view of the frame's
        parts. None where the call cannot be answered later (no server, or TLS: no
        non-blocking write); asking commits to nothing."""
        server, inbox = self._server, self._inbox
        if server is None or inbox is None or isinstance(self._sock, ssl.SSLSocket):
            return None
        return lambda answer: server._answer_later(self._sock, inbox, answer, self)

    def is_active(self) -> bool:
        if not super().is_active():
            return False
        # a call answered as soon as it arrived has a caller waiting: peek only for one that
        # waited (for a worker, a batch, the next hop), which its caller may have given up on
        return time.monotonic() - self._arrived < 1e-3 or not _peer_closed(self._sock)

    @property
    def connection(self) -> socket.socket:
        """The caller's connection: a middle hop watches it while it waits on the next hop,
        to cancel that call when the caller hangs up (gRPC cancels its own)."""
        return self._sock

    def peer(self) -> str:
        try:
            host, port = self._sock.getpeername()[:2]
        except OSError:
            return "gone"
        return f"tcp:{host}:{port}"


DEFERRED = Frame(0, 0)  # a handler's answer when FrameContext.defer() answers later


def _peer_closed(sock: socket.socket) -> bool:
    """True when the caller hung up (a clean close reads as zero bytes): one non-blocking peek."""
    if isinstance(sock, ssl.SSLSocket):
        return False  # a TLS peek would read a record: the deadline still bounds the work
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


Handler = Callable[[Frame, FrameContext], Frame]
_MALFORMED_CALL = "malformed call frame (kind, metadata or timeout)"


class _Gate:
    """What one server connection checks of a frame between its meta and its parts: a call,
    well-formed metadata carrying the token (failures throttled: :class:`AuthThrottle`), and
    how long its parts may take. The memory its frames hold in growing is taken from ``budget``."""

    def __init__(self, server: FrameServer, host: str) -> None:
        self.token, self.throttle, self.host = server.token, server.throttle, host
        self.limits, self.budget = server.limits, server.budget
        self.passed: dict[str, Any] | None = None  # the last meta let in (a repeated one is
        #                                             the same object: checked once)
        self.longer = 0.0  # how much longer than frame_s its calls' parts may take

    def wait_s(self) -> float:
        """How long the connection may wait for its next frame's first byte."""
        limits = self.limits
        return limits.idle_s if self.passed is not None else min(limits.hello_s, limits.idle_s)

    def frame_s(self) -> float:
        """How long its next frame's header and meta may take from their first byte."""
        limits = self.limits
        return limits.frame_s if self.passed is not None else min(limits.hello_s,
                                                                  limits.frame_s)

    def admit(self, kind: int, meta: dict[str, Any], deadline: float | None) -> float | None:
        """The deadline for the frame's parts, or FrameRefused: its meta is checked first."""
        if meta is not self.passed or kind != CALL:
            self._check(kind, meta)
            self.passed, self.longer = meta, self._longer(meta)
        return deadline + self.longer if deadline is not None else None

    def _longer(self, meta: dict[str, Any]) -> float:
        """A call that may take longer than ``frame_s`` (a large message on a slow link) may
        send its parts for as long as its own timeout, up to ``idle_s``."""
        timeout, frame_s = meta.get("timeout_s"), self.limits.frame_s
        if not isinstance(timeout, int | float) or not timeout > frame_s:
            return 0.0
        return min(float(timeout), self.limits.idle_s) - frame_s

    def _check(self, kind: int, meta: dict[str, Any]) -> None:
        metadata = meta.get("metadata", [])
        if kind != CALL or not _pairs(metadata):
            raise FrameRefused(grpc.StatusCode.INVALID_ARGUMENT, _MALFORMED_CALL)
        if self.token is None:
            return
        why = self.throttle.check(self.host, sent_bearer([(k, v) for k, v in metadata]),
                                  f"Bearer {self.token}")
        if why is not None:
            raise FrameRefused(grpc.StatusCode.UNAUTHENTICATED, why)


class FrameServer:
    """Accepts connections and answers each one's calls in its own thread with ``handler``
    (which may raise nothing: it turns failures into FAILED frames itself). At most
    ``max_connections`` connections at once; more are answered RESOURCE_EXHAUSTED.

    With ``token``, a frame's meta must carry it (``authorization: Bearer ...``) before a byte
    of its parts is read; failed checks are throttled per peer host and token bucket
    (``throttle``, shared with the gRPC server's). ``limits`` bound how long a connection may
    be silent or slow and the memory frames still arriving hold together (``budget``)."""

    def __init__(self, handler: Handler, limit: int, tls: TlsFiles | None = None,
                 max_connections: int = 256, *, token: str | None = None,
                 limits: ConnectionLimits | None = None,
                 throttle: AuthThrottle | None = None) -> None:
        self.handler, self.limit, self.max_connections = handler, limit, max_connections
        self.token = token
        # read when built: IDLE_S may be changed (as a test does) before a server starts
        self.limits = limits if limits is not None else ConnectionLimits(idle_s=IDLE_S)
        self.throttle = throttle if throttle is not None else AuthThrottle()
        self.budget = PendingBudget(self.limits.budget_bytes(limit))
        self._ssl = _server_context(tls)
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._busy = 0  # calls being answered, for a graceful stop
        self._idle = threading.Condition(self._lock)
        self._stopping = False
        self.port: int | None = None

    def start(self, host: str, port: int = 0) -> int:
        listener = socket.create_server((host, port), reuse_port=False, backlog=128)
        self._listener, self.port = listener, listener.getsockname()[1]
        threading.Thread(target=self._accept, name="edgesplit-data-accept", daemon=True).start()
        return self.port

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new calls, wait up to ``grace_s`` for the calls being answered, close."""
        with self._lock:
            self._stopping = True
            listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):  # wakes the accepting thread (close does not)
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        deadline = time.monotonic() + grace_s
        with self._idle:
            while self._busy and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
            conns = list(self._conns)
        for conn in conns:
            _close(conn)

    def _accept(self) -> None:
        while True:
            listener = self._listener
            if listener is None:
                return
            try:
                conn, peer = listener.accept()
            except OSError:
                return  # closed by stop()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                stopping = self._stopping
                full = len(self._conns) >= self.max_connections or stopping
                if not full:
                    self._conns.add(conn)
            if full:
                self._refuse(conn, stopping)
                continue
            threading.Thread(target=self._serve, args=(conn, str(peer[0])),
                             name="edgesplit-data-conn", daemon=True).start()

    def _refuse(self, conn: socket.socket, stopping: bool) -> None:
        answer = failure(0, grpc.StatusCode.UNAVAILABLE, "the server is shutting down",
                         unserved=True) if stopping else \
            failure(0, grpc.StatusCode.RESOURCE_EXHAUSTED, f"the server holds "
                    f"{self.max_connections} data-plane connections already: try again later",
                    unserved=True)
        try:
            conn.settimeout(1.0)
            write_frame(conn, answer)
        except OSError:
            pass
        _close(conn)

    def _serve(self, raw: socket.socket, host: str = "") -> None:
        inbox, conn, gate = _Inbox(), raw, _Gate(self, host)
        limits = self.limits
        try:
            if self._ssl is not None:
                raw.settimeout(limits.hello_s)  # the handshake must not hold a thread long
                conn = self._ssl.wrap_socket(raw, server_side=True)
            # a new connection must authenticate soon; one silent for idle_s between calls
            # is closed: neither can pin the max_connections threads for long
            inbox.bound_to(conn, gate.wait_s())
            while self._answer(conn, inbox, gate):
                if inbox.bound != limits.idle_s:  # not authenticated yet, or a slow frame
                    inbox.bound_to(conn, gate.wait_s())
        except (OSError, ssl.SSLError):
            pass  # the peer went away, fell silent or spoke something else: nobody to tell
        finally:
            with self._lock:
                self._conns.discard(raw)
            _close(conn)

    def _answer(self, conn: socket.socket, inbox: _Inbox, gate: _Gate | None = None) -> bool:
        """Read one call and answer it; False when the connection is done."""
        try:
            frame = read_frame(conn, inbox, self.limit, gate=gate)
        except _Closed:
            return False
        except FrameRefused as exc:  # the parts are unread: the connection cannot go on
            _refuse(conn, failure(0, exc.code, str(exc), exc.unserved), self.limit,
                    inbox.writing)
            return False
        except FrameTooLarge as exc:  # the body is unread: the connection cannot go on
            _refuse(conn, failure(0, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)), self.limit,
                    inbox.writing)
            return False
        except ValueError as exc:
            _refuse(conn, failure(0, grpc.StatusCode.INVALID_ARGUMENT, str(exc)), self.limit,
                    inbox.writing)
            return False
        with self._lock:
            stopping = self._stopping
            if not stopping:
                self._busy += 1
        if stopping:
            with inbox.writing:
                write_frame(conn, failure(frame.request_id, grpc.StatusCode.UNAVAILABLE,
                                          "the server is shutting down"))
            return False
        deferred = False
        try:
            reply = self._handle(conn, frame, inbox)
            deferred = reply is DEFERRED
        finally:
            if not deferred:
                self._call_done()
        if not deferred:
            with inbox.writing:  # a deferred answer may be written meanwhile
                write_frame(conn, reply)
        return True

    def _call_done(self) -> None:
        with self._lock:  # the condition's own lock, taken directly (the hot path)
            self._busy -= 1
            if self._stopping:  # only stop() waits on it
                self._idle.notify_all()

    def _answer_later(self, conn: socket.socket, inbox: _Inbox, answer: Frame,
                      context: FrameContext) -> None:
        """Write a deferred call's answer and end the call. The calling thread (a batch
        worker, which other calls wait on) writes what the kernel takes at once; a caller too
        slow to take the rest gets it from a thread of its own."""
        buffers, total = _buffers(answer)
        inbox.writing.acquire()
        try:
            try:
                sent = conn.sendmsg(buffers[:_IOV_MAX], [], socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
        except OSError:
            sent = total  # the caller hung up meanwhile: nobody to tell
        if sent >= total:
            self._answered_later(inbox, context)
            return
        threading.Thread(target=self._send_rest_later, name="edgesplit-data-answer",
                         args=(conn, inbox, buffers, sent, context), daemon=True).start()

    def _send_rest_later(self, conn: socket.socket, inbox: _Inbox, buffers: list[Buffer],
                         sent: int, context: FrameContext) -> None:
        try:
            _send_rest(conn, buffers, sent)
        except OSError:
            pass  # the caller hung up, or read nothing for IDLE_S: nobody to tell
        finally:
            self._answered_later(inbox, context)

    def _answered_later(self, inbox: _Inbox, context: FrameContext) -> None:
        inbox.writing.release()
        context.finish()
        self._call_done()

    def _handle(self, conn: socket.socket, frame: Frame, inbox: _Inbox) -> Frame:
        meta = frame.meta
        timeout = meta.get("timeout_s")
        if inbox.checked[0] is not meta:  # a repeated meta is the same object, checked once
            metadata = meta.get("metadata", [])
            if not _pairs(metadata) or not (
                    timeout is None or (isinstance(timeout, int | float) and timeout >= 0)):
                return failure(frame.request_id, grpc.StatusCode.INVALID_ARGUMENT,
                               "malformed call frame (kind, metadata or timeout)")
            inbox.checked = (meta, tuple((k, v) for k, v in metadata))
        if frame.kind != CALL:
            return failure(frame.request_id, grpc.StatusCode.INVALID_ARGUMENT,
                           "malformed call frame (kind, metadata or timeout)")
        context = FrameContext(conn, inbox.checked[1], timeout, self, inbox)
        reply = None
        try:
            reply = self.handler(frame, context)
            return reply
        finally:
            if reply is not DEFERRED:  # a deferred call ends when it is answered
                context.finish()


def _refuse(conn: socket.socket, answer: Frame, limit: int,
            writing: threading.Lock | None = None) -> None:
    """Answer a frame that cannot be read and end the connection so that the caller reads
    the answer: stop sending, then drain what it still sends (closing with unread bytes would
    reset the connection, and a reset can discard the answer before the caller reads it),
    for at most a second and ``limit`` bytes. ``writing``: the connection's write lock."""
    with writing or contextlib.nullcontext():
        write_frame(conn, answer)
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(1.0)
        sink, left = bytearray(1 << 16), limit
        while left > 0 and (n := conn.recv_into(sink)):
            left -= n


def _pairs(metadata: Any) -> bool:
    return isinstance(metadata, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p)
        for p in metadata)



def _server_context(tls: TlsFiles | None) -> ssl.SSLContext | None:
    if tls is None or tls.cert is None or tls.key is None:
        return None
    return _context(ssl.PROTOCOL_TLS_SERVER, chain=(tls.cert, tls.key))

