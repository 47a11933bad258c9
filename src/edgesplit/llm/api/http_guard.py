"""What an HTTP endpoint of edgesplit does before any of its work: bound its connections,
their time and their bytes, and check the caller's key before reading a body.

Two parts, each at the depth where its check is cheapest:

- :func:`guarded_protocol`, uvicorn's HTTP protocol (httptools) with what uvicorn lacks: a
  cap on open connections, in all and per peer host, below the open-file limit (at a cap the
  connection idle longest is closed to make room, or, with none idle, the new one is answered
  503 and closed at once: an idle flood can neither take the process's file descriptors nor
  keep out a caller that sends its request as soon as it connects); a deadline for a
  request's headers from the connection's first byte wait (uvicorn's keep-alive timeout only
  starts after a first response, so a connection that never sends, or sends its headers a
  byte a second, stayed open for ever: 408 and closed); a bound on the headers' bytes (431).
- :class:`Gate`, an ASGI middleware in front of the app for the protected paths: the key is
  compared before the body is read (401, with the connection closed: what the caller sent
  after its headers is never buffered), wrong keys are throttled per peer host (429 with
  ``Retry-After``; keyed by host and by a keyed hash of the key sent, so that a right key from
  an address a guesser shares still goes through: :class:`~edgesplit.transport.auth.
  AuthThrottle`), a declared ``Content-Length`` over the limit is refused before reading
  (413), and the body is read here within its byte limit (413) and its deadline (408), then
  handed to the app whole. Everything else, and the disconnect, passes through.

Invariant: no bytes of a request's body are held before its key has been compared, and never
more than ``max_body_bytes`` of them; no connection lives past ``header_timeout_s`` without a
complete request head, or ``keep_alive_s`` idle after a response.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import resource
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import anyio

from edgesplit.errors import ConfigError, option
from edgesplit.transport.auth import AuthThrottle

__all__ = ["Gate", "HttpLimits", "check_open_files", "guarded_protocol"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_MIB = 1 << 20
_FD_RESERVE = 64  # descriptors the process keeps for its own files, stages and logs


@dataclass(frozen=True)
class HttpLimits:
    """An HTTP endpoint's bounds, each checked before the work it protects. The defaults fit
    an API whose largest honest request is a long chat prompt (about a megabyte of JSON)."""

    max_body_bytes: int = 2 * _MIB  # a request body: 413 over it
    max_header_bytes: int = 64 * 1024  # a request's head (line and headers): 431 over it
    header_timeout_s: float = 10.0  # from a connection's (or request's) first byte wait: 408
    body_timeout_s: float = 30.0  # to receive the whole body once its head is in: 408
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this
    max_connections: int = 512  # open at once, in all: 503 and closed over it
    max_connections_per_host: int = 64  # open at once from one peer host

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "max_connections",
                     "max_connections_per_host"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{option(name)} must be at least 1, got "
                                  f"{getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{option(name)} must be positive, got {getattr(self, name)}")
        if self.max_connections_per_host > self.max_connections:
            raise ConfigError(f"{option('max_connections_per_host')} "
                              f"({self.max_connections_per_host}) cannot exceed "
                              f"{option('max_connections')} ({self.max_connections})")


def check_open_files(limits: HttpLimits) -> None:
    """Make room for ``max_connections`` sockets: raise this process's soft open-file limit
    to its hard one, and refuse (ConfigError) a cap the hard limit cannot hold. Past the
    limit, accept() fails and every caller, with a key or without, is refused."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.max_connections + _FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(hard, max(want, soft))
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < want:
        raise ConfigError(f"{option('max_connections')} {limits.max_connections} needs "
                          f"{want} open files, and this process may open {soft}: lower it to "
                          f"{max(1, soft - _FD_RESERVE)} or raise the limit (ulimit -n)")


