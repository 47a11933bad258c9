"""The data plane's frames: their format, and writing and reading one on a socket.

A connection carries one call at a time (a client keeps several open for concurrent calls),
each call and its answer one *frame*::

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
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from edgesplit.transport.frames.sockets import _bound, _left
from edgesplit.transport.limits import PendingBudget
from edgesplit.transport.loopback import LoopbackError

__all__ = ["CALL", "FAILED", "REPLY", "Buffer", "Frame", "FrameGate", "FrameRefused",
           "FrameTooLarge", "MetaCache", "Part", "Pieces", "Unserved", "encode_meta", "failure",
           "read_frame", "write_frame"]

MAGIC, VERSION = b"ESF1", 1
CALL, REPLY, FAILED = 1, 2, 3
_HEADER = struct.Struct("<4sBBHQIIQ")
MAX_META = 1 << 16  # bytes of JSON: names, metadata, timings; never payload
MAX_PARTS = 4096
_IOV_MAX = 512  # buffers per sendmsg (Linux allows 1024)
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


class FrameGate(Protocol):
    """What a server checks of a frame between its meta and its parts (the frame server's
    gate): how long the header and meta may take, the meta (its token) before a byte of the
    parts is read, and the budget the frame's growing buffer takes from."""

    budget: PendingBudget

    def frame_s(self) -> float:
        """How long the next frame's header and meta may take from their first byte."""
        ...

    def admit(self, kind: int, meta: dict[str, Any], deadline: float | None) -> float | None:
        """The deadline for the frame's parts, or FrameRefused."""
        ...


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
               deadline: float | None = None, gate: FrameGate | None = None) -> Frame:
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
                gate: FrameGate | None) -> Frame:
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

