"""The runtime clients' base (edgesplit.runtime.client.RuntimeClient): metadata, retries and
the final failure's error, the plan check made once, request ids, closing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from edgesplit.errors import RemoteError
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime import calls
from edgesplit.runtime.client import RuntimeClient
from edgesplit.runtime.planned import SESSION_KEY


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Client(RuntimeClient):
    """Two servers, asked in turn; ``runs`` is the plan each says it runs."""

    address = "host:1"

    def __init__(self, runs: dict[str, str], **kw: Any) -> None:
        super().__init__("plan-a", "secret", timeout_s=2.5, retries=2, retry_backoff_s=0.0,
                         **kw)
        self.runs, self.asked, self.closed = runs, [], 0

    def _described(self) -> Iterator[tuple[str, Any]]:
        for name, plan in self.runs.items():
            self.asked.append(name)
            yield name, SimpleNamespace(plan_id=plan, plan_version=PLAN_VERSION)

    def _plan_mismatch(self, where: str, described: Any) -> str:
        return f"{where} runs {described.plan_id}"

    def close(self) -> None:
        self.closed += 1


def test_metadata_holds_the_token_and_the_session():
    assert _Client({}).metadata == [("authorization", "Bearer secret")]
    assert _Client({}, session="s1").metadata == [("authorization", "Bearer secret"),
                                                  (SESSION_KEY, "s1")]


def test_the_plan_is_checked_once_and_a_mismatch_stops_the_asking_in_the_clients_words():
    client = _Client({"a": "plan-a", "b": "plan-a"})
    client._ensure_plan()
    client._ensure_plan()
    assert client.asked == ["a", "b"]  # once, every server
    wrong = _Client({"a": "plan-b", "b": "plan-a"})
    with pytest.raises(RemoteError, match=r"^a runs plan-b$"):
        wrong._ensure_plan()
    assert wrong.asked == ["a"]
    with pytest.raises(RemoteError):  # not marked checked: asked again
        wrong._ensure_plan()
    assert wrong.asked == ["a", "a"]


def test_a_call_is_retried_on_the_clients_codes_then_explained(monkeypatch):
    monkeypatch.setattr(calls.time, "sleep", lambda s: None)
    client = _Client({})
    seen: list[tuple[float, Any]] = []

    def down(timeout: float, metadata: Any) -> None:
        seen.append((timeout, metadata))
        raise _Rpc(grpc.StatusCode.UNAVAILABLE, "gone")

    with pytest.raises(RemoteError, match="host:1"):
        client._call(down)
    assert seen == [(2.5, client.metadata)] * 3  # the first try and 2 retries

    class _Picky(_Client):
        retryable = (grpc.StatusCode.DEADLINE_EXCEEDED,)

        def _failed(self, exc: grpc.RpcError) -> Exception:
            return KeyError(exc.code().name)

    seen.clear()
    with pytest.raises(KeyError, match="UNAVAILABLE"):
        _Picky({})._call(down)
    assert len(seen) == 1


def test_request_ids_are_unique_across_threads_and_with_closes():
    client = _Client({})
    ids: list[int] = []
    threads = [threading.Thread(target=lambda: ids.extend(client.next_request_id()
                                                          for _ in range(200)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == list(range(1, 801))
    with client as same:
        assert same is client
    assert client.closed == 1
