"""Serving in process: dynamic batching (same answers, isolated failures) and TLS + token."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch

from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.batching import Batcher, batched_step
from edgesplit.runtime.client import ChainClient
from edgesplit.transport import BadRequest
from helpers import listening, server_for


def _inputs(k: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 1, 32, 32, generator=torch.Generator().manual_seed(k)),)


def test_batched_server_answers_each_request_as_alone(program):
    with server_for(program, "cloud", shape=False, max_batch=4, max_wait_ms=30) as server:
        channel = server.loopback_channel()  # in-process: the servicer code without a socket
        def one(k: int) -> float:
            with ChainClient(program, channel, shape=False) as client:
                out = client.request(_inputs(k)).outputs[0]
            return float((out - program.unsplit(_inputs(k))[0]).abs().max())

        with ThreadPoolExecutor(8) as pool:
            diffs = list(pool.map(one, range(16)))
        assert max(diffs) < 1e-4
        assert server.handler.batcher.batches_run > 0  # concurrent requests really were batched


def test_a_failing_request_does_not_fail_its_batch(program):
    step = program.step("cloud")
    batcher = Batcher(step, batched_step(program, "cloud", 4), 4, max_wait_ms=50)
    try:
        good = {"relu_1": torch.randn(1, 32, 16, 16)}
        bad = {"relu_1": torch.randn(1, 7, 16, 16)}  # wrong channels: the batch cannot run
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(batcher.compute, v) for v in (good, bad, good, good)]
        results = []
        for f in futures:
            try:
                results.append(f.result())
            except Exception as exc:
                results.append(exc)
        assert isinstance(results[1], Exception)
        for r in (results[0], results[2], results[3]):
            assert torch.allclose(r[step.partition.outputs[0]],
                                  step.compute(good)[step.partition.outputs[0]], atol=1e-5)
    finally:
        batcher.close()


def test_a_request_whose_deadline_passed_in_the_queue_is_dropped_uncomputed(program):
    """Two requests queue behind a busy batcher; the one whose caller's deadline passed is
    answered DEADLINE_EXCEEDED without computing, the other is computed as alone."""
    step = program.step("cloud")
    computed = []

    class Counting:  # the step, counting what it computes
        partition = step.partition

        def compute(self, values):
            computed.append(values)
            return step.compute(values)

    batcher = Batcher(Counting(), Counting(), 4)
    good = {"relu_1": torch.randn(1, 32, 16, 16)}
    done: dict = {}
    batcher._computing.acquire()  # busy: both wait in the queue (or the worker's hand)
    try:
        batcher.submit(good, lambda w: done.setdefault("late", w), time.monotonic() - 1.0)
        batcher.submit(good, lambda w: done.setdefault("live", w), time.monotonic() + 600)
    finally:
        batcher._computing.release()
    try:
        waited = time.monotonic() + 10  # polled: no guess at this machine's speed
        while len(done) < 2 and time.monotonic() < waited:
            time.sleep(0.01)
        late, live = done["late"], done["live"]
        assert isinstance(late.error, BadRequest) and late.result is None
        assert late.error.code == grpc.StatusCode.DEADLINE_EXCEEDED
        name = step.partition.outputs[0]
        assert live.error is None and torch.equal(live.result[name], step.compute(good)[name])
        assert len(computed) == 1 and batcher.requests_expired == 1
    finally:
        batcher.close()


def test_tls_with_a_token_end_to_end(program, tmp_path):
    """A self-signed certificate (made with the openssl command line) secures the hop."""
    from edgesplit.errors import RemoteError
    from helpers import self_signed

    tls, ca = self_signed(tmp_path)
    with listening(program, "cloud", shape=False, tls=tls, token="s3cret") as (server, _):
        port = server.port
        with ChainClient(program, f"localhost:{port}", shape=False, tls=ca,
                         token="s3cret") as client:
            out = client.request(_inputs(1)).outputs[0]
        assert torch.allclose(out, program.unsplit(_inputs(1))[0], atol=1e-5)
        with (ChainClient(program, f"localhost:{port}", shape=False, timeout_s=5) as plain,
              pytest.raises(RemoteError)):
            plain.request(_inputs(1))  # plaintext against a TLS server
        with (ChainClient(program, f"localhost:{port}", shape=False, tls=ca,
                          token="wrong") as wrong,
              pytest.raises(RemoteError, match="UNAUTHENTICATED")):
            wrong.request(_inputs(1))


def test_a_foreign_plan_is_named_as_such_even_when_its_messages_are_too_big(program):
    """The client checks the server's plan first, so a mismatch is not reported as a message
    size error when the foreign plan sends more than this server accepts."""
    from edgesplit.errors import RemoteError

    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")))
    foreign = PlanProgram.load(Manual(["stem.0"]).plan(problem))  # 64 KiB cut, over the limit
    with server_for(program, "cloud", shape=False) as server:
        channel = server.loopback_channel()  # same message limit as the server's socket
        with (ChainClient(foreign, channel, shape=False) as client,
              pytest.raises(RemoteError, match="plan mismatch")):
            client.request()
        with ChainClient(program, channel, shape=False) as client:
            assert client.request().outputs[0].shape == (1, 10)  # still serving
