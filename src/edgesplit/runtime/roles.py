"""A chain device's role, chosen once when its server is made: a :class:`Relay` (a middle
hop; a star's source, a mesh's root or branch) computes and forwards what it sends to the next
hop, answering with what came back; a :class:`LastHop` answers from what it computed, and a
data-plane call of the plan's plain shape takes its
:class:`~edgesplit.runtime.fastpath.FastPath`; a :class:`Sink` (a star's sink, a mesh's
aggregator) answers through its :class:`~edgesplit.runtime.star.Join`. They reach the server
only through its public calls, so :meth:`~edgesplit.runtime.server.PartitionServer.handle`
asks its role, not which role it has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
import torch

from edgesplit.runtime.dataplane import Message
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.transport.frames import Frame

if TYPE_CHECKING:  # the server module imports this one
    from edgesplit.runtime.fastpath import FastPath
    from edgesplit.runtime.server import PartitionServer
    from edgesplit.runtime.star import Join

__all__ = ["LastHop", "Relay", "Role", "Sink"]

FrameRun = Callable[[Frame, grpc.ServicerContext], Frame]


def _slotted(server: PartitionServer) -> FrameRun:
    """A data-plane call answered the general way, holding one of the server's slots."""

    def run(frame: Frame, context: grpc.ServicerContext) -> Frame:
        """At most ``max_workers`` requests at once, as gRPC's thread pool allows; a request
        that waits for a slot past its deadline is dropped."""
        request = Message.from_frame(frame)
        server.take_slot(context)
        try:
            return server.reply_frame(server.handle(request, context))
        finally:
            server.give_slot()

    return run


class Relay:
    """A device that sends: the next hop's answer is part of its own."""

    def __init__(self, server: PartitionServer) -> None:
        self.server = server
        self.slotted = _slotted(server)

    def downstream(self, request: pb.Bundle | Message, values: Mapping[str, torch.Tensor],
                   context: grpc.ServicerContext | None, timings: dict[str, float]
                   ) -> dict[str, Any]:
        """The next hop's reply tensors (still encoded); its timings added to ``timings``."""
        downstream, more = self.server.forward(request, values, context, timings)
        timings.update(more)
        return downstream

    def route(self, frame: Frame) -> FrameRun:
        """How a data-plane call is answered: the general way."""
        return self.slotted


class LastHop:
    """A device that sends nothing on: it answers from what it computed."""

    def __init__(self, server: PartitionServer, fast: FastPath) -> None:
        self.fast = fast if fast.serves else None  # decided once, for every call
        self.slotted = _slotted(server)

    def downstream(self, request: pb.Bundle | Message, values: Mapping[str, torch.Tensor],
                   context: grpc.ServicerContext | None, timings: dict[str, float]
                   ) -> dict[str, Any]:
        """Nothing: no hop follows."""
        return {}

    def route(self, frame: Frame) -> FrameRun:
        """How a data-plane call is answered: the short way where it fits, else the general
        way."""
        fast = self.fast
        return fast.reply if fast is not None and fast.fits(frame) else self.slotted


class Sink:
    """A device that joins its sources' calls: a data-plane call is one part of a join, and
    holds no worker while it waits for the others (the join takes one to compute)."""

    def __init__(self, join: Join) -> None:
        self.join = join

    def downstream(self, request: pb.Bundle | Message, values: Mapping[str, torch.Tensor],
                   context: grpc.ServicerContext | None, timings: dict[str, float]
                   ) -> dict[str, Any]:
        """Nothing: the join forwards a complete join's result itself."""
        return {}

    def route(self, frame: Frame) -> FrameRun:
        """How a data-plane call is answered: as a part of its join."""
        return self.join.reply_frame


Role = Relay | LastHop | Sink
