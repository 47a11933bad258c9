"""The hop handlers of a chain device, composed when its server is assembled
(:func:`~edgesplit.runtime.server.partition_server`), never chosen per request.

:class:`StepWire` is one device's step on the wire: what a request must carry (its plan, its
tensors, each of the plan's shape and dtype) and how an answer is made. :class:`Chain`
answers a chain request: decode, compute (a :mod:`~edgesplit.runtime.compute` part), then
what the hop after it adds: a :class:`Relay` (a middle hop, a star's source, a mesh's root or
branch) sends what this step sends to the next device and its answer is part of this one;
a :class:`LastHop` answers from what it computed, a data-plane call of the plan's plain
shape taking its :class:`~edgesplit.runtime.fastpath.FastPath`. A star's sink (a mesh's
aggregator) answers through its :class:`~edgesplit.runtime.star.Join` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import torch

from edgesplit.errors import WireError
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime.dataplane import Message, Part
from edgesplit.runtime.planned import decode_planned, max_message_bytes
from edgesplit.runtime.program import DeviceStep, PlanProgram
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.shell import NextHop, WorkerSlots, check_request_plan, failure_of
from edgesplit.transport import BadRequest, LinkShaper, check_alive
from edgesplit.transport.frames import REPLY, Frame, MetaCache

if TYPE_CHECKING:
    from edgesplit.runtime.compute import Compute

__all__ = ["Chain", "LastHop", "Relay", "StepWire"]

Request: TypeAlias = "pb.Bundle | Message"
Context: TypeAlias = "grpc.ServicerContext | None"
FrameRun = Callable[[Frame, grpc.ServicerContext], Frame]


class StepWire:
    """Device ``step`` of ``program`` on the wire: the plan it serves, the largest message
    (``limit``), the timing names it reports, the checks a request passes, an answer's frame,
    and the sentence for an unexpected failure."""

    def __init__(self, program: PlanProgram, step: DeviceStep) -> None:
        self.program, self.step = program, step
        self.plan_id, self.name = program.plan_id, step.name
        self.limit = max_message_bytes(program)
        # the timing names this device reports, built once (a request's path stays short)
        self.ser_key, self.compute_key = f"{step.name}.serialize_ms", f"{step.name}.compute_ms"
        self._expected = set(step.receives)
        self._reply_metas = MetaCache()
        self.failure = failure_of(step.name, "request")

    def check_plan(self, request: Request) -> None:
        """Refuse (FAILED_PRECONDITION) a request made for another plan."""
        check_request_plan(request, self.plan_id)

    def decode(self, request: Request) -> dict[str, torch.Tensor]:
        """A chain request's tensors: its plan, then exactly the step's tensors, checked."""
        self.check_plan(request)
        names = [t.name for t in request.tensors]
        expected = self._expected
        if set(names) != expected or len(names) != len(expected):
            raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                             f"device {self.name!r} expects tensors {sorted(expected)}, "
                             f"got {names}")
        return self.decode_tensors(request)

    def decode_tensors(self, request: Request) -> dict[str, torch.Tensor]:
        """The request's tensors (names already checked), each of the plan's shape and dtype."""
        values = {}
        for t in request.tensors:
            try:  # shape and dtype checked from the header, before anything is allocated
                values[t.name] = decode_planned(self.program, t.name, t.data)
            except WireError as exc:
                info = self.program.graph.tensors[t.name]
                raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"tensor {t.name!r}: {exc}; the plan says shape "
                                 f"{list(info.shape)}, dtype {info.dtype}") from None
        return values

    def reply_frame(self, reply: Message) -> Frame:
        """``reply`` as the data plane's answer (its meta encoded once while it repeats)."""
        return self._reply_metas.fill(reply.to_frame(REPLY))


class Relay:
    """A device that sends: what its step sends goes to the next device through
    ``forwarding``, and that device's answer is part of this one."""

    def __init__(self, wire: StepWire, forwarding: NextHop) -> None:
        self.wire, self.forwarding = wire, forwarding
        self._encode, self._step, self._sends = wire.program.encode, wire.step, wire.step.sends
        self._forward, self._ser_key = forwarding.forward, wire.ser_key

    def downstream(self, request: Request, values: Mapping[str, torch.Tensor],
                   context: Context, timings: dict[str, float]) -> dict[str, Any]:
        """Send this step's ``sends`` of ``values`` on (its serialize time added to
        ``timings``, its link shaped); the next device's reply tensors, still encoded (their
        timings added to ``timings``)."""
        t0 = time.perf_counter()
        encoded = self._encode(self._step, values, self._sends)
        out = Message(request.plan_id, request.plan_version, request.request_id,
                      [Part(name, data) for name, data in encoded.items()])
        reply = self._forward(out, context, timings, self._ser_key, t0)
        return {t.name: t.data for t in reply.tensors}


