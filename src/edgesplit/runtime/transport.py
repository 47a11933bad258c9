"""gRPC transport for split inference: a server per device (``PartitionServer``) and the
client that runs device 0 and drives the chain (``ChainClient``). Star plans (sources joined by
one sink) use the same server; the sink's join and the client that drives a star are in
:mod:`edgesplit.runtime.star`.

The service (``proto/edgesplit_runtime.proto``) carries wire-format tensor messages. Every
request names its plan (``plan_id`` and schema version) so both ends provably run the same
plan; a bearer token (metadata ``authorization: Bearer ...``) and TLS are optional. A request
that is malformed (unknown or missing tensors, wrong shape or dtype, corrupt bytes) fails alone
with INVALID_ARGUMENT and a message naming the problem; the server keeps serving others.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import grpc
import torch

from edgesplit.errors import ConfigError, RemoteError, WireError, option
from edgesplit.hardware import Link
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime.calls import RETRYABLE, rpc_failed_with, runs_plan, with_retries
from edgesplit.runtime.dataplane import (
    DataPlane,
    Hop,
    Message,
    Part,
    as_part,
    open_data_plane,
    reply_of,
)
from edgesplit.runtime.fastpath import FastPath
from edgesplit.runtime.program import DeviceStep, PlanProgram
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.runtime.shell import Servicer, check_request_plan
from edgesplit.transport import (
    TOKEN_ENV,
    BadRequest,
    GrpcServer,
    LoopbackChannel,
    TlsFiles,
    answer,
    bearer_metadata,
    check_alive,
    check_tls_pair,
    deadline_of,
    explain,
    open_channel,
    read_token,
    remaining_timeout,
    serve_forever,
)
from edgesplit.transport.frames import (
    REPLY,
    Frame,
    FrameContext,
    FrameServer,
    MetaCache,
    failure,
)
from edgesplit.transport.limits import ConnectionLimits
from edgesplit.transport.loopback import Aborted
from edgesplit.transport.shaping import LinkShaper
from edgesplit.transport.slots import Slots

if TYPE_CHECKING:  # the star module imports this one
    from edgesplit.runtime.batching import Batcher
    from edgesplit.runtime.mesh import Fanout
    from edgesplit.runtime.ray_engine import RayEngine
    from edgesplit.runtime.star import Join

__all__ = [
    "JOIN_KEY",
    "SESSION_KEY",
    "TOKEN_ENV",
    "ChainClient",
    "GrpcServer",
    "PartitionServer",
    "RequestResult",
    "TlsFiles",
    "address_name",
    "check_tls_pair",
    "connect",
    "decode_planned",
    "explain_failure",
    "max_message_bytes",
    "open_channel",
    "plan_device",
    "read_token",
    "serve_forever",
]

log = logging.getLogger(__name__)

SESSION_KEY = "edgesplit-session"  # call metadata naming the client session (backend state)
# call metadata joining a star's source requests at its sink (one key per client request)
JOIN_KEY = "edgesplit-join"
MAX_SESSIONS = 1024  # sessions whose backend state a server keeps (the oldest go first)

def max_message_bytes(program: PlanProgram) -> int:
    """The largest message the plan can need: every tensor that may travel, at float32, plus
    headers. Anything larger is refused by gRPC itself (RESOURCE_EXHAUSTED)."""
    names = {t for s in program.steps for t in (*s.receives, *s.sends, *s.returns)}
    tensors = program.graph.tensors
    payload = sum(max(tensors[t].bytes, tensors[t].elements * 4) + 256 for t in names)
    return max(64 * 1024, int(payload * 1.25) + 16 * 1024)


def plan_device(program: PlanProgram, device: str) -> str:
    """The plan's name for ``device``: a plan device's own name (edge, cloud, a hop), or the
    preset it was planned with when exactly one plan device uses that preset."""
    names = [s.name for s in program.steps]
    if device in names:
        return device
    matches = [d.name for d in program.plan.devices if d.device.name == device]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ConfigError(f"{len(matches)} plan devices use {device!r} ({', '.join(matches)}): "
                          "name one of them")
    presets = ", ".join(f"{d.name} ({d.device.name})" for d in program.plan.devices)
    raise ConfigError(f"device {device!r} is not in the plan; its devices are {presets}")


def _links(program: PlanProgram, step: DeviceStep) -> tuple[Link | None, Link | None]:
    """The plan links ``step`` replies over and sends over (None: none). A star's source has
    no link before it (its inputs are its own); the sink shapes each reply on its source's
    link itself."""
    if program.kind == "star":
        from edgesplit.runtime.star import star_link

        return None, (star_link(program, step.name) if step.sends else None)
    if program.kind == "mesh":  # the root's fan-out and the aggregator's join shape their own
        before = {b: a for a, b in program.hops.items() if b != program.sink}
        before |= dict.fromkeys(program.sources, str(program.root))
        up, down = before.get(step.name), program.next_device(step)
        return (_link_between(program, up, step.name) if up and step.name != program.sink
                else None, _link_between(program, step.name, down) if down else None)
    return (_link_before(program, step.index),
            _link_before(program, step.index + 1) if step.sends else None)


def _link_before(program: PlanProgram, device_index: int):
    """The plan's link between device i-1 and i (None for device 0)."""
    if device_index == 0:
        return None
    names = [s.name for s in program.steps]
    return _link_between(program, names[device_index - 1], names[device_index])


