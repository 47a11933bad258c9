"""The data plane (length-prefixed frames over TCP beside gRPC) and dynamic batching: the same
answers, errors and refusals as the gRPC path, hostile frames refused without harm, and
batches whose every reply is its own request's.

Servers run in this process on loopback sockets (`ServingShell.start`); each test stops its
own. The bad-input suite is test_runtime.py's, sent as frames instead of gRPC messages.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch

from edgesplit.errors import ConfigError, RemoteError
from edgesplit.graph import capture
from edgesplit.hardware import chain, get_device, get_link
from edgesplit.plan import PLAN_VERSION, EdgeCloudSetting, PlanningProblem
from edgesplit.plan.planners import Manual
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.batching import flexible_step
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.dataplane import Message, Part, split_address
from edgesplit.runtime.planned import SESSION_KEY, max_message_bytes
from edgesplit.runtime.shell import ServingShell
from edgesplit.transport import LoopbackError
from edgesplit.transport.frames import CALL, FAILED, REPLY, Frame, FrameClient, read_frame
from helpers import listening, self_signed, server_for, wait_until
from test_runtime import AUTH, BAD_CASES, TOKEN, _bad_cases

pytestmark = pytest.mark.xdist_group("runtime")
TOL = 1e-5


@pytest.fixture(scope="module")
def served(program):
    """One server with a token, batching as by default; (server, gRPC address)."""
    with listening(program, "cloud", shape=False, token=TOKEN) as (server, address):
        yield server, address


def _x(k: int) -> tuple[torch.Tensor]:
    return (torch.randn(1, 1, 32, 32, generator=torch.Generator().manual_seed(k)),)


def _frames(server: ServingShell) -> FrameClient:
    return FrameClient("127.0.0.1", server.data_port, max_message_bytes(server.handler.program) * 4)


def _call(program: PlanProgram, tensors: list[Part], request_id: int = 7,
          metadata=AUTH, **fields) -> Frame:
    message = Message(program.plan_id, PLAN_VERSION, request_id, tensors)
    for key, value in fields.items():
        setattr(message, key, value)
    return message.to_frame(metadata=[list(p) for p in metadata], timeout_s=30)


def _good(program: PlanProgram, k: int = 3) -> list[Part]:
    step = program.steps[0]
    values = step.compute(program.input_values(list(_x(k))))
    return [Part(n, d) for n, d in program.encode(step, values, step.sends).items()]


# ---- the same answers --------------------------------------------------------------------------
def test_requests_go_over_the_data_plane_and_equal_the_unsplit_model(program, served):
    server, address = served
    assert server.data_port and server.handler.batching == "up to 32"
    with ChainClient(program, address, token=TOKEN, shape=False) as client:
        for k in range(3):
            out = client.request(_x(k)).outputs[0]
            assert torch.allclose(out, program.unsplit(_x(k))[0], atol=TOL)
        assert client.data_plane == f"tcp 127.0.0.1:{server.data_port}"
    with ChainClient(program, address, token=TOKEN, shape=False, data_plane="grpc") as client:
        assert torch.allclose(client.request(_x(5)).outputs[0], program.unsplit(_x(5))[0],
                              atol=TOL)
        assert client.data_plane == "grpc"


def test_one_client_shared_by_threads_gets_every_reply_matched(program, served):
    """16 threads share one client (a connection each when they overlap); batching groups
    their requests; every output is its own input's."""
    server, address = served
    before = server.handler.batcher.batches_run
    with ChainClient(program, address, token=TOKEN, shape=False) as client:
        def one(k: int) -> float:
            out = client.request(_x(k)).outputs[0]
            return float((out - program.unsplit(_x(k))[0]).abs().max())

        with ThreadPoolExecutor(16) as pool:
            diffs = list(pool.map(one, range(96)))
    assert max(diffs) <= TOL
    assert server.handler.batcher.batches_run > before  # concurrent requests really were batched


@contextlib.contextmanager
def _batcher_held(server: ServingShell):
    """The batcher busy (its compute lock held): calls that arrive meanwhile are queued and
    answered later by its worker, once released."""
    server.handler.batcher._computing.acquire()
    try:
        yield
    finally:
        server.handler.batcher._computing.release()


