"""The serving shell shared by every runtime server: its gRPC face and its data plane.

A server (:class:`~edgesplit.runtime.server.PartitionServer`,
:class:`~edgesplit.runtime.llm_server.LLMStageServer`) is a shell around one handler: the
shell authenticates each call, answers ``Run`` through :func:`~edgesplit.transport.answer`
(a failure becomes its status, an unexpected one INTERNAL with a logged sentence), answers a
stream's requests one by one (one that fails ends only itself, as an error in its reply),
and refuses a request made for another plan in one set of words. Its data plane
(:class:`ServingShell`) opens beside the gRPC port with the same token, TLS, throttle and
connection limits, and answers a frame with the same checks and errors; the worker slots both
planes' calls share are the shell's too (:meth:`ServingShell.take_slot`), and so is the
refusal once it stops (UNAVAILABLE, not a busy server's RESOURCE_EXHAUSTED). A server that sends
on calls the next device through :class:`NextHop`, which carries the caller's token, session
and deadline there and turns the call's failure into this request's. What a request does
(relay, compute, join, a generation step) is the handler's: :class:`Handler` and
:class:`FrameHandler` are all the shell asks of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, Protocol, cast

import grpc

from edgesplit.errors import ConfigError, RemoteError, option
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime.dataplane import Message, Metadata
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.transport import (
    BadRequest,
    GrpcServer,
    LinkShaper,
    answer,
    check_alive,
    remaining_timeout,
)
from edgesplit.transport.frames import Frame, FrameContext, FrameServer, failure
from edgesplit.transport.limits import ConnectionLimits
from edgesplit.transport.loopback import Aborted
from edgesplit.transport.slots import Slots

__all__ = ["FrameHandler", "Handler", "NextHop", "Servicer", "ServingShell",
           "check_request_plan"]


class Handler(Protocol):
    """What a serving shell calls: the plan it serves, what it says it serves, the answer to
    one gRPC request, and the sentence (logged) for an unexpected failure."""

    @property
    def plan_id(self) -> str: ...

    def describe(self) -> pb.Description: ...

    def reply_pb(self, request: pb.Bundle, context: grpc.ServicerContext) -> pb.Bundle: ...

    def failure(self, exc: BaseException) -> str: ...


class FrameHandler(Protocol):
    """What a serving shell's data plane calls: the answer to one data-plane call (its
    failures become statuses as :func:`~edgesplit.transport.answer` makes them), and the
    sentence (logged) for an unexpected failure."""

    def answer_frame(self, frame: Frame, context: grpc.ServicerContext) -> Frame: ...

    def failure(self, exc: BaseException) -> str: ...


class _Authenticating(Protocol):
    def check_token(self, context: grpc.ServicerContext) -> None: ...


Requests = Callable[[Iterator[pb.Bundle], grpc.ServicerContext], Iterator[pb.Bundle]]


class Servicer(pb_grpc.PartitionServiceServicer):
    """The PartitionService of ``shell`` (its token checked on every call) answered by
    ``handler``. ``requests`` reads a stream's requests (the shell's idle limit, say; by
    default they are read as they come)."""

    def __init__(self, shell: _Authenticating, handler: Handler,
                 requests: Requests | None = None) -> None:
        self.shell, self.handler = shell, handler
        self.requests: Requests = requests or (lambda iterator, context: iterator)

    def Run(self, request: pb.Bundle, context: grpc.ServicerContext) -> pb.Bundle:
        self.shell.check_token(context)
        handler = self.handler
        return answer(context, lambda: handler.reply_pb(request, context), handler.failure)

    def RunStream(self, request_iterator: Iterator[pb.Bundle], context: grpc.ServicerContext
                  ) -> Iterator[pb.Bundle]:
        self.shell.check_token(context)
        handler = self.handler
        for request in self.requests(request_iterator, context):
            try:
                yield handler.reply_pb(request, context)
            except (BadRequest, RemoteError) as exc:  # one bad request ends only itself
                yield pb.Bundle(request_id=request.request_id, error=str(exc),
                                plan_id=handler.plan_id)
            except Exception as exc:
                yield pb.Bundle(request_id=request.request_id, error=handler.failure(exc),
                                plan_id=handler.plan_id)

    def Describe(self, request: pb.DescribeRequest, context: grpc.ServicerContext
                 ) -> pb.Description:
        self.shell.check_token(context)
        return self.handler.describe()


class ServingShell(GrpcServer):
    """A :class:`~edgesplit.transport.GrpcServer` with the data plane beside it: length-prefixed
    frames over TCP (:class:`~edgesplit.transport.frames.FrameServer`) carrying the same
    calls, under the server's token, TLS, auth throttle and connection limits, and bounded by
    its message limit. A server calls :meth:`_init_data_plane` after ``_init_grpc``;
    :meth:`start` then opens the data plane on the port it asked for (None: none) and names it
    in ``data_port``, and :meth:`stop` closes it before gRPC."""

    _frames: FrameServer | None = None
    data_port: int | None = None  # the data plane's port once started (None: none)
    next_timeout_s: float  # the longest a call waits for a slot or the next device
    _stopping = False

    def _init_slots(self, workers: int, device: str, busy: str) -> None:
        """``workers`` slots that the calls of both planes share (:meth:`take_slot`); a call
        that finds none free in time is refused as ``device`` busy with ``busy``."""
        self._slots = Slots(workers)
        self._slot_words = (device, busy)

    def take_slot(self, context: grpc.ServicerContext | None) -> None:
        """One of the server's worker slots (give it back with :meth:`give_slot`), or
        BadRequest once the call's deadline passed waiting (UNAVAILABLE once :meth:`stop`
        began: the client should retry elsewhere, not back off from a busy server)."""
        if not self._slots.take(remaining_timeout(context, self.next_timeout_s)):
            device, busy = self._slot_words
            self._check_running()
            check_alive(context, device)
            raise BadRequest(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"device {device!r} is busy with {busy}")

    def give_slot(self) -> None:
        """Give back the slot :meth:`take_slot` took."""
        self._slots.give()

    def _check_running(self) -> None:
        """BadRequest UNAVAILABLE once :meth:`stop` began."""
        if self._stopping:
            raise BadRequest(grpc.StatusCode.UNAVAILABLE,
                             f"device {self._slot_words[0]!r} is shutting down")

    def _refuse_new(self) -> None:
        """Take no more work: every call waiting for a slot is answered at once (again: a
        no-op). A server with more to close at the end of a stop's grace extends it."""
        self._stopping = True
        self._slots.close()

    def _init_data_plane(self, handler: FrameHandler, port: int | None,
                         limits: ConnectionLimits | None) -> None:
        """Answer data-plane calls with ``handler`` on ``port`` (0: any free port; None: no
        data plane); ``limits``: the frame server's (None: its defaults)."""
        self._frame_handler, self._want_data_port = handler, port
        self._frame_limits = limits
        self._token_checked: object = None  # the call metadata last found to hold the token

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen for gRPC on host:port (0: any free port) and for the data plane on the port
        asked for, of the same host; returns the gRPC port."""
        bound = super().start(host, port)
        if self._want_data_port is not None:
            self._frames, self.data_port = self._open_data_plane(host, self._want_data_port)
        return bound

    def _open_data_plane(self, host: str, port: int) -> tuple[FrameServer, int]:
        """A started frame server and its port. When the port cannot be opened, the gRPC
        server (just started) stops and a ConfigError says what to change."""
        frames = FrameServer(self._frame_call, self._limit, self.tls, token=self.token,
                             limits=self._frame_limits, throttle=self.throttle)
        try:
            return frames, frames.start(host, port)
        except OSError as exc:
            GrpcServer.stop(self, 0)
            raise ConfigError(f"cannot open the data plane on {host}:{port} "
                              f"({exc.strerror or exc}): pick another {option('data_port')} "
                              "or turn it off") from None

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new calls and finish the ones in flight on both planes, those still waiting
        for a slot included, for up to ``grace_s``; what still waits then is answered
        UNAVAILABLE (:meth:`_refuse_new`; at once with ``grace_s`` 0). A request that came in
        just before a SIGTERM is served, not refused: it was sent to this server."""
        self._stopping = True
        deadline = time.monotonic() + grace_s  # the grace of the whole stop, not each part's

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        try:
            if self._frames is not None:
                self._frames.stop(left())
            super().stop(left())
            self._drain(left())  # in-process (loopback) callers, which no plane counts
        finally:
            self._refuse_new()

    def _drain(self, timeout: float) -> None:
        """Wait at most ``timeout`` for the calls waiting for a slot to have one. A server
        with more waits (workers) extends it."""
        self._slots.drain(timeout)

    def _frame_call(self, frame: Frame, context: FrameContext) -> Frame:
        """Answer one data-plane call: the same token check, errors and work as over gRPC."""
        call = cast(grpc.ServicerContext, context)  # the part of it our handlers use
        handler = self._frame_handler
        try:
            metadata = context.invocation_metadata()
            if metadata is not self._token_checked:  # a connection's repeated metadata
                self.check_token(call)                # is one object, checked once
                self._token_checked = metadata
            return answer(call, lambda: handler.answer_frame(frame, call), handler.failure)
        except Aborted:
            return failure(frame.request_id, context.code or grpc.StatusCode.UNKNOWN,
                           context.details)