def _link_between(program: PlanProgram, a: str, b: str) -> Link:
    """The plan's link between devices ``a`` and ``b``."""
    for link in program.plan.links:
        if {link.src, link.dst} == {a, b}:
            return link.link
    raise ConfigError(f"the plan has no link between {a!r} and {b!r}")


# ---- server ---------------------------------------------------------------------------------
DEFAULT_MAX_BATCH = 32  # batches up to this many requests where the partition allows it


def _batcher(program: PlanProgram, device: str, max_batch: int | None, max_wait_ms: float
             ) -> tuple[Batcher | None, str]:
    """Dynamic batching for ``device`` (``max_batch`` None: up to DEFAULT_MAX_BATCH where
    the partition allows it; 1: none), and a few words saying what was decided."""
    from edgesplit.runtime.batching import Batcher, flexible_step

    limit = DEFAULT_MAX_BATCH if max_batch is None else max_batch
    if limit <= 1:
        return None, "off"
    flexible = flexible_step(program, device)
    if isinstance(flexible, str):
        log.warning("device %s serves requests one by one: %s", device, flexible)
        return None, f"off ({flexible})"
    return (Batcher(program.step(device), flexible, limit, max_wait_ms, flexible=True),
            f"up to {limit}")


class PartitionServer(GrpcServer):
    """Serves one device's partition; a middle hop forwards to ``next_address``.

    In a star plan (and a mesh's branches: :mod:`edgesplit.runtime.mesh`; its root gets one
    ``next_address`` per branch) a source forwards to the sink (``next_address``) like a
    middle hop, its join key travelling on; the sink joins its sources' calls (see
    :class:`edgesplit.runtime.star.Join`: ``join_timeout_s``, ``max_joins``), computes on
    ``max_workers`` workers, each taken only by a complete join (a part waiting for the other
    sources is parked and holds none; a source's call waiting for the sink holds none of the
    source's either), and does not batch (``max_batch > 1`` is refused: each join already
    computes once).

    Besides gRPC, :meth:`start` opens the data plane (length-prefixed frames over TCP,
    :mod:`edgesplit.transport.frames`) on ``data_port`` (0: any free port; None: none) and
    names it in ``Describe``; a chain's calls go there unless the client says ``grpc``. A
    star's devices serve gRPC only. ``data_plane`` says how this server calls the next hop.

    With ``engine`` (a :class:`~edgesplit.runtime.ray_engine.RayEngine`) this server is an
    ingress: it checks and decodes each request as always, and the engine's deployment computes
    it (and batches); health follows the deployment's, and :meth:`stop` shuts it down too."""

    def __init__(self, program: PlanProgram, device: str, *,
                 next_address: str | LoopbackChannel | Mapping[str, str | LoopbackChannel]
                 | None = None,
                 token: str | None = None, tls: TlsFiles | None = None, shape: bool = False,
                 max_workers: int = 32, next_timeout_s: float = 60.0,
                 max_batch: int | None = None, max_wait_ms: float = 0.0,
                 join_timeout_s: float = 10.0, max_joins: int = 256,
                 data_port: int | None = 0, data_plane: DataPlane = "auto",
                 engine: RayEngine | None = None, limits: ConnectionLimits | None = None
                 ) -> None:
        self.program, self.step = program, program.step(plan_device(program, device))
        # the timing names this server reports, built once (a request's path stays short)
        self._ser_key = f"{self.step.name}.serialize_ms"
        self._compute_key = f"{self.step.name}.compute_ms"
        device = self.step.name
        if program.kind != "star" and self.step.index == 0:
            raise ConfigError(f"device {device!r} is the first of the chain: it runs in the "
                              "client (`edgesplit run`), not as a server")
        nxt = program.next_device(self.step)
        if device == program.root:  # a mesh's root: one address per branch
            nxt = ", ".join(program.sources)
            if not isinstance(next_address, Mapping):
                from edgesplit.runtime.mesh import check_branches

                check_branches(program, {})
        elif isinstance(next_address, Mapping):
            flag = option("next_address", "HOST:PORT", flag="--next")
            raise ConfigError(f"device {device!r} sends to one device, {nxt!r}: give its "
                              f"address alone ({flag})")
        if nxt is not None and next_address is None:
            raise ConfigError(f"device {device!r} sends to {nxt!r}: give its address with "
                              f"{option('next_address', 'HOST:PORT', flag='--next')}")
        self.token, self.tls = token, tls
        # idle and slow callers' timeouts, the data plane's memory budget (None: defaults)
        self._limits = limits
        if limits is not None:
            self.limits = limits
        self.batcher: Batcher | None = None
        self.batching = "off"
        self.join: Join | None = None
        self.engine = engine
        if engine is not None:  # the deployment computes and batches
            if engine.device != device:
                raise ConfigError(f"the engine runs device {engine.device!r}, not {device!r}")
            self.batching = "in the engine"
        elif device == program.sink:  # a star's sink, a mesh's aggregator
            from edgesplit.runtime.star import Join

            if max_batch is not None and max_batch > 1:
                raise ConfigError(f"device {device!r} joins a star's sources and computes each "
                                  f"request once: it does not batch ({option('max_batch', 1)})")
            self.join = Join(self, join_timeout_s, max_joins, shape, max_workers)
            # threads for the parts parked in the join table (they compute nothing) and the
            # callers of the joins being computed: a parked part never queues another
            sources = len(program.sources)
            max_workers = max_workers * sources + max_joins * (sources - 1)
        elif self.step.partition is not None and self.step.emulate_ms is None:  # emulation paces
            self.batcher, self.batching = _batcher(program, device, max_batch, max_wait_ms)
        # a star source (a mesh's branch) computes on max_workers workers, then waits for the
        # sink's join holding none (a worker held across that wait deadlocks sources on each
        # other)
        self._computing: Slots | None = None
        if device in program.sources:
            self._computing = Slots(max_workers)
            max_workers += max_joins
        self._stopping = False
        self.limit = max_message_bytes(program)
        upstream, downstream = _links(program, self.step)
        self.upstream = LinkShaper(upstream, shape)  # replies
        self.downstream = LinkShaper(downstream, shape)
        self.next_timeout_s = next_timeout_s
        self._states: OrderedDict[str, Any] = OrderedDict()  # backend state per session
        self._states_lock = threading.Lock()
        self._next: Hop | Fanout | None = None
        if isinstance(next_address, Mapping):
            from edgesplit.runtime.mesh import Fanout

            self._next = Fanout(program, next_address, self.limit, tls, data_plane, shape)
        elif next_address is not None:
            self._next = Hop(next_address, self.limit, tls, data_plane)
        self._frames: FrameServer | None = None
        # a join's parts, and a branch's call cancelled with its siblings, travel over gRPC
        joined = device in program.sources or device == program.sink
        self._want_data_port = None if joined else data_port
        self.data_port: int | None = None
        self._slots = Slots(max_workers)  # the data plane's workers
        self._token_checked: object = None  # the call metadata last found to hold the token
        self._reply_metas = MetaCache()
        self._fast = FastPath(self)
        # a request's path, chosen once: a star's sink (a mesh's aggregator) joins its
        # sources' calls; any other device decodes, computes (in the engine's deployment or
        # here) and forwards what it sends
        self._reply_pb = self.join.handle if self.join is not None else self._chain_reply_pb
        self._compute_step = self._engine_compute if engine is not None else self._compute
        self._init_grpc(lambda server: pb_grpc.add_PartitionServiceServicer_to_server(
            Servicer(self, self, self.idle_limited), server), self.limit, max_workers)

    # ---- the shell's handler -------------------------------------------------------------
    @property
    def plan_id(self) -> str:
        return self.program.plan_id

    def describe(self) -> pb.Description:
        """What this server serves (gRPC's ``Describe``): its plan, device, tensors, message
        limit and data-plane port (0: none)."""
        step = self.step
        return pb.Description(plan_id=self.program.plan_id, plan_version=PLAN_VERSION,
                              device=step.name, inputs=list(step.receives),
                              outputs=list(step.returns), max_message_bytes=self.limit,
                              data_port=self.data_port or 0)

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen for gRPC on host:port (0 = any free port), and for the data plane on
        ``data_port`` of the same host; returns the gRPC port."""
        bound = super().start(host, port)
        if self.engine is not None:
            from grpc_health.v1 import health_pb2

            status = health_pb2.HealthCheckResponse
            self.engine.watch(lambda ok: self.health.set(
                "", status.SERVING if ok else status.NOT_SERVING))
        if self._want_data_port is not None:
            self._frames, self.data_port = open_data_plane(
                self._frame_call, self.limit, self.tls, host, self._want_data_port,
                lambda: GrpcServer.stop(self, 0),  # the gRPC server just started
                token=self.token, limits=self._limits, throttle=self.throttle)
        return bound

    def stop(self, grace_s: float = 5.0) -> None:
        """Finish requests in flight (up to ``grace_s``), refuse new ones; then shut the
        engine's deployment down. Calls waiting for a worker, and a star sink's parked
        joins, are answered UNAVAILABLE: their clients may retry on another server."""
        self._stopping = True
        for slots in (self._slots, self._computing):
            if slots is not None:
                slots.close()
        if self.join is not None:
            self.join.close()
        if self.engine is not None:  # its health watch must not say SERVING again
            self.engine.stop_watching()
        if self._frames is not None:
            self._frames.stop(grace_s)
        super().stop(grace_s)
        if self.batcher is not None:
            self.batcher.close()
        if self._next is not None:
            self._next.close()
        if self.engine is not None:
            self.engine.close()

    def session_state(self, context: grpc.ServicerContext | None) -> Any:
        """The backend state of the caller's session (metadata ``edgesplit-session``), made
        on its first request; None without a session or with a stateless backend. The oldest
        sessions are forgotten beyond ``MAX_SESSIONS`` (a client cannot grow memory without
        bound)."""
        session = dict(context.invocation_metadata()).get(SESSION_KEY) if context else None
        if not isinstance(session, str) or self.step.partition is None:
            return None
        with self._states_lock:
            if session in self._states:
                self._states.move_to_end(session)
                return self._states[session]
            state = self.step.backend.new_state(self.step)
            if state is not None:
                self._states[session] = state
                while len(self._states) > MAX_SESSIONS:
                    self._states.popitem(last=False)
            return state

    # ---- requests ----------------------------------------------------------------------------
    def failure(self, exc: BaseException) -> str:
        log.exception("device %s failed on a request", self.step.name)
        return f"device {self.step.name!r} failed on this request: {type(exc).__name__}: {exc}"

    def check_plan(self, request: pb.Bundle) -> None:
        """Refuse (FAILED_PRECONDITION) a request made for another plan."""
        check_request_plan(request, self.program.plan_id)

    def _decode(self, request: pb.Bundle) -> dict[str, torch.Tensor]:
        self.check_plan(request)
        names = [t.name for t in request.tensors]
        expected = set(self.step.receives)
        if set(names) != expected or len(names) != len(expected):
            raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                              f"device {self.step.name!r} expects tensors {sorted(expected)}, "
                              f"got {names}")
        return self.decode_tensors(request)

    def decode_tensors(self, request: pb.Bundle) -> dict[str, torch.Tensor]:
        """The request's tensors (names already checked), each of the plan's shape and dtype."""
        values = {}
        for t in request.tensors:
            try:  # shape and dtype checked from the header, before anything is allocated
                values[t.name] = decode_planned(self.program, t.name, t.data)
            except WireError as exc:
                raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"tensor {t.name!r}: {exc}; the plan says "
                                  f"{_planned(self.program, t.name)}") from None
        return values

    def reply_pb(self, request: pb.Bundle, context: grpc.ServicerContext | None = None
                 ) -> pb.Bundle:
        """Answer one gRPC request, the reply's time on the link included."""
        return self._reply_pb(request, context)

    def _chain_reply_pb(self, request: pb.Bundle, context: grpc.ServicerContext | None
                        ) -> pb.Bundle:
        reply = self.handle(request, context).to_pb()
        self.upstream.send(reply.ByteSize(), "down")
        return reply

    def _frame_call(self, frame: Frame, context: FrameContext) -> Frame:
        """Answer one data-plane call: the same checks, errors and work as over gRPC."""
        call = cast(grpc.ServicerContext, context)  # the part of it our servicers use
        try:
            metadata = context.invocation_metadata()
            if metadata is not self._token_checked:  # a connection's repeated metadata
                self.check_token(call)                # is one object, checked once
                self._token_checked = metadata
            run = self._fast.reply if self._fast.fits(frame) else self._handle_slot
            out = answer(call, lambda: run(frame, call), self.failure)
        except Aborted:
            return failure(frame.request_id, context.code or grpc.StatusCode.UNKNOWN,
                           context.details)
        if self.upstream.enabled:
            self.upstream.send(out.nbytes(), "down")
        return out

    def _handle_slot(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """At most ``max_workers`` requests at once, as gRPC's thread pool allows; a request
        that waits for a slot past its deadline is dropped."""
        request = Message.from_frame(frame)
        self.take_slot(context)
        try:
            return self.reply_frame(self.handle(request, context))
        finally:
            self._slots.give()

    def reply_frame(self, reply: Message) -> Frame:
        """``reply`` as the data plane's answer (its meta encoded once while it repeats)."""
        return self._reply_metas.fill(reply.to_frame(REPLY))

    def take_slot(self, context: grpc.ServicerContext) -> None:
        """One of the data plane's ``max_workers`` slots (give it back with
        :meth:`give_slot`), or BadRequest once the request's deadline passed waiting."""
        if not self._slots.take(remaining_timeout(context, self.next_timeout_s)):
            self._check_running()
            check_alive(context, self.step.name)
            raise BadRequest(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"device {self.step.name!r} is busy with {option('max_workers')} "
                             "requests")

    def give_slot(self) -> None:
        """Give back the slot :meth:`take_slot` took."""
        self._slots.give()

    def _check_running(self) -> None:
        """BadRequest UNAVAILABLE once :meth:`stop` began (not RESOURCE_EXHAUSTED: the
        client should retry elsewhere, not back off from a busy server)."""
        if self._stopping:
            raise BadRequest(grpc.StatusCode.UNAVAILABLE,
                             f"device {self.step.name!r} is shutting down")

    def handle(self, request: pb.Bundle | Message,
               context: grpc.ServicerContext | None = None) -> Message:
        """Answer one chain request (gRPC's or the data plane's); ``context`` (the caller's
        call) gives the deadline and cancellation that travel down the chain."""
        t_in = time.perf_counter()
        values = self._decode(request)
        timings: dict[str, float] = {self._ser_key: (time.perf_counter() - t_in) * 1e3}
        check_alive(context, self.step.name)  # the client may have given up while we queued
        values = self._compute_step(values, context, timings)
        downstream: dict[str, bytes] = {}
        if self.step.sends:
            downstream, more = self.forward(request, values, context, timings)
            timings.update(more)
        t1 = time.perf_counter()
        parts = []
        for name in self.step.returns:
            data = downstream.get(name)
            parts.append(Part(name, data if data is not None else encode_tensor(values[name], 32)))
        timings[self._ser_key] = timings.get(self._ser_key, 0.0) + (time.perf_counter() - t1) * 1e3
        return Message(self.program.plan_id, PLAN_VERSION, request.request_id, parts, timings)

    def _engine_compute(self, values: dict[str, torch.Tensor],
                        context: grpc.ServicerContext | None, timings: dict[str, float]
                        ) -> dict[str, torch.Tensor]:
        """The deployment's compute, and the hop to it (their timings added)."""
        assert self.engine is not None
        values, more = self.engine.compute(values,
                                           remaining_timeout(context, self.next_timeout_s))
        timings.update(more)
        return values

    def _compute(self, values: dict[str, torch.Tensor], context: grpc.ServicerContext | None,
                 timings: dict[str, float]) -> dict[str, torch.Tensor]:
        computing = self._computing
        if computing is not None and not computing.take(
                remaining_timeout(context, self.next_timeout_s)):
            self._check_running()
            raise BadRequest(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"device {self.step.name!r}: the caller's deadline passed while "
                             f"its {option('max_workers')} workers were busy")
        try:
            return self._compute_now(values, context, timings)
        finally:
            if computing is not None:
                computing.give()

    def _compute_now(self, values: dict[str, torch.Tensor],
                     context: grpc.ServicerContext | None, timings: dict[str, float]
                     ) -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        state = self.session_state(context)
        if state is None:
            batcher = self.batcher
            values = batcher.compute(values, deadline_of(context)) if batcher is not None \
                else self.step.compute(values)
        else:  # a session's state is its own: no batching across sessions
            values = self.step.compute(values, state)
        timings[self._compute_key] = (time.perf_counter() - t0) * 1e3
        if self.step.emulate_ms is not None:  # compute emulation: the time slept
            timings.update(self.step.emulation_timings())
        return values

    def forward(self, request: pb.Bundle | Message, values: Mapping[str, torch.Tensor],
                context: grpc.ServicerContext | None, timings: dict[str, float]
                ) -> tuple[dict[str, Any], dict[str, float]]:
        """Send this step's ``sends`` of ``values`` to the next hop (its serialize time added
        to ``timings``, its link shaped); the next hop's reply tensors (still encoded) and
        timings."""
        t0 = time.perf_counter()
        encoded = self.program.encode(self.step, values, self.step.sends)
        out = Message(request.plan_id, request.plan_version, request.request_id,
                      [Part(name, data) for name, data in encoded.items()])
        key = f"{self.step.name}.serialize_ms"
        timings[key] = timings.get(key, 0.0) + (time.perf_counter() - t0) * 1e3
        if self.downstream.enabled:
            assert self._next is not None
            self.downstream.send(self._next.wire_size(out), "up")
        return self._call_next(out, context)

    def _call_next(self, out: Message, context: grpc.ServicerContext | None
                   ) -> tuple[dict[str, Any], dict[str, float]]:
        """Forward within what is left of the caller's deadline, and cancel the downstream
        call when the caller gives up, so abandoned requests free every hop's workers."""
        metadata = context.invocation_metadata() if context is not None else ()
        # the token and the session travel on: every hop keeps the session's backend state;
        # so does a star's join key, which the sink joins its sources' requests by
        auth = [(k, v) for k, v in metadata if k in ("authorization", SESSION_KEY, JOIN_KEY)]
        check_alive(context, self.step.name)
        timeout = remaining_timeout(context, self.next_timeout_s)
        assert self._next is not None  # a step that sends was given a next address
        try:
            reply = self._next.run(out, timeout, auth, context)
        except grpc.FutureCancelledError:
            raise BadRequest(grpc.StatusCode.CANCELLED, "the caller cancelled the request"
                              ) from None
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                raise BadRequest(exc.code(), f"next hop after {self.step.name!r}: "
                                  f"{exc.code().name}: {exc.details()}") from None
            raise RemoteError(f"next hop after {self.step.name!r} failed: "
                              f"{exc.code().name}: {exc.details()}") from None
        return {t.name: t.data for t in reply.tensors}, dict(reply.timings_ms)


# ---- client ---------------------------------------------------------------------------------
# a reply as the client reads it: request id, the hops' timings, outputs by name, decode ms
Reply = tuple[int, dict[str, float], dict[str, torch.Tensor], float]


@dataclass
class RequestResult:
    request_id: int
    outputs: tuple[torch.Tensor, ...]
    breakdown_ms: dict[str, float]  # edge, serialize, transfer, remote, total
    hops_ms: dict[str, float] = field(default_factory=dict)  # what each server reported


class ChainClient:
    """Runs device 0's partition and sends the rest of the chain to ``address``: over the
    server's data plane when it offers one (``data_plane="auto"``, the default; ``"tcp"``
    insists on it), else, or with ``"grpc"``, over gRPC. Safe to share between threads.
    A mesh whose root is device 0: ``address`` maps each branch device to its address, and
    the client broadcasts to them (:class:`edgesplit.runtime.mesh.Fanout`)."""

    def __init__(self, program: PlanProgram,
                 address: str | LoopbackChannel | Mapping[str, str | LoopbackChannel], *,
                 token: str | None = None,
                 tls: TlsFiles | None = None, shape: bool = False, timeout_s: float = 60.0,
                 retries: int = 0, retry_backoff_s: float = 0.2,
                 session: str | None = None, data_plane: DataPlane = "auto") -> None:
        self.program, self.step = program, program.steps[0]
        self.metadata = bearer_metadata(token)
        if session is not None:  # the servers keep backend state (a KV cache) per session
            self.metadata.append((SESSION_KEY, session))
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, retry_backoff_s
        self.limit = max_message_bytes(program)
        # a mesh's root here: its fan-out shapes each branch's link
        fanout = program.root == self.step.name
        self.shaper = LinkShaper(_link_before(program, 1) if len(program.steps) > 1 and
                                 not fanout else None, shape)
        self._hop: Hop | Fanout
        if isinstance(address, Mapping) or program.root == self.step.name:
            from edgesplit.runtime.mesh import Fanout

            if program.root != self.step.name:
                raise ConfigError("this plan's first device sends to one device: give the "
                                  "second device's address alone, not one per device")
            branches = address if isinstance(address, Mapping) else {}  # {}: says what to give
            self._hop = Fanout(program, branches, self.limit, tls, data_plane, shape)
        else:
            self._hop = Hop(address, self.limit, tls, data_plane)
        self.address = self._hop.address
        self._ids = iter(range(1, 1 << 62))
        self._id_lock = threading.Lock()
        self._plan_checked = False
        self._returns = list(program.steps[1].returns) if len(program.steps) > 1 else []
        self._reply_meta: dict[str, Any] | None = None  # a reply meta found well formed

    def close(self) -> None:
        self._hop.close()

    @property
    def data_plane(self) -> str:
        """How requests travel now: "tcp HOST:PORT" or "grpc" (decided by the first
        :meth:`describe`, which :meth:`request` makes before its first request)."""
        return self._hop.data_plane

    def __enter__(self) -> ChainClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> pb.Description:
        return self._call(self._hop.describe)

    def _call(self, method: Any) -> Any:
        """``method(timeout, metadata)``, retried on UNAVAILABLE and DEADLINE_EXCEEDED."""
        try:
            return with_retries(lambda _: method(self.timeout_s, self.metadata),
                                retries=self.retries, base_s=self.backoff_s,
                                retryable=rpc_failed_with(RETRYABLE))
        except grpc.RpcError as exc:
            raise RemoteError(explain_failure(exc.code(), exc.details(), self.address)
                              ) from None

    def check_plan(self) -> None:
        """Ask the server which plan it runs before sending it tensors: a mismatch is then
        reported as such even when this plan's messages exceed the server's size limit."""
        described = self.describe()
        if not runs_plan(described, self.program.plan_id):
            raise RemoteError(
                f"server {self.address} refused the request: FAILED_PRECONDITION: plan "
                f"mismatch: the server runs plan {described.plan_id} (version "
                f"{described.plan_version}), this client {self.program.plan_id} (version "
                f"{PLAN_VERSION}); start both sides from the same plan file")
        self._plan_checked = True

    def request(self, inputs: Sequence[torch.Tensor] | None = None) -> RequestResult:
        if self.step.sends and not self._plan_checked:
            self.check_plan()
        with self._id_lock:
            request_id = next(self._ids)
        start = time.perf_counter()
        values = self.step.compute(self.program.input_values(inputs))
        edge_ms = (time.perf_counter() - start) * 1e3
        if not self.step.sends:  # edge-only: nothing crosses
            total = (time.perf_counter() - start) * 1e3
            return RequestResult(request_id, tuple(values[t] for t in self.program.outputs),
                                 {"edge": edge_ms, "serialize": 0.0, "transfer": 0.0,
                                  "remote": 0.0, "total": total})
        t0 = time.perf_counter()
        encoded = self._encode(values)
        message = Message(self.program.plan_id, PLAN_VERSION, request_id,
                          [Part(name, data) for name, data in encoded.items()])
        serialize_ms = (time.perf_counter() - t0) * 1e3
        if self.shaper.enabled:
            self.shaper.send(self._hop.wire_size(message), "up")
        # the reply's tensors decode straight from the connection's buffer (no copy first)
        reply_id, hops, remote, decode_ms = self._call(lambda timeout, metadata: self._hop.run(
            message, timeout, metadata, read=self._read_reply, read_frame=self._read_frame))
        if reply_id != request_id:
            raise RemoteError(f"reply for request {reply_id} arrived for request {request_id}")
        serialize_ms += decode_ms
        total = (time.perf_counter() - start) * 1e3  # the request's clock stops here
        remote_ms = 0.0
        for key, ms in hops.items():
            if key.endswith(".compute_ms"):
                remote_ms += ms
            elif key.endswith(".serialize_ms"):
                serialize_ms += ms
        outputs = tuple(values.get(t, remote.get(t)) for t in self.program.outputs)
        if any(o is None for o in outputs):
            raise RemoteError("the chain did not return every model output")
        return RequestResult(request_id, cast(tuple[torch.Tensor, ...], outputs), {
            "edge": edge_ms, "serialize": serialize_ms, "remote": remote_ms,
            "transfer": max(0.0, total - edge_ms - serialize_ms - remote_ms), "total": total},
            hops)


    def _encode(self, values: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The sent tensors' messages; over the data plane a large plain one goes out from
        the tensor's own memory (its header and checksum in front), not copied into bytes."""
        if self._hop.frames is None:
            return self.program.encode(self.step, values, self.step.sends)
        bits, codec = self.step.send_bits, self.program.codec
        return {t: as_part(codec(t).encode_pieces(values[t], bits.get(t, 32)))
                for t in self.step.sends}

    def _read_reply(self, reply: Message) -> Reply:
        """The reply's request id, timings, outputs (decoded) and the milliseconds decoding
        took."""
        t0 = time.perf_counter()
        remote = self._decode_reply(reply)
        return reply.request_id, reply.timings_ms, remote, (time.perf_counter() - t0) * 1e3

    def _read_frame(self, answer: Frame) -> Reply:
        """:meth:`_read_reply` of a data-plane reply, read from its frame: once its meta (the
        same object while a connection's replies repeat it) was found to name this plan's
        outputs in order and its timings, later replies decode their parts without building
        a Message or checking names again. Anything else reads the general way, which says
        what is wrong."""
        meta, parts = answer.meta, answer.parts
        if meta is not self._reply_meta or len(parts) != len(self._returns) + 1:
            read = self._read_reply(reply_of(answer))
            if (meta.get("names") == self._returns and isinstance(meta.get("timings"), list)
                    and len(parts) == len(self._returns) + 1):
                self._reply_meta = meta
            return read
        t0 = time.perf_counter()
        names, decode = meta["timings"], self.program.decode
        try:
            remote = {name: decode(name, data)  # the last part holds the timings
                      for name, data in zip(self._returns, parts, strict=False)}
        except WireError:
            return self._read_reply(reply_of(answer))
        if len(parts[-1]) != 8 * len(names):
            return self._read_reply(reply_of(answer))
        timings = dict(zip(names, struct.unpack(f"<{len(names)}d", parts[-1]), strict=True))
        return answer.request_id, timings, remote, (time.perf_counter() - t0) * 1e3

    def _decode_reply(self, reply: Message) -> dict[str, torch.Tensor]:
        """The outputs a server answered with: only the ones this client waits for, each of
        the plan's shape and dtype (a hostile or broken server cannot make it allocate more)."""
        expected = set(self.program.steps[1].returns)
        names = [t.name for t in reply.tensors]
        if set(names) != expected or len(names) != len(expected):
            raise RemoteError(f"server {self.address} answered with tensors {names}, the plan "
                              f"expects {sorted(expected)}")
        try:
            return {t.name: decode_planned(self.program, t.name, t.data) for t in reply.tensors}
        except WireError as exc:
            raise RemoteError(f"server {self.address} answered with a bad tensor: {exc}"
                              ) from None


def _planned(program: PlanProgram, name: str) -> str:
    info = program.graph.tensors[name]
    return f"shape {list(info.shape)}, dtype {info.dtype}"


def decode_planned(program: PlanProgram, name: str, data: bytes | bytearray | memoryview
                   ) -> torch.Tensor:
    """Decode tensor ``name`` of the plan (:meth:`PlanProgram.decode`): any other shape or
    dtype is refused (WireError) before its payload is decompressed or allocated."""
    return program.decode(name, data)


def connect(address: str | grpc.Channel | LoopbackChannel, limit: int, tls: TlsFiles | None
             ) -> grpc.Channel | LoopbackChannel:
    """A channel to ``address``, or the channel given (a server's ``loopback_channel()``)."""
    return open_channel(address, limit, tls) if isinstance(address, str) else address


def address_name(address: str | grpc.Channel | LoopbackChannel) -> str:
    return address if isinstance(address, str) else "in-process"


def explain_failure(code: grpc.StatusCode, details: str | None, address: str) -> str:
    return explain(code, details, address,
                   unavailable_hint="; is `edgesplit serve` running there? "
                   f"({option('retries')} retries with backoff)",
                   timeout_hint=f"raise {option('timeout_s')}")
