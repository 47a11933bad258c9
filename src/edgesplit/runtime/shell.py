"""The serving shell every runtime server is: its gRPC face, its data plane, and what both
planes' calls share; what a request does is its handler's.

A server is ``ServingShell(handler, options, limit=..., slots=...)``, never a subclass of it:
the partition server (:func:`~edgesplit.runtime.server.partition_server`) and an LLM stage
(:func:`~edgesplit.llm.stage.server.llm_stage_server`) assemble a handler from parts and put
it in a shell. Those two serve the PartitionService (:func:`plan_service`, the default); a
handler with a gRPC service of its own (the training server,
:func:`~edgesplit.train.remote.server.training_server`) names it with ``service=`` and answers
each call through :meth:`ServingShell.serve_call` (token, worker slot, status), without the
data plane, which carries the PartitionService's calls only. The shell authenticates each
call, answers ``Run`` through
:func:`~edgesplit.transport.answer` (a failure becomes its status, an unexpected one INTERNAL
with a logged sentence), answers a stream's requests one by one (one that fails ends only
itself, as an error in its reply), says what it serves (``Describe``), and refuses a request
made for another plan in one set of words. Its data plane opens beside the gRPC port with
the same token, TLS, throttle and connection limits, and answers a frame with the same checks
and errors. The worker slots both planes' calls share (:class:`WorkerSlots`) are the shell's
too, and so is the refusal once it stops (UNAVAILABLE, not a busy server's
RESOURCE_EXHAUSTED): a stop refuses new calls, serves the ones in flight and those waiting
for a slot for up to its grace, then the handler's parts close.

A handler that sends on calls the next device through :class:`NextHop`, which carries the
caller's token, session and deadline there, turns the call's failure into this request's,
and times what it sends (:meth:`NextHop.forward`). What every server says alike is here once:
a failure's sentence (:func:`failure_of`), that the first device is not served
(:func:`check_served`) and that a device that sends needs the next one's address
(:func:`check_next`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast, final

import grpc

from edgesplit.errors import ConfigError, RemoteError, option
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime.dataplane import Hop, Message, Metadata
from edgesplit.runtime.options import ServeOptions
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.transport import (
    BadRequest,
    GrpcServer,
    LinkShaper,
    LoopbackChannel,
    abort_for,
    answer,
    check_alive,
    remaining_timeout,
)
from edgesplit.transport.frames import Frame, FrameContext, FrameServer, failure
from edgesplit.transport.loopback import Aborted
from edgesplit.transport.slots import Slots

__all__ = ["AddServicer", "Handler", "NextHop", "PlanHandler", "Servicer", "ServingShell",
           "WorkerSlots", "check_next", "check_request_plan", "check_served", "failure_of",
           "open_hop", "plan_service"]

log = logging.getLogger(__name__)


class Handler(Protocol):
    """What a serving shell asks of every handler: the sentence (logged) for an unexpected
    failure of a call, and its parts' share of a start and a stop: ``started`` once the shell
    listens (``serving(ok)`` sets its health), ``refuse`` when it takes no more work (every
    wait of a part is answered at once), ``drain`` while it finishes the calls in flight,
    ``close`` once both planes stopped."""

    def failure(self, exc: BaseException) -> str: ...

    def started(self, serving: Callable[[bool], None]) -> None: ...

    def refuse(self) -> None: ...

    def drain(self, timeout: float) -> None: ...

    def close(self) -> None: ...


class PlanHandler(Handler, Protocol):
    """A handler of the PartitionService (:func:`plan_service`): what it serves (the plan,
    the device, the tensors a request carries and its reply returns, for ``Describe``), and
    the answer to one gRPC request and to one data-plane call (their failures become
    statuses as :func:`~edgesplit.transport.answer` makes them)."""

    @property
    def plan_id(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def inputs(self) -> Sequence[str]: ...

    @property
    def outputs(self) -> Sequence[str]: ...

    def reply_pb(self, request: pb.Bundle, context: grpc.ServicerContext) -> pb.Bundle: ...

    def answer_frame(self, frame: Frame, context: grpc.ServicerContext) -> Frame: ...


H = TypeVar("H", bound=Handler)
T = TypeVar("T")
AddServicer = Callable[[grpc.Server], None]  # registers a service's servicer on a server


class _Shell(Protocol):
    def check_token(self, context: grpc.ServicerContext) -> None: ...

    def describe(self) -> pb.Description: ...


Requests = Callable[[Iterator[pb.Bundle], grpc.ServicerContext], Iterator[pb.Bundle]]


class Servicer(pb_grpc.PartitionServiceServicer):
    """The PartitionService of ``shell`` (its token checked on every call) answered by
    ``handler``. ``requests`` reads a stream's requests (the shell's idle limit, say; by
    default they are read as they come)."""

    def __init__(self, shell: _Shell, handler: PlanHandler, requests: Requests | None = None
                 ) -> None:
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
        return self.shell.describe()


class WorkerSlots:
    """The ``workers`` slots that a server's calls share, over gRPC and the data plane alike
    (:meth:`take` one, :meth:`give` it back). A call that finds none free before its
    deadline (``timeout_s`` without one) is refused as ``device`` busy with ``busy``; once the
    server stops (:meth:`close`), UNAVAILABLE: its client should retry elsewhere, not back
    off from a busy server. Made by a server's assembly, handed to its handler's parts and
    to its shell, which closes and drains it when it stops."""

    def __init__(self, workers: int, device: str, busy: str, timeout_s: float) -> None:
        self.workers, self.device, self.busy, self.timeout_s = workers, device, busy, timeout_s
        self._slots = Slots(workers)
        self.give = self._slots.give  # bound once: every call gives one back
        self.stopping = False

    def take(self, context: grpc.ServicerContext | None) -> None:
        """One slot (give it back with :meth:`give`), or BadRequest once the call's deadline
        passed waiting (UNAVAILABLE once the server stops)."""
        if self._slots.take_free():  # the usual case: no deadline to work out
            return
        if not self._slots.take(remaining_timeout(context, self.timeout_s)):
            self.check_running()
            check_alive(context, self.device)
            raise BadRequest(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"device {self.device!r} is busy with {self.busy}")

    def check_running(self) -> None:
        """BadRequest UNAVAILABLE once the server began to stop."""
        if self.stopping:
            raise BadRequest(grpc.StatusCode.UNAVAILABLE,
                             f"device {self.device!r} is shutting down")

    def drain(self, timeout: float) -> None:
        """Wait at most ``timeout`` for the calls waiting for a slot to have one."""
        self._slots.drain(timeout)

    def close(self) -> None:
        """Take no more work: every call waiting for a slot is answered at once."""
        self.stopping = True
        self._slots.close()


@final
class ServingShell(GrpcServer, Generic[H]):
    """Serves ``handler`` over gRPC and, beside it, the data plane: length-prefixed frames
    over TCP (:class:`~edgesplit.transport.frames.FrameServer`) carrying the same calls,
    under ``options``' token, TLS and connection limits and the server's auth throttle, each
    message at most ``limit`` bytes; ``slots`` bound the calls served at once (and size
    gRPC's thread pool). :meth:`start` opens the data plane on ``options.data_port`` (None:
    none) and names it in ``data_port``; :meth:`stop` closes it before gRPC. A context
    manager: leaving the ``with`` stops it at once.

    ``service``: the gRPC service the handler answers, as a function of the shell that
    returns what registers its servicer (None: the PartitionService, :func:`plan_service`,
    for a :class:`PlanHandler`). Another service has no data plane: its ``options`` must
    say ``data_port=None``. Either way the choice is made here once; no call pays for it."""

    def __init__(self, handler: H, options: ServeOptions, *, limit: int,
                 slots: WorkerSlots,
                 service: Callable[[ServingShell[H]], AddServicer] | None = None) -> None:
        if service is not None and options.data_port is not None:
            raise ValueError("the data plane carries the PartitionService's calls only: "
                             "serve another service with data_port=None")
        self.handler, self.options, self.slots, self.limit = handler, options, slots, limit
        # the PartitionService's handler, for Describe and the data plane (bound once)
        self._plan = cast(PlanHandler, handler)
        self.token, self.tls = options.token, options.tls
        if options.limits is not None:  # idle and slow callers' timeouts, frames' memory
            self.limits = options.limits
        self.data_port: int | None = None  # the data plane's port once started (None: none)
        self._frames: FrameServer | None = None
        self._token_checked: object = None  # the call metadata last found to hold the token
        self._stopping = False
        self._health_lock = threading.Lock()  # a part's health never says SERVING once stopped
        self._init_grpc((service or plan_service)(self), limit, slots.workers)

    def __enter__(self) -> ServingShell[H]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(0)

    # ---- what both planes share ----------------------------------------------------------
    def describe(self) -> pb.Description:
        """What this server serves (``Describe``): its plan, device, tensors, message limit
        and data-plane port (0: none)."""
        handler = self._plan
        return pb.Description(plan_id=handler.plan_id, plan_version=PLAN_VERSION,
                              device=handler.device, inputs=list(handler.inputs),
                              outputs=list(handler.outputs), max_message_bytes=self.limit,
                              data_port=self.data_port or 0)

    def take_slot(self, context: grpc.ServicerContext | None) -> None:
        """One of the server's worker slots (:meth:`WorkerSlots.take`)."""
        self.slots.take(context)

    def give_slot(self) -> None:
        """Give back the slot :meth:`take_slot` took."""
        self.slots.give()

    def serve_call(self, context: grpc.ServicerContext, work: Callable[[], T]) -> T:
        """Answer one unary call of a handler's own service (not the PartitionService's):
        the caller's token checked, ``work()`` run in one of the worker slots, its failure
        the call's status as :func:`~edgesplit.transport.answer` makes it (an unexpected one
        INTERNAL with the handler's sentence)."""
        self.check_token(context)
        return answer(context, lambda: self._in_slot(context, work), self.handler.failure)

    def _in_slot(self, context: grpc.ServicerContext, work: Callable[[], T]) -> T:
        self.slots.take(context)
        try:
            return work()
        finally:
            self.slots.give()

    # ---- start and stop ------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen for gRPC on host:port (0: any free port) and for the data plane on the port
        asked for, of the same host; returns the gRPC port. The handler's parts then start
        (a deployment's health, say, is the server's from here on)."""
        bound = super().start(host, port)
        if self.options.data_port is not None:
            self._frames, self.data_port = self._open_data_plane(host, self.options.data_port)
        self.handler.started(self._serving)
        return bound

    def _serving(self, ok: bool) -> None:
        """Set the server's health (a part's, as it changes), never SERVING once it stops."""
        from grpc_health.v1 import health_pb2

        status = health_pb2.HealthCheckResponse
        with self._health_lock:
            if not self._stopping:
                self.health.set("", status.SERVING if ok else status.NOT_SERVING)

    def _open_data_plane(self, host: str, port: int) -> tuple[FrameServer, int]:
        """A started frame server and its port. When the port cannot be opened, the gRPC
        server (just started) stops and a ConfigError says what to change."""
        frames = FrameServer(self._frame_call, self._limit, self.tls, token=self.token,
                             limits=self.options.limits, throttle=self.throttle)
        try:
            return frames, frames.start(host, port)
        except OSError as exc:
            GrpcServer.stop(self, 0)
            raise ConfigError(f"cannot open the data plane on {host}:{port} "
                              f"({exc.strerror or exc}): pick another {option('data_port')} "
                              "or turn it off") from None

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new calls and finish the ones in flight on both planes, those still waiting
        for a slot (or a part's worker, a star sink's parked joins) included, for up to
        ``grace_s``; what still waits then is answered UNAVAILABLE (at once with ``grace_s``
        0); then the handler's parts close (a batcher, the next hop, a deployment). A request
        that came in just before a SIGTERM is served, not refused: it was sent to this
        server."""
        with self._health_lock:
            self._stopping = True
        self.slots.stopping = True
        deadline = time.monotonic() + grace_s  # the grace of the whole stop, not each part's

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        try:
            if self._frames is not None:
                self._frames.stop(left())
            super().stop(left())
            # in-process (loopback) callers, which no plane counts
            self.slots.drain(left())
            self.handler.drain(left())
        finally:
            self.slots.close()  # first: a woken wait for a part's worker reads it
            self.handler.refuse()
        self.handler.close()

    # ---- the data plane ------------------------------------------------------------------
    def _frame_call(self, frame: Frame, context: FrameContext) -> Frame:
        """Answer one data-plane call: the same token check, errors and work as over gRPC."""
        call = cast(grpc.ServicerContext, context)  # the part of it our handlers use
        handler = self._plan
        try:
            metadata = context.invocation_metadata()
            if metadata is not self._token_checked:  # a connection's repeated metadata
                self.check_token(call)                # is one object, checked once
                self._token_checked = metadata
            try:  # answer()'s work, without a closure per call on the hot path
                return handler.answer_frame(frame, call)
            except Exception as exc:
                abort_for(call, exc, handler.failure)
        except Aborted:
            return failure(frame.request_id, context.code or grpc.StatusCode.UNKNOWN,
                           context.details)


