"""The runtime end to end: servers driven by the client (`ChainClient`, `run_requests`,
`edgesplit run`) and by hand-built gRPC messages.

Most tests talk to in-process servers over the loopback transport (fixture ``local``: the
same servicer code without sockets). The end-to-end ones (CLI, token, retries, a killed
server, a three-device chain, load) use real servers: each is a subprocess started with
`python -m edgesplit.cli serve ... --port 0`; its address comes from the one
`listening on HOST:PORT ...` line it prints. Start-up (torch import and capture) dominates
this file's time, so the servers start side by side as soon as the plans exist, most load the
model from a saved `.pt2` (half the start-up of exporting it again), and they are killed in
the fixture's teardown, failures included; they also die with this process
(PR_SET_PDEATHSIG). The plans are made once, in-process, with `edgesplit plan` on digits_cnn:

- ``chain``: cut after ``down1.0`` (one tensor crosses), float; the built-in model name;
- ``dag``: cut after ``block1.conv1.0``, inside a residual block (the skip tensor crosses too),
  over 4g: its server shapes the link, so it also serves the shaping check;
- ``topo``: a 3-device chain planned for throughput over a topology file: cam -> hub -> server,
  the camera too small for any layer, so the raw input crosses (as float32, what topology plans
  send) and the output, computed on the last device, is relayed back by the hub;
- ``quant``: a manual cut after ``block1.add`` whose edge part is quantized the way AUTO-SPLIT
  writes it (w_bits/a_bits per edge layer, the crossing tensor sent at 4 bits). AUTO-SPLIT itself
  never cuts digits_cnn in the middle (edge-only or cloud-only in every setting tried).
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import RemoteError
from edgesplit.graph import capture
from edgesplit.plan import PLAN_VERSION, load_plan
from edgesplit.quant import decode_tensor, encode_tensor
from edgesplit.runtime import PlanProgram, plan_id
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.planned import max_message_bytes
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.runtime.session import run_requests
from helpers import free_port, server_for

MODEL = "digits_cnn"
INPUT_SHAPE = (1, 1, 32, 32)
TOKEN = "s3cret-token"
AUTH = [("authorization", f"Bearer {TOKEN}")]
FLOAT_TOL = 1e-5
START_TIMEOUT_S = 120.0  # a server's start-up (torch import + capture), on a busy machine
runner = CliRunner()
pytestmark = pytest.mark.xdist_group("runtime")  # with --dist loadgroup: one worker, one set

THREE_HOPS = """\
name: three-hops
devices:
  - {preset: raspberry-pi-4, name: cam, memory_bytes: 16384}  # too small for any layer
  - {preset: raspberry-pi-4, name: hub}
  - {preset: raspberry-pi-4, name: server}
links:
  - {src: cam, dst: hub, link: {name: lan1, bandwidth_mbps: 10000, rtt_ms: 0}}
  - {src: hub, dst: server, link: {name: lan2, bandwidth_mbps: 10000, rtt_ms: 0}}
