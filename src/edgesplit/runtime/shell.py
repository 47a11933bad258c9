"""The serving shell's gRPC face, shared by every runtime server.

A server (:class:`~edgesplit.runtime.server.PartitionServer`,
:class:`~edgesplit.runtime.llm_server.LLMStageServer`) is a shell around one handler: the
shell authenticates each call, answers ``Run`` through :func:`~edgesplit.transport.answer`
(a failure becomes its status, an unexpected one INTERNAL with a logged sentence), answers a
stream's requests one by one (one that fails ends only itself, as an error in its reply),
and refuses a request made for another plan in one set of words. What a request does (relay,
compute, join, a generation step) is the handler's: :class:`Handler` is all the shell asks
of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from edgesplit.errors import RemoteError
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.transport import BadRequest, answer

__all__ = ["Handler", "Servicer", "check_request_plan"]


class Handler(Protocol):
    """What a serving shell calls: the plan it serves, what it says it serves, the answer to
    one gRPC request, and the sentence (logged) for an unexpected failure."""

    @property
    def plan_id(self) -> str: ...

    def describe(self) -> pb.Description: ...

    def reply_pb(self, request: pb.Bundle, context: grpc.ServicerContext) -> pb.Bundle: ...

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


def check_request_plan(request: Any, plan_id: str) -> None:
    """Refuse (FAILED_PRECONDITION) a request (a Bundle or a Message) made for another plan
    than ``plan_id`` at this plan version."""
    if request.plan_id != plan_id or request.plan_version != PLAN_VERSION:
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                         f"plan mismatch: this server runs plan {plan_id} (version "
                         f"{PLAN_VERSION}), the request is for {request.plan_id or '?'} "
                         f"(version {request.plan_version}); start both sides from the "
                         "same plan file")