def plan_service(shell: ServingShell[Any]) -> AddServicer:
    """The PartitionService answered by ``shell``'s handler (a :class:`PlanHandler`), its
    streams' requests read under the shell's idle limit: what a shell serves by default."""
    servicer = Servicer(shell, shell.handler, shell.idle_limited)
    return lambda server: pb_grpc.add_PartitionServiceServicer_to_server(servicer, server)


# ---- the next device ------------------------------------------------------------------------
class _Hop(Protocol):  # a Hop, or a mesh root's Fanout
    def wire_size(self, message: Message) -> int: ...

    def run(self, message: Message, timeout: float | None, metadata: Metadata,
            context: Any = None) -> Any: ...

    def close(self) -> None: ...


def open_hop(address: str | LoopbackChannel, limit: int, options: ServeOptions) -> Hop:
    """The next device at ``address``, reached as ``options`` say (TLS, data plane)."""
    return Hop(address, limit, options.tls, options.data_plane)


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

    def forward(self, out: Message, context: grpc.ServicerContext | None,
                timings: dict[str, float], key: str, t0: float) -> Message:
        """:meth:`send` ``out``, made since ``t0`` (``time.perf_counter()``): that time is
        added to ``timings[key]`` (the sender's serialize time), and the reply's timings
        (the devices after it) to ``timings``."""
        timings[key] = timings.get(key, 0.0) + (time.perf_counter() - t0) * 1e3
        reply = self.send(out, context)
        timings.update(reply.timings_ms)
        return reply

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

    def close(self) -> None:
        self.hop.close()