def test_calls_queued_for_a_batch_are_answered_by_the_worker_even_when_pipelined(
        program, served):
    """Two calls sent back to back on one connection while the batcher is busy: both are
    queued (the connection reads the second while the first waits: each must own its
    tensors), computed in one batch and answered from the worker, each with its own id and
    its own input's outputs."""
    from edgesplit.transport.frames.codec import _Inbox, write_frame

    server, _ = served
    before = server.handler.batcher.batches_run
    with socket.create_connection(("127.0.0.1", server.data_port)) as sock:
        with _batcher_held(server):
            for k in (3, 4):
                write_frame(sock, _call(program, _good(program, k), request_id=100 + k))
            # both read, waiting on the held batcher (one in its worker's hand)
            assert wait_until(lambda: server._frames._busy == 2)
            assert server.handler.batcher._queue.qsize() >= 1
        answers = {}
        inbox = _Inbox()
        for _ in range(2):
            frame = read_frame(sock, inbox, 1 << 22)
            assert frame.kind == REPLY
            answers[frame.request_id] = program.decode(program.outputs[0], frame.parts[0])
    assert sorted(answers) == [103, 104]
    for k in (3, 4):
        assert torch.allclose(answers[100 + k], program.unsplit(_x(k))[0], atol=TOL)
    assert server.handler.batcher.batches_run == before + 1


def test_a_queued_call_whose_deadline_passes_is_answered_without_computing(program, served):
    """A call waiting for a batch past its caller's deadline is answered DEADLINE_EXCEEDED by
    the worker, uncomputed; the server goes on."""
    from edgesplit.transport.frames.codec import _Inbox, write_frame

    server, address = served
    batcher = server.handler.batcher
    expired = batcher.requests_expired
    call = Message(program.plan_id, PLAN_VERSION, 60, _good(program)).to_frame(
        metadata=[list(p) for p in AUTH], timeout_s=0.3)
    with socket.create_connection(("127.0.0.1", server.data_port)) as sock:
        with _batcher_held(server):
            write_frame(sock, call)
            assert wait_until(lambda: server._frames._busy == 1)  # it waits for the batch
            time.sleep(0.5)  # more than its 0.3 s: the deadline has passed
        answer = read_frame(sock, _Inbox(), 1 << 22)
    assert answer.kind == FAILED and answer.request_id == 60
    assert answer.meta["code"] == "DEADLINE_EXCEEDED"
    assert batcher.requests_expired == expired + 1
    with ChainClient(program, address, token=TOKEN, shape=False) as client:
        assert torch.allclose(client.request(_x(1)).outputs[0], program.unsplit(_x(1))[0],
                              atol=TOL)


def test_a_queued_call_that_fails_is_answered_as_the_synchronous_path_would(program, served):
    """A call answered by the batcher's worker whose compute fails gets the FAILED answer a
    call computed on its own thread gets (status and words); the server goes on."""
    server, address = served
    batcher = server.handler.batcher

    class Boom:  # a partition whose compute fails, alone and in a batch
        partition = batcher.single.partition

        def compute(self, values):
            raise RuntimeError("boom")

    frames = _frames(server)
    kept = batcher.single, batcher.batched
    batcher.single = batcher.batched = Boom()
    try:
        failures = []
        for held in (False, True):
            with pytest.raises(LoopbackError) as err, ThreadPoolExecutor(1) as pool, \
                    (_batcher_held(server) if held else contextlib.nullcontext()):
                future = pool.submit(frames.call, _call(program, _good(program), 30 + held), 10)
                if held:  # once it waits for the batch, let the worker run it
                    assert wait_until(lambda: server._frames._busy == 1)
                    batcher._computing.release()
                    try:
                        future.result(timeout=10)
                    finally:
                        batcher._computing.acquire()
                future.result(timeout=10)
            failures.append((err.value.code(), err.value.details()))
        assert failures[0] == failures[1] and failures[0][0] == grpc.StatusCode.INTERNAL
    finally:
        batcher.single, batcher.batched = kept
        frames.close()
    with ChainClient(program, address, token=TOKEN, shape=False) as client:
        assert torch.allclose(client.request(_x(1)).outputs[0], program.unsplit(_x(1))[0],
                              atol=TOL)