"""


# ---- server processes -----------------------------------------------------------------------
_LIBC = ctypes.CDLL(None) if sys.platform == "linux" else None  # loaded here, not after fork


def _die_with_parent() -> None:  # runs in the child between fork and exec: one system call
    _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProc:
    """One `edgesplit serve` subprocess; ``address`` waits for its `listening on` line."""

    def __init__(self, plan: Path, device: str, *flags: str, log_dir: Path,
                 port: int = 0) -> None:
        self.plan, self.device, self.flags, self.log_dir = plan, device, flags, log_dir
        self.proc: subprocess.Popen | None = None
        self._start(port)

    def _start(self, port: int) -> None:
        cmd = [sys.executable, "-m", "edgesplit.cli", "serve", str(self.plan),
               "--device", self.device, "--port", str(port), *self.flags]
        self.log_path = self.log_dir / f"{self.plan.stem}-{self.device}-{time.time_ns()}.err"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - open while the server runs
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     preexec_fn=_die_with_parent if _LIBC else None)
        self._lines: queue.Queue = queue.Queue()
        self._address: str | None = None
        threading.Thread(target=self._pump, args=(self.proc, self._lines), daemon=True).start()

    @staticmethod
    def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    @property
    def address(self) -> str:
        if self._address is None:
            deadline = time.monotonic() + START_TIMEOUT_S
            while self._address is None:
                try:
                    line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    self.kill()
                    pytest.fail(f"{self.device} server did not start in {START_TIMEOUT_S:.0f} s: "
                                f"{self.stderr()}")
                if line is None:
                    pytest.fail(f"{self.device} server exited with {self.proc.wait()}: "
                                f"{self.stderr()}")
                if line.startswith("listening on "):
                    fields = line.split()
                    assert fields[3] == f"device={self.device}", line
                    self._address = fields[2]
        return self._address

    def stderr(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()[-2000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


# ---- plans and programs ---------------------------------------------------------------------
def _cli(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    """digits_cnn saved with torch.export.save: a server loads it in about half the time it
    takes to export the built-in model again (start-up dominates this file)."""
    from edgesplit.graph import export_model
    from edgesplit.models import create_model

    built = create_model(MODEL)
    path = tmp_path_factory.mktemp("runtime-model") / f"{MODEL}.pt2"
    torch.export.save(export_model(built.module, built.example_inputs, name=MODEL), str(path))
    return path


@pytest.fixture(scope="module")
def graph(model_file):
    return capture(model_file)


@pytest.fixture(scope="module")
def plans(tmp_path_factory, model_file) -> dict[str, Path]:
    """The chain plan names the built-in model; the others its saved program."""
    d = tmp_path_factory.mktemp("runtime-plans")
    paths = {name: d / f"{name}.json" for name in ("chain", "dag", "topo", "quant")}
    _cli("plan", MODEL, "--edge", "jetson-nano", "--cloud", "v100-server", "--link", "4g",
         "--method", "manual", "--split-after", "down1.0", "--input-bits", "32",
         "--out", paths["chain"])
    _cli("plan", model_file, "--link", "4g", "--method", "manual", "--split-after",
         "block1.conv1.0", "--input-bits", "32", "--out", paths["dag"])
    (d / "three-hops.yaml").write_text(THREE_HOPS)
    _cli("plan", model_file, "--topology", d / "three-hops.yaml", "--objective", "throughput",
         "--out", paths["topo"])
    base = d / "quant-float.json"
    _cli("plan", model_file, "--link", "4g", "--method", "manual", "--split-after",
         "block1.add", "--input-bits", "32", "--out", base)
    float_plan = load_plan(base)
    edge = set(float_plan.devices[0].layers)
    layers = [layer.model_copy(update={"w_bits": 4, "a_bits": 8}) if layer.name in edge
              else layer for layer in float_plan.layers]
    transfers = [t.model_copy(update={"bits": dict.fromkeys(t.tensors, 4)}) if t.src == "edge"
                 else t for t in float_plan.transfers]
    float_plan.model_copy(update={"method": "manual-w4a8", "layers": layers,
                                  "transfers": transfers}).save(paths["quant"])
    return paths


@pytest.fixture(scope="module")
def programs(plans, graph) -> dict[str, PlanProgram]:
    out = {name: PlanProgram.load(load_plan(path), None if name == "chain" else graph)
           for name, path in plans.items()}
    assert out["chain"].plan.model.source == MODEL
    assert out["dag"].plan.model.source.endswith(".pt2")
    assert out["chain"].steps[0].sends == ("relu_1",)
    assert sorted(out["dag"].steps[0].sends) == ["relu_1", "relu_2"]
    cam, hub, server = out["topo"].steps
    assert [s.name for s in out["topo"].steps] == ["cam", "hub", "server"]
    assert cam.partition is None and cam.sends == ("x",) and cam.send_bits.get("x", 32) == 32
    assert hub.partition is not None and server.partition is not None and hub.sends
    return out


# key: (plan, device, flags); the hub of the three-device chain starts in its test
# (the other tests talk to in-process servers over the loopback transport: ``local``)
SERVERS = {
    "chain": ("chain", "cloud", "--no-shape", "--token", TOKEN),
    "dag": ("dag", "cloud", "--no-shape", "--threads", "1"),  # killed by its test
    "topo-server": ("topo", "server", "--no-shape"),
}


@pytest.fixture(scope="module")
def local(programs):
    """In-process servers by key, reached over the loopback transport: the servicer code a
    socket runs (decode, validate, compute, errors with status codes) without a subprocess."""
    made = {"chain": server_for(programs["chain"], "cloud", token=TOKEN, shape=False),
            # shaped (4g; asked: shaping is a rehearsal, off by default): the shaping check
            "dag": server_for(programs["dag"], "cloud", shape=True),
            "quant": server_for(programs["quant"], "cloud", shape=False)}
    return {key: server.loopback_channel() for key, server in made.items()}


class Servers:
    """The file's servers by key, each started on first use (or all at once: ``prefetch``)."""

    def __init__(self, plans: dict[str, Path], log_dir: Path) -> None:
        self.plans, self.log_dir = plans, log_dir
        self.started: dict[str, ServerProc] = {}

    def start(self, key: str, plan: str, device: str, *flags: str, port: int = 0
              ) -> ServerProc:
        self.started[key] = ServerProc(self.plans[plan], device, *flags, log_dir=self.log_dir,
                                       port=port)
        return self.started[key]

    def __getitem__(self, key: str) -> ServerProc:
        if key not in self.started:
            self.start(key, *SERVERS[key])
        return self.started[key]

    def prefetch(self) -> None:
        for key in SERVERS:
            self[key]  # starts it

    def kill_all(self) -> None:
        for s in self.started.values():  # SIGKILL: a graceful exit costs each 1-2 s of CPU
            s.kill()