# ---- what every server says alike -----------------------------------------------------------
def check_request_plan(request: Any, plan_id: str) -> None:
    """Refuse (FAILED_PRECONDITION) a request (a Bundle or a Message) made for another plan
    than ``plan_id`` at this plan version."""
    if request.plan_id != plan_id or request.plan_version != PLAN_VERSION:
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                         f"plan mismatch: this server runs plan {plan_id} (version "
                         f"{PLAN_VERSION}), the request is for {request.plan_id or '?'} "
                         f"(version {request.plan_version}); start both sides from the "
                         "same plan file")


def failure_of(device: str, work: str) -> Callable[[BaseException], str]:
    """A server's sentence for an unexpected failure of one ``work`` (a request, a step) on
    ``device``; the failure is logged with its traceback."""
    def failure_text(exc: BaseException) -> str:
        log.exception("device %s failed on a %s", device, work)
        return f"device {device!r} failed on this {work}: {type(exc).__name__}: {exc}"

    return failure_text


def check_served(device: str, *, first: bool, client: str) -> None:
    """Refuse (ConfigError) to serve the chain's first device: it runs in the ``client``
    command."""
    if first:
        raise ConfigError(f"device {device!r} is the first of the chain: it runs in the "
                          f"client ({client}), not as a server")


def check_next(device: str, after: str | None, address: object) -> None:
    """Refuse (ConfigError) a device that sends to ``after`` without its ``address``."""
    if after is not None and address is None:
        raise ConfigError(f"device {device!r} sends to {after!r}: give its address with "
                          f"{option('next_address', 'HOST:PORT', flag='--next')}")