def test_a_deferred_answer_never_waits_on_a_caller_that_does_not_read():
    """The batch worker writes a deferred answer only as far as the kernel takes it at once:
    a caller that does not read (its buffers full) gets the rest from a thread of its own,
    the worker returns at once, and the call ends once the rest is sent."""
    from edgesplit.transport.frames import FrameContext, FrameServer
    from edgesplit.transport.frames.codec import _Inbox

    server = FrameServer(lambda frame, context: frame, 1 << 30)
    a, b = socket.socketpair()
    with a, b:
        inbox, big = _Inbox(), b"x" * (16 << 20)  # far more than the socket buffers hold
        context = FrameContext(a, (), None, server, inbox)
        send = context.defer()
        server._busy = 1
        worker = threading.Thread(target=send, args=(Frame(REPLY, 5, {}, [big]),))
        worker.start()
        worker.join(10)
        assert not worker.is_alive()  # it did not wait for b to read
        assert server._busy == 1  # the rest is still on its way
        got = read_frame(b, _Inbox(), 1 << 30)
        assert got.request_id == 5 and bytes(got.parts[0]) == big
        assert wait_until(lambda: server._busy == 0) and not inbox.writing.locked()


def test_a_middle_hop_forwards_over_the_next_hops_data_plane():
    graph = capture("digits_cnn")
    from edgesplit.plan.multisplit import ChainCosts, chain_plan, evaluate_boundaries

    base = get_device("raspberry-pi-4")
    devices = [base.model_copy(update={"name": n}) for n in ("a", "b", "c")]
    topology = chain("abc", devices, [get_link("4g")] * 2)
    costs = ChainCosts.build(graph, topology)
    n = len(graph.layers)
    plan = chain_plan(costs, evaluate_boundaries(costs, [0, 2, 5, n]), topology,
                      method="manual", source="a")
    hops = PlanProgram.load(plan, graph)
    with (listening(hops, "c", shape=False) as (_, last),
          listening(hops, "b", shape=False, next_address=last) as (mid, address)):
        with ChainClient(hops, address, shape=False) as client:
            out = client.request().outputs[0]
        assert torch.allclose(out, hops.unsplit()[0], atol=TOL)
        hop = mid.handler.next_hop
        assert hop is not None and hop.data_plane.startswith("tcp")