# ---- the connection's part ------------------------------------------------------------------
def _status(code: int, reason: str, text: str, retry_after: str | None = None) -> bytes:
    """A whole HTTP/1.1 response that closes its connection, for the protocol's refusals (no
    request reached the app)."""
    body = json.dumps({"error": {"message": text, "type": "invalid_request_error",
                                 "param": None, "code": None}}).encode()
    head = [f"HTTP/1.1 {code} {reason}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Connections:
    """Open connections, in all and per peer host, and which of them are idle (no request in
    progress: before a request's head is complete, or kept alive after a response), oldest
    idle first. Only the event loop's thread touches it."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.total = 0
        self.per_host: Counter[str] = Counter()
        self.idle: OrderedDict[Any, str] = OrderedDict()  # protocol -> host

    def admit(self, host: str) -> bool:
        """Room for one more from ``host``: at a cap, the connection idle longest (from that
        host, for its own cap) is closed to make it, so that an idle flood cannot keep out a
        caller that sends its request at once; False when none is idle."""
        if self.per_host[host] >= self.limits.max_connections_per_host and \
                not self._evict(lambda h: h == host):
            return False
        if self.total >= self.limits.max_connections and not self._evict(lambda h: True):
            return False
        self.total += 1
        self.per_host[host] += 1
        return True

    def _evict(self, which: Callable[[str], bool]) -> bool:
        for protocol, host in self.idle.items():
            if which(host):
                protocol.evict()  # releases it here: its connection_lost comes later
                return True
        return False

    def release(self, protocol: Any, host: str) -> None:
        self.idle.pop(protocol, None)
        self.total -= 1
        self.per_host[host] -= 1
        if self.per_host[host] <= 0:
            del self.per_host[host]

    def set_idle(self, protocol: Any, host: str, idle: bool) -> None:
        if idle:
            self.idle[protocol] = host
            self.idle.move_to_end(protocol)
        else:
            self.idle.pop(protocol, None)


def guarded_protocol(limits: HttpLimits) -> type:
    """uvicorn's httptools protocol with ``limits``' connection caps, header deadline and
    header bytes (see the module docstring), as a class for ``uvicorn.Config(http=...)``:
    one class, and one count of connections, per server."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    connections = _Connections(limits)

    class GuardedHttp(HttpToolsProtocol):
        _host = "?"
        _admitted = False
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes: int | None = None  # bytes of the request head so far; None: not in one

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._host = self.client[0] if self.client else "?"
            if not connections.admit(self._host):
                transport.write(_status(503, "Service Unavailable", "too many connections "
                                        f"from {self._host} or in all: retry later", "1"))
                transport.close()
                return
            self._admitted = True
            connections.set_idle(self, self._host, True)
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            self._release()
            super().connection_lost(exc)

        def evict(self) -> None:
            """Closed to make room for a new connection (it was the idle one longest)."""
            self._release()
            self._refuse(503, "Service Unavailable", "closed to make room for another "
                                                     "connection: reconnect")

        def _release(self) -> None:
            if self._admitted:
                self._admitted = False
                connections.release(self, self._host)

        def data_received(self, data: bytes) -> None:
            if self._head_bytes is None and self.cycle is not None \
                    and self.cycle.response_complete:
                self._await_head()  # the next request on a kept-alive connection
            super().data_received(data)
            # counted once parsed: bytes after a head that completed here are its body's
            if self._head_bytes is not None and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_header_bytes:
                    self._refuse(431, "Request Header Fields Too Large",
                                 f"the request's head exceeds {limits.max_header_bytes} bytes")

        def on_headers_complete(self) -> None:
            self._stop_timer()
            self._head_bytes = None
            if self._admitted:
                connections.set_idle(self, self._host, False)
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._admitted and not self.transport.is_closing():
                connections.set_idle(self, self._host, True)

        def _await_head(self) -> None:
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_late)

        def _head_late(self) -> None:
            self._head_timer = None
            self._refuse(408, "Request Timeout", f"no complete request head within "
                                                 f"{limits.header_timeout_s:g} s")

        def _refuse(self, code: int, reason: str, text: str) -> None:
            self._stop_timer()
            self._head_bytes = None
            if not self.transport.is_closing():
                self.transport.write(_status(code, reason, text))
                self.transport.close()

        def _stop_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    return GuardedHttp


# ---- the request's part ---------------------------------------------------------------------
class _Refused(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers or {}


class Gate:
    """ASGI middleware: requests whose path starts with ``prefix`` need ``Authorization:
    Bearer <api_key>`` (none: no key), compared in constant time before their body is read,
    with wrong keys throttled per peer host by ``throttle``; every request's body is read
    here within ``limits`` and handed to ``app`` whole. Refusals are OpenAI-shaped JSON errors whose
    responses close the connection."""

    def __init__(self, app: App, *, api_key: str | None, limits: HttpLimits,
                 throttle: AuthThrottle | None = None, prefix: str = "/v1") -> None:
        self.app, self.limits, self.prefix = app, limits, prefix
        self._expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.throttle = throttle if throttle is not None else AuthThrottle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._admit(scope)
            body = await self._read_body(receive)
        except _Refused as refused:
            await _refuse(send, refused)
            return
        await self.app(scope, _replay(body, receive), send)

    def _admit(self, scope: Scope) -> None:
        """The key (on the protected paths), then the declared size: nothing is read before
        both pass."""
        if self._expected is not None and scope["path"].startswith(self.prefix):
            self._check_key(scope)
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or
                                     int(declared) > self.limits.max_body_bytes):
            raise self._too_large()

    def _check_key(self, scope: Scope) -> None:
        assert self._expected is not None
        host = (scope.get("client") or ("?",))[0]  # the address, never the port
        sent = _header(scope, b"authorization") or ""  # the bucket: the value as sent
        wait = self.throttle.wait_s(host, sent)
        if wait > 0:
            raise _Refused(429, f"too many wrong API keys from {host}: wait {wait:.1f} s, then "
                                "send the right key", "rate_limit_exceeded",
                           {"retry-after": str(max(1, math.ceil(wait)))})
        scheme, _, given = sent.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            self.throttle.failed(host, sent)
            raise _Refused(401, "missing API key: send the header 'Authorization: Bearer KEY'",
                           "invalid_api_key", {"www-authenticate": "Bearer"})
        if not hmac.compare_digest(f"Bearer {given.strip()}".encode(), self._expected):
            self.throttle.failed(host, sent)
            raise _Refused(401, "incorrect API key", "invalid_api_key",
                           {"www-authenticate": "Bearer"})

    def _too_large(self) -> _Refused:
        return _Refused(413, f"the request body exceeds {self.limits.max_body_bytes} bytes: "
                             "send a shorter prompt", "request_too_large")

    async def _read_body(self, receive: Receive) -> bytes:
        """The whole body within the byte limit and the body deadline."""
        parts, size = [], 0
        with anyio.move_on_after(self.limits.body_timeout_s) as late:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Refused(499, "the client left")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.limits.max_body_bytes:
                    raise self._too_large()
                parts.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(parts)
        assert late.cancelled_caught
        raise _Refused(408, f"the request body did not arrive within "
                            f"{self.limits.body_timeout_s:g} s")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body read, then the connection's own messages (its
    disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _refuse(send: Send, refused: _Refused) -> None:
    if refused.status == 499:
        return  # no one is there to read it
    body = json.dumps({"error": {"message": str(refused), "type": "invalid_request_error",
                                 "param": None, "code": refused.code}}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close"),
               *((k.encode(), v.encode()) for k, v in refused.headers.items())]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
