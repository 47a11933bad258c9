"""The data plane: length-prefixed frames over plain TCP (TLS when configured), for the bytes
gRPC's Python stack costs more to move than the socket does.

gRPC keeps the control plane (``Describe``, health, cross-language access); a server that
offers this data plane names its port there, and a client that finds one sends its calls
here. A connection carries one call at a time (a client keeps several open for concurrent
calls), each call and its answer one *frame*::

    magic "ESF1" | version u8 | kind u8 | reserved u16 | request_id u64 | meta_len u32 |
    n_parts u32 | rest u64 | part lengths: n_parts x u64 | meta: meta_len bytes, a UTF-8
    JSON object | the parts, back to back

all little-endian; ``rest`` is the byte count after the fixed header (lengths, meta and
parts), so a receiver reads a frame in two reads: the header, then the rest. Kind 1 is a
call, 2 its answer, 3 a failed call, whose meta holds ``code``
(a gRPC status code's name) and ``details``, so a failure reads exactly as it does over gRPC.
A receiver checks the header and every size against its limit before it reads a payload byte
(a frame over the limit is answered RESOURCE_EXHAUSTED and the connection closed), reads the
parts into one buffer per connection that is reused call after call (no per-message
allocation) and hands them out as memoryviews of it; a sender writes header, meta and parts
with one scatter-gather ``sendmsg``: no part is copied to be framed.

A server authenticates before it allocates: the meta (with the caller's token) comes before
the parts, and is checked before a byte of them is read. Its receive buffer grows with the
bytes that arrived, never with what a header declares, and all frames still arriving share one
budget (:class:`~edgesplit.transport.limits.PendingBudget`); a connection silent between calls,
or slow within one, is closed (:class:`~edgesplit.transport.limits.ConnectionLimits`).
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from edgesplit.transport.auth import AuthThrottle, sent_bearer
from edgesplit.transport.limits import ConnectionLimits, PendingBudget
from edgesplit.transport.loopback import LoopbackContext, LoopbackError
from edgesplit.transport.tls import TlsFiles

__all__ = ["CALL", "DEFERRED", "FAILED", "REPLY", "Frame", "FrameClient", "FrameContext",
           "FrameServer", "Handler", "MetaCache", "Part", "Pieces", "Unserved", "encode_meta",
           "read_frame", "write_frame"]

MAGIC, VERSION = b"ESF1", 1
CALL, REPLY, FAILED = 1, 2, 3
_HEADER = struct.Struct("<4sBBHQIIQ")
MAX_META = 1 << 16  # bytes of JSON: names, metadata, timings; never payload
MAX_PARTS = 4096
_IOV_MAX = 512  # buffers per sendmsg (Linux allows 1024)
IDLE_S = 300.0  # a server closes a connection that sends nothing for this long
MAX_META_DEPTH = 32  # nesting of a meta's JSON (ours is 3 deep): deeper is refused unparsed
_GROW = 64 * 1024  # a receive buffer grows by at most this beyond twice what arrived

Buffer = bytes | bytearray | memoryview


class Pieces(tuple):
    """One part sent from consecutive buffers (a tensor message's header and the tensor's own
    memory): the scatter-gather write joins them, no copy does."""

    __slots__ = ()

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes if type(b) is memoryview else len(b) for b in self)

    def __bytes__(self) -> bytes:
        return b"".join(self)


Part = Buffer | Pieces


def _size(part: Buffer | Pieces) -> int:
    """A part's byte size (a memoryview's len counts items)."""
    return part.nbytes if type(part) is memoryview or type(part) is Pieces else len(part)


@dataclass
class Frame:
    kind: int
    request_id: int
    meta: dict[str, Any] = field(default_factory=dict)  # read-only once built or read
    parts: Sequence[Buffer] = ()  # a sender's may also be Pieces (kept apart until sent)
    meta_json: bytes | None = None  # ``meta`` already encoded, by a sender that caches it

    def encoded_meta(self) -> bytes:
        if self.meta_json is None:
            self.meta_json = encode_meta(self.meta)
        return self.meta_json

    def nbytes(self) -> int:
        """The frame's size on the wire (what a link shaper is charged)."""
        return (_HEADER.size + 8 * len(self.parts) + len(self.encoded_meta())
                + sum(_size(p) for p in self.parts))


