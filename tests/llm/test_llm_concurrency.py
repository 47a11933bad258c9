"""An LLM stage's bounds under concurrent steps (issue 39): ``max_workers`` steps at once,
whether they come over gRPC or the data plane (one limiter), and ``max_sessions`` KV caches
alive, a session evicted mid-step included.

The counts are deterministic: an instrumented stage counts the steps inside its compute at
once (and the caches alive then), and holds each step until the steps that could overlap are
all inside (or a short while passed), so steps that may overlap do; no timing is asserted.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest
import torch

from edgesplit.errors import SessionError, SessionOwnerError, SessionsBusyError
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.stage.kv_sessions import LLMSessions
from edgesplit.llm.stage.wire import session_error, session_status
from edgesplit.models.causal_lm import create_causal_lm
from edgesplit.plan.model import Plan
from edgesplit.runtime.shell import ServingShell
from helpers import listening, server_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HOLD_S = 0.2  # how long a step waits for others to join it (never asserted)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return create_causal_lm("llama_tiny")


@pytest.fixture(scope="module")
def plan(two_stage_plan: Plan) -> Plan:
    """The shared llama_tiny over home-wifi's phone (the client) and laptop (the served
    head): conftest.py's two_stage_plan."""
    return two_stage_plan


class Gate:
    """Wraps ``server``'s stage step: records the most steps inside at once and the most KV
    caches alive at a step's start (those in steps and those listed); each step waits until
    ``together`` steps are inside, or HOLD_S passed."""

    def __init__(self, server: ServingShell, together: int) -> None:
        self.server, self.together = server, together
        self.inside: list[Any] = []  # the caches of the steps inside (kept referenced)
        self.most = self.most_alive = 0
        self._cond = threading.Condition()
        self._step = server.handler.stage.step
        server.handler.stage.step = self._wrapped

    def _wrapped(self, x, position, cache, sampling=None):
        with self._cond:
            self.inside.append(cache)
            listed = [s.cache for s in self.server.handler.sessions.table.values()]
            self.most = max(self.most, len(self.inside))
            self.most_alive = max(self.most_alive, len({id(c) for c in self.inside + listed}))
            self._cond.notify_all()
            self._cond.wait_for(lambda: len(self.inside) >= self.together, HOLD_S)
        try:
            return self._step(x, position, cache, sampling)
        finally:
            with self._cond:
                self.inside.remove(cache)


def _generate_at_once(plan: Plan, model, address: str, planes: list[str]) -> list[Any]:
    """One client per entry of ``planes`` (its data plane), each generating one token in a
    thread of its own, all at once; what each returned (or raised)."""
    results: list[Any] = [None] * len(planes)
    clients = [LLMClient(plan, address, model=model, data_plane=p, session=f"s{i}")
               for i, p in enumerate(planes)]
    start = threading.Barrier(len(clients))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = [t.token for t in clients[i].generate([1, 2, 3, 4], 1)]
        except Exception as exc:  # reported by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    return results


def test_workers_bound_grpc_and_the_data_plane_together(plan, model):
    """With --workers 1, steps over the data plane all ran at once (12 seen): one limiter
    now serves both paths."""
    with listening(plan, "laptop", model=model, max_workers=1, max_sessions=4) as (server, address):
        gate = Gate(server, together=2)
        planes = ["tcp", "tcp", "tcp", "grpc"]
        results = _generate_at_once(plan, model, address, planes)
        assert all(isinstance(r, list) and len(r) == 1 for r in results), results
        assert gate.most == 1


def test_max_sessions_bounds_the_caches_alive_under_concurrent_steps(plan, model):
    """With --max-sessions 2, concurrent steps of new sessions each evicted one in a step and
    kept its cache alive (12 caches seen): a new session now takes an idle one's room only,
    waiting while every cache is in a step."""
    with listening(plan, "laptop", model=model, max_workers=4, max_sessions=2) as (server, address):
        gate = Gate(server, together=4)
        results = _generate_at_once(plan, model, address, ["tcp"] * 4)
        assert all(isinstance(r, list) and len(r) == 1 for r in results), results
        assert gate.most_alive <= 2
        assert server.handler.sessions.alive <= 2


def _cache() -> object:
    return object()


def test_a_cache_in_a_step_keeps_its_room_until_the_step_ends():
    sessions = LLMSessions("d", _cache, max_sessions=1, max_context=8)
    with sessions.step("a", 0, 1, "o"):
        with pytest.raises(SessionsBusyError, match=r"all 1 KV caches.*max_sessions"), \
                sessions.step("b", 0, 1, "o", wait_s=0):
            pass
        assert sessions.end("a", "o")  # unlisted, but its step still uses the cache
        assert len(sessions) == 0 and sessions.alive == 1
        with pytest.raises(SessionsBusyError), sessions.step("b", 0, 1, "o", wait_s=0):
            pass
    assert sessions.alive == 0
    with sessions.step("b", 0, 1, "o", wait_s=0):
        assert sessions.alive == 1
    with sessions.step("c", 0, 1, "o", wait_s=0):  # "b" is idle: evicted for it
        assert "b" not in sessions and sessions.evicted == 1


