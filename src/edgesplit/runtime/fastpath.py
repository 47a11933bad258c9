"""The data plane's short way through a last hop for the call every client repeats.

A served request runs its serving code right after compute, with cold caches, where each Python
call and object costs several microseconds; the general path (the chain's own data-plane
handler, :class:`~edgesplit.runtime.roles.Chain`) builds a request :class:`Message`, its parts,
checks the plan and the tensor names, a reply :class:`Message` and its frame, call after call.
For a server that only computes and answers (a :class:`~edgesplit.runtime.roles.LastHop`
computing here, no compute emulation: the server's assembly gives only such a one a short way),
a call whose frame meta was found to be the plan's own once (the same object: a connection
parses a repeated meta once) needs none of that again: :class:`FastPath` decodes its parts by
the plan's names, computes, and answers with the reply meta built once. Whatever differs
(another meta, a part count, a tensor that does not decode) takes the general path, which says
what is wrong in its own words, so both paths give the same answers and errors.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from edgesplit.errors import WireError
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime.dataplane import Message, as_part
from edgesplit.runtime.planned import SESSION_KEY
from edgesplit.transport import answer, check_alive, deadline_of
from edgesplit.transport.frames import DEFERRED, REPLY, Frame, encode_meta, failure
from edgesplit.transport.loopback import Aborted

if TYPE_CHECKING:
    import torch

    from edgesplit.runtime.compute import LocalCompute
    from edgesplit.runtime.roles import StepWire
    from edgesplit.runtime.shell import WorkerSlots
    from edgesplit.transport import LinkShaper

__all__ = ["FastPath"]

MAX_METAS = 256  # call metas found fit, remembered by identity (one or a few per connection)
_TIMINGS = struct.Struct("<2d")  # the reply's serialize and compute milliseconds


class FastPath:
    """Answers the calls that ``fits`` with ``reply``: ``wire``'s step computed by
    ``compute`` (its batcher) in one of ``slots``. ``general`` (the chain's ``handle``)
    answers a call whose tensors do not decode; a call waits for a batch on the batcher's
    worker only while ``upstream`` shapes no reply."""

    def __init__(self, wire: StepWire, compute: LocalCompute, slots: WorkerSlots,
                 upstream: LinkShaper, general: Callable[[Message, Any], Message]) -> None:
        self.wire, self.compute, self.slots, self.upstream = wire, compute, slots, upstream
        self.general, self.batcher = general, compute.batcher
        program, step = wire.program, wire.step
        self.plan_id, self.step = program.plan_id, step
        self.receives, self.returns = list(step.receives), list(step.returns)
        # a large answer goes out from the output tensor's own memory (no copy into a message)
        self.encoders = [(name, program.codec(name).encode_pieces) for name in self.returns]
        # the request's tensors are read where they lie in the connection's buffer: the call
        # is computed and answered before that connection reads its next frame into it;
        # a call answered later (batched, the connection reading on) gets copies
        self.decoders = [program.codec(name).decode_in_place for name in self.receives]
        self.copying = [program.codec(name).decode for name in self.receives]
        # what the general path's reply meta holds: the timings it reports, in its order
        self.reply_meta = {"plan_id": program.plan_id, "plan_version": PLAN_VERSION,
                           "names": self.returns,
                           "timings": [f"{step.name}.serialize_ms", f"{step.name}.compute_ms"]}
        self.reply_json = encode_meta(self.reply_meta)
        self._fit: dict[int, dict[str, Any]] = {}  # id -> meta, held so that no id is reused

    def _fits(self, meta: dict[str, Any]) -> bool:
        """Whether calls with this meta are the plan's plain ones: its plan, its tensor names
        in order, no timings and no session (a session's state is the general path's)."""
        return (meta.get("plan_id") == self.plan_id
                and meta.get("plan_version") == PLAN_VERSION
                and meta.get("names") == self.receives
                and "timings" not in meta and "timings_ms" not in meta
                and all(k != SESSION_KEY for k, _ in meta.get("metadata", ())))

    def fits(self, frame: Frame) -> bool:
        """Whether ``frame`` is a plain call (checked by its meta's identity after the first)."""
        meta = frame.meta
        if self._fit.get(id(meta)) is not meta:
            if not self._fits(meta):
                return False
            if len(self._fit) >= MAX_METAS:
                self._fit.clear()
            self._fit[id(meta)] = meta
        return len(frame.parts) == len(self.receives)

    def reply(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """Decode, compute (in one of the server's worker slots, batched where the server
        batches) and answer a plain call: the general path's reply, frame for frame. A call
        whose tensors do not decode is answered by the general path, which says why. A call
        that would wait for a batch is answered by the batcher's worker (:meth:`_later`)."""
        slots = self.slots
        slots.take(context)
        batcher = self.batcher
        # a lone client's call finds the batcher idle: asked first, before any defer is made
        if batcher is not None and not batcher.idle() and not self.upstream.enabled:
            defer = getattr(context, "defer", None)
            send = defer() if defer is not None else None
            answered = self._later(frame, context, send) if send is not None else None
            if answered is not None:
                return answered
        try:
            t0 = time.perf_counter()
            values = self._decode(frame)
            if values is None:
                return self.wire.reply_frame(self.general(Message.from_frame(frame), context))
            t1 = time.perf_counter()
            step = self.step
            check_alive(context, step.name)  # the client may have given up meanwhile
            out = batcher.compute(values, deadline_of(context)) if batcher is not None \
                else step.compute(values)
            t2 = time.perf_counter()
            parts: list[Any] = [as_part(codec(out[name], 32)) for name, codec in self.encoders]
        finally:
            slots.give()
        serialize_ms = (t1 - t0 + time.perf_counter() - t2) * 1e3
        parts.append(_TIMINGS.pack(serialize_ms, (t2 - t1) * 1e3))
        return Frame(REPLY, frame.request_id, self.reply_meta, parts, self.reply_json)

    def _later(self, frame: Frame, context: Any, send: Any) -> Frame | None:
        """Queue the call for the batcher and answer it from there once its batch ran:
        DEFERRED (the connection reads on, its thread is not woken to answer). None, with the
        slot still taken, when its tensors do not decode (the general path then answers)."""
        slots, batcher = self.slots, self.batcher
        assert batcher is not None
        t0 = time.perf_counter()
        values = self._decode(frame, self.copying)  # the connection's buffer is reused
        if values is None:
            return None
        try:
            check_alive(context, self.step.name)
        except Exception:
            slots.give()
            raise
        t1 = time.perf_counter()
        request_id = frame.request_id
        failure_text = self.wire.failure

        def finish(waiting: Any) -> None:  # on the batcher's worker, once the batch ran
            try:
                if waiting.error is not None:
                    raise waiting.error
                t2 = time.perf_counter()
                out = waiting.result
                parts: list[Any] = [as_part(codec(out[name], 32))
                                    for name, codec in self.encoders]
                serialize_ms = (t1 - t0 + time.perf_counter() - t2) * 1e3
                parts.append(_TIMINGS.pack(serialize_ms, (t2 - t1) * 1e3))
                reply = Frame(REPLY, request_id, self.reply_meta, parts, self.reply_json)
            except Exception as exc:
                reply = _failed(context, request_id, exc, failure_text)
            finally:
                slots.give()
            send(reply)

        batcher.submit(values, finish, deadline_of(context))
        return DEFERRED

    def _decode(self, frame: Frame, decoders: list[Any] | None = None
                ) -> dict[str, torch.Tensor] | None:
        values = {}
        try:
            for name, decode, data in zip(self.receives, decoders or self.decoders,
                                          frame.parts, strict=True):
                values[name] = decode(data)
        except WireError:
            return None
        return values


def _failed(context: Any, request_id: int, exc: Exception, failure_text: Any) -> Frame:
    """The FAILED answer the synchronous path gives for ``exc`` (its status and words)."""
    def rethrow() -> None:
        raise exc

    with contextlib.suppress(Aborted):  # it always raises: Aborted, with the status set
        answer(context, rethrow, failure_text)
    return failure(request_id, context.code or grpc.StatusCode.UNKNOWN, context.details)