@pytest.fixture(scope="module")
def servers(plans, tmp_path_factory):
    """Started side by side up front (start-up is the slow part), except under pytest-xdist,
    where a worker runs only some of these tests and starts only the servers they use."""
    registry = Servers(plans, tmp_path_factory.mktemp("runtime-logs"))
    try:
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            registry.prefetch()
        yield registry
    finally:
        registry.kill_all()


def _inputs(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*INPUT_SHAPE, generator=g) for _ in range(n)]


def _assert_float_equal(program: PlanProgram, client: ChainClient, n: int = 3) -> None:
    for x in _inputs(n):
        got = client.request([x]).outputs
        want = program.unsplit([x])
        for o, ref in zip(got, want, strict=True):
            assert o.shape == ref.shape
            assert torch.allclose(o, ref, atol=FLOAT_TOL, rtol=FLOAT_TOL), \
                float((o - ref).abs().max())


# ---- 1. float plans equal the unsplit model -------------------------------------------------
def test_chain_cut_equals_unsplit_model(servers, programs, plans):
    program, server = programs["chain"], servers["chain"]
    with ChainClient(program, server.address, token=TOKEN, shape=False, timeout_s=30) as c:
        d = c.describe()
        assert (d.device, list(d.inputs), d.plan_id) == ("cloud", ["relu_1"], program.plan_id)
        _assert_float_equal(program, c)
    # the same through `edgesplit run --json` (links real by default: no --no-shape needed)
    result = runner.invoke(app, ["run", str(plans["chain"]), "--server", server.address,
                                 "--token", TOKEN, "-n", "6", "-c", "2",
                                 "--timeout-s", "30", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    for key in ("requests", "ok", "errors", "error_messages", "max_abs_diff", "latency_ms",
                "breakdown_ms", "predicted_ms", "per_request"):
        assert key in doc
    assert (doc["requests"], doc["ok"], doc["errors"]) == (6, 6, 0)
    assert doc["max_abs_diff"] <= FLOAT_TOL
    assert set(doc["latency_ms"]) == {"mean", "p50", "p95", "max"}
    assert set(doc["breakdown_ms"]) == {"edge", "serialize", "transfer", "remote", "total"}
    assert doc["predicted_ms"] == pytest.approx(programs["chain"].plan.predicted.total_ms)
    assert doc["rehearsal"] == {"links_shaped": False, "compute_emulated": False}


def test_dag_cut_equals_unsplit_model(local, programs):
    program = programs["dag"]
    with ChainClient(program, local["dag"], shape=False, timeout_s=30) as c:
        assert sorted(c.describe().inputs) == ["relu_1", "relu_2"]
        _assert_float_equal(program, c)


def test_three_device_chain_equals_unsplit_model_and_retries_wait_for_its_hub(servers, programs):
    """The raw input crosses to the hub, the hub's output to the last device, the model output
    back. The hub comes up while a client with --retries is already calling it."""
    program = programs["topo"]
    last = servers["topo-server"]
    address = f"127.0.0.1:{free_port()}"
    done: dict = {}

    def early_client() -> None:
        try:
            with ChainClient(program, address, shape=False, timeout_s=30, retries=40,
                             retry_backoff_s=0.1) as c:
                done["result"] = c.request()
        except Exception as exc:
            done["error"] = exc
        done["at"] = time.perf_counter()

    thread = threading.Thread(target=early_client, daemon=True)
    thread.start()
    hub = servers.start("topo-hub", "topo", "hub", "--no-shape", "--next", last.address,
                        port=int(address.rsplit(":", 1)[1]))
    assert hub.address == address
    up_at = time.perf_counter()
    thread.join(timeout=120)
    assert not thread.is_alive() and "error" not in done, done.get("error")
    assert done["at"] >= up_at - 0.5  # it was answered only once the hub was up
    assert torch.allclose(done["result"].outputs[0], program.unsplit()[0], atol=FLOAT_TOL,
                          rtol=FLOAT_TOL)

    for s, device in ((last, "server"), (hub, "hub")):
        with grpc.insecure_channel(s.address) as ch:
            d = pb_grpc.PartitionServiceStub(ch).Describe(pb.DescribeRequest(), timeout=30)
        step = program.step(device)
        assert (d.device, tuple(d.inputs), tuple(d.outputs)) == \
            (device, step.receives, step.returns)
    assert program.step("server").returns == tuple(program.outputs)  # computed on the last
    with ChainClient(program, hub.address, shape=False, timeout_s=30) as c:
        r = c.request()
        assert {"hub.compute_ms", "server.compute_ms"} <= set(r.hops_ms)
        assert program.step("cam").partition is None  # the camera runs nothing, relays
        _assert_float_equal(program, c)
        # the last device dies: the middle hop answers with a clear error and keeps running
        last.kill()
        with pytest.raises(RemoteError, match="is up, but the chain behind it failed: next hop "
                                              "after 'hub' failed: UNAVAILABLE"):
            c.request()
        assert hub.alive()


# ---- 2. a quantized plan equals its in-process reference ------------------------------------
def test_quantized_plan_equals_run_local(local, programs):
    program = programs["quant"]
    step = program.steps[0]
    assert step.send_bits == {"relu_3": 4}
    assert all(layer.w_bits == 4 for layer in program.plan.layers if layer.name in
               step.partition.layers)
    address = local["quant"]
    local_diffs = []
    with ChainClient(program, address, shape=False, timeout_s=30) as c:
        for x in _inputs(3, seed=1):
            got, = c.request([x]).outputs
            local, = program.run_local([x])[0]
            unsplit, = program.unsplit([x])
            local_diffs.append(float((got - local).abs().max()))
            assert torch.allclose(got, local, atol=1e-4, rtol=1e-4), local_diffs[-1]
            assert float((got - unsplit).abs().max()) > 1e-3  # quantization shows
    report = run_requests(program, address, requests=3,
                          client_options={"shape": False, "timeout_s": 30})
    assert (report["ok"], report["errors"]) == (3, 0)
    local, = program.run_local()[0]
    unsplit, = program.unsplit()
    expected = float((local - unsplit).abs().max())
    assert report["max_abs_diff"] == pytest.approx(expected, rel=1e-3, abs=1e-4)
    assert report["max_abs_diff"] > 1e-3
    print(f"\nquantized plan (w4 a8, 4-bit wire): max |networked - run_local| "
          f"{max(local_diffs):.2e}, reported max_abs_diff from float {report['max_abs_diff']:.4f} "
          f"(outputs up to {float(unsplit.abs().max()):.1f})")


# ---- 3. bad requests fail alone, with clear errors ------------------------------------------
def _bundle(program: PlanProgram, x: torch.Tensor, request_id: int) -> pb.Bundle:
    """What the client sends for input ``x``, built by hand."""
    step = program.steps[0]
    values = step.compute(program.input_values([x]))
    b = pb.Bundle(plan_id=plan_id(program.plan), plan_version=PLAN_VERSION,
                  request_id=request_id)
    for name, data in program.encode(step, values, step.sends).items():
        b.tensors.add(name=name, data=data)
    return b


def _check_reply(program: PlanProgram, reply: pb.Bundle, x: torch.Tensor,
                 request_id: int) -> None:
    assert reply.request_id == request_id and not reply.error
    assert [t.name for t in reply.tensors] == program.outputs
    got = decode_tensor(reply.tensors[0].data)
    assert torch.allclose(got, program.unsplit([x])[0], atol=FLOAT_TOL, rtol=FLOAT_TOL)


def _good_request(program: PlanProgram, stub, request_id: int = 99) -> None:
    x = _inputs(1, seed=request_id)[0]
    _check_reply(program, stub.Run(_bundle(program, x, request_id), timeout=30,
                                   metadata=AUTH), x, request_id)


def _relu1(data: bytes | None = None, **kw) -> pb.Tensor:
    return pb.Tensor(name="relu_1", data=data if data is not None else
                     encode_tensor(torch.randn(1, 32, 16, 16, **kw), 32))


def _bad_cases(limit: int):
    good = encode_tensor(torch.randn(1, 32, 16, 16), 32)
    corrupt = bytearray(good)
    corrupt[-5] ^= 0xFF  # a payload byte: only the checksum can tell
    small = encode_tensor(torch.randn(4), 32)
    return {
        "wrong shape": ([pb.Tensor(name="relu_1",
                                   data=encode_tensor(torch.randn(1, 32, 8, 8), 32))],
                        {}, grpc.StatusCode.INVALID_ARGUMENT, "shape"),
        "wrong dtype": ([_relu1(dtype=torch.float64)], {}, grpc.StatusCode.INVALID_ARGUMENT,
                        "dtype"),
        "truncated": ([_relu1(good[: len(good) // 2])], {}, grpc.StatusCode.INVALID_ARGUMENT,
                      "truncated"),
        "corrupt": ([_relu1(bytes(corrupt))], {}, grpc.StatusCode.INVALID_ARGUMENT,
                    "checksum"),
        "not a tensor": ([_relu1(b"hello")], {}, grpc.StatusCode.INVALID_ARGUMENT,
                         "relu_1"),
        "unknown tensor": ([pb.Tensor(name="relu_2", data=good)], {},
                           grpc.StatusCode.INVALID_ARGUMENT, "expects tensors"),
        "missing tensor": ([], {}, grpc.StatusCode.INVALID_ARGUMENT, "expects tensors"),
        "twice": ([_relu1(small), _relu1(small)], {}, grpc.StatusCode.INVALID_ARGUMENT,
                  "expects tensors"),
        "other plan": ([_relu1(good)], {"plan_id": "0123456789abcdef"},
                       grpc.StatusCode.FAILED_PRECONDITION, "plan mismatch"),
        "other version": ([_relu1(good)], {"plan_version": PLAN_VERSION + 1},
                          grpc.StatusCode.FAILED_PRECONDITION, "plan mismatch"),
        "oversized": ([_relu1(b"\0" * (limit + 1024))], {}, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      "larger than max"),
    }


BAD_CASES = ["wrong shape", "wrong dtype", "truncated", "corrupt", "not a tensor",
             "unknown tensor", "missing tensor", "twice", "other plan", "other version",
             "oversized"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_message_fails_alone(local, programs, case):
    program, channel = programs["chain"], local["chain"]
    limit = max_message_bytes(program)
    tensors, fields, code, text = _bad_cases(limit)[case]
    bad = pb.Bundle(plan_id=plan_id(program.plan), plan_version=PLAN_VERSION, request_id=7,
                    tensors=tensors)
    for key, value in fields.items():
        setattr(bad, key, value)
    stub = pb_grpc.PartitionServiceStub(channel)
    assert stub.Describe(pb.DescribeRequest(), timeout=30,
                         metadata=AUTH).max_message_bytes == limit
    with pytest.raises(grpc.RpcError) as info:
        stub.Run(bad, timeout=30, metadata=AUTH)
    assert info.value.code() == code, info.value.details()
    assert text in info.value.details()
    _good_request(program, stub)  # the server serves the next request


def test_wrong_token_and_mismatched_plan(servers, programs, plans):
    program, server = programs["chain"], servers["chain"]
    for token in ("wrong", None):
        with ChainClient(program, server.address, token=token, shape=False,
                         timeout_s=30) as c, \
                pytest.raises(RemoteError, match=r"UNAUTHENTICATED.*token"):
            c.request()
        with ChainClient(program, server.address, token=TOKEN, shape=False,
                         timeout_s=30) as c:
            _assert_float_equal(program, c, n=1)
    # the client runs another plan file than the server (one whose messages fit the server's
    # limit: a larger one, e.g. the dag plan's, is refused as RESOURCE_EXHAUSTED first)
    with ChainClient(programs["quant"], server.address, token=TOKEN, shape=False,
                     timeout_s=30) as c, \
            pytest.raises(RemoteError, match="FAILED_PRECONDITION: plan mismatch"):
        c.request()
    result = runner.invoke(app, ["run", str(plans["quant"]), "--server", server.address,
                                 "--token", TOKEN, "--no-shape", "--timeout-s", "30"])
    assert result.exit_code != 0
    assert "plan mismatch" in result.output and program.plan_id in result.output
    with ChainClient(program, server.address, token=TOKEN, shape=False, timeout_s=30) as c:
        _assert_float_equal(program, c, n=1)


# ---- 5. streaming: one bad request in the middle fails alone --------------------------------
def test_stream_with_bad_requests_in_the_middle(local, programs):
    program = programs["chain"]
    xs = dict(zip(range(101, 108), _inputs(7, seed=5), strict=True))
    bad = {104: ("shape", [pb.Tensor(name="relu_1",
                                      data=encode_tensor(torch.randn(1, 32, 4, 4), 32))]),
           106: ("dtype", [_relu1(dtype=torch.float64)])}
    bundles = []
    for rid, x in xs.items():
        b = _bundle(program, x, rid)
        if rid in bad:
            del b.tensors[:]
            b.tensors.extend(bad[rid][1])
        bundles.append(b)
    stub = pb_grpc.PartitionServiceStub(local["chain"])
    replies = list(stub.RunStream(iter(bundles), timeout=60, metadata=AUTH))
    by_id = {r.request_id: r for r in replies}
    assert len(replies) == len(bundles) and set(by_id) == set(xs)
    for rid, x in xs.items():
        if rid in bad:
            assert bad[rid][0] in by_id[rid].error and not by_id[rid].tensors
        else:
            _check_reply(program, by_id[rid], x, rid)


# ---- 6. load: 32 concurrent clients x 50 requests -------------------------------------------
def test_load_32_clients_x_50_requests(servers, programs):
    """A real server: 32 client threads and gRPC's worker pool in another process (in-process,
    clients and server would share one interpreter lock and measure that instead)."""
    program, server = programs["chain"], servers["chain"]
    batches = [(x,) for x in _inputs(64, seed=11)]  # distinct inputs: a mixed-up reply shows
    start = time.perf_counter()
    report = run_requests(program, server.address, requests=32 * 50, concurrency=32,
                          inputs=batches,
                          client_options={"token": TOKEN, "shape": False, "timeout_s": 60})
    wall = time.perf_counter() - start
    assert (report["requests"], report["ok"], report["errors"]) == (1600, 1600, 0), \
        report["error_messages"]
    assert report["max_abs_diff"] <= FLOAT_TOL
    # each of the 32 clients numbers its requests 1..50: every id exactly once per client
    ids = collections.Counter(r["request_id"] for r in report["per_request"])
    assert ids == {i: 32 for i in range(1, 51)}
    lat = report["latency_ms"]
    print(f"\nload 32 clients x 50 requests ({MODEL}, unshaped): {wall:.1f} s, "
          f"{report['throughput_rps']:.0f} req/s, latency ms mean {lat['mean']:.1f} "
          f"p50 {lat['p50']:.1f} p95 {lat['p95']:.1f} max {lat['max']:.1f}; breakdown ms "
          + ", ".join(f"{k} {v:.1f}" for k, v in report["breakdown_ms"].items()))
    assert server.alive()


# ---- 7. shaping: the measured transfer is the link's -----------------------------------------
def test_shaping_takes_the_links_time(local, programs):
    program = programs["dag"]
    link = program.plan.links[0].link
    assert (link.bandwidth_mbps, link.down_bandwidth_mbps, link.rtt_ms) == (10, 30, 50)
    with ChainClient(program, local["dag"], shape=True, timeout_s=30) as c:
        c.request()  # warm the connection
        transfers, expected = [], []
        for x in _inputs(4, seed=3):
            up = _bundle(program, x, 1).ByteSize()
            r = c.request([x])
            down = pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION, request_id=1,
                             tensors=[pb.Tensor(name=t, data=encode_tensor(o, 32)) for t, o in
                                      zip(program.outputs, r.outputs, strict=True)],
                             timings_ms=r.hops_ms).ByteSize()
            expected.append(up * 8 / (link.bandwidth_mbps * 1e3)
                            + down * 8 / (link.down_bandwidth_mbps * 1e3) + link.rtt_ms)
            transfers.append(r.breakdown_ms["transfer"])
    assert up > 65536  # the two crossing tensors at float32
    want, got = float(np.median(expected)), float(np.median(transfers))
    print(f"\nshaping 4g: expected transfer {want:.1f} ms, measured {got:.1f} ms "
          f"(min {min(transfers):.1f})")
    # a lower bound only: the shaper sleeps at least the link's time, and how much longer a
    # loaded machine takes to wake it says nothing about the shaper (no timing upper bounds)
    assert min(t - e for t, e in zip(transfers, expected, strict=True)) >= -0.5


# ---- 4. a killed server: a clear error, no hang; retries back off ---------------------------
def test_killed_server_gives_a_clear_error_promptly(servers, programs, plans):
    """(Retries reaching a server that comes up later: the three-device test.)"""
    program, server = programs["dag"], servers["dag"]
    address = server.address
    with ChainClient(program, address, shape=False, timeout_s=5) as c:
        _assert_float_equal(program, c, n=1)
        server.kill()
        # "unavailable", not "did not answer in time": it failed at once, not at the deadline
        with pytest.raises(RemoteError, match=r"unavailable.*edgesplit serve"):
            c.request()
    # the CLI: nonzero exit, one line
    result = runner.invoke(app, ["run", str(plans["dag"]), "--server", address, "--no-shape",
                                 "--timeout-s", "3"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "unavailable" in lines[0], \
        result.stderr
    # --retries waits with backoff (0.1 + 0.2 + 0.4 s) before giving up
    with ChainClient(program, address, shape=False, timeout_s=2, retries=3,
                     retry_backoff_s=0.1) as c:
        start = time.perf_counter()
        with pytest.raises(RemoteError, match="unavailable"):
            c.request()
        assert time.perf_counter() - start >= 0.7  # slept at least the backoff (no bound above)