def test_tls_covers_the_data_plane(program, tmp_path):
    tls, ca = self_signed(tmp_path)
    with listening(program, "cloud", shape=False, token=TOKEN, tls=tls) as (server, _):
        port = server.port
        with ChainClient(program, f"localhost:{port}", shape=False, tls=ca,
                         token=TOKEN) as client:
            assert torch.allclose(client.request(_x(1)).outputs[0],
                                  program.unsplit(_x(1))[0], atol=TOL)
            assert client.data_plane.startswith("tcp")
            # a call that waits for a batch is answered by its own thread over TLS (no
            # non-blocking write there), still right
            with ThreadPoolExecutor(1) as pool, _batcher_held(server):
                waiting = pool.submit(client.request, _x(2))
                time.sleep(0.2)
                assert not waiting.done()
            assert torch.allclose(waiting.result(timeout=10).outputs[0],
                                  program.unsplit(_x(2))[0], atol=TOL)
        plain = FrameClient("127.0.0.1", server.data_port, 1 << 20)  # no TLS: refused
        with pytest.raises(LoopbackError) as info:
            plain.call(_call(program, _good(program)), 5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # every closed connection gives its slot back
        assert wait_until(lambda: not server._frames._conns, 5)


def test_data_plane_off_and_required(program):
    with listening(program, "cloud", shape=False, data_port=None) as (server, address):
        assert server.data_port is None
        with ChainClient(program, address, shape=False) as client:  # auto: gRPC
            assert torch.allclose(client.request(_x(2)).outputs[0],
                                  program.unsplit(_x(2))[0], atol=TOL)
            assert client.data_plane == "grpc"
        with (ChainClient(program, address, shape=False, data_plane="tcp") as client,
              pytest.raises(ConfigError, match="offers no data plane")):
            client.request()
    with pytest.raises(ConfigError, match="unknown data plane"):
        ChainClient(program, address, data_plane="udp")  # type: ignore[arg-type]


# ---- the same errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_message_fails_alone_over_the_data_plane(program, served, case):
    server, _ = served
    limit = max_message_bytes(program)
    tensors, fields, code, text = _bad_cases(limit)[case]
    parts = [Part(t.name, t.data) for t in tensors]
    client = _frames(server)
    try:
        with pytest.raises(LoopbackError) as info:
            client.call(_call(program, parts, **fields), 30)
        assert info.value.code() == code, info.value.details()
        assert text in info.value.details()
        reply = client.call(_call(program, _good(program)), 30, Message.from_frame)
        assert reply.request_id == 7 and [t.name for t in reply.tensors] == program.outputs
    finally:
        client.close()


def test_token_plan_and_deadline_errors_read_as_over_grpc(program, served):
    server, address = served
    for token in ("wrong", None):
        with (ChainClient(program, address, token=token, shape=False) as client,
              pytest.raises(RemoteError, match=r"UNAUTHENTICATED.*token")):
            client.request()
    client = _frames(server)
    try:
        with pytest.raises(LoopbackError, match="plan mismatch"):
            client.call(_call(program, _good(program), plan_id="0123456789abcdef"), 30)
    finally:
        client.close()
    step = program.step("cloud")
    release = threading.Event()
    compute = step.compute
    step.compute = lambda values, state=None: (release.wait(10), compute(values, state))[1]
    try:
        with (ChainClient(program, address, token=TOKEN, shape=False, timeout_s=0.3,
                          data_plane="tcp") as slow,
              pytest.raises(RemoteError, match="did not answer in time")):
            slow.request()
    finally:
        release.set()
        del step.compute
    with ChainClient(program, address, token=TOKEN, shape=False) as client:  # still serving
        assert client.request(_x(4)).outputs[0].shape == (1, 10)


def test_a_stopped_server_is_unavailable_promptly(program):
    server = server_for(program, "cloud", shape=False)
    address = f"127.0.0.1:{server.start()}"
    with ChainClient(program, address, shape=False, timeout_s=5) as client:
        client.request()
        server.stop(0)
        with pytest.raises(RemoteError, match="unavailable"):
            client.request()


# ---- hostile frames ----------------------------------------------------------------------------
def _raw(server: ServingShell, data: bytes) -> bytes:
    """Send raw bytes to the data port; what comes back before the server hangs up."""
    with socket.create_connection(("127.0.0.1", server.data_port), timeout=10) as s:
        s.sendall(data)
        with contextlib.suppress(OSError):  # the server may have answered and hung up already
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _failure(data: bytes) -> dict:
    class _Sock:
        def __init__(self) -> None:
            self.data = memoryview(data)

        def recv_into(self, view: memoryview) -> int:
            n = min(len(view), len(self.data))
            view[:n] = self.data[:n]
            self.data = self.data[n:]
            return n

    from edgesplit.transport.frames.codec import _Inbox

    frame = read_frame(_Sock(), _Inbox(), 1 << 20)  # type: ignore[arg-type]
    assert frame.kind == FAILED
    return frame.meta


HEAD = struct.Struct("<4sBBHQIIQ")  # magic, version, kind, reserved, id, meta, parts, rest


def _head(kind: int, meta: bytes = b"", sizes: tuple[int, ...] = (), rest: int | None = None
          ) -> bytes:
    if rest is None:
        rest = 8 * len(sizes) + len(meta) + sum(sizes)
    return HEAD.pack(b"ESF1", 1, kind, 0, 1, len(meta), len(sizes), rest) + \
        struct.pack(f"<{len(sizes)}Q", *sizes) + meta


@pytest.mark.parametrize("data, code, text", [
    (b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 16, "INVALID_ARGUMENT", "not an edgesplit"),
    (_head(9), "INVALID_ARGUMENT", "malformed frame header"),
    (HEAD.pack(b"ESF1", 1, CALL, 0, 1, 1 << 20, 0, 1 << 20), "INVALID_ARGUMENT",
     "malformed frame"),
    (_head(CALL, sizes=(1 << 62,)), "RESOURCE_EXHAUSTED", "larger than max"),
    (_head(CALL, sizes=(7,), rest=13) + b"\0" * 5, "INVALID_ARGUMENT", "add up"),
    (HEAD.pack(b"ESF1", 1, CALL, 0, 1, 10, 2, 4), "INVALID_ARGUMENT", "cannot hold"),
    (_head(CALL, b"{x}"), "INVALID_ARGUMENT", "metadata"),
    (_head(CALL, b"[]"), "INVALID_ARGUMENT", "not a JSON object"),
    (_head(CALL, b'{"metadata": [[1, 2]]}'), "INVALID_ARGUMENT", "malformed call frame"),
    (_head(REPLY, b"{}"), "INVALID_ARGUMENT", "malformed call"),
])
def test_hostile_frames_are_refused_and_the_server_goes_on(program, served, data, code, text):
    server, address = served
    meta = _failure(_raw(server, data))
    assert meta["code"] == code and text in meta["details"], meta
    _raw(server, data[: len(data) // 2])  # cut mid-frame: the server just hangs up
    with ChainClient(program, address, token=TOKEN, shape=False) as client:
        assert torch.allclose(client.request(_x(6)).outputs[0], program.unsplit(_x(6))[0],
                              atol=TOL)


def test_names_that_do_not_match_the_parts_are_refused(program, served):
    server, _ = served
    frame = _call(program, _good(program))
    frame.meta["names"] = ["relu_1", "extra"]
    client = _frames(server)
    try:
        with pytest.raises(LoopbackError, match="names do not match") as info:
            client.call(frame, 30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        client.close()


def test_split_address():
    assert split_address("127.0.0.1:50051") == ("127.0.0.1", 50051)
    assert split_address("[::1]:7") == ("::1", 7)
    assert split_address("localhost:x") is None
    assert split_address("unix:/tmp/sock") is None


# ---- batching ----------------------------------------------------------------------------------
def test_a_model_that_mixes_its_batch_is_served_one_by_one():
    class Mixer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(x * 2.0)
            return h - h.mean(dim=0, keepdim=True) + h.sum()  # every row sees the others

    problem = PlanningProblem(Mixer(), EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")),
        example_inputs=(torch.randn(1, 8),))
    graph = problem.graph
    first = graph.layers[0].name
    mixer = PlanProgram.load(Manual([first]).plan(problem), graph)
    reason = flexible_step(mixer, "cloud")
    assert isinstance(reason, str) and "mix" in reason
    with server_for(mixer, "cloud", shape=False) as server:
        assert server.handler.batcher is None and server.handler.batching.startswith("off")


def test_flexible_step_runs_any_batch_size_like_each_alone(program):
    flexible = flexible_step(program, "cloud")
    assert not isinstance(flexible, str)
    step = program.step("cloud")
    xs = [torch.randn(1, 32, 16, 16, generator=torch.Generator().manual_seed(k))
          for k in range(5)]
    together = flexible.compute({"relu_1": torch.cat(xs)})
    for i, x in enumerate(xs):
        alone = step.compute({"relu_1": x})
        for name in step.partition.outputs:
            assert torch.allclose(together[name][i:i + 1], alone[name], atol=1e-5)


# ---- the CLI -----------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["serve", "{plan}", "--device", "cloud", "--data-port", "eighty"], "--data-port takes"),
    (["serve", "{plan}", "--device", "cloud", "--data-plane", "udp"], "--data-plane takes"),
    (["run", "{plan}", "--server", "127.0.0.1:1", "--data-plane", "udp"], "--data-plane takes"),
])
def test_cli_refuses_bad_data_plane_options_in_one_line(program, tmp_path, args, message):
    from typer.testing import CliRunner

    from edgesplit.cli import app

    path = tmp_path / "plan.json"
    program.plan.save(path)
    result = CliRunner().invoke(app, [a.format(plan=path) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_silent_connection_is_closed_and_counted_out(program, monkeypatch):
    import edgesplit.transport.frames.server as frame_server

    monkeypatch.setattr(frame_server, "IDLE_S", 0.3)
    with listening(program, "cloud", shape=False) as (server, _):
        with socket.create_connection(("127.0.0.1", server.data_port), timeout=10) as s:
            assert s.recv(1) == b""  # the server hung up on a caller that said nothing
        assert wait_until(lambda: not server._frames._conns, 5)  # its slot is free again


def test_a_retry_finds_a_restarted_servers_new_data_port(program):
    first = server_for(program, "cloud", shape=False)
    port = first.start()
    address = f"127.0.0.1:{port}"
    with ChainClient(program, address, shape=False, retries=4, retry_backoff_s=0.2) as client:
        client.request(_x(1))
        old = client.data_plane
        first.stop(0)
        second = server_for(program, "cloud", shape=False)  # same gRPC port, new data port
        second.start(port=port)
        try:
            out = client.request(_x(2)).outputs[0]
            assert torch.allclose(out, program.unsplit(_x(2))[0], atol=TOL)
            assert client.data_plane == f"tcp 127.0.0.1:{second.data_port}" != old
        finally:
            second.stop(0)


def test_the_flexible_step_shares_the_partitions_weights(program):
    flexible = flexible_step(program, "cloud")
    assert not isinstance(flexible, str)
    original = dict(program.step("cloud").partition.module.named_parameters(remove_duplicate=False))
    original.update(program.step("cloud").partition.module.named_buffers())
    shared = dict(flexible.partition.module.named_parameters(remove_duplicate=False))
    shared.update(flexible.partition.module.named_buffers())
    assert shared and all(shared[k].data_ptr() == original[k].data_ptr() for k in shared)


def test_a_repeated_meta_is_parsed_once_and_a_changed_one_anew():
    from edgesplit.transport.frames.codec import _Inbox, write_frame

    a, b = socket.socketpair()
    inbox = _Inbox()
    with a, b:
        metas = [{"names": ["x"], "timeout_s": 1.0}, {"names": ["x"], "timeout_s": 1.0},
                 {"names": ["y"], "timeout_s": 2.0}]
        seen = []
        for i, meta in enumerate(metas):
            write_frame(a, Frame(CALL, i, dict(meta), [b"abc"]))
            frame = read_frame(b, inbox, 1 << 20)
            assert frame.meta == meta and bytes(frame.parts[0]) == b"abc"
            seen.append(frame.meta)
    assert seen[1] is seen[0] and seen[2] is not seen[1]


def test_metas_are_padded_so_that_parts_arrive_8_aligned():
    """A frame's parts follow its lengths and meta; the meta's JSON is padded with spaces to a
    multiple of 8 bytes, so the parts start aligned in the receive buffer (where a server
    reads a float payload in place) and the meta still parses to itself."""
    from edgesplit.transport.frames.codec import _Inbox, encode_meta, write_frame

    a, b = socket.socketpair()
    inbox = _Inbox()
    with a, b:
        for names in (["x"], ["a_longer_name", "y"], ["z" * 13]):
            meta = {"names": names, "timeout_s": 1.5}
            assert len(encode_meta(meta)) % 8 == 0
            write_frame(a, Frame(CALL, 1, meta, [b"abcd", b"efgh"]))
            frame = read_frame(b, inbox, 1 << 20)
            assert frame.meta == meta
            base = torch.frombuffer(inbox.buffer, dtype=torch.uint8).data_ptr()
            first = torch.frombuffer(frame.parts[0], dtype=torch.uint8).data_ptr()
            assert (first - base) % 8 == 0 and bytes(frame.parts[1]) == b"efgh"


@pytest.mark.parametrize("tls", [False, True])
def test_pieces_go_out_joined_without_a_copy(tls):
    """A part given as Pieces (a message's header and a tensor's memory) arrives as the joined
    bytes, over a plain socket's scatter-gather write and over TLS alike; its frame's size
    counts every piece."""
    from edgesplit.transport.frames.codec import Pieces, _Inbox, write_frame

    body = memoryview(bytearray(range(256)) * 300)
    pieces = Pieces((b"head", body))
    frame = Frame(REPLY, 9, {"names": ["y"]}, [b"x" * 10, pieces])
    assert frame.nbytes() == Frame(REPLY, 9, {"names": ["y"]}, [b"x" * 10, bytes(pieces)]
                                   ).nbytes()
    a, b = socket.socketpair()
    with a, b:
        if tls:  # TLS has no sendmsg: each piece is written in turn
            import ssl

            class Recorder(ssl.SSLSocket):
                def __init__(self) -> None:  # no handshake: only sendall is used
                    self.sent: list[bytes] = []

                def sendall(self, data, flags=0):
                    self.sent.append(bytes(data))

            sock = Recorder.__new__(Recorder)
            sock.__init__()
            write_frame(sock, frame)
            a.sendall(b"".join(sock.sent))
        else:
            write_frame(a, frame)
        got = read_frame(b, _Inbox(), 1 << 20)
    assert bytes(got.parts[0]) == b"x" * 10 and bytes(got.parts[1]) == b"head" + bytes(body)


def test_the_server_reads_requests_in_place_and_answers_as_from_a_copy(program, served):
    """The short way decodes a request's tensors where they lie in the connection's buffer
    (no copy); the answers are the unsplit model's, request after request, the buffer being
    overwritten by each next one."""
    server, address = served
    decoded = []
    decoders = server.handler.fast.decoders
    server.handler.fast.decoders = [lambda data, d=d: decoded.append(d(data)) or decoded[-1]
                             for d in decoders]
    try:
        with ChainClient(program, address, token=TOKEN, shape=False) as client:
            for k in range(4):
                out = client.request(_x(k)).outputs[0]
                assert torch.allclose(out, program.unsplit(_x(k))[0], atol=TOL)
    finally:
        server.handler.fast.decoders = decoders
    assert len(decoded) == 4
    # no copy: every request's tensor lies at the same place, the connection's buffer
    assert len({t.data_ptr() for t in decoded}) == 1


def test_a_frame_the_kernel_takes_in_pieces_arrives_whole():
    """sendmsg may take part of a frame (a send timeout, a full buffer): the rest follows,
    from the right byte of the right part, memoryviews of other formats included."""
    from edgesplit.transport.frames.codec import _Inbox, write_frame

    class Trickle:  # a socket whose kernel takes at most 7 bytes a call
        def __init__(self) -> None:
            self.out = bytearray()

        def sendmsg(self, buffers):
            data = b"".join(bytes(memoryview(b).cast("B")) for b in buffers)[:7]
            self.out += data
            return len(data)

    floats = memoryview(bytearray(struct.pack("<4f", 1, 2, 3, 4))).cast("f")
    frame = Frame(CALL, 9, {"names": ["a", "b", "c"]}, [b"xyz" * 11, b"", floats])
    sock = Trickle()
    assert write_frame(sock, frame) == len(sock.out)  # type: ignore[arg-type]
    a, b = socket.socketpair()
    with a, b:
        a.sendall(sock.out)
        got = read_frame(b, _Inbox(), 1 << 20)
    assert [bytes(p) for p in got.parts] == [b"xyz" * 11, b"", floats.tobytes()]
    assert got.request_id == 9 and got.meta == {"names": ["a", "b", "c"]}


def test_timings_travel_as_a_binary_part_and_bad_ones_are_refused():
    message = Message("p", 1, 3, [Part("y", b"abc")], {"cloud.compute_ms": 1.5, "x_ms": 2.0})
    frame = message.to_frame(REPLY)
    assert frame.meta["timings"] == ["cloud.compute_ms", "x_ms"] and len(frame.parts) == 2
    back = Message.from_frame(frame)
    assert back.timings_ms == message.timings_ms and [p.name for p in back.tensors] == ["y"]
    legacy = Frame(REPLY, 3, {"plan_id": "p", "plan_version": 1, "names": ["y"],
                              "timings_ms": {"a": 1}}, [b"abc"])  # the first data plane's
    assert Message.from_frame(legacy).timings_ms == {"a": 1.0}
    for meta, parts, text in [
            ({"names": ["y"], "timings": ["a", "b"]}, [b"abc", b"\0" * 8], "need 16 bytes"),
            ({"names": ["y"], "timings": []}, [b"abc", b""], "timings must name"),
            ({"names": ["y"], "timings": [1]}, [b"abc", b"\0" * 8], "timings must name"),
            ({"names": ["y"], "timings": ["a"]}, [b"abc"], "names do not match")]:
        with pytest.raises(Exception, match=text) as info:
            Message.from_frame(Frame(REPLY, 3, {"plan_id": "p", "plan_version": 1, **meta},
                                     parts))
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_slots_bound_holders_and_wake_a_waiter():
    from edgesplit.transport.slots import Slots

    slots = Slots(2)
    assert slots.take() and slots.take(0.5)
    assert not slots.take(0.05)  # all taken: times out
    got = []
    waiter = threading.Thread(target=lambda: got.append(slots.take(30)))
    waiter.start()
    time.sleep(0.05)
    slots.give()  # wakes the waiter, which takes the freed slot
    waiter.join(timeout=30)
    assert got == [True] and not slots.take(0)
    with pytest.raises(ValueError):
        Slots(0)


def test_a_meta_checked_once_is_checked_again_with_another_part_count():
    """The same meta object (a connection's repeated meta) with a different number of parts
    is checked anew: a peer cannot slip extra or missing tensors past the first check."""
    meta = {"plan_id": "p", "plan_version": 1, "names": ["x"]}
    assert [p.name for p in Message.from_frame(Frame(CALL, 1, meta, [b"a"])).tensors] == ["x"]
    for parts in ([b"a", b"b"], []):
        with pytest.raises(Exception, match="names do not match"):
            Message.from_frame(Frame(CALL, 2, meta, parts))


def test_a_busy_data_port_is_a_one_line_config_error_and_frees_the_grpc_port(program):
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        server = server_for(program, "cloud", shape=False,
                            data_port=busy.getsockname()[1])
        with pytest.raises(ConfigError, match=r"cannot open the data plane.*another data.port"):
            server.start("127.0.0.1", 0)
        again = server_for(program, "cloud", shape=False)  # nothing was left half-open
        again.start("127.0.0.1", 0)
        again.stop(0)
    finally:
        busy.close()


# ---- the short ways (runtime/fastpath.py, ChainClient._read_frame) ---------------------------
def _reply_parts(frame: Frame) -> tuple[dict, list[bytes]]:
    """A reply's meta and its tensor bytes (the last part, the timings, differs call by
    call)."""
    return frame.meta, [bytes(p) for p in frame.parts[:-1]]


def test_the_servers_short_way_answers_as_its_general_path(program, served):
    """A plain call (the plan's names, no session) goes the short way; with a session it goes
    the general way: the same reply meta and the same tensor bytes."""
    server, _ = served
    client = _frames(server)
    try:
        short = client.call(_call(program, _good(program)), 30, _reply_parts)
        assert any(m.get("names") == list(server.handler.step.receives)
                   for m in server.handler.fast._fit.values())
        with_session = [*AUTH, (SESSION_KEY, "s1")]
        general = client.call(_call(program, _good(program), metadata=with_session), 30,
                              _reply_parts)
    finally:
        client.close()
    assert short == general
    assert short[0]["timings"] == ["cloud.serialize_ms", "cloud.compute_ms"]


@pytest.mark.parametrize("case", ["wrong shape", "wrong dtype", "truncated", "corrupt",
                                  "not a tensor"])
def test_a_bad_tensor_after_good_calls_fails_as_on_the_general_path(program, served, case):
    """Once a connection's meta was found plain, a bad tensor under that same meta fails with
    the general path's code and words, and the connection serves the next call."""
    server, _ = served
    tensors, _, code, text = _bad_cases(max_message_bytes(program))[case]
    client = _frames(server)
    try:
        for _ in range(2):
            client.call(_call(program, _good(program)), 30)
        with pytest.raises(LoopbackError) as info:
            client.call(_call(program, [Part(t.name, t.data) for t in tensors]), 30)
        assert info.value.code() == code and text in info.value.details()
        reply = client.call(_call(program, _good(program)), 30, Message.from_frame)
        assert [t.name for t in reply.tensors] == program.outputs
    finally:
        client.close()


def test_the_clients_short_read_refuses_a_bad_reply_under_a_checked_meta(program):
    """After a well-formed reply, a reply under the same meta object (a connection's repeated
    meta) with a corrupt tensor or a timings part of the wrong size is refused as the
    general reader refuses it."""
    client = ChainClient(program, "127.0.0.1:1", shape=False)  # nothing is called
    try:
        out = program.steps[1].returns[0]
        good = encode_tensor(program.unsplit(_x(1))[0], 32)
        reply = Message(program.plan_id, PLAN_VERSION, 9, [Part(out, good)],
                        {"cloud.serialize_ms": 0.5, "cloud.compute_ms": 1.5}).to_frame(REPLY)
        meta, parts = reply.meta, list(reply.parts)
        for _ in range(2):  # the first read checks the meta, the second takes the short way
            rid, timings, remote, _ = client._read_frame(Frame(REPLY, 9, meta, parts))
            assert rid == 9 and timings == {"cloud.serialize_ms": 0.5, "cloud.compute_ms": 1.5}
            assert torch.equal(remote[out], program.unsplit(_x(1))[0])
        assert client._reply_meta is meta
        corrupt = bytearray(good)
        corrupt[-3] ^= 0xFF
        with pytest.raises(RemoteError, match=r"bad tensor.*checksum"):
            client._read_frame(Frame(REPLY, 10, meta, [bytes(corrupt), parts[1]]))
        with pytest.raises(LoopbackError, match="timings"):
            client._read_frame(Frame(REPLY, 11, meta, [good, parts[1][:8]]))
    finally:
        client.close()


def test_a_changed_metadata_list_is_sent_as_changed(program, served):
    """The call meta a Hop reuses follows the caller's metadata by value: a token changed in
    the client's list between calls is the one the next call carries."""
    _, address = served
    with ChainClient(program, address, token=TOKEN, shape=False) as client:
        client.request(_x(1))
        client.request(_x(2))  # the second call reuses the first one's meta
        client.metadata[0] = ("authorization", "Bearer wrong")
        with pytest.raises(RemoteError, match="UNAUTHENTICATED"):
            client.request(_x(3))
