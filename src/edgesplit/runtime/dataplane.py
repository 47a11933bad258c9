"""What a request is, whichever way it travels, and the caller of a next device.

A :class:`Message` is the runtime's request or reply: the plan it belongs to, its id, its
tensors as wire-format messages by name, and the hops' timings. It converts to and from gRPC's
``Bundle`` (the control plane, and any peer without a data plane) and to and from a data-plane
:class:`~edgesplit.transport.frames.Frame`, whose tensor bytes are never copied into a
protobuf. :class:`Hop` calls the next device: it asks the server's ``Describe`` once for a data
port and then sends ``Run`` as frames there, or over gRPC when there is none (``mode``
``"auto"``), always over gRPC (``"grpc"``), or only over the data plane (``"tcp"``). In
``"auto"``, a call the data plane did not serve (refused, unreachable, closed before an answer:
:class:`~edgesplit.transport.frames.Unserved`) goes over gRPC.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import grpc

from edgesplit.errors import ConfigError, option
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.transport import BadRequest, LoopbackChannel, LoopbackError, TlsFiles, open_channel
from edgesplit.transport.frames import (
    CALL,
    Buffer,
    Frame,
    FrameClient,
    MetaCache,
    Pieces,
    Unserved,
)

__all__ = ["DATA_PLANES", "DataPlane", "Hangup", "Hop", "Message", "Part", "as_part",
           "reply_of", "split_address"]

DataPlane = Literal["auto", "grpc", "tcp"]
Metadata = Sequence[tuple[str, str | bytes]]
DATA_PLANES = ("auto", "grpc", "tcp")


@dataclass
class Part:
    name: str
    data: Buffer  # one wire-format tensor message (a sender's may be Pieces: sent as they are)


def as_part(message: bytes | tuple[bytes, memoryview]) -> Buffer:
    """A codec's message as a frame part: ``encode_pieces``' two pieces stay apart (Pieces;
    typed as the buffer it stands for, which the data plane sends without joining it)."""
    return message if type(message) is bytes else cast(Buffer, Pieces(message))


@dataclass
class Message:
    """A request or reply; attribute names as gRPC's ``Bundle``, so code reading one reads
    the other."""

    plan_id: str = ""
    plan_version: int = 0
    request_id: int = 0
    tensors: list[Part] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, bundle: Any) -> Message:
        """From a gRPC ``Bundle`` (its tensor bytes are read once, here)."""
        return cls(bundle.plan_id, bundle.plan_version, bundle.request_id,
                   [Part(t.name, t.data) for t in bundle.tensors], dict(bundle.timings_ms))

    def to_pb(self) -> Any:
        bundle = pb.Bundle(plan_id=self.plan_id, plan_version=self.plan_version,
                           request_id=self.request_id)
        for part in self.tensors:
            bundle.tensors.add(name=part.name, data=bytes(part.data))
        bundle.timings_ms.update(self.timings_ms)
        return bundle

    def to_frame(self, kind: int = CALL, **meta: Any) -> Frame:
        """The message as a frame: names in the meta, tensors as parts, and the timings as
        their names in the meta plus one last part of float64 values (so that the meta of a
        server's answers repeats call after call, and is encoded and parsed once)."""
        meta.update(plan_id=self.plan_id, plan_version=self.plan_version,
                    names=[p.name for p in self.tensors])
        parts = [p.data for p in self.tensors]
        if self.timings_ms:
            meta["timings"] = list(self.timings_ms)
            parts.append(struct.pack(f"<{len(self.timings_ms)}d", *self.timings_ms.values()))
        return Frame(kind, self.request_id, meta, parts)

    @classmethod
    def from_frame(cls, frame: Frame) -> Message:
        """A frame's message, its fields checked (a hostile peer wrote them): BadRequest. A
        meta seen last time (the same object: a connection parses a repeated one once) is not
        checked again."""
        global _last_checked
        meta, parts = frame.meta, frame.parts
        names, timing_names = meta.get("names", []), meta.get("timings")
        last = _last_checked  # one read: other threads replace the pair, never half of it
        if last[0] is not meta or last[1] != len(parts):
            _check(meta, len(parts))
            _last_checked = (meta, len(parts))
        timings: dict[str, float]
        if timing_names is None:  # a peer that sends them in the meta (the first data plane)
            timings = {k: float(v) for k, v in meta.get("timings_ms", {}).items()}
        elif len(parts[-1]) != 8 * len(timing_names):
            raise _malformed(f"{len(timing_names)} timings need {8 * len(timing_names)} bytes, "
                             f"the part has {len(parts[-1])}")
        else:
            values = struct.unpack(f"<{len(timing_names)}d", parts[-1])
            timings = dict(zip(timing_names, values, strict=True))
        return cls(meta.get("plan_id", ""), meta.get("plan_version", 0), frame.request_id,
                   [Part(n, d) for n, d in zip(names, parts, strict=False)], timings)


# the last meta found well formed with its frame's part count, as one pair (compared by
# identity: frames read off one connection share the object of a repeated meta; the pair holds
# a reference, so that object's id cannot be reused meanwhile)
_last_checked: tuple[dict[str, Any] | None, int] = (None, -1)


def _check(meta: dict[str, Any], n_parts: int) -> None:
    names, timing_names = meta.get("names", []), meta.get("timings")
    plan, version = meta.get("plan_id", ""), meta.get("plan_version", 0)
    n_timing_parts = 0 if timing_names is None else 1
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)
            and len(names) + n_timing_parts == n_parts):
        raise _malformed("the tensor names do not match its parts")
    if not (isinstance(plan, str) and isinstance(version, int) and version >= 0):
        raise _malformed("plan_id must be a string and plan_version a count")
    if timing_names is not None:
        if not (isinstance(timing_names, list) and timing_names
                and all(isinstance(k, str) for k in timing_names)):
            raise _malformed("timings must name one or more timings")
        return
    timings = meta.get("timings_ms", {})
    if not (isinstance(timings, dict) and all(
            isinstance(k, str) and isinstance(v, int | float) for k, v in timings.items())):
        raise _malformed("timings_ms must map names to numbers")