def test_session_errors_travel_as_their_own_statuses():
    cases = [(SessionOwnerError, grpc.StatusCode.PERMISSION_DENIED),
             (SessionsBusyError, grpc.StatusCode.RESOURCE_EXHAUSTED),
             (SessionError, grpc.StatusCode.ABORTED)]
    for kind, code in cases:
        status = session_status(kind("why"))
        assert status.code == code
        back = session_error(code, "why")
        assert type(back) is kind and str(back) == "why"


def test_the_data_plane_checks_the_token_before_it_allocates_a_step(plan, model):
    """The stage's data plane read a frame whole, the size its header declared, before its
    handler looked at the token; the frame server now checks it first (as a partition
    server's does). So a header declaring a whole step with a wrong token is refused at once,
    before any payload arrives (the old server waited for, and allocated, the step: the read
    below timed out)."""
    import socket
    import struct

    from edgesplit.transport import bearer_metadata
    from edgesplit.transport.frames.codec import CALL, FAILED, _Inbox, encode_meta, read_frame

    with listening(plan, "laptop", model=model, token="s3cret") as (server, _):
        meta = encode_meta({"metadata": [list(p) for p in bearer_metadata("wrong")]})
        part = server.limit - 4096  # the most a step may carry
        head = struct.pack("<4sBBHQIIQ", b"ESF1", 1, CALL, 0, 1, len(meta), 1,
                           8 + len(meta) + part) + struct.pack("<Q", part) + meta
        assert server.data_port is not None
        with socket.create_connection(("127.0.0.1", server.data_port), timeout=10) as sock:
            sock.sendall(head)  # declares a whole step, sends none of it
            answer = read_frame(sock, _Inbox(), 1 << 20)
    assert answer.kind == FAILED and answer.meta["code"] == "UNAUTHENTICATED"


def test_grpc_message_limits_are_not_read_as_a_busy_stage():
    """RESOURCE_EXHAUSTED means a busy stage (no worker or cache free: try again) only when the
    stage says so; gRPC's own for a message over the limit is another failure, told as is."""
    busy = session_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "device 'laptop' is busy")
    assert isinstance(busy, SessionsBusyError)
    for text in ("Received message larger than max (4194405 vs. 4194304)",
                 "Sent message larger than max (9 vs. 8)"):
        assert session_error(grpc.StatusCode.RESOURCE_EXHAUSTED, text) is None


def _step_waiting_for_the_worker(plan, model):
    """A stage with one worker, busy, and a step (a thread) waiting for it: the stage, the
    thread, and what became of the step ("served" once it had the worker, or its error)."""
    from edgesplit.transport.loopback import LoopbackContext

    server = server_for(plan, "laptop", model=model, max_workers=1)
    server.take_slot(None)  # the one worker busy
    outcome: list[object] = []

    def wait() -> None:
        try:
            server.take_slot(LoopbackContext(timeout=30))
            outcome.append("served")
            server.give_slot()
        except BaseException as exc:  # the assertions read it
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    for _ in range(1000):  # at most 10 s for the thread to start waiting
        if server.slots._slots._waiting:
            break
        time.sleep(0.01)
    return server, waiter, outcome


def test_a_stopping_stage_serves_a_waiting_step_within_its_grace(plan, model):
    """Issue 55: a request sent just before a SIGTERM was refused "shutting down" when it
    waited for a worker. A stop now lets the calls waiting for a slot have one for its grace
    (a stop with grace 0 refuses them at once: the test below)."""
    server, waiter, outcome = _step_waiting_for_the_worker(plan, model)
    stopping = threading.Thread(target=server.stop, args=(30,))
    stopping.start()
    time.sleep(0.2)
    assert outcome == [], "the waiting step was answered before a worker came free"
    server.give_slot()  # the step in flight ends
    waiter.join(10)
    stopping.join(10)
    assert outcome == ["served"]
    assert not stopping.is_alive()


def test_a_stopping_stage_answers_a_waiting_step_unavailable(plan, model):
    """A step waiting for a worker while its stage stops is told UNAVAILABLE at once (retry
    elsewhere): the stage's slots are the serving shell's, as a partition server's are; before,
    it waited out its deadline and was then told RESOURCE_EXHAUSTED (a busy stage)."""
    from edgesplit.transport import BadRequest

    server, waiter, outcome = _step_waiting_for_the_worker(plan, model)
    server.stop(0)
    waiter.join(10)
    assert not waiter.is_alive(), "the waiting step was not answered when the stage stopped"
    exc, = outcome
    assert isinstance(exc, BadRequest) and exc.code == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in str(exc)
