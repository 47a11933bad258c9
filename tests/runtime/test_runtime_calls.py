"""The runtime clients' shared retry loop and plan check (edgesplit.runtime.calls)."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime import calls
from edgesplit.transport import MAX_BACKOFF_S


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def test_retries_back_off_doubling_and_stop_at_the_first_result(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(calls.time, "sleep", slept.append)
    seen: list[int] = []

    def attempt(n: int) -> str:
        seen.append(n)
        if n < 3:
            raise _Rpc(grpc.StatusCode.UNAVAILABLE)
        return "ok"

    assert calls.with_retries(attempt, retries=5, base_s=0.1,
                              retryable=calls.rpc_failed_with(calls.RETRYABLE)) == "ok"
    assert seen == [0, 1, 2, 3]
    assert slept == pytest.approx([0.1, 0.2, 0.4])
    assert calls.backoff_s(1.0, 20) == MAX_BACKOFF_S


def test_a_failure_not_retryable_or_the_last_is_raised_as_it_is(monkeypatch):
    monkeypatch.setattr(calls.time, "sleep", lambda s: None)
    seen: list[int] = []

    def invalid(n: int) -> None:
        seen.append(n)
        raise _Rpc(grpc.StatusCode.INVALID_ARGUMENT)

    with pytest.raises(_Rpc):
        calls.with_retries(invalid, retries=3, base_s=0.1,
                           retryable=calls.rpc_failed_with(calls.RETRYABLE))
    assert seen == [0]

    def down(n: int) -> None:
        seen.append(n)
        raise _Rpc(grpc.StatusCode.UNAVAILABLE)

    seen.clear()
    with pytest.raises(_Rpc):
        calls.with_retries(down, retries=2, base_s=0.1,
                           retryable=calls.rpc_failed_with(calls.RETRYABLE))
    assert seen == [0, 1, 2]


def test_runs_plan_compares_the_plan_and_its_version():
    assert calls.runs_plan(SimpleNamespace(plan_id="p", plan_version=PLAN_VERSION), "p")
    assert not calls.runs_plan(SimpleNamespace(plan_id="q", plan_version=PLAN_VERSION), "p")
    assert not calls.runs_plan(SimpleNamespace(plan_id="p", plan_version=PLAN_VERSION + 1), "p")


def test_no_wait_runs_past_the_deadline_and_the_predicate_is_asked_only_before_a_retry(
        monkeypatch):
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    monkeypatch.setattr(calls.time, "sleep", sleep)
    monkeypatch.setattr(calls.time, "perf_counter", lambda: now[0])
    asked: list[int] = []

    def down(n: int) -> None:
        raise _Rpc(grpc.StatusCode.UNAVAILABLE)

    def retryable(exc: Exception) -> bool:  # the Ray engine and the training client log here
        asked.append(1)
        return True

    with pytest.raises(_Rpc):
        calls.with_retries(down, retries=3, base_s=0.1, retryable=retryable, until=100.25)
    assert slept == pytest.approx([0.1, 0.15, 0.0])  # 0.1, then what was left, then nothing
    assert len(asked) == 3  # not after the last attempt