def _malformed(what: str) -> BadRequest:
    return BadRequest(grpc.StatusCode.INVALID_ARGUMENT, f"malformed data-plane frame: {what}")


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of ``HOST:PORT`` or ``[V6]:PORT``; None for other gRPC targets (``unix:``,
    ``dns:///...``), which keep to gRPC."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host or host.startswith(("unix", "dns")):
        return None
    return host.strip("[]"), int(port)


class Hangup:
    """A connection that hangs up on :meth:`cancel`: what a data-plane call watches
    (``FrameClient.call``'s ``caller``) on behalf of a caller with no connection of its own to
    watch (a gRPC call, a mesh root's group of branch calls), so that cancelling it ends the
    call as a hung-up data-plane caller does. :meth:`close` once nothing watches it."""

    def __init__(self) -> None:
        self.watched, self._end = socket.socketpair()

    def cancel(self) -> None:
        self._end.close()  # the watched end reads a hang-up; closing twice is harmless

    def close(self) -> None:
        self._end.close()
        self.watched.close()


@contextlib.contextmanager
def _watched(context: Any) -> Any:
    """The connection a data-plane call made for ``context`` watches: the caller's own, a
    :class:`Hangup` its cancellation closes (gRPC's callback), or None (no caller)."""
    connection = getattr(context, "connection", None)
    if connection is not None or context is None or not hasattr(context, "add_callback"):
        yield connection
        return
    hangup = Hangup()
    try:
        if not context.add_callback(hangup.cancel):
            hangup.cancel()  # the caller's call ended already
        yield hangup.watched
    finally:
        hangup.close()


def _owned(reply: Message) -> Message:
    """``reply`` with its tensors' bytes copied out of the connection's buffer."""
    for part in reply.tensors:
        if not isinstance(part.data, bytes):
            part.data = bytes(part.data)
    return reply


class Hop:
    """Calls one device's server: ``describe`` over gRPC, ``run`` over the data plane the
    server offers (found by the first successful ``describe``) or over gRPC."""

    def __init__(self, address: str | grpc.Channel | LoopbackChannel, limit: int,
                 tls: TlsFiles | None, mode: DataPlane = "auto") -> None:
        if mode not in DATA_PLANES:
            raise ConfigError(f"unknown data plane {mode!r}: use {', '.join(DATA_PLANES)} "
                              f"({option('data_plane')})")
        self.address = address if isinstance(address, str) else "in-process"
        self.limit, self.tls, self.mode = limit, tls, mode
        self.channel = open_channel(address, limit, tls) if isinstance(address, str) \
            else address
        self.stub = pb_grpc.PartitionServiceStub(self.channel)
        self.frames: FrameClient | None = None
        self._resolved = False
        self._lock = threading.Lock()
        self._metas = MetaCache()
        # the last call's (metadata, timeout, names, plan id, version) and its meta and JSON
        self._last_call: tuple[Any, ...] = (None,) * 7

    @property
    def data_plane(self) -> str:
        """What ``run`` uses now: "tcp HOST:PORT" or "grpc"."""
        return f"tcp {self.frames.host}:{self.frames.port}" if self.frames else "grpc"

    def close(self) -> None:
        if self.frames is not None:
            self.frames.close()
        self.channel.close()

    def describe(self, timeout: float | None, metadata: Metadata) -> Any:
        """The server's Description; the first one also decides the data plane."""
        described = self.stub.Describe(pb.DescribeRequest(), timeout=timeout,
                                       metadata=metadata)
        with self._lock:
            if not self._resolved:
                self.frames = self._frames(described)
                self._resolved = True
        return described

    def _frames(self, described: Any) -> FrameClient | None:
        where = split_address(self.address) if isinstance(self.channel, grpc.Channel) else None
        offered = bool(described.data_port) and where is not None
        if self.mode == "tcp" and not offered:
            raise ConfigError(f"server {self.address} offers no data plane (started with "
                              "--data-port off, an older edgesplit, or not a host:port "
                              f"address): use {option('data_plane', 'grpc')}")
        if self.mode == "grpc" or not offered or where is None:
            return None
        return FrameClient(where[0], int(described.data_port), self.limit, self.tls)

    def forget(self) -> None:
        """Drop the data plane found so far: the next call asks ``Describe`` again (a server
        restarted on its gRPC port may have opened its data plane on another one)."""
        with self._lock:
            frames, self.frames, self._resolved = self.frames, None, False
        if frames is not None:
            frames.close()

    def resolve(self, timeout: float | None, metadata: Metadata) -> None:
        """Ask once which data plane to use (gRPC until a Describe has succeeded)."""
        if not self._resolved and self.mode != "grpc":
            with contextlib.suppress(grpc.RpcError):  # Run over gRPC fails the same way
                self.describe(timeout, metadata)

    def _frame(self, message: Message, timeout: float | None, metadata: Metadata) -> Frame:
        """The call's frame, its meta built and encoded once for as long as it repeats (the
        same names, timeout and metadata: a client's calls)."""
        names = [p.name for p in message.tensors]
        pairs_now = tuple(metadata)  # compared by value: a caller may change its list
        last = self._last_call
        if not (last[0] == pairs_now and last[1] == timeout and last[2] == names
                and message.plan_id == last[3] and message.plan_version == last[4]
                and not message.timings_ms):
            pairs = [[k, v] for k, v in metadata if isinstance(v, str)]  # no binary headers
            frame = self._metas.fill(message.to_frame(metadata=pairs, timeout_s=timeout))
            if not message.timings_ms:
                self._last_call = (pairs_now, timeout, names, message.plan_id,
                                   message.plan_version, frame.meta, frame.meta_json)
            return frame
        return Frame(CALL, message.request_id, last[5], [p.data for p in message.tensors],
                     last[6])

    def wire_size(self, message: Message) -> int:
        """The bytes ``message`` takes on the way ``run`` sends it (what a shaper charges)."""
        if self.frames is not None:
            return message.to_frame().nbytes()
        return int(message.to_pb().ByteSize())

    def run(self, message: Message, timeout: float | None, metadata: Metadata,
            context: Any = None, read: Callable[[Message], Any] = _owned,
            read_frame: Callable[[Frame], Any] | None = None) -> Any:
        """``read`` (by default: the tensors' bytes copied out) of the next device's reply to
        ``message``; raises ``grpc.RpcError`` as gRPC would. ``read`` runs while the reply's
        tensor data may still be views of the connection's buffer, which the next call
        reuses: it must copy or decode what it keeps. ``read_frame``, when given, reads a
        data-plane reply instead, from its frame (:func:`reply_of` makes its Message). The
        call is cancelled when ``context`` (the caller's own call) ends: over gRPC by its
        callback, over the data plane when the caller's connection hangs up (a caller with no
        connection, a gRPC call, through a :class:`Hangup` its callback closes)."""
        if not self._resolved:
            self.resolve(timeout, metadata)
        frames = self.frames
        if frames is not None:
            frame = self._frame(message, timeout, metadata)
            start = time.monotonic()
            on_reply = read_frame or (lambda answer: read(reply_of(answer)))
            try:  # a middle hop stops waiting when its own caller hangs up or cancels
                if context is None:  # a client's own call: nobody to watch
                    return frames.call(frame, timeout, on_reply)
                with _watched(context) as caller:
                    return frames.call(frame, timeout, on_reply, caller=caller)
            except Unserved as exc:  # nothing of it ran there: gRPC may serve it
                if self.mode == "tcp":
                    raise
                timeout = self._after_unserved(exc, timeout, start, metadata)
            except LoopbackError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self.forget()  # a retry finds the server's data plane anew
                raise
        call = self.stub.Run.future(message.to_pb(), timeout=timeout, metadata=metadata)
        # runs when the caller's call ends, any way; a caller that ended already (gRPC then
        # refuses the callback) cancels it at once, or it would run on to its deadline
        if context is not None and not context.add_callback(call.cancel):
            call.cancel()
        return read(Message.of(call.result()))

    def _after_unserved(self, exc: Unserved, timeout: float | None, start: float,
                        metadata: Metadata) -> float | None:
        """Before a call the data plane did not serve goes over gRPC: an unreachable data
        plane (a restarted server may have opened it elsewhere) is looked up anew; a busy
        one stays. What is left of ``timeout``."""
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            self.forget()
            self.resolve(_rest(timeout, start), metadata)
        return _rest(timeout, start)


def _rest(timeout: float | None, start: float) -> float | None:
    """What is left of ``timeout`` seconds begun at ``start`` (never quite nothing: gRPC then
    answers DEADLINE_EXCEEDED itself)."""
    return None if timeout is None else max(1e-3, timeout - (time.monotonic() - start))


def reply_of(frame: Frame) -> Message:
    """The reply a data-plane server answered with, its fields checked (LoopbackError
    INTERNAL for a malformed one)."""
    try:
        return Message.from_frame(frame)
    except BadRequest as exc:
        raise LoopbackError(grpc.StatusCode.INTERNAL, f"the server answered with a {exc}"
                            ) from None