class LastHop:
    """A device that sends nothing on: it answers from what it computed. A data-plane call
    that fits the plan's plain one takes ``fast`` (the short way), any other ``general``."""

    def __init__(self, fast: Any, general: FrameRun) -> None:  # fast: a FastPath
        self.fast, self.general = fast, general
        self._fits, self._short = fast.fits, fast.reply  # bound once, for every call

    @staticmethod
    def downstream(request: Request, values: Mapping[str, torch.Tensor], context: Context,
                   timings: dict[str, float]) -> dict[str, Any]:
        """Nothing: no hop follows."""
        return {}

    def answer_frame(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """The short way where it fits, else the general way."""
        return self._short(frame, context) if self._fits(frame) else self.general(frame, context)


class Chain:
    """A chain device's answers (anything but a star's sink): a request is decoded, computed
    by ``compute`` and completed by ``downstream`` (a :class:`Relay`'s, or a
    :class:`LastHop`'s nothing), each chosen once; a reply takes its time on ``upstream``
    (the link back to the caller). A data-plane call is answered in one of ``slots``
    (:meth:`slotted`) unless a short way was given (:meth:`short_way`)."""

    def __init__(self, wire: StepWire, compute: Compute, downstream: Any,
                 slots: WorkerSlots, upstream: LinkShaper) -> None:
        self.wire, self.slots, self.upstream = wire, slots, upstream
        self.fast: Any = None  # a last hop's FastPath, once given
        self._decode, self._compute, self._downstream = wire.decode, compute.compute, downstream
        self._name, self._plan_id, self._ser_key = wire.name, wire.plan_id, wire.ser_key
        self._returns = wire.step.returns
        self._route: FrameRun = self.slotted

    def short_way(self, last: LastHop) -> None:
        """Answer data-plane calls as ``last`` does (its fast path, else :meth:`slotted`)."""
        self.fast, self._route = last.fast, last.answer_frame

    def reply_pb(self, request: pb.Bundle, context: Context = None) -> pb.Bundle:
        """Answer one gRPC request, the reply's time on the link included."""
        reply = self.handle(request, context).to_pb()
        self.upstream.send(reply.ByteSize(), "down")
        return reply

    def answer_frame(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """Answer one data-plane call (the shell checked its token), the reply's time on the
        link included."""
        out = self._route(frame, context)
        if self.upstream.enabled:
            self.upstream.send(out.nbytes(), "down")
        return out

    def slotted(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """A data-plane call answered the general way, holding one of the slots: at most
        ``max_workers`` requests at once, as gRPC's thread pool allows; a request that waits
        for a slot past its deadline is dropped."""
        request = Message.from_frame(frame)
        slots = self.slots
        slots.take(context)
        try:
            return self.wire.reply_frame(self.handle(request, context))
        finally:
            slots.give()

    def handle(self, request: Request, context: Context = None) -> Message:
        """Answer one chain request (gRPC's or the data plane's); ``context`` (the caller's
        call) gives the deadline and cancellation that travel down the chain."""
        t_in = time.perf_counter()
        values = self._decode(request)
        ser_key = self._ser_key
        timings: dict[str, float] = {ser_key: (time.perf_counter() - t_in) * 1e3}
        check_alive(context, self._name)  # the client may have given up while we queued
        values = self._compute(values, context, timings)
        downstream = self._downstream(request, values, context, timings)
        t1 = time.perf_counter()
        parts = []
        for name in self._returns:
            data = downstream.get(name)
            parts.append(Part(name, data if data is not None else encode_tensor(values[name], 32)))
        timings[ser_key] = timings.get(ser_key, 0.0) + (time.perf_counter() - t1) * 1e3
        return Message(self._plan_id, PLAN_VERSION, request.request_id, parts, timings)