def encode_meta(meta: dict[str, Any]) -> bytes:
    """The meta as JSON, padded with spaces to a multiple of 8 bytes: the parts that follow the
    lengths and the meta then start 8-aligned in a receive buffer, where a float payload can
    be read in place (:meth:`~edgesplit.quant.wire.PlainCodec.decode_in_place`)."""
    raw = json.dumps(meta, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


class MetaCache:
    """One sender's last meta and its JSON, reused while the next frame's meta equals it: a
    client's calls, and a server's answers, differ only in their ids and parts (comparing two
    small dicts costs a fraction of encoding one, in the cold path after compute)."""

    def __init__(self) -> None:
        self._last: tuple[dict[str, Any], bytes] = ({}, b"{}")

    def fill(self, frame: Frame) -> Frame:
        """``frame`` with its meta's JSON set (from the cache when it repeats)."""
        last = self._last
        if frame.meta != last[0]:
            last = self._last = (frame.meta, encode_meta(frame.meta))
        frame.meta_json = last[1]
        return frame


class FrameTooLarge(Exception):
    """A frame whose header declares more than the receiver's limit: nothing of it is read."""


class FrameRefused(Exception):
    """A frame a server will not read on (no token, the wrong one, a malformed call, no memory
    left for it): answered with ``code`` and the connection closed; ``unserved``: the caller
    may send the call another way (nothing of it ran, and another way may take it)."""

    def __init__(self, code: grpc.StatusCode, message: str, unserved: bool = False) -> None:
        super().__init__(message)
        self.code, self.unserved = code, unserved


class Unserved(LoopbackError):
    """A call the data plane did not serve, and nothing of which ran there (it refused the
    connection or the frame for want of room, or could not be reached): the caller may send
    it over gRPC instead."""


class _Closed(Exception):
    """The peer closed the connection between two frames (its normal way to hang up)."""


# ---- the bytes --------------------------------------------------------------------------------
def write_frame(sock: socket.socket, frame: Frame) -> int:
    """Send ``frame`` (one scatter-gather write where the kernel takes it all); its size."""
    buffers, total = _buffers(frame)
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg through TLS: one record stream
        for b in buffers:
            sock.sendall(b)
        return total
    sent = sock.sendmsg(buffers[:_IOV_MAX])
    if sent < total:  # the kernel took part of it (a timeout, a large frame): send the rest
        _send_rest(sock, buffers, sent)
    return total


def _buffers(frame: Frame) -> tuple[list[Buffer], int]:
    """The frame's bytes as buffers to write in order (header, lengths and meta, then the
    parts as they are, Pieces spread), and their total size."""
    meta = frame.encoded_meta()
    # byte sizes (a memoryview's len counts items); the parts go out as they are
    sizes = [_size(p) for p in frame.parts]
    total = _HEADER.size + 8 * len(sizes) + len(meta) + sum(sizes)
    head = _HEADER.pack(MAGIC, VERSION, frame.kind, 0, frame.request_id, len(meta),
                        len(sizes), total - _HEADER.size)
    buffers: list[Buffer] = [head + struct.pack(f"<{len(sizes)}Q", *sizes) + meta]
    for p in frame.parts:
        if type(p) is Pieces:
            buffers.extend(p)
        else:
            buffers.append(p)
    return buffers, total


def _send_rest(sock: socket.socket, buffers: list[Buffer], sent: int) -> None:
    """Send what ``sent`` bytes of ``buffers`` left over, in byte-addressed pieces."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        while sent and views:  # drop what went out, keep the rest of a partial buffer
            if sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            else:
                views[0], sent = views[0][sent:], 0
        if views:
            sent = sock.sendmsg(views[:_IOV_MAX])


def _recv_into(sock: socket.socket, view: memoryview, at_start: bool = False,
               deadline: float | None = None, inbox: _Inbox | None = None,
               frame_s: float | None = None) -> float | None:
    """Fill ``view``; the frame's deadline. With ``frame_s`` (and no deadline), the deadline
    is set ``frame_s`` after the first bytes arrive. A receive that leaves bytes to wait for
    bounds the socket's receive timeout by what is left of the deadline (a slow peer is cut
    off at it, not at the idle timeout), noting on ``inbox`` that its bound changed."""
    got = 0
    while got < view.nbytes:
        try:
            n = sock.recv_into(view[got:])
        except BlockingIOError:  # SO_RCVTIMEO ran out (a client's deadline)
            raise TimeoutError from None
        except ConnectionResetError:
            if at_start and got == 0:
                raise _Closed from None
            raise
        if n == 0:
            if at_start and got == 0:
                raise _Closed
            raise ConnectionError("the connection closed in the middle of a frame")
        got += n
        if deadline is None and frame_s is not None:
            deadline = time.monotonic() + frame_s
        if deadline is not None and got < view.nbytes:
            _bound_receive(sock, deadline, inbox)
    return deadline


def _bound_receive(sock: socket.socket, deadline: float, inbox: _Inbox | None) -> None:
    """Bound the next receives on ``sock`` by what is left of ``deadline`` (the slow path of
    a frame that arrives in pieces; TimeoutError once it passed), unless they are bound to at
    most twice that already: a receive then ends at most that much past the deadline, and a
    large frame's many receives do not each pay a system call. ``inbox.bound`` is then
    unknown, so the next :meth:`_Inbox.bound_to` sets it anew."""
    seconds = _left(deadline)
    assert seconds is not None
    if inbox is not None:
        if seconds >= inbox.receiving / 2:
            return
        inbox.bound, inbox.receiving = -1.0, seconds
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(seconds)
    else:
        whole = int(seconds)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack("ll", whole, max(1, int((seconds - whole) * 1e6))))


class _Inbox:
    """One connection's receive buffer, grown to the largest frame seen, never beyond the
    limit the header was checked against, and only as bytes arrive (at most twice what
    arrived, plus ``_GROW``): a header that declares much and sends little costs little."""

    def __init__(self) -> None:
        self.head = bytearray(_HEADER.size)
        self.buffer = bytearray(0)
        self.taken = 0  # bytes of a pending budget this connection's growth holds
        self.bound: float | None = -1.0  # the socket's kernel timeouts as last set (-1: unset)
        self.receiving = float("inf")  # its receive timeout as last set (inf: none or unknown)
        # the last frame's meta, raw and parsed: a client's calls repeat theirs, and parsing
        # JSON costs tens of microseconds in the cold path after compute
        self.meta_raw: bytes = b""
        self.meta: dict[str, Any] = {}
        # a server's last call meta found well formed, and its metadata as pairs
        self.checked: tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]] = (None, ())
        self.writing = threading.Lock()  # a server's answers: one frame at a time

    def bound_to(self, sock: socket.socket, seconds: float | None) -> None:
        """:func:`_bound` the connection to ``seconds``, unless it is bound within a
        millisecond of that already: a client with a fixed timeout makes the same two
        setsockopt calls before every call otherwise, each costly in the cold path right
        after compute; a deadline may be overrun by at most that millisecond."""
        last = self.bound
        if seconds is None and last is None:
            return
        if seconds is not None and last is not None and last >= 0 and \
                abs(seconds - last) < 1e-3:
            return
        _bound(sock, seconds)
        self.bound = seconds
        self.receiving = float("inf") if seconds is None else seconds

    def receive(self, sock: socket.socket, got: int, need: int, upto: int,
                deadline: float | None, budget: PendingBudget | None) -> int:
        """Receive the frame's rest into the buffer from byte ``got`` until ``need`` bytes
        arrived, growing the buffer as they do (each growth taken from ``budget``,
        FrameRefused when it has no room, held until :meth:`release`); bytes up to ``upto``
        that came with them are kept where the buffer has room already (a frame that arrives
        at once is read in one receive, and nothing is allocated for bytes not yet needed).
        How many arrived."""
        while got < need:
            if len(self.buffer) <= got:
                self._grow(min(need, max(2 * got, got + _GROW)), got, budget)
            view = memoryview(self.buffer)[got:min(upto, len(self.buffer))]
            try:
                n = sock.recv_into(view)
            except BlockingIOError:  # SO_RCVTIMEO ran out (a deadline)
                raise TimeoutError from None
            if n == 0:
                raise ConnectionError("the connection closed in the middle of a frame")
            got += n
            if deadline is not None and got < need:
                _bound_receive(sock, deadline, self)
        return got

    def _grow(self, size: int, keep: int, budget: PendingBudget | None) -> None:
        if budget is not None:
            more = size - len(self.buffer)
            if not budget.take(more):
                raise FrameRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"the server holds {budget.total} bytes of frames still "
                                   "arriving: try again later", unserved=True)
            self.taken += more
        grown = bytearray(size)
        grown[:keep] = memoryview(self.buffer)[:keep]
        self.buffer = grown

    def release(self, budget: PendingBudget | None) -> None:
        """Give back what this frame's growth took from ``budget`` (it arrived whole, or
        failed): a buffer kept for the next frame is no longer pending."""
        if budget is not None and self.taken:
            budget.give(self.taken)
            self.taken = 0


def read_frame(sock: socket.socket, inbox: _Inbox, limit: int,
               deadline: float | None = None, gate: _Gate | None = None) -> Frame:
    """The next frame; its parts are views of ``inbox``, valid until the next read. Raises
    ValueError for a malformed frame, FrameTooLarge for one over ``limit`` bytes of parts,
    _Closed when the peer hung up cleanly before it, TimeoutError past ``deadline``. A
    server's ``gate`` bounds the frame's time and memory and checks its meta (the token)
    before a byte of its parts is read (FrameRefused)."""
    if gate is None:  # a client: no budget to give back
        return _read_frame(sock, inbox, limit, deadline, None)
    try:
        return _read_frame(sock, inbox, limit, deadline, gate)
    finally:
        inbox.release(gate.budget)


def _read_frame(sock: socket.socket, inbox: _Inbox, limit: int, deadline: float | None,
                gate: _Gate | None) -> Frame:
    head = inbox.head
    deadline = _recv_into(sock, memoryview(head), at_start=True, deadline=deadline,
                          inbox=inbox, frame_s=gate.frame_s() if gate else None)
    magic, version, kind, reserved, request_id, meta_len, n_parts, rest = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION or reserved:
        raise ValueError("not an edgesplit data-plane frame (bad magic, version or reserved "
                         "bits): is this the server's data port?")
    if kind not in (CALL, REPLY, FAILED) or meta_len > MAX_META or n_parts > MAX_PARTS:
        raise ValueError(f"malformed frame header (kind {kind}, {meta_len} meta bytes, "
                         f"{n_parts} parts)")
    total = rest - 8 * n_parts - meta_len  # the parts' bytes, checked against their sizes
    if total > limit:
        raise FrameTooLarge(f"Received message larger than max ({total} vs. {limit})")
    if total < 0:
        raise ValueError(f"malformed frame header: {rest} bytes cannot hold {n_parts} part "
                         f"lengths and {meta_len} meta bytes")
    budget = gate.budget if gate is not None else None
    at = 8 * n_parts
    got = inbox.receive(sock, 0, at + meta_len, rest, deadline, budget)  # <= 96 KiB needed
    sizes = struct.unpack_from(f"<{n_parts}Q", inbox.buffer)
    if sum(sizes) != total:
        raise ValueError(f"malformed frame: part lengths add up to {sum(sizes)}, the header "
                         f"leaves {total}")
    raw = memoryview(inbox.buffer)[at:at + meta_len]
    if raw == inbox.meta_raw:  # the same bytes parse to the same (read-only) object
        meta = inbox.meta
    else:
        meta = _parse_meta(raw)
        inbox.meta_raw, inbox.meta = bytes(raw), meta
    if gate is not None:  # authenticate before the parts are allocated
        deadline = gate.admit(kind, meta, deadline)
    inbox.receive(sock, got, rest, rest, deadline, budget)
    view = memoryview(inbox.buffer)[:rest]
    parts = []
    at += meta_len
    for n in sizes:
        parts.append(view[at:at + n])
        at += n
    return Frame(kind, request_id, meta, parts)


def _parse_meta(raw: memoryview) -> dict[str, Any]:
    data = bytes(raw)
    if _depth(data) > MAX_META_DEPTH:
        raise ValueError(f"malformed frame metadata: nested deeper than {MAX_META_DEPTH}")
    try:
        meta = json.loads(data) if data else {}
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"malformed frame metadata: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError("malformed frame metadata: not a JSON object")
    return meta


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def _depth(data: bytes) -> int:
    """An upper bound of the JSON's nesting, found without parsing it (the parser recurses
    once a level: thousands of levels would exhaust Python's stack). Brackets in strings do
    not count; a meta with few brackets is not scanned."""
    if data.count(b"[") + data.count(b"{") <= MAX_META_DEPTH:
        return 0
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRING.sub(b'""', data)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def failure(request_id: int, code: grpc.StatusCode, details: str, unserved: bool = False
            ) -> Frame:
    """A FAILED frame; ``unserved`` tells the caller nothing of its call ran and it may send
    it another way (:class:`Unserved`)."""
    meta: dict[str, Any] = {"code": code.name, "details": details}
    if unserved:
        meta["unserved"] = True
    return Frame(FAILED, request_id, meta)


def _status(name: Any) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN) if isinstance(name, str) \
        else grpc.StatusCode.UNKNOWN


# ---- server -------------------------------------------------------------------------------------
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


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already shut down by the peer
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _server_context(tls: TlsFiles | None) -> ssl.SSLContext | None:
    if tls is None or tls.cert is None or tls.key is None:
        return None
    return _context(ssl.PROTOCOL_TLS_SERVER, chain=(tls.cert, tls.key))


def _context(protocol: int, chain: tuple[bytes, bytes] | None = None,
             ca: bytes | None = None) -> ssl.SSLContext:
    import tempfile
    from pathlib import Path

    context = ssl.SSLContext(protocol)
    if ca is not None:
        context.load_verify_locations(cadata=ca.decode())
    if chain is not None:
        with tempfile.TemporaryDirectory() as tmp:  # ssl reads a key pair from files only
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(chain[0])
            key.write_bytes(chain[1])
            key.chmod(0o600)
            context.load_cert_chain(cert, key)
    return context


# ---- client -------------------------------------------------------------------------------------
class FrameClient:
    """Calls one data-plane server. Thread-safe: each call borrows an idle connection (or opens
    one) and gives it back when the answer has been read; a connection whose call failed
    midway is closed, never reused."""

    def __init__(self, host: str, port: int, limit: int, tls: TlsFiles | None = None,
                 connect_timeout_s: float = 10.0) -> None:
        self.host, self.port, self.limit = host, port, limit
        self.connect_timeout_s = connect_timeout_s
        self._ssl = _context(ssl.PROTOCOL_TLS_CLIENT, ca=tls.ca) if tls and tls.ca else None
        # the name the server's certificate must carry: the gRPC channel's, when one is set
        self._server_name = (tls.server_name if tls else None) or host
        self._idle: list[tuple[socket.socket, _Inbox]] = []
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock, _ in idle:
            _close(sock)

    def call(self, frame: Frame, timeout: float | None,
             on_reply: Callable[[Frame], Any] = lambda f: f, *,
             caller: socket.socket | None = None) -> Any:
        """Send ``frame``, wait for its answer (at most ``timeout`` seconds in all) and return
        ``on_reply(answer)``, run while the answer's parts are still valid (they are views of
        the connection's buffer). Failures raise LoopbackError (a ``grpc.RpcError``) with
        the status gRPC would give: UNAVAILABLE when the server cannot be reached or hangs up,
        DEADLINE_EXCEEDED after ``timeout``, and the server's own for a FAILED answer. With
        ``caller`` (the connection of the call this one serves), the wait ends CANCELLED as
        soon as that caller hangs up, and this call's connection is closed (the server it
        calls then drops the work it has not started).

        :class:`Unserved` (a LoopbackError) says nothing of the call ran: the server could not
        be reached, refused the connection or the frame for want of room, or hung up before
        answering. A kept connection the server closed meanwhile (idle too long) is replaced
        by a new one, once."""
        deadline = None if timeout is None else time.monotonic() + timeout
        sock, inbox, reused = self._borrow(timeout)
        try:
            return self._call(sock, inbox, frame, deadline, on_reply, caller)
        except Unserved as exc:
            if not reused or exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        try:
            sock, inbox = self._connect(_left(deadline))
        except TimeoutError:
            raise LoopbackError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                                ) from None
        return self._call(sock, inbox, frame, deadline, on_reply, caller)

    def _call(self, sock: socket.socket, inbox: _Inbox, frame: Frame, deadline: float | None,
              on_reply: Callable[[Frame], Any], caller: socket.socket | None) -> Any:
        keep = False
        try:
            # one bound for the call: each receive is also checked against the deadline
            inbox.bound_to(sock, _left(deadline))
            # refused midway (too large, malformed): the server's answer says why, read below
            try:  # noqa: SIM105 (contextlib.suppress's object costs microseconds here)
                write_frame(sock, frame)
            except (BrokenPipeError, ConnectionResetError):
                pass
            if caller is not None:
                _await_answer(sock, caller, deadline)
            answer = read_frame(sock, inbox, self.limit, deadline)
            if answer.kind == FAILED:
                keep = answer.request_id == frame.request_id
                error = Unserved if answer.meta.get("unserved") is True else LoopbackError
                raise error(_status(answer.meta.get("code")),
                            str(answer.meta.get("details", "")))
            if answer.kind != REPLY or answer.request_id != frame.request_id:
                raise LoopbackError(grpc.StatusCode.INTERNAL,
                                    f"the data plane answered request {answer.request_id} "
                                    f"(kind {answer.kind}) to request {frame.request_id}")
            result = on_reply(answer)
            keep = True
            return result
        except (TimeoutError, BlockingIOError):  # BlockingIOError: SO_SNDTIMEO ran out
            raise LoopbackError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                                ) from None
        except FrameTooLarge as exc:
            raise LoopbackError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
        except _Closed:  # hung up before a byte of an answer: an idle timeout, a refusal
            raise Unserved(grpc.StatusCode.UNAVAILABLE, "the data plane connection was "
                           "closed before an answer") from None
        except (ConnectionError, ValueError, OSError, ssl.SSLError) as exc:
            raise LoopbackError(grpc.StatusCode.UNAVAILABLE,
                                f"the data plane connection failed: {exc or type(exc).__name__}"
                                ) from None
        finally:
            self._give_back(sock, inbox, keep)

    def _borrow(self, timeout: float | None) -> tuple[socket.socket, _Inbox, bool]:
        """An idle connection (True) or a new one (False)."""
        with self._lock:
            if self._closed:
                raise LoopbackError(grpc.StatusCode.CANCELLED, "the client was closed")
            if self._idle:
                return (*self._idle.pop(), True)
        return (*self._connect(timeout), False)

    def _connect(self, timeout: float | None) -> tuple[socket.socket, _Inbox]:
        wait = self.connect_timeout_s if timeout is None else min(timeout,
                                                                  self.connect_timeout_s)
        try:
            sock = socket.create_connection((self.host, self.port), timeout=wait)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._server_name)
            else:
                sock.settimeout(None)  # blocking; calls are bounded by kernel timeouts
        except (OSError, ssl.SSLError) as exc:
            raise Unserved(grpc.StatusCode.UNAVAILABLE,
                           f"failed to connect to the data plane at {self.host}:"
                           f"{self.port}: {exc}") from None
        return sock, _Inbox()

    def _give_back(self, sock: socket.socket, inbox: _Inbox, keep: bool) -> None:
        with self._lock:
            if keep and not self._closed:
                self._idle.append((sock, inbox))
                return
        _close(sock)


_HUNG_UP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


def _await_answer(sock: socket.socket, caller: socket.socket, deadline: float | None) -> None:
    """Wait until ``sock`` has an answer to read; LoopbackError CANCELLED when ``caller`` hangs
    up first, TimeoutError past ``deadline``. Where the platform cannot tell a hang-up from
    data (no POLLRDHUP), or TLS holds decrypted bytes already, it returns at once and the
    deadline alone bounds the wait."""
    if not hasattr(select, "POLLRDHUP") or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
        return
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(caller, _HUNG_UP)
    while True:
        left = _left(deadline)
        events = dict(poller.poll(None if left is None else max(1, int(left * 1e3))))
        if events.get(caller.fileno(), 0) & _HUNG_UP:
            raise LoopbackError(grpc.StatusCode.CANCELLED, "the caller hung up")
        if events.get(sock.fileno()):
            return


def _bound(sock: socket.socket, seconds: float | None) -> None:
    """Bound each send and receive on ``sock`` by ``seconds`` (None: no bound). A plain socket
    stays blocking with kernel timeouts (a Python timeout would poll before every call);
    TLS keeps Python's."""
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(seconds)
        return
    if seconds is None:
        value = struct.pack("ll", 0, 0)  # no timeout
    else:
        whole = int(seconds)
        value = struct.pack("ll", whole, max(1, int((seconds - whole) * 1e6)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left