class _Hop(Protocol):  # a Hop, or a mesh root's Fanout
    def wire_size(self, message: Message) -> int: ...

    def run(self, message: Message, timeout: float | None, metadata: Metadata,
            context: Any = None) -> Any: ...


class NextHop:
    """How a server calls the device after it through ``hop`` (a
    :class:`~edgesplit.runtime.dataplane.Hop`: the data plane where offered, else gRPC; a mesh
    root's :class:`~edgesplit.runtime.mesh.Fanout`). The caller's metadata named in
    ``passes`` (its token, its session, ...) travels on, and the call gets what is left of
    the caller's deadline (``timeout_s`` without one); a caller that gave up is not called
    for, and one that cancels cancels the call downstream, so abandoned requests free every
    hop's workers. A failed call fails this request as ``own`` says where the failure is the
    caller's own to see (a passed deadline, a session's status), else as a failed next hop
    (RemoteError: UNAVAILABLE). ``device`` names this server in its errors."""

    def __init__(self, hop: _Hop, device: str, *, timeout_s: float, shaper: LinkShaper,
                 passes: Collection[str],
                 own: Callable[[grpc.RpcError], BadRequest | None]) -> None:
        self.hop, self.device, self.timeout_s, self.shaper = hop, device, timeout_s, shaper
        self.passes, self.own = frozenset(passes), own

    def send(self, out: Message, context: grpc.ServicerContext | None) -> Message:
        """:meth:`call`, the message first taking its time on ``shaper``'s link."""
        if self.shaper.enabled:
            self.shaper.send(self.hop.wire_size(out), "up")
        return self.call(out, context)

    def call(self, out: Message, context: grpc.ServicerContext | None) -> Message:
        """The next device's reply to ``out``, sent on behalf of ``context``'s caller."""
        metadata = context.invocation_metadata() if context is not None else ()
        passed = [(k, v) for k, v in metadata if k in self.passes]
        check_alive(context, self.device)
        try:
            return cast(Message, self.hop.run(
                out, remaining_timeout(context, self.timeout_s), passed, context))
        except grpc.FutureCancelledError:
            raise BadRequest(grpc.StatusCode.CANCELLED, "the caller cancelled the request"
                             ) from None
        except grpc.RpcError as exc:
            raise self.own(exc) or RemoteError(
                f"next hop after {self.device!r} failed: {exc.code().name}: "
                f"{exc.details()}") from None


def check_request_plan(request: Any, plan_id: str) -> None:
    """Refuse (FAILED_PRECONDITION) a request (a Bundle or a Message) made for another plan
    than ``plan_id`` at this plan version."""
    if request.plan_id != plan_id or request.plan_version != PLAN_VERSION:
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                         f"plan mismatch: this server runs plan {plan_id} (version "
                         f"{PLAN_VERSION}), the request is for {request.plan_id or '?'} "
                         f"(version {request.plan_version}); start both sides from the "
                         "same plan file")
