"""The server of split inference: one ``PartitionServer`` per device after the first. Star
plans (sources joined by one sink) use the same server; the sink's join is in
:mod:`edgesplit.runtime.star`. The client that runs device 0 and drives the chain is in
:mod:`edgesplit.runtime.client`.

The service (``proto/edgesplit_runtime.proto``) carries wire-format tensor messages. Every
request names its plan (``plan_id`` and schema version) so both ends provably run the same
plan; a bearer token (metadata ``authorization: Bearer ...``) and TLS are optional. A request
that is malformed (unknown or missing tensors, wrong shape or dtype, corrupt bytes) fails alone
with INVALID_ARGUMENT and a message naming the problem; the server keeps serving others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc
import torch

from edgesplit.errors import ConfigError, WireError, option
from edgesplit.hardware import Link
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime.dataplane import DataPlane, Hop, Message, Part
from edgesplit.runtime.fastpath import FastPath
from edgesplit.runtime.planned import (
    JOIN_KEY,
    SESSION_KEY,
    decode_planned,
    link_before,
    link_between,
    max_message_bytes,
    plan_device,
)
from edgesplit.runtime.program import DeviceStep, PlanProgram
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.runtime.roles import LastHop, Relay, Role, Sink
from edgesplit.runtime.shell import NextHop, Servicer, ServingShell, check_request_plan
from edgesplit.transport import (
    BadRequest,
    LoopbackChannel,
    TlsFiles,
    check_alive,
    deadline_of,
    remaining_timeout,
)
from edgesplit.transport.frames import REPLY, Frame, MetaCache
from edgesplit.transport.limits import ConnectionLimits
from edgesplit.transport.shaping import LinkShaper
from edgesplit.transport.slots import Slots

if TYPE_CHECKING:  # they import this module's neighbours, or need what it serves
    from edgesplit.runtime.batching import Batcher
    from edgesplit.runtime.mesh import Fanout
    from edgesplit.runtime.ray_engine import RayEngine
    from edgesplit.runtime.star import Join

__all__ = ["DEFAULT_MAX_BATCH", "MAX_SESSIONS", "PartitionServer"]

log = logging.getLogger(__name__)

MAX_SESSIONS = 1024  # sessions whose backend state a server keeps (the oldest go first)


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
        return (link_between(program, up, step.name) if up and step.name != program.sink
                else None, link_between(program, step.name, down) if down else None)
    return (link_before(program, step.index),
            link_before(program, step.index + 1) if step.sends else None)


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



class PartitionServer(ServingShell):
    """Serves one device's partition; a middle hop forwards to ``next_address``.

    In a star plan (and a mesh's branches: :mod:`edgesplit.runtime.mesh`; its root gets one
    ``next_address`` per branch) a source forwards to the sink (``next_address``) like a
    middle hop, its join key travelling on; the sink joins its sources' calls (see
    :class:`edgesplit.runtime.star.Join`: ``join_timeout_s``, ``max_joins``), computes on
    ``max_workers`` workers, each taken only by a complete join (a part waiting for the other
    sources is parked and holds none; a source's call waiting for the sink holds none of the
    source's either), and batches complete joins that wait together (``max_batch``, as any
    device).

    Besides gRPC, :meth:`start` opens the shell's data plane (length-prefixed frames over
    TCP, :class:`~edgesplit.runtime.shell.ServingShell`) on ``data_port`` (0: any free port;
    None: none) and names it in ``Describe``; calls go there unless the caller says ``grpc``
    (a star's and a mesh's joins too). ``data_plane`` says how this server calls the next
    hop.

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

            self.join = Join(self, join_timeout_s, max_joins, shape, max_workers)
            # threads for the parts parked in the join table (they compute nothing) and the
            # callers of the joins being computed: a parked part never queues another
            sources = len(program.sources)
            max_workers = max_workers * sources + max_joins * (sources - 1)
        if engine is None and self.step.partition is not None and \
                self.step.emulate_ms is None:  # emulation paces; the sink batches complete joins
            self.batcher, self.batching = _batcher(program, device, max_batch, max_wait_ms)
        # a star source (a mesh's branch) computes on max_workers workers, then waits for the
        # sink's join holding none (a worker held across that wait deadlocks sources on each
        # other)
        self._computing: Slots | None = None
        if device in program.sources:
            self._computing = Slots(max_workers)
            max_workers += max_joins
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
        # the token and the session travel on: every hop keeps the session's backend state;
        # so does a star's join key, which the sink joins its sources' requests by
        self._forwarding = None if self._next is None else NextHop(
            self._next, device, timeout_s=next_timeout_s, shaper=self.downstream,
            passes=("authorization", SESSION_KEY, JOIN_KEY), own=self._next_failed)
        self._init_slots(max_workers, self.step.name, f"{option('max_workers')} requests")
        self._reply_metas = MetaCache()
        self._fast = FastPath(self)
        # its role, chosen once: a device that sends relays, the last one answers (the short
        # way where a data-plane call fits)
        self._role: Role = Sink(self.join) if self.join is not None else \
            Relay(self) if self.step.sends else LastHop(self, self._fast)
        # a request's path, chosen once: a star's sink (a mesh's aggregator) joins its
        # sources' calls; any other device decodes, computes (in the engine's deployment or
        # here) and forwards what it sends
        self._reply_pb = self.join.reply_pb if self.join is not None else self._chain_reply_pb
        self._compute_step = self._engine_compute if engine is not None else self._compute
        self._init_grpc(lambda server: pb_grpc.add_PartitionServiceServicer_to_server(
            Servicer(self, self, self.idle_limited), server), self.limit, max_workers)
        self._init_data_plane(self, data_port, limits)

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
        ``data_port`` of the same host; returns the gRPC port. With an engine, health then
        follows its deployment's."""
        bound = super().start(host, port)
        if self.engine is not None:
            from grpc_health.v1 import health_pb2

            status = health_pb2.HealthCheckResponse
            self.engine.watch(lambda ok: self.health.set(
                "", status.SERVING if ok else status.NOT_SERVING))
        return bound

    def _refuse_new(self) -> None:
        """The shell's slots, then the compute workers and the star sink's parked joins: every
        call still waiting for one is answered UNAVAILABLE."""
        super()._refuse_new()  # first: a woken wait for a compute worker reads it
        if self._computing is not None:
            self._computing.close()
        if self.join is not None:
            self.join.close()

    def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        super()._drain(timeout)
        if self._computing is not None:
            self._computing.drain(max(0.0, deadline - time.monotonic()))

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new requests, finish those in flight (those waiting for a worker, and a
        star sink's parked joins, included) for up to ``grace_s``; then shut the engine's
        deployment down. What still waits after the grace is answered UNAVAILABLE: its
        client may retry on another server."""
        if self.engine is not None:  # its health watch must not say SERVING again
            self.engine.stop_watching()
        super().stop(grace_s)  # the data plane, then gRPC; _refuse_new at the grace's end
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

    def answer_frame(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """Answer one data-plane call (the shell checked its token) the way this device's
        role takes it, the reply's time on the link included."""
        out = self._role.route(frame)(frame, context)
        if self.upstream.enabled:
            self.upstream.send(out.nbytes(), "down")
        return out

    def reply_frame(self, reply: Message) -> Frame:
        """``reply`` as the data plane's answer (its meta encoded once while it repeats)."""
        return self._reply_metas.fill(reply.to_frame(REPLY))

    def handle(self, request: pb.Bundle | Message,
               context: grpc.ServicerContext | None = None) -> Message:
        """Answer one chain request (gRPC's or the data plane's); ``context`` (the caller's
        call) gives the deadline and cancellation that travel down the chain."""
        t_in = time.perf_counter()
        values = self._decode(request)
        timings: dict[str, float] = {self._ser_key: (time.perf_counter() - t_in) * 1e3}
        check_alive(context, self.step.name)  # the client may have given up while we queued
        values = self._compute_step(values, context, timings)
        downstream = self._role.downstream(request, values, context, timings)
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
            return self.compute_now(values, context, timings)
        finally:
            if computing is not None:
                computing.give()

    def compute_now(self, values: dict[str, torch.Tensor],
                    context: grpc.ServicerContext | None, timings: dict[str, float]
                    ) -> dict[str, torch.Tensor]:
        """This step's outputs of ``values``, in the batcher's next batch where there is one
        (a session's requests alone, on its state); the compute time added to ``timings``."""
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
        assert self._forwarding is not None  # a step that sends was given a next address
        reply = self._forwarding.send(out, context)
        return {t.name: t.data for t in reply.tensors}, dict(reply.timings_ms)

    def _next_failed(self, exc: grpc.RpcError) -> BadRequest | None:
        """The next hop's failure this request fails with as it is: the caller's deadline
        passed, or it cancelled (anything else: the next hop failed)."""
        if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            return BadRequest(exc.code(), f"next hop after {self.step.name!r}: "
                              f"{exc.code().name}: {exc.details()}")
        return None


def _planned(program: PlanProgram, name: str) -> str:
    info = program.graph.tensors[name]
    return f"shape {list(info.shape)}, dtype {info.dtype}"

