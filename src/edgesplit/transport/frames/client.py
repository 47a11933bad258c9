"""The data plane's client side (:class:`FrameClient`): calls one frame server over pooled
connections, and reads its answers as gRPC would report them.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from edgesplit.transport.frames.codec import (
    FAILED,
    REPLY,
    Frame,
    FrameTooLarge,
    Unserved,
    _Closed,
    _Inbox,
    read_frame,
    write_frame,
)
from edgesplit.transport.frames.sockets import _close, _context, _left
from edgesplit.transport.loopback import LoopbackError
from edgesplit.transport.tls import TlsFiles

__all__ = ["FrameClient"]


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



def _status(name: Any) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN) if isinstance(name, str) \
        else grpc.StatusCode.UNKNOWN
