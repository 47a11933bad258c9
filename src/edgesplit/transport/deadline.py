"""The caller's deadline and cancellation, checked before work and passed down the chain."""

from __future__ import annotations

import time

import grpc

from edgesplit.transport.errors import BadRequest

__all__ = ["check_alive", "deadline_of", "remaining_timeout"]


def check_alive(context: grpc.ServicerContext | None, device: str) -> None:
    """Stop work nobody waits for: the caller cancelled, or its deadline has passed."""
    if context is None:
        return
    remaining = context.time_remaining()
    if not context.is_active() or (remaining is not None and remaining <= 0):
        raise BadRequest(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"device {device!r} dropped the request: its caller's deadline passed "
                         "or it was cancelled")


def remaining_timeout(context: grpc.ServicerContext | None, limit_s: float) -> float:
    """The timeout for a call made on behalf of ``context``: what is left of its deadline,
    at most ``limit_s``."""
    remaining = context.time_remaining() if context is not None else None
    return limit_s if remaining is None else min(remaining, limit_s)


def deadline_of(context: grpc.ServicerContext | None) -> float | None:
    """The caller's deadline as a ``time.monotonic()`` instant (None: it set none), for work
    that waits before it starts (a batch queue) and should not start past it."""
    remaining = context.time_remaining() if context is not None else None
    return None if remaining is None else time.monotonic() + remaining
