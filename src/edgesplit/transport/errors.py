"""Request errors in one place: what a servicer raises to fail one request with a status
code, and how a client explains a failed call to its user."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc

from edgesplit.errors import RemoteError, WireError

__all__ = ["BadRequest", "abort_for", "answer", "explain", "invalid"]

T = TypeVar("T")


class BadRequest(Exception):
    """This request fails with ``code`` and the message; the server goes on serving others."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def invalid(message: str) -> BadRequest:
    return BadRequest(grpc.StatusCode.INVALID_ARGUMENT, message)


def explain(code: grpc.StatusCode, details: str | None, address: str, *,
            server: str = "server", unavailable_hint: str = "",
            timeout_hint: str = "raise timeout_s", too_large_hint: str | None = None) -> str:
    """A failed call as a sentence saying what to do; ``server`` names the kind of server
    ("training server"), the hints say how to start it, wait longer or send less."""
    details = " ".join((details or "").split())  # one line, whatever the server wrote
    if code == grpc.StatusCode.UNAVAILABLE and details.startswith("next hop after"):
        # a middle hop answered: it is the chain behind it that failed
        return f"{server} {address} is up, but the chain behind it failed: {details}"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{server} {address} is unavailable ({details}){unavailable_hint}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{server} {address} did not answer in time ({timeout_hint})"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and too_large_hint is not None:
        return f"{server} {address} refused a message as too large ({details}); {too_large_hint}"
    return f"{server} {address} refused the request: {code.name}: {details}"


def answer(context: grpc.ServicerContext, compute: Callable[[], T],
           failure: Callable[[Exception], str]) -> T:
    """``compute()``'s reply, or the call aborted with the status its failure deserves: a
    :class:`BadRequest` its own code, a tensor that does not fit (WireError) INVALID_ARGUMENT,
    a failed next hop (RemoteError) UNAVAILABLE, anything else INTERNAL with ``failure(exc)``
    (which logs it). Only this request fails; the server goes on."""
    try:
        return compute()
    except Exception as exc:
        abort_for(context, exc, failure)


def abort_for(context: grpc.ServicerContext, exc: Exception,
              failure: Callable[[Exception], str]) -> NoReturn:
    """Abort the call with the status ``exc`` deserves (as :func:`answer` does): for a hot
    path that catches its own failures rather than pass :func:`answer` a closure per call."""
    if isinstance(exc, BadRequest):
        context.abort(exc.code, str(exc))
    elif isinstance(exc, WireError):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    elif isinstance(exc, RemoteError):
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    else:
        context.abort(grpc.StatusCode.INTERNAL, failure(exc))
    raise AssertionError("context.abort returned")  # it raises; this line is never reached
