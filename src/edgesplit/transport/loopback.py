"""An in-process transport: a server's own servicer answers a client in the same process,
without sockets, threads or subprocesses.

``GrpcServer.loopback_channel()`` returns a :class:`LoopbackChannel` that the generated gRPC
stubs accept like any channel. Each call runs the servicer method the server registered, with
a :class:`LoopbackContext` standing in for gRPC's ``ServicerContext`` (metadata, deadline,
cancellation, abort with a status code). Messages are serialized and parsed as on the wire and
held to the same size limit, so decoding, validation and errors are the code a socket runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import grpc

__all__ = ["Aborted", "LoopbackChannel", "LoopbackContext", "LoopbackError", "LoopbackServer"]

Metadata = Sequence[tuple[str, str]]


class LoopbackError(grpc.RpcError):
    """A failed loopback call, read like gRPC's own error: ``code()`` and ``details()``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Aborted(Exception):
    """What ``context.abort`` raises, as gRPC's does, to end the servicer method."""


class LoopbackContext:
    """The part of ``grpc.ServicerContext`` edgesplit's servicers use."""

    def __init__(self, metadata: Metadata = (), timeout: float | None = None,
                 peer: str = "loopback") -> None:
        self._metadata, self._peer = tuple(metadata), peer
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._callbacks: list[Callable[[], Any]] = []
        self.cancelled = False
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def is_active(self) -> bool:
        remaining = self.time_remaining()
        return not self.cancelled and (remaining is None or remaining > 0)

    def cancel(self) -> None:
        self.cancelled = True

    def add_callback(self, callback: Callable[[], Any]) -> bool:
        self._callbacks.append(callback)
        return True

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise Aborted(details)

    def finish(self) -> None:
        """The call ended: run its callbacks, as gRPC does."""
        for callback in self._callbacks:
            callback()


class LoopbackServer:
    """Collects the method handlers a generated ``add_..._to_server`` registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[object]) -> None:
        pass  # the same handlers also arrive by name through the method below

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler


class _Done:
    """A finished call, shaped like the future ``stub.Method.future`` returns."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._reply, self._error = None, None
        try:
            self._reply = call()
        except grpc.RpcError as exc:
            self._error = exc

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._reply

    def cancel(self) -> bool:
        return False  # already done

    def done(self) -> bool:
        return True


class _Method:
    def __init__(self, channel: LoopbackChannel, path: str, serialize: Callable,
                 deserialize: Callable) -> None:
        self.channel, self.path = channel, path
        self.serialize, self.deserialize = serialize, deserialize

    def _handler(self) -> Any:  # a grpc.RpcMethodHandler, its fields set for this kind
        handler = self.channel.handlers.get(self.path)
        if handler is None:
            raise LoopbackError(grpc.StatusCode.UNIMPLEMENTED, f"no method {self.path}")
        return handler

    def _carry(self, message: Any, serialize: Callable, parse: Callable, direction: str) -> Any:
        data = serialize(message)
        if len(data) > self.channel.limit:
            raise LoopbackError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{direction} message larger than max ({len(data)} vs. "
                                f"{self.channel.limit})")
        return parse(data)

    def _run(self, behaviour: Callable[[Any, LoopbackContext], Any], request: Any,
             context: LoopbackContext) -> Any:
        try:
            return behaviour(request, context)
        except Aborted:
            raise LoopbackError(context.code or grpc.StatusCode.UNKNOWN, context.details
                                ) from None
        except grpc.RpcError:
            raise
        except Exception as exc:  # gRPC answers an escaped exception with UNKNOWN
            raise LoopbackError(grpc.StatusCode.UNKNOWN,
                                f"Exception calling application: {exc}") from None


class _UnaryUnary(_Method):
    def __call__(self, request: Any, timeout: float | None = None,
                 metadata: Metadata | None = None, **_: Any) -> Any:
        handler = self._handler()
        request = self._carry(request, self.serialize, handler.request_deserializer, "Sent")
        context = LoopbackContext(metadata or (), timeout, self.channel.peer)
        try:
            reply = self._run(handler.unary_unary, request, context)
        finally:
            context.finish()
        if context.code not in (None, grpc.StatusCode.OK):
            raise LoopbackError(context.code, context.details)
        return self._carry(reply, handler.response_serializer, self.deserialize, "Received")

    def future(self, request: Any, timeout: float | None = None,
               metadata: Metadata | None = None, **_: Any) -> _Done:
        return _Done(lambda: self(request, timeout=timeout, metadata=metadata))


class _StreamStream(_Method):
    def __call__(self, requests: Iterator[Any], timeout: float | None = None,
                 metadata: Metadata | None = None, **_: Any) -> Iterator[Any]:
        handler = self._handler()
        context = LoopbackContext(metadata or (), timeout, self.channel.peer)
        parsed = (self._carry(r, self.serialize, handler.request_deserializer, "Sent")
                  for r in requests)
        try:
            for reply in self._run(handler.stream_stream, parsed, context):
                yield self._carry(reply, handler.response_serializer, self.deserialize,
                                  "Received")
        except Aborted:
            raise LoopbackError(context.code or grpc.StatusCode.UNKNOWN, context.details
                                ) from None
        finally:
            context.finish()


class LoopbackChannel:
    """A channel to a server in this process; pass it to a generated stub. The server sees
    its calls come from ``peer`` (as gRPC names one: ``ipv4:10.0.0.2:5000``), so that tests
    can call as several hosts."""

    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler], limit: int,
                 peer: str = "loopback") -> None:
        self.handlers, self.limit, self.peer = handlers, limit, peer

    def unary_unary(self, path: str, request_serializer: Callable = bytes,
                    response_deserializer: Callable = bytes, **_: Any) -> _UnaryUnary:
        return _UnaryUnary(self, path, request_serializer, response_deserializer)

    def stream_stream(self, path: str, request_serializer: Callable = bytes,
                      response_deserializer: Callable = bytes, **_: Any) -> _StreamStream:
        return _StreamStream(self, path, request_serializer, response_deserializer)

    def close(self) -> None:
        pass  # nothing to release

    def __enter__(self) -> LoopbackChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
