"""What every runtime client shares: retrying a call with backoff, and checking that a
server runs the client's plan.

The chain's, the star's and the LLM's clients, the training client's state-changing calls and
the Ray engine's calls to its deployment each decide which failures are worth another attempt
and how a final failure reads; the loop that tries, backs off (doubling up to
``MAX_BACKOFF_S``) and tries again is written once, here, as is the plan comparison a
``Describe`` answer is checked by.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc

from edgesplit.plan.model import PLAN_VERSION
from edgesplit.transport import MAX_BACKOFF_S

__all__ = ["RETRYABLE", "backoff_s", "rpc_failed_with", "runs_plan", "with_retries"]

T = TypeVar("T")

# a call that failed so may reach a server that is up again, or a less busy moment
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def backoff_s(base_s: float, attempt: int) -> float:
    """The wait after failed attempt ``attempt`` (0 first): ``base_s`` doubled per attempt,
    never more than ``MAX_BACKOFF_S``."""
    return min(base_s * (2 ** attempt), MAX_BACKOFF_S)


def with_retries(attempt: Callable[[int], T], *, retries: int, base_s: float,
                 retryable: Callable[[Exception], bool], until: float | None = None) -> T:
    """``attempt(n)`` for n = 0, 1, ...: its first result; an exception it raises is retried
    (after :func:`backoff_s`) while ``retryable`` says so and attempts are left (``retries``
    more after the first), else raised as it is for the caller to explain. ``retryable`` is
    asked only when another attempt would follow (it may count or log the retry). ``until``
    (a ``time.perf_counter()`` instant; None: none): no wait runs past it, and the attempt
    after says what a passed deadline means."""
    for n in range(retries + 1):
        try:
            return attempt(n)
        except Exception as exc:
            if n < retries and retryable(exc):
                wait = backoff_s(base_s, n)
                if until is not None:
                    wait = min(wait, max(0.0, until - time.perf_counter()))
                time.sleep(wait)
                continue
            raise
    raise AssertionError("unreachable")


def rpc_failed_with(codes: Iterable[grpc.StatusCode]) -> Callable[[Exception], bool]:
    """Whether an exception is a gRPC call's failure with one of ``codes``."""
    wanted = frozenset(codes)
    return lambda exc: isinstance(exc, grpc.RpcError) and exc.code() in wanted


def runs_plan(described: Any, plan_id: str) -> bool:
    """Whether a server's ``Describe`` answer names plan ``plan_id`` at this plan version
    (each client says in its own words what a mismatch means)."""
    return bool(described.plan_id == plan_id and described.plan_version == PLAN_VERSION)
