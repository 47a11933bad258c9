"""The split-inference runtime on this machine: what serving a plan costs over the data plane
and over gRPC, how exactly link shaping delays messages, how well plans predict measured
end-to-end latency, and how one server holds up under concurrent clients.

1. Overhead (loopback, no shaping): a served chain (client runs the edge part, an
   ``edgesplit serve`` process the cloud part) over the data plane and over gRPC, against
   ``PlanProgram.run_local()`` (the same partitions and wire encoding in one process), a
   raw TCP round trip of the same bytes, warm and in the served request's place (between the
   same computations), and a minimal Python split server (``MinimalSplit``: what any Python
   server pays), the references served by a process of their own, for requests of 16 KB to
   3.2 MB.
2. Shaping accuracy: the runtime's measured transfer time against the physical limit
   bytes*8/bandwidth + RTT at 3, 25 and 100 Mbps for messages of three splits.
3. Predicted vs measured: plans for edge = cloud = ``this-machine`` over a shaped 25 Mbps /
   10 ms link, predicted by the roofline of ``this-machine`` and by a per-layer profile measured
   just before, against the mean of 10 shaped requests.
4. Load: 1 and 32 concurrent clients against an ``edgesplit serve`` process for digits_cnn,
   over each plane, with and without dynamic batching.
5. Mesh (benchmarks/bench_mesh.py): a JMSNAS mesh plan served by one process per device, its
   measured latency against its eq. 2 prediction, and the same problem's best chain.
6. Baseline: an older commit's code (``--baseline REF``, default the commit before the
   serving-shell refactor) against this checkout's, interleaved: per setup an old and a new
   server run at once, each driven by its own version's clients (benchmarks/load_client.py,
   benchmarks/ab_client.py, importing that version's ``src``), one version's short block at a
   time, round by round, so that drift hits both alike. Section 4's setups (``--baseline-rounds``
   rounds of one client, then all), and section 1 (``--baseline-overhead-rounds`` rounds of a
   block of each plane per version and of the raw round trip in place; 0: skip): per metric
   the median of the rounds' new/old, with its spread.

Section 2 runs its servers in this process; every server is stopped in a ``finally``. The
benchmark refuses to start on a busy machine (1-minute load above 1.0; ``--allow-load`` for a
trial run, with ``--out`` elsewhere). Writes runtime.json (to benchmarks/results/ by default),
then runtime.md from it alone (render_runtime.py, where the tables and their prose live;
``--render-only`` renders again without measuring); quote the ratios, not absolute times.

    python benchmarks/bench_runtime.py [--sections overhead,load] [--out DIR] [--models a,b]
        [--requests 10] [--rounds 60] [--mesh-requests 400] [--baseline REF]
        [--baseline-rounds 15] [--baseline-overhead-rounds 20] [--overhead-splits 6] [--keep]
        [--render-only]
    python benchmarks/bench_runtime.py --smoke --out /tmp/rt   # (--quick) tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import bench_predicted as predicted  # section 3, also runnable alone (benchmarks/ is on the path)
import numpy as np
import render_runtime  # runtime.md from runtime.json
import torch

import edgesplit
from edgesplit.hardware import Device, Link, get_device
from edgesplit.hardware.profile import machine_info, time_call
from edgesplit.plan import (
    EdgeCloudSetting,
    PlanningProblem,
    get_planner,
)
from edgesplit.plan.model import Plan
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime import PlanProgram

try:
    from edgesplit.runtime.client import ChainClient
    from edgesplit.runtime.planned import decode_planned
except ImportError:  # section 6 runs this script on older commits' code too (section 1)
    from edgesplit.runtime.transport import ChainClient, decode_planned

RESULTS = Path(__file__).parent / "results"
HOST = "127.0.0.1"

# 1. overhead: (model, --split-after layer), requests from 16 KB to 3.2 MB of float32
OVERHEAD_SPLITS = [("digits_cnn", "down2.0"),                                   # 16 KB
                   ("resnet18", "resnet.encoder.stages.3.layers.1.add"),         # 100 KB
                   ("bert_mini", "encoder.layer.1.output.LayerNorm"),           # 131 KB both ways
                   ("resnet18", "resnet.encoder.stages.1.layers.1.add"),         # 401 KB
                   ("resnet18", "resnet.embedder.pooler"),                       # 803 KB
                   ("resnet18", "resnet.embedder.embedder.convolution")]         # 3.2 MB
# each variant runs OVERHEAD_BLOCK requests back to back, as a client streams them; one
# request at a time, interleaved, left the served process idle through five other variants'
# requests while the reference peers' process served three of the six (warmer, unfairly)
OVERHEAD_BLOCK = 6
PLANES = ("tcp", "grpc", "floor")  # floor: MinimalSplit, the least a Python server does
# 2. shaping: three message sizes (16 KiB, 98 KiB, 392 KiB of float32 activation)
SHAPING_SPLITS = [("digits_cnn", "down2.0"),
                  ("resnet18", "resnet.encoder.stages.3.layers.1.add"),
                  ("resnet18", "resnet.encoder.stages.1.layers.1.add")]
SHAPING_MBPS = (3.0, 25.0, 100.0)
SHAPING_RTT_MS = 20.0
# 3. predicted vs measured: models and link in benchmarks/bench_predicted.py
UNSHAPED_LINK = Link(name="loopback", bandwidth_mbps=10_000.0, rtt_ms=0.0, medium="wired")
# 4. load
LOAD_SPLIT = ("digits_cnn", "down2.0")
# long enough (a few seconds each) that start and end, and a slow second, weigh little
LOAD_CLIENTS, LOAD_REQUESTS, LOAD_SINGLE_REQUESTS = 32, 150, 1500
# one client then 32, LOAD_PAIRS times over: a lone client's rate moves by up to 10 % from
# run to run (where the scheduler puts it and the server), so one pair decides nothing at 2x
LOAD_PAIRS = 3
LOAD_PROCESSES = 4  # client processes (devices), LOAD_CLIENTS // LOAD_PROCESSES clients each


@dataclasses.dataclass(frozen=True)
class LoadSize:
    """How much load sections 4 and 6 put on a server: ``processes`` client processes of
    ``clients // processes`` clients, ``requests`` each; a lone client's ``single_requests``;
    ``pairs`` (one client, then all) per setup in section 4."""

    clients: int = LOAD_CLIENTS
    processes: int = LOAD_PROCESSES
    requests: int = LOAD_REQUESTS
    single_requests: int = LOAD_SINGLE_REQUESTS
    pairs: int = LOAD_PAIRS


FULL_LOAD = LoadSize()
QUICK_LOAD = LoadSize(clients=2, processes=1, requests=20, single_requests=50, pairs=1)
LOAD_SETUPS = [("tcp", True), ("grpc", True), ("tcp", False), ("grpc", False)]
QUIET_LOAD = 1.0  # 1-minute load average above which the machine is not quiet (2 cores)


# ---- helpers ------------------------------------------------------------------------------------
def _ms(fn) -> float:
    """One timed call (the benchmark interleaves its variants, in short blocks, round by round,
    so that all of them see the same machine conditions)."""
    return time_call(fn, warmup=0, repeats=1)["median"]


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


@contextlib.contextmanager
def serving(program: PlanProgram, *, shape: bool) -> Iterator[tuple[str, Any]]:
    """The plan's second device served on loopback, in this process; always stopped. Made as
    the code imported makes one (section 6 runs section 1 on an older commit's code too)."""
    try:
        from edgesplit.runtime.options import ServeOptions
        from edgesplit.runtime.server import partition_server
    except ImportError:  # before the serving shell took ServeOptions (issue 57)
        from edgesplit.runtime.transport import PartitionServer

        server = PartitionServer(program, program.steps[1].name, shape=shape)
    else:
        server = partition_server(program, program.steps[1].name, ServeOptions(shape=shape))
    try:
        port = server.start(HOST, 0)
        yield f"{HOST}:{port}", server
    finally:
        server.stop(grace_s=1.0)


def _record_sizes(shaper, log: list[int]) -> None:
    """Record the message sizes a LinkShaper is charged with (the exact protobuf sizes); the
    shaper still does its work (with shaping off it returns at once)."""
    send = shaper.send

    def recording(nbytes: int, direction: str = "up") -> float:
        log.append(int(nbytes))
        return send(nbytes, direction)

    shaper.send = recording


# ---- 1. the reference peers, served from their own process ------------------------------------
def _recv_exact(conn: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def _listen_thread(serve_one: Any) -> int:
    """A listener on loopback whose one connection ``serve_one(conn)`` answers in a thread; its
    port."""
    listener = socket.create_server((HOST, 0))

    def run() -> None:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            serve_one(conn)
        listener.close()

    threading.Thread(target=run, daemon=True).start()
    return int(listener.getsockname()[1])


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Echo:
    """A raw TCP round trip: an 8-byte header (bytes up, bytes down) and the upload, answered
    with that many bytes by the peer process. The baseline a transport cannot beat on
    loopback, measured warm (nothing computes before or between)."""

    @staticmethod
    def serve(conn: socket.socket, max_reply: int) -> None:
        reply, header, sink = memoryview(os.urandom(max_reply)), bytearray(8), bytearray(1 << 16)
        while _recv_exact(conn, memoryview(header)):
            n_up, n_down = struct.unpack("<II", header)
            if len(sink) < n_up:
                sink = bytearray(n_up)
            if not _recv_exact(conn, memoryview(sink)[:n_up]):
                return
            conn.sendall(reply[:n_down])

    def __init__(self, port: int, n_up: int, n_down: int) -> None:
        self._sock = _connect(port)
        self._message = struct.pack("<II", n_up, n_down) + os.urandom(n_up)
        self._buf, self._n_down = bytearray(max(n_down, 1)), n_down

    def round_trip(self) -> None:
        self._sock.sendall(self._message)
        _recv_exact(self._sock, memoryview(self._buf)[:self._n_down])

    def close(self) -> None:
        self._sock.close()


class MinimalSplit:
    """The floor of serving a split in Python, for comparison: one raw TCP connection to a peer
    process whose thread reads the request's wire messages behind a bare length header, decodes
    them (against the plan's shapes, as every server must), runs the second partition, encodes
    its outputs and answers them with its compute and codec times. No frame meta, token, plan,
    name or deadline checks, no pooled connections or worker slots: what the data plane adds
    on top of this is its own cost; what this adds on top of a raw round trip is the least a
    Python server pays.

    With ``codec=False`` it is the raw round trip between the same computations: the messages
    are made beforehand, the peer computes the cloud part on inputs decoded beforehand and
    answers with outputs encoded beforehand, so that what is left besides compute is the
    transport alone, in the served request's place (after the edge compute, to a peer that
    wakes for it and computes before answering)."""

    _HEAD = struct.Struct("<IQ")  # message count, total bytes after this header
    _REPLY = struct.Struct("<Idd")  # message count, remote compute ms, remote codec ms

    def __init__(self, program: PlanProgram, port: int, *, codec: bool = True) -> None:
        self.program, self.edge, self.cloud = program, program.steps[0], program.steps[1]
        self.codec = codec
        self._sent, _, answer = _prepared(program)
        self._reply_size = self._REPLY.size + 8 * len(answer) + sum(map(len, answer))
        self._sock = _connect(port)
        self._buf = bytearray(max(self._reply_size, 1 << 16))

    @classmethod
    def serve(cls, conn: socket.socket, program: PlanProgram, codec: bool) -> None:
        cloud, head = program.steps[1], bytearray(cls._HEAD.size)
        _, ready, answer = _prepared(program)
        buf = bytearray(1 << 20)
        while _recv_exact(conn, memoryview(head)):
            count, rest = cls._HEAD.unpack(head)
            if len(buf) < rest:
                buf = bytearray(rest)
            view = memoryview(buf)[:rest]
            if not _recv_exact(conn, view):
                return
            if not codec:  # the raw round trip: compute between, no codec
                t1 = time.perf_counter()
                cloud.compute(dict(ready))
                t2 = time.perf_counter()
                conn.sendmsg(cls._pack(cls._REPLY.pack(len(answer), (t2 - t1) * 1e3, 0.0),
                                       answer))
                continue
            t0 = time.perf_counter()
            values = {name: decode_planned(program, name, data) for name, data in
                      zip(cloud.receives, cls._messages(view, count), strict=True)}
            t1 = time.perf_counter()
            values = cloud.compute(values)
            t2 = time.perf_counter()
            out = [encode_tensor(values[name], 32) for name in cloud.returns]
            codec_ms = (t1 - t0 + time.perf_counter() - t2) * 1e3
            conn.sendmsg(cls._pack(cls._REPLY.pack(len(out), (t2 - t1) * 1e3, codec_ms), out))

    @staticmethod
    def _messages(view: memoryview, count: int) -> list[memoryview]:
        sizes = struct.unpack_from(f"<{count}Q", view)
        out, at = [], 8 * count
        for n in sizes:
            out.append(view[at:at + n])
            at += n
        return out

    @staticmethod
    def _pack(head: bytes, messages: list[bytes]) -> list[bytes]:
        return [head + struct.pack(f"<{len(messages)}Q", *map(len, messages)), *messages]

    def request(self) -> dict[str, float]:
        """One request, split as ChainClient splits its own: edge, serialize, remote,
        transfer, total (ms)."""
        start = time.perf_counter()
        values = self.edge.compute(self.program.input_values())
        edge = (time.perf_counter() - start) * 1e3
        if not self.codec:
            return self._raw_request(start, edge)
        t0 = time.perf_counter()
        sent = list(self.program.encode(self.edge, values, self.cloud.receives).values())
        codec = (time.perf_counter() - t0) * 1e3
        self._sock.sendmsg(self._pack(self._HEAD.pack(len(sent), 8 * len(sent) + sum(
            map(len, sent))), sent))
        head = bytearray(self._REPLY.size)
        _recv_exact(self._sock, memoryview(head))
        count, remote, remote_codec = self._REPLY.unpack(head)
        sizes = bytearray(8 * count)
        _recv_exact(self._sock, memoryview(sizes))
        body = bytearray(sum(struct.unpack(f"<{count}Q", sizes)))
        _recv_exact(self._sock, memoryview(body))
        t1 = time.perf_counter()
        at = 0
        for name, n in zip(self.cloud.returns, struct.unpack(f"<{count}Q", sizes), strict=True):
            decode_planned(self.program, name, memoryview(body)[at:at + n])
            at += n
        codec += (time.perf_counter() - t1) * 1e3 + remote_codec
        total = (time.perf_counter() - start) * 1e3
        return {"edge": edge, "serialize": codec, "remote": remote, "total": total,
                "transfer": max(0.0, total - edge - codec - remote)}

    def _raw_request(self, start: float, edge: float) -> dict[str, float]:
        """The raw round trip between the same computations: the messages made beforehand go
        out in one write and the reply (its size known) comes back in one read."""
        self._sock.sendmsg(self._pack(self._HEAD.pack(len(self._sent), 8 * len(self._sent) + sum(
            map(len, self._sent))), self._sent))
        reply = memoryview(self._buf)[:self._reply_size]
        _recv_exact(self._sock, reply)
        remote = self._REPLY.unpack_from(reply)[1]
        total = (time.perf_counter() - start) * 1e3
        return {"edge": edge, "serialize": 0.0, "remote": remote, "total": total,
                "transfer": max(0.0, total - edge - remote)}

    def close(self) -> None:
        self._sock.close()


def _prepared(program: PlanProgram) -> tuple[list[bytes], dict[str, torch.Tensor], list[bytes]]:
    """The request's wire messages, the cloud part's inputs decoded from them and its outputs'
    messages, for the plan's example input (same shapes, so same sizes, in either process)."""
    edge, cloud = program.steps[0], program.steps[1]
    sent = list(program.encode(edge, edge.compute(program.input_values()), cloud.receives)
                .values())
    ready = {name: decode_planned(program, name, data) for name, data in
             zip(cloud.receives, sent, strict=True)}
    out = cloud.compute(dict(ready))
    return sent, ready, [encode_tensor(out[name], 32) for name in cloud.returns]


def _peer_process(plan_path: str, max_reply: int, ports: Any, stop: Any) -> None:
    """The reference peers for one plan in their own process (a split's two sides are two
    processes, as the served chain's are): an echo, the floor, and the raw split; their ports
    go on ``ports``, and the process ends when ``stop`` is set."""
    from edgesplit.plan import load_plan

    torch.set_num_threads(predicted.THREADS)  # a device: one core, as the served side has
    program = PlanProgram.load(load_plan(plan_path))
    ports.put((_listen_thread(lambda c: Echo.serve(c, max_reply)),
               _listen_thread(lambda c: MinimalSplit.serve(c, program, True)),
               _listen_thread(lambda c: MinimalSplit.serve(c, program, False))))
    stop.wait()


@contextlib.contextmanager
def reference_peers(plan_path: Path, max_reply: int) -> Iterator[tuple[int, int, int]]:
    """:func:`_peer_process` started and, at the end, stopped: the echo's, the floor's and the
    raw split's ports."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork after torch and gRPC started
    ports, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_peer_process, args=(str(plan_path), max_reply, ports, stop))
    proc.start()
    try:
        yield ports.get(timeout=300)
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.terminate()


def _problem(model: str, setting: EdgeCloudSetting) -> PlanningProblem:
    return PlanningProblem(model, setting)


def _with_setting(problem: PlanningProblem, setting: EdgeCloudSetting) -> PlanningProblem:
    """The same captured graphs under another setting (fresh cost tables), as sweep_link does."""
    return dataclasses.replace(problem, setting=setting, _costs={})


def _manual(problem: PlanningProblem, layer: str) -> tuple[Plan, PlanProgram]:
    plan = get_planner("manual", split_after=[layer]).plan(problem)
    return plan, PlanProgram.load(plan, graph=problem.graph)


def _link_for(mbps: float, rtt_ms: float) -> Link:
    return Link(name=f"shaped-{mbps:g}mbps-{rtt_ms:g}ms", bandwidth_mbps=mbps, rtt_ms=rtt_ms,
                medium="wired")


# ---- 1. overhead --------------------------------------------------------------------------------
def _wire_bytes(program: PlanProgram) -> tuple[int, int]:
    """Bytes of the wire messages a request sends up and its reply brings down (tensor
    messages with their headers; frames and protobuf add a few dozen bytes)."""
    step = program.steps[0]
    values = step.compute(program.input_values())
    up = sum(len(d) for d in program.encode(step, values, step.sends).values())
    down = sum(len(encode_tensor(o, 32)) for o in program.unsplit())
    return up, down


def _overhead_row(model: str, layer: str, program: PlanProgram, plane: str,
                  results: list[dict[str, float]], local_timings: list, raw: list[float],
                  up: int, down: int, served: list[float], in_place: list[dict[str, float]]
                  ) -> dict[str, Any]:
    """One plane's row; ``results`` are the requests' breakdowns (ChainClient's own split),
    ``in_place`` the raw round trips between the same computations (MinimalSplit without
    codec: their transfer is the whole round trip)."""
    transfer = _median([r["transfer"] for r in results])
    between = _median([r["transfer"] for r in in_place])
    serialize = _median([r["serialize"] for r in results])
    local_serialize = _median([t["serialize"] for t in local_timings])
    local = _median([sum(t.values()) for t in local_timings])
    overhead = transfer + serialize - local_serialize
    sock = _median(raw)
    return {
        "model": model, "split_after": layer, "crossing": list(program.steps[0].sends),
        "plane": plane, "request_bytes": up, "reply_bytes": down, "rounds": len(results),
        "block": OVERHEAD_BLOCK,
        "served_ms": _median(served), "run_local_ms": local, "raw_socket_rtt_ms": sock,
        "served_compute_ms": _median([r["edge"] + r["remote"] for r in results]),
        "local_compute_ms": _median([t["compute"] for t in local_timings]),
        "runtime_transfer_ms": transfer, "runtime_serialize_ms": serialize,
        "local_serialize_ms": local_serialize,
        # what serving adds besides compute: the transport and the reply's encode/decode
        "overhead_ms": overhead, "overhead_over_socket": overhead / sock,
        # the same bytes' round trip in the served request's place: after the edge compute,
        # to a peer that wakes for it and computes the cloud part before answering
        "raw_rtt_in_place_ms": between, "overhead_over_in_place": overhead / between,
        "overhead_over_local": overhead / local,
    }


def bench_overhead(device: Device, rounds: int, tmp: Path,
                   splits: list[tuple[str, str]] = OVERHEAD_SPLITS) -> list[dict[str, Any]]:
    """Per split: the data plane and gRPC served side by side with run_local, a raw socket
    carrying the same bytes, the floor and the raw round trip between the same computations,
    interleaved block by block. Every server is a process of its own (`edgesplit serve`, and
    one process for the reference peers), as a split's two sides are: in one process the
    client's and the server's threads would take turns on one interpreter lock."""
    threads = torch.get_num_threads()
    torch.set_num_threads(predicted.THREADS)  # this process is the edge device: one core
    try:
        return _overhead_splits(device, rounds, tmp, splits)
    finally:
        torch.set_num_threads(threads)


def _overhead_splits(device: Device, rounds: int, tmp: Path, splits: list[tuple[str, str]]
                     ) -> list[dict[str, Any]]:
    rows = []
    for i, (model, layer) in enumerate(splits):
        problem = _problem(model, EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED_LINK))
        plan, program = _manual(problem, layer)
        plan_path = tmp / f"overhead-{i}.json"
        plan.save(plan_path)
        up, down = _wire_bytes(program)
        with serve_process(plan_path, "--threads", str(predicted.THREADS)) as address, \
                reference_peers(plan_path, max(down, 1)) as (echo_port, floor_port, raw_port), \
                ChainClient(program, address, shape=False, data_plane="tcp") as tcp, \
                ChainClient(program, address, shape=False, data_plane="grpc") as grpc_client:
            echo, floor = Echo(echo_port, up, down), MinimalSplit(program, floor_port)
            in_place = MinimalSplit(program, raw_port, codec=False)
            try:
                results, local_timings, raw, served = _overhead_rounds(
                    program, rounds, tcp, grpc_client, floor, echo, in_place)
            finally:
                echo.close()
                floor.close()
                in_place.close()
        for plane in PLANES:
            rows.append(_overhead_row(model, layer, program, plane, results[plane],
                                      local_timings, raw, up, down, served[plane],
                                      results["raw"]))
        by = {r["plane"]: r for r in rows[-len(PLANES):]}
        print(f"overhead {model} {up:,} B up: data plane {by['tcp']['overhead_ms']:.3f} ms "
              f"(x{by['tcp']['overhead_over_in_place']:.2f} raw in place, "
              f"x{by['tcp']['overhead_over_socket']:.2f} warm), gRPC "
              f"{by['grpc']['overhead_ms']:.3f} ms, Python floor {by['floor']['overhead_ms']:.3f}"
              f" ms, raw in place {by['tcp']['raw_rtt_in_place_ms']:.3f} ms, warm "
              f"{by['tcp']['raw_socket_rtt_ms']:.3f} ms")
    return rows


def _overhead_rounds(program: PlanProgram, rounds: int, tcp: ChainClient,
                     grpc_client: ChainClient, floor: MinimalSplit, echo: Echo,
                     in_place: MinimalSplit) -> tuple[dict[str, list], list, list, dict]:
    """``rounds`` requests of every variant, in blocks of OVERHEAD_BLOCK back-to-back requests
    (as a client streams them: its server wakes after the edge compute, not after five other
    variants' requests to other processes), one block of each variant per round in an order
    that rotates round by round (so that all see the same machine conditions and each follows
    each); three warm-up requests of each first."""
    results: dict[str, list] = {"tcp": [], "grpc": [], "floor": [], "raw": []}
    served: dict[str, list[float]] = {"tcp": [], "grpc": [], "floor": []}
    local_timings: list = []
    raw: list[float] = []
    variants = [
        lambda: results["tcp"].append(tcp.request().breakdown_ms),
        lambda: results["grpc"].append(grpc_client.request().breakdown_ms),
        lambda: results["floor"].append(floor.request()),
        lambda: local_timings.append(program.run_local()[1]),
        echo.round_trip,
        lambda: results["raw"].append(in_place.request())]
    for _ in range(3):  # warm every path (connections, first-call work)
        for v in variants:
            v()
    for key in results:
        results[key].clear()
    local_timings.clear()
    for r in range(-(-rounds // OVERHEAD_BLOCK)):
        for k in [(r + i) % len(variants) for i in range(len(variants))]:
            for _ in range(OVERHEAD_BLOCK):
                t = _ms(variants[k])
                (served["tcp"], served["grpc"], served["floor"], [], raw, [])[k].append(t)
    return results, local_timings, raw, served


# ---- 2. shaping accuracy ------------------------------------------------------------------------
def bench_shaping(device: Device, requests: int) -> list[dict[str, Any]]:
    rows = []
    problems: dict[str, PlanningProblem] = {}
    for model, layer in SHAPING_SPLITS:
        base = problems.setdefault(model, _problem(
            model, EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED_LINK)))
        # the same program unshaped: what the transport itself costs for these messages
        _, program = _manual(base, layer)
        with serving(program, shape=False) as (address, _server), \
                ChainClient(program, address, shape=False) as client:
            for _ in range(2):
                client.request()
            baseline = _median([client.request().breakdown_ms["transfer"]
                                for _ in range(3 * requests)])
        for mbps in SHAPING_MBPS:
            link = _link_for(mbps, SHAPING_RTT_MS)
            problem = _with_setting(base, EdgeCloudSetting(edge=device, cloud=device, link=link))
            plan, program = _manual(problem, layer)
            up, down = [], []
            with serving(program, shape=True) as (address, server):
                _record_sizes(getattr(server, "handler", server).upstream, down)
                with ChainClient(program, address, shape=True) as client:
                    _record_sizes(client.shaper, up)
                    client.request()  # warm-up
                    measured = [client.request().breakdown_ms["transfer"]
                                for _ in range(requests)]
            n_up, n_down = up[-1], down[-1]
            physical = (n_up + n_down) * 8 / (mbps * 1e3) + SHAPING_RTT_MS
            predicted = plan.predicted.transfer_ms + plan.predicted.rtt_ms
            m = _median(measured)
            rows.append({
                "model": model, "split_after": layer, "bandwidth_mbps": mbps,
                "rtt_ms": SHAPING_RTT_MS, "request_bytes": n_up, "reply_bytes": n_down,
                "tensor_bytes": plan.transfers[0].bytes, "requests": requests,
                "measured_transfer_ms": m, "measured_min_ms": min(measured),
                "measured_max_ms": max(measured), "physical_limit_ms": physical,
                "measured_over_physical": m / physical, "excess_ms": m - physical,
                "unshaped_transfer_ms": baseline,
                "excess_minus_unshaped_ms": m - physical - baseline,
                "plan_predicted_ms": predicted, "plan_over_physical": predicted / physical,
            })
            print(f"shaping {model} {layer} @ {mbps:g} Mbps: {m:.2f} ms vs {physical:.2f} ms")
    return rows


# ---- 3. predicted vs measured: benchmarks/bench_predicted.py ----------------------------------
def bench_predicted_section(models: list[str], requests: int, tmp: Path) -> dict[str, Any]:
    before = os.getloadavg()[0]
    rows, extra = predicted.bench_predicted(models, requests, tmp)
    return {"rows": rows, **extra, "requests": requests, "models": models,
            "threads": predicted.THREADS, "idle_ms": predicted.IDLE_MS, "load_before": before,
            "load_after": os.getloadavg()[0],
            "summary": predicted.summary(rows)}


# ---- 4. load ------------------------------------------------------------------------------------
serve_process = predicted.serve_process  # section 3 serves its plans the same way


def _client_process(plan_path: str, address: str, plane: str, threads: int, requests: int,
                    barrier: Any, results: Any) -> None:
    """One client device: ``threads`` clients of its own, started together with every other
    process's at ``barrier``; puts what it measured on ``results``."""
    from edgesplit.plan import load_plan

    torch.set_num_threads(1)  # a client device computes on one core; four share two here
    program = PlanProgram.load(load_plan(plan_path))
    inputs = [(x,) for x in torch.randn(16, *program.graph.example_inputs[0].shape)]
    references = [program.unsplit(x) for x in inputs]
    clients = [ChainClient(program, address, shape=False, data_plane=plane)
               for _ in range(threads)]
    for c in clients:  # connect and warm up before the clock starts
        c.request(inputs[0])
    barrier.wait()
    latencies, answers, errors = [], [], []

    def loop(k: int) -> None:
        for i in range(requests):
            x = (k * requests + i) % len(inputs)
            t = time.monotonic()
            try:
                r = clients[k].request(inputs[x])
            except Exception as exc:
                errors.append(str(exc))
                continue
            latencies.append((time.monotonic() - t) * 1e3)
            answers.append((x, r.outputs))  # checked once the clock has stopped

    cpu = time.process_time()  # this device's CPU (all its threads) for the run
    start = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(loop, range(threads)))
    end = time.monotonic()
    cpu = time.process_time() - cpu
    for c in clients:
        c.close()
    diffs = [max(float((o - ref).abs().max()) for o, ref in zip(out, references[x], strict=True))
             for x, out in answers]
    results.put({"start": start, "end": end, "latencies_ms": latencies, "errors": errors,
                 "max_abs_diff": max(diffs, default=float("nan")), "cpu_s": cpu})


def _load_run(plan_path: Path, address: str, plane: str, processes: int, threads: int,
              requests: int) -> dict[str, Any]:
    """``processes`` client processes x ``threads`` clients each, ``requests`` each; what they
    measured together (throughput from the first start to the last end), and the CPU the
    clients and (for a served process's address) the server used per request."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork after torch and gRPC started
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=(str(plan_path), address, plane, threads,
                                                        requests, barrier, results))
             for _ in range(processes)]
    for p in procs:
        p.start()
    pid = getattr(address, "pid", None)
    server_cpu = predicted.process_cpu_s(pid) if pid else 0.0  # idle until the clients start
    parts = [results.get(timeout=600) for _ in procs]
    server_cpu = predicted.process_cpu_s(pid) - server_cpu if pid else float("nan")
    for p in procs:
        p.join(10)
    return _load_summary(parts, processes, threads, requests, server_cpu)


def _load_summary(parts: list[dict[str, Any]], processes: int, threads: int, requests: int,
                  server_cpu: float) -> dict[str, Any]:
    """What ``processes`` client processes x ``threads`` clients measured together: latency,
    throughput from the first start to the last end, errors, CPU per request."""
    lat = [x for part in parts for x in part["latencies_ms"]]
    errors = [e for part in parts for e in part["errors"]]
    wall = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    return {
        "processes": processes, "clients": processes * threads, "requests_per_client": requests,
        "requests": processes * threads * requests, "ok": len(lat), "errors": len(errors),
        "error_messages": errors[:5],
        "max_abs_diff": max(p["max_abs_diff"] for p in parts),
        "latency_ms": {"mean": float(np.mean(lat)), "p50": float(np.percentile(lat, 50)),
                       "p95": float(np.percentile(lat, 95)),
                       "p99": float(np.percentile(lat, 99)), "max": float(np.max(lat))},
        "throughput_rps": len(lat) / wall, "wall_s": wall,
        # CPU per answered request; cores busy = all of it over the wall time
        "client_cpu_ms": 1e3 * sum(p["cpu_s"] for p in parts) / max(len(lat), 1),
        "server_cpu_ms": 1e3 * server_cpu / max(len(lat), 1),
        "cores_busy": (sum(p["cpu_s"] for p in parts) + server_cpu) / wall,
    }


def bench_load(device: Device, tmp: Path, size: LoadSize = FULL_LOAD) -> dict[str, Any]:
    """One client against LOAD_CLIENTS, for each (plane, batching) in LOAD_SETUPS. The server
    is an `edgesplit serve` process and the clients are LOAD_PROCESSES processes (devices are
    separate machines: one interpreter for 32 clients would measure its lock instead)."""
    model, layer = LOAD_SPLIT
    problem = _problem(model, EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED_LINK))
    plan, _program = _manual(problem, layer)
    plan.save(tmp / "load.json")
    out: dict[str, Any] = {"model": model, "split_after": layer, "setups": []}
    threads = size.clients // size.processes
    for plane, batching in LOAD_SETUPS:
        # one torch thread, as every device in this benchmark: an idle OpenMP worker of the
        # server would spin on the cores the clients need
        flags = ("--threads", "1") if batching else ("--threads", "1", "--max-batch", "1")
        pairs = []
        with serve_process(tmp / "load.json", *flags) as address:
            for _ in range(size.pairs):
                one = _load_run(tmp / "load.json", address, plane, 1, 1, size.single_requests)
                many = _load_run(tmp / "load.json", address, plane, size.processes, threads,
                                 size.requests)
                pairs.append((many["throughput_rps"] / one["throughput_rps"], one, many))
        row = _load_row(plane, batching, pairs)
        out["setups"].append(row)
        one, many = row["single client"], row["concurrent"]
        print(f"load {plane}, batching {'on' if batching else 'off'}: x"
              + ", x".join(f"{r:.2f}" for r in row["ratios"])
              + f" (median x{row['throughput_ratio']:.2f}: 1 client "
              f"{one['throughput_rps']:.0f} req/s, {size.clients} clients "
              f"{many['throughput_rps']:.0f} req/s), {row['errors_all_runs']} errors")
    return out


def _load_row(plane: str, batching: bool, pairs: list[tuple[float, dict, dict]]
              ) -> dict[str, Any]:
    """One setup's row: the pair (one client, then LOAD_CLIENTS) with the median ratio, every
    pair's ratio, and every run's errors and largest output difference (none is dropped)."""
    ranked = sorted(pairs, key=lambda p: p[0])
    ratio, one, many = ranked[len(ranked) // 2]
    return {"plane": plane, "batching": batching, "single client": one, "concurrent": many,
            "throughput_ratio": ratio, "ratios": [p[0] for p in pairs],
            "p50_ratio": many["latency_ms"]["p50"] / one["latency_ms"]["p50"],
            "errors_all_runs": sum(p[1]["errors"] + p[2]["errors"] for p in pairs),
            "max_abs_diff_all_runs": max(max(p[1]["max_abs_diff"], p[2]["max_abs_diff"])
                                         for p in pairs)}


# ---- 6. old and new code in the same run --------------------------------------------------------
# the commit before the restructuring (issue 57: servers as one shell plus handlers) began: its
# overhead and throughput are what the refactor must stay within
BASELINE_REF = "0f0ccd7"
BASELINE_ABOUT = "before issue 57's restructuring: servers as one shell plus handlers"
# old, new, then new, old, ...: many short rounds, so that drift over the run hits both alike
# (whole runs of section 4's size, 5 rounds, drifted by 10-30 % between runs)
BASELINE_ROUNDS = 15
BASELINE_LOAD = LoadSize(requests=50, single_requests=500)  # a third of section 4's, a round
BASELINE_OVERHEAD_ROUNDS = 20  # section 1's rounds (each a block of each plane per version)
CLIENT_SCRIPT = Path(__file__).with_name("load_client.py")
NEW_SRC = Path(edgesplit.__file__).resolve().parents[1]  # the source this process imports


@contextlib.contextmanager
def source_at(ref: str) -> Iterator[tuple[Path, str]]:
    """``src/`` of commit ``ref`` of this repository in a temporary folder (removed at the end),
    and the full commit id."""
    repo = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="edgesplit-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(repo), "archive", commit, "src"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp) / "src", commit


def _env(src: Path) -> dict[str, str]:
    """This environment with ``src`` alone on PYTHONPATH (ahead of the installed edgesplit)."""
    return {**os.environ, "PYTHONPATH": str(src)}


class ClientDevices:
    """``processes`` load_client.py processes of ``threads`` clients each, importing edgesplit
    from ``env``'s PYTHONPATH, connected and warmed up; :meth:`run` starts them together."""

    def __init__(self, plan_path: Path, address: str, plane: str, processes: int,
                 threads: int, env: dict[str, str]) -> None:
        self.procs = [subprocess.Popen(
            [sys.executable, str(CLIENT_SCRIPT), str(plan_path), address, plane, str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(processes)]
        self.address, self.threads = address, threads
        src = Path(env["PYTHONPATH"]).resolve()
        for p in self.procs:
            assert p.stdout is not None
            ready, _, imported = p.stdout.readline().strip().partition(" ")
            if ready != "ready" or not Path(imported).resolve().is_relative_to(src):
                self.close()
                raise RuntimeError(f"a client process for {address} did not start on {src} "
                                   f"(exit {p.poll()}, imported {imported or 'nothing'})")

    def run(self, kind: str, requests: int) -> dict[str, Any]:
        """``single``: the first client alone; ``concurrent``: every client at once."""
        procs = self.procs[:1] if kind == "single" else self.procs
        pid = getattr(self.address, "pid", None)
        cpu = predicted.process_cpu_s(pid) if pid else 0.0
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{kind} {requests}\n")
            p.stdin.flush()
        parts = [json.loads(p.stdout.readline()) for p in procs if p.stdout is not None]
        cpu = predicted.process_cpu_s(pid) - cpu if pid else float("nan")
        return _load_summary(parts, len(procs), 1 if kind == "single" else self.threads,
                             requests, cpu)

    def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _load_rounds(plan_path: Path, addresses: dict[str, str], plane: str, size: LoadSize,
                 envs: dict[str, dict[str, str]], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Each version's client devices, started once and kept (importing that version's
    edgesplit), and ``rounds`` rounds of one client alone then all, old first in even rounds
    and new first in odd ones: short blocks, many rounds, so that drift hits both alike."""
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with contextlib.ExitStack() as stack:
        devices = {}
        for code in ("old", "new"):
            devices[code] = ClientDevices(plan_path, addresses[code], plane, size.processes,
                                          size.clients // size.processes, envs[code])
            stack.callback(devices[code].close)
        for r in range(rounds):
            for code in ("old", "new") if r % 2 == 0 else ("new", "old"):
                runs[code].append({
                    "single client": devices[code].run("single", size.single_requests),
                    "concurrent": devices[code].run("concurrent", size.requests)})
    return runs


def bench_baseline(device: Device, tmp: Path, ref: str = BASELINE_REF,
                   rounds: int = BASELINE_ROUNDS, size: LoadSize = BASELINE_LOAD,
                   setups: list[tuple[str, bool]] = LOAD_SETUPS,
                   overhead: tuple[int, int] | None = None) -> dict[str, Any]:
    """Section 4's setups served and driven by commit ``ref``'s code and by this checkout's,
    side by side: per setup an old and a new `edgesplit serve` process and each version's
    client devices (the same client script, importing the version under test), and
    ``rounds`` short rounds of (one client alone, then all) against each, alternating
    (:func:`_load_rounds`). ``overhead``: (rounds, splits) to compare section 1 too, old and
    new interleaved block by block (:func:`bench_baseline_overhead`)."""
    model, layer = LOAD_SPLIT
    problem = _problem(model, EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED_LINK))
    plan, _program = _manual(problem, layer)
    plan_path = tmp / "baseline-load.json"
    plan.save(plan_path)  # this version's plan file; the old code reads it (checked at start)
    before = os.getloadavg()[0]
    out: dict[str, Any] = {"model": model, "split_after": layer, "ref": ref, "rounds": rounds,
                           "about": BASELINE_ABOUT if ref == BASELINE_REF else None,
                           "method": "interleaved", "setups": [], "load_before": before}
    with source_at(ref) as (old_src, commit):
        out["commit"] = commit
        envs = {"old": _env(old_src), "new": _env(NEW_SRC)}
        if overhead is not None:  # (rounds, splits)
            out["overhead"] = bench_baseline_overhead({"old": old_src, "new": NEW_SRC}, tmp,
                                                      *overhead)
        for plane, batching in setups:
            flags = ("--threads", "1") if batching else ("--threads", "1", "--max-batch", "1")
            with predicted.serve_process(plan_path, *flags, env=envs["old"]) as old_address, \
                    predicted.serve_process(plan_path, *flags, env=envs["new"]) as new_address:
                runs = _load_rounds(plan_path, {"old": old_address, "new": new_address}, plane,
                                    size, envs, rounds)
            row = _baseline_row(plane, batching, runs)
            out["setups"].append(row)
            print(f"baseline {plane}, batching {'on' if batching else 'off'}: " + "; ".join(
                f"{m['run']} {m['metric']} new/old x{m['ratio']:.3f} ({m['verdict']})"
                for m in row["metrics"]))
    out["load_after"] = os.getloadavg()[0]
    out["date"] = time.strftime("%Y-%m-%d %H:%M")
    return out


BASELINE_METRICS = (("single client", "throughput_rps", "req/s", True),
                    ("single client", "p50_ms", "ms", False),
                    ("concurrent", "throughput_rps", "req/s", True),
                    ("concurrent", "p50_ms", "ms", False))


def _metric(run: dict[str, Any], key: str) -> float:
    return run["throughput_rps"] if key == "throughput_rps" else run["latency_ms"]["p50"]


def _baseline_row(plane: str, batching: bool, runs: dict[str, list[dict[str, Any]]]
                  ) -> dict[str, Any]:
    """Per metric of BASELINE_METRICS: :func:`_paired` over the rounds."""
    metrics = []
    for label, key, unit, higher_is_better in BASELINE_METRICS:
        values = {code: [_metric(r[label], key) for r in rs] for code, rs in runs.items()}
        metrics.append({"run": label, "metric": key, "unit": unit,
                        **_paired(values["old"], values["new"], higher_is_better)})
    errors = sum(r[k]["errors"] for rs in runs.values() for r in rs
                 for k in ("single client", "concurrent"))
    diff = max(r[k]["max_abs_diff"] for rs in runs.values() for r in rs
               for k in ("single client", "concurrent"))
    return {"plane": plane, "batching": batching, "metrics": metrics, "runs": runs,
            "errors_all_runs": errors, "max_abs_diff_all_runs": diff}


class AbClient:
    """One version's section-1 client (benchmarks/ab_client.py) in a process of its own,
    importing edgesplit from ``env``'s PYTHONPATH, connected to ``address`` and warmed up;
    :meth:`block` runs one block of its requests."""

    def __init__(self, plan_path: Path, address: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(AB_CLIENT_SCRIPT), str(plan_path), address,
             str(predicted.THREADS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env)
        assert self.proc.stdout is not None
        ready, _, imported = self.proc.stdout.readline().strip().partition(" ")
        src = Path(env["PYTHONPATH"]).resolve()
        if ready != "ready" or not Path(imported).resolve().is_relative_to(src):
            self.close()
            raise RuntimeError(f"the section-1 client for {address} did not start on {src} "
                               f"(exit {self.proc.poll()}, imported {imported or 'nothing'})")

    def block(self, n: int, r: int) -> dict[str, Any]:
        """``n`` requests over each plane and ``n`` run_local passes (order rotated by round
        ``r``); per variant the breakdowns and wall times."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"block {n} {r}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


AB_CLIENT_SCRIPT = Path(__file__).with_name("ab_client.py")
OVERHEAD_METRICS = (("overhead_ms", "overhead ms"), ("runtime_transfer_ms", "transfer ms"),
                    ("served_ms", "served ms"))
AB_VARIANTS = ("old", "new", "raw")  # each round runs one block of each, order rotating


def _block_metrics(block: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per plane, one version's block reduced as section 1 reduces its requests: medians of
    transfer and of the whole request, and overhead (transfer + serialize, less run_local's
    serialize: what serving adds besides compute)."""
    local = _median([t["serialize"] for t in block["local"]["breakdown_ms"]])
    out = {}
    for plane in ("tcp", "grpc"):
        results = block[plane]["breakdown_ms"]
        transfer = _median([r["transfer"] for r in results])
        serialize = _median([r["serialize"] for r in results])
        out[plane] = {"runtime_transfer_ms": transfer, "overhead_ms": transfer + serialize - local,
                      "served_ms": _median(block[plane]["wall_ms"])}
    return out


def bench_baseline_overhead(srcs: dict[str, Path], tmp: Path, rounds: int, splits: int,
                            block: int = OVERHEAD_BLOCK) -> dict[str, Any]:
    """Section 1, old and new code interleaved: per split an old and a new `edgesplit serve`
    process run at once, each driven by its own version's client process
    (:class:`AbClient`), and this process runs the raw round trip of the same bytes in the
    served request's place (:class:`MinimalSplit` without codec, its peer a process of its
    own). Each round runs one block (``block`` requests of each plane) of old, new and raw, in
    an order that rotates round by round, so that drift hits all alike; per metric, the
    round's new/old, and its median and spread over the ``rounds`` rounds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(predicted.THREADS)  # this process is the raw round trip's edge
    before = os.getloadavg()[0]
    device = get_device("this-machine")
    rows, transport = [], []
    try:
        for i, (model, layer) in enumerate(OVERHEAD_SPLITS[:splits]):
            per_round = _ab_split(device, srcs, tmp / f"ab-overhead-{i}.json", model, layer,
                                  rounds, block)
            rows += _ab_rows(model, layer, per_round)
            transport.append(_ab_transport(model, layer, per_round))
            tcp = next(r for r in rows[-len(OVERHEAD_METRICS) * 2:] if r["plane"] == "tcp")
            print(f"baseline overhead {model} {per_round['request_bytes']:,} B: data plane "
                  f"new/old x{tcp['ratio']:.3f} (x{tcp['ratio_min']:.3f}..x"
                  f"{tcp['ratio_max']:.3f}); new transfer x"
                  f"{transport[-1]['transfer_over_in_place_median']:.2f} raw in place")
    finally:
        torch.set_num_threads(threads)
    return {"rounds": rounds, "block": block, "method": "interleaved", "rows": rows,
            "load_before": before, "load_after": os.getloadavg()[0], "transport": transport}


def _ab_split(device: Device, srcs: dict[str, Path], plan_path: Path, model: str, layer: str,
              rounds: int, block: int) -> dict[str, Any]:
    """One split's rounds: per version its block metrics per round, and the raw round trip's
    median per round."""
    problem = _problem(model, EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED_LINK))
    plan, program = _manual(problem, layer)
    plan.save(plan_path)  # this version's plan file; the old code reads it
    up, down = _wire_bytes(program)
    envs = {code: _env(src) for code, src in srcs.items()}
    flags = ("--threads", str(predicted.THREADS))
    out: dict[str, Any] = {"request_bytes": up, "old": [], "new": [], "raw": []}
    with predicted.serve_process(plan_path, *flags, env=envs["old"]) as old_address, \
            predicted.serve_process(plan_path, *flags, env=envs["new"]) as new_address, \
            reference_peers(plan_path, max(down, 1)) as (_, _, raw_port), \
            contextlib.ExitStack() as stack:
        clients = {"old": AbClient(plan_path, old_address, envs["old"])}
        stack.callback(clients["old"].close)
        clients["new"] = AbClient(plan_path, new_address, envs["new"])
        stack.callback(clients["new"].close)
        raw = MinimalSplit(program, raw_port, codec=False)
        stack.callback(raw.close)
        for _ in range(3):
            raw.request()
        for r in range(rounds):
            for code in AB_VARIANTS[r % 3:] + AB_VARIANTS[:r % 3]:
                if code == "raw":
                    out["raw"].append(_median([raw.request()["transfer"]
                                               for _ in range(block)]))
                else:
                    out[code].append(_block_metrics(clients[code].block(block, r)))
    return out


def _paired(old: list[float], new: list[float], higher_is_better: bool) -> dict[str, Any]:
    """Old and new per round, new/old per round, and its median with the spread (min..max);
    ``within 5 %`` where the median ratio is, else better or worse."""
    ratios = [n / o for o, n in zip(old, new, strict=True)]
    ratio = _median(ratios)
    if abs(ratio - 1) <= AB_TOLERANCE:
        verdict = "within 5 %"
    else:
        verdict = "better" if (ratio > 1) == higher_is_better else "worse"
    return {"old": old, "new": new, "old_median": _median(old), "new_median": _median(new),
            "ratios": ratios, "ratio": ratio, "ratio_min": min(ratios),
            "ratio_max": max(ratios), "verdict": verdict}


AB_TOLERANCE = 0.05  # issue 57: each metric's new/old median within 5 %


def _ab_rows(model: str, layer: str, per_round: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for plane in ("tcp", "grpc"):
        for metric, unit in OVERHEAD_METRICS:
            rows.append({"model": model, "split_after": layer, "plane": plane,
                         "request_bytes": per_round["request_bytes"], "metric": metric,
                         "unit": unit, **_paired([b[plane][metric] for b in per_round["old"]],
                                                 [b[plane][metric] for b in per_round["new"]],
                                                 False)})
    return rows


def _ab_transport(model: str, layer: str, per_round: dict[str, Any]) -> dict[str, Any]:
    """Each version's data-plane transfer (framing, sockets, wake-ups) over the raw round trip
    of the same bytes in the same round, per round, and their medians."""
    raw = per_round["raw"]
    row: dict[str, Any] = {"model": model, "split_after": layer,
                           "request_bytes": per_round["request_bytes"]}
    for code in ("old", "new"):
        ratios = [b["tcp"]["runtime_transfer_ms"] / x
                  for b, x in zip(per_round[code], raw, strict=True)]
        key = "transfer_over_in_place" if code == "new" else "old_transfer_over_in_place"
        row[key], row[f"{key}_median"] = ratios, _median(ratios)
    row["raw_rtt_in_place_ms"] = raw
    return row


# ---- results ------------------------------------------------------------------------------------
def write(doc: dict[str, Any], out: Path = RESULTS) -> None:
    """runtime.json in ``out``, with the sections this run measured, then runtime.md from it
    (render_runtime.py)."""
    out.mkdir(parents=True, exist_ok=True)
    saved = json.dumps(doc, indent=2)
    (out / "runtime.json").write_text(saved + "\n")
    print("\n".join(render_runtime.write_report(json.loads(saved), out)))  # what the file holds


SECTIONS = ("overhead", "shaping", "predicted", "load", "mesh", "baseline")


def _quiet(threshold: float) -> None:
    """Refuse to measure on a busy machine: the numbers would blame the runtime for others'
    work (a table measured at load 5-6 on 2 cores once did)."""
    load = os.getloadavg()[0]
    if load > threshold:
        raise SystemExit(f"load average {load:.2f} > {threshold:g}: the machine is not quiet "
                         "(tests, helpers or other jobs running?); wait, or pass --allow-load "
                         "for a trial run (with --out elsewhere)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite runtime.md from runtime.json without measuring")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"which to run, comma-separated ({', '.join(SECTIONS)})")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD,
                        help="highest 1-minute load average to start at (default: quiet)")
    parser.add_argument("--models", default=",".join(predicted.MODELS),
                        help="models for section 3 (predicted vs measured)")
    parser.add_argument("--requests", type=int, default=10, help="requests per plan, section 3")
    parser.add_argument("--rounds", type=int, default=60,
                        help=f"requests per variant, section 1 (in blocks of {OVERHEAD_BLOCK})")
    parser.add_argument("--overhead-splits", type=int, default=len(OVERHEAD_SPLITS),
                        help="section 1: the first N splits only")
    parser.add_argument("--shaping-requests", type=int, default=5)
    parser.add_argument("--mesh-requests", type=int, default=400,
                        help="requests per plan, section 5 (mesh and best chain)")
    parser.add_argument("--baseline", default=BASELINE_REF, metavar="REF",
                        help="section 6: the commit whose code this checkout's is compared "
                             f"with (default {BASELINE_REF}, before the serving-shell work)")
    parser.add_argument("--baseline-rounds", type=int, default=BASELINE_ROUNDS,
                        help="section 6: rounds of section 4's setups, old and new "
                             "alternating (who goes first), each a third of section 4's size")
    parser.add_argument("--baseline-overhead-rounds", type=int,
                        default=BASELINE_OVERHEAD_ROUNDS,
                        help="section 6: rounds of section 1, old, new and the raw round "
                             f"trip interleaved, {OVERHEAD_BLOCK} requests per plane each "
                             "(0: compare section 4's setups only)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the sections not run now from runtime.json in --out")
    parser.add_argument("--quick", "--smoke", action="store_true",
                        help="a smoke run with tiny sizes (seconds per section; section 6 "
                             "runs one setup): its numbers mean nothing, so it needs --out "
                             "elsewhere and starts at any load")
    parser.set_defaults(load_size=FULL_LOAD, baseline_load=BASELINE_LOAD,
                        baseline_setups=LOAD_SETUPS,
                        mesh_profile_repeats=20)
    args = parser.parse_args()
    if args.quick:
        _quick(args)
    if args.render_only:
        doc = json.loads((args.out / "runtime.json").read_text())
        print("\n".join(render_runtime.write_report(doc, args.out)))
        return
    sections = [x for x in args.sections.split(",") if x]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}: use {', '.join(SECTIONS)}")
    _quiet(args.allow_load)
    start = time.perf_counter()
    load_start = os.getloadavg()
    torch.manual_seed(0)
    device = get_device("this-machine")
    doc: dict[str, Any] = {"version": 2, "machine": machine_info(), "sections": sections,
                           "edgesplit_source": str(NEW_SRC),
                           "this_machine": device.model_dump(mode="json"),
                           "load_average": list(load_start),
                           "e2e_link": predicted.LINK.model_dump(mode="json"),
                           "e2e_requests": args.requests}
    with tempfile.TemporaryDirectory(prefix="edgesplit-bench-") as tmp:
        if "overhead" in sections:
            doc["overhead"] = bench_overhead(device, args.rounds, Path(tmp),
                                             OVERHEAD_SPLITS[:args.overhead_splits])
        if "shaping" in sections:
            doc["shaping"] = bench_shaping(device, args.shaping_requests)
        if "predicted" in sections:
            doc["predicted"] = bench_predicted_section(args.models.split(","), args.requests,
                                                       Path(tmp))
        if "load" in sections:
            doc["load"] = bench_load(device, Path(tmp), args.load_size)
        if "mesh" in sections:
            import bench_mesh

            doc["mesh"] = bench_mesh.bench_mesh(args.mesh_requests, Path(tmp),
                                                args.mesh_profile_repeats)
        if "baseline" in sections:
            doc["baseline"] = bench_baseline(device, Path(tmp), args.baseline,
                                             args.baseline_rounds, args.baseline_load,
                                             args.baseline_setups,
                                             (args.baseline_overhead_rounds,
                                              args.overhead_splits)
                                             if args.baseline_overhead_rounds else None)
    doc["load_average_end"] = list(os.getloadavg())
    doc["wall_s"] = time.perf_counter() - start
    if args.keep:
        _keep_earlier(doc, args.out)
    write(doc, args.out)


def _quick(args: argparse.Namespace) -> None:
    """Tiny sizes for every section (a smoke run), never into the committed results."""
    if args.out.resolve() == RESULTS.resolve():
        raise SystemExit("--quick measures nothing worth keeping: pass --out DIR elsewhere")
    args.rounds, args.shaping_requests, args.requests = OVERHEAD_BLOCK, 1, 2
    args.models, args.mesh_requests, args.mesh_profile_repeats = "digits_cnn", 20, 3
    args.baseline_rounds, args.allow_load = 2, float("inf")
    args.overhead_splits = 1
    args.baseline_overhead_rounds = min(args.baseline_overhead_rounds, len(AB_VARIANTS))
    args.load_size, args.baseline_load = QUICK_LOAD, QUICK_LOAD
    args.baseline_setups = LOAD_SETUPS[:1]


def _keep_earlier(doc: dict[str, Any], out: Path) -> None:
    """Sections of the runtime.json in ``out`` that this run did not measure, kept as they
    were (named in ``kept_sections``: the header's load and time are this run's)."""
    path = out / "runtime.json"
    if not path.exists():
        return
    earlier = json.loads(path.read_text())
    kept = [k for k in SECTIONS if k in earlier and k not in doc]
    for key in kept:
        doc[key] = earlier[key]
    doc["kept_sections"] = kept
    if "baseline" in doc and "baseline" in earlier:
        doc["baseline_runs"] = render_runtime.baseline_runs(earlier, doc["baseline"])


if __name__ == "__main__":
    main()
