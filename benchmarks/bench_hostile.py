"""A served plan under hostile and heavy use, measured from outside: the server is a real
``edgesplit serve`` subprocess and its memory is read from /proc.

1. Decompression bombs: small messages whose zstd frame claims (and holds) far more than the
   tensor they declare, over gRPC and over the data plane. Reported: the status each got and
   the server's peak RSS before/after.
2. Malformed messages with a valid CRC (so they reach the deep checks): every status code, on
   both paths.
3. The data plane's own attacks: frames that lie about their sizes, are not frames, or carry
   bad meta (each answered and its connection closed, the server serving on), and a flood of
   more connections than the server holds.
4. Load: 32 concurrent clients x 50 requests, every reply checked against the unsplit model.
5. Soak: clients sending good and bad requests (bad ones alternating gRPC and the data plane)
   for ``--soak-s`` seconds; RSS sampled along the way (flat memory: no leak per request).

Loopback only; every loop is bounded in count and time and the server is killed at the end.
Writes benchmarks/results/hostile.md and hostile.json.

    python benchmarks/bench_hostile.py [--soak-s 120] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import grpc
import torch

from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.plan.planners import Manual
from edgesplit.quant import encode_tensor
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.runtime.session import run_requests
from edgesplit.transport.frames import CALL, REPLY, Frame, FrameClient

RESULTS = Path(__file__).parent / "results"
MIB = 1 << 20


# ---- the server, from outside -----------------------------------------------------------------
def start_server(plan_path: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "edgesplit.cli", "serve", str(plan_path),
                             "--device", "cloud", "--port", "0", "--no-shape"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on"):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, line.split()[2]


def memory(pid: int) -> dict[str, float]:
    """Current and peak resident set size of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss_mib": fields["VmRSS"], "peak_mib": fields["VmHWM"]}


# ---- messages ---------------------------------------------------------------------------------
def with_crc(msg: bytes) -> bytes:
    """Recompute a message's CRC after a mutation (see docs/wire-format.md): the CRC covers
    everything before it and the payload."""
    ndim = msg[10]
    n_params = struct.unpack_from("<I", msg, 12 + 4 * ndim)[0]
    crc_at = 12 + 4 * ndim + 4 + 8 * n_params + 16
    crc = zlib.crc32(msg[crc_at + 4:], zlib.crc32(msg[:crc_at]))
    return msg[:crc_at] + struct.pack("<I", crc) + msg[crc_at + 4:]


def zstd_bomb(shape: list[int], claimed: int) -> bytes:
    """A float32 message of ``shape`` whose zstd body decompresses to ``claimed`` bytes (the
    frame states that size), from a few tens of KB on the wire."""
    import zstandard

    body = zstandard.ZstdCompressor(level=19).compress(bytes(claimed))
    good = encode_tensor(torch.zeros(shape), 32)
    ndim = good[10]
    head_end = 12 + 4 * ndim + 4  # fixed header, shape, n_params (0 for float32)
    head = bytearray(good[:head_end])
    head[9] = 1  # compression: zstd
    raw_len = 4 * int(torch.tensor(shape).prod())
    msg = bytes(head) + struct.pack("<QQ", raw_len, len(body)) + b"\0\0\0\0" + body
    return with_crc(msg)


def malformed(shape: list[int]) -> dict[str, bytes]:
    """Messages that pass the CRC but break a deeper rule (the decoder's old crash cases)."""
    x = torch.randn(shape)
    four = encode_tensor(x, 4)
    f32 = encode_tensor(x, 32)
    ndim = four[10]

    def patch(msg: bytes, offset: int, value: bytes) -> bytes:
        return with_crc(msg[:offset] + value + msg[offset + len(value):])

    per_channel = encode_tensor(x, 4, per_channel_axis=1)
    return {
        "float at 0 bits": patch(f32, 6, b"\0"),
        "per-channel axis >= rank": patch(per_channel, 8, bytes([ndim + 3])),
        "uncompressed body shorter than raw_len": patch(
            f32[:-4], 12 + 4 * ndim + 4 + 8, struct.pack("<Q", 4 * x.numel() - 4)),
        "zero dim next to huge ones": patch(patch(f32[:12 + 4 * ndim + 4 + 20], 12, struct.pack(
            "<4I", 0, 2**31 - 1, 2**31 - 1, 2**31 - 1)), 12 + 4 * ndim + 4, bytes(16)),
        "huge declared size (lz4)": patch(patch(f32, 9, b"\2"), 12, struct.pack(
            "<4I", 1 << 15, 1 << 15, 1, 1)),
        "truncated": f32[:len(f32) // 2],
        "bad magic": b"XXXX" + f32[4:],
    }


class Paths:
    """The server's two ways in: its gRPC stub and a frame client on its data port."""

    def __init__(self, stub, frames: FrameClient) -> None:
        self.stub, self.frames = stub, frames

    def send(self, plane: str, program: PlanProgram, tensor: str, data: bytes, rid: int
             ) -> tuple[str, float]:
        """One request carrying ``data`` as ``tensor``: its status name and time (ms)."""
        t0 = time.perf_counter()
        try:
            if plane == "grpc":
                self.stub.Run(pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION,
                                        request_id=rid, tensors=[pb.Tensor(name=tensor,
                                                                           data=data)]),
                              timeout=30)
            else:
                self.frames.call(Frame(CALL, rid, {
                    "plan_id": program.plan_id, "plan_version": PLAN_VERSION,
                    "names": [tensor], "metadata": [], "timeout_s": 30.0}, [data]), 30.0)
            code = "OK"
        except grpc.RpcError as exc:  # LoopbackError, the data plane's, is one too
            code = exc.code().name
        return code, (time.perf_counter() - t0) * 1e3


def data_port(stub) -> int:
    port = int(stub.Describe(pb.DescribeRequest(), timeout=10).data_port)
    if not port:
        raise SystemExit("the server offers no data plane")
    return port


# ---- the runs ---------------------------------------------------------------------------------
PLANES = ("grpc", "tcp")


def bombs(paths: Paths, program, tensor, shape, pid) -> dict[str, Any]:
    before = memory(pid)
    rows = []
    for claimed in (64 * MIB, 256 * MIB, 1024 * MIB):
        msg = zstd_bomb(shape, claimed)
        for plane in PLANES:
            codes = [paths.send(plane, program, tensor, msg, k) for k in range(5)]
            rows.append({"plane": plane, "claimed_mib": claimed / MIB,
                         "message_kib": len(msg) / 1024,
                         "codes": sorted({c for c, _ in codes}),
                         "max_ms": max(ms for _, ms in codes), **memory(pid)})
    return {"before": before, "rows": rows}


def bad_messages(paths: Paths, program, tensor, shape) -> list[dict[str, Any]]:
    rows = []
    for name, msg in malformed(shape).items():
        for plane in PLANES:
            code, ms = paths.send(plane, program, tensor, msg, 1)
            rows.append({"case": name, "plane": plane, "code": code, "ms": ms})
    return rows


# ---- the data plane's own attacks ----------------------------------------------------------------
_HEAD = struct.Struct("<4sBBHQIIQ")  # magic, version, kind, reserved, id, meta, parts, rest


def _frame_head(meta: bytes = b"{}", sizes: tuple[int, ...] = (), rest: int | None = None,
                kind: int = CALL) -> bytes:
    rest = 8 * len(sizes) + len(meta) + sum(sizes) if rest is None else rest
    return _HEAD.pack(b"ESF1", 1, kind, 0, 1, len(meta), len(sizes), rest) + \
        struct.pack(f"<{len(sizes)}Q", *sizes) + meta


def hostile_frames() -> dict[str, bytes]:
    """Frames no client sends: each is answered with a status and its connection closed."""
    return {
        "not a frame (an HTTP request)": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(16),
        "part declared at 4 EiB": _frame_head(sizes=(1 << 62,)),
        "rest declared at 1 TiB, nothing sent": _frame_head(rest=1 << 40),
        "part lengths that do not add up": _frame_head(sizes=(7,), rest=13) + bytes(5),
        "64 KiB of meta that is not JSON": _frame_head(meta=b"{" * 65536),
        "meta over the 64 KiB limit": _HEAD.pack(b"ESF1", 1, CALL, 0, 1, 1 << 20, 0, 1 << 20),
        "call metadata that is not pairs": _frame_head(meta=b'{"metadata": [[1, 2]]}'),
        "a reply sent as a call": _frame_head(kind=REPLY),
        "unknown kind": _frame_head(kind=9),
    }


def _answer_to(address: tuple[str, int], data: bytes) -> str:
    """The status a raw connection gets for ``data``, or how it ended."""
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        reply = bytearray()
        while chunk := conn.recv(65536):
            reply += chunk
    if len(reply) < _HEAD.size:
        return "closed without an answer"
    meta_len = _HEAD.unpack_from(reply)[5]
    n_parts = _HEAD.unpack_from(reply)[6]
    at = _HEAD.size + 8 * n_parts
    return json.loads(bytes(reply[at:at + meta_len])).get("code", "?")


def frame_attacks(address: tuple[str, int], paths: Paths, program, tensor, shape,
                  pid) -> dict[str, Any]:
    good = encode_tensor(torch.randn(shape), 32)
    rows = []
    for name, data in hostile_frames().items():
        t0 = time.perf_counter()
        code = _answer_to(address, data)
        after, _ = paths.send("tcp", program, tensor, good, 7)  # the server serves on
        rows.append({"case": name, "code": code, "ms": (time.perf_counter() - t0) * 1e3,
                     "next_request": after})
    return {"rows": rows, "flood": flood(address, paths, program, tensor, good, pid)}


def flood(address: tuple[str, int], paths: Paths, program, tensor, good: bytes, pid,
          n: int = 300) -> dict[str, Any]:
    """``n`` idle connections at once (the server holds 256): how many it refused and with
    what, whether a request still gets through while they are open, and its memory."""
    before = memory(pid)
    conns = []
    try:
        for _ in range(n):
            conns.append(socket.create_connection(address, timeout=10))
        time.sleep(0.5)  # the server answers the ones over its limit and closes them
        refused: dict[str, int] = {}
        for conn in conns:
            conn.setblocking(False)
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue  # held: the server waits for its first frame
            if len(data) >= _HEAD.size:
                at = _HEAD.size + 8 * _HEAD.unpack_from(data)[6]
                code = json.loads(data[at:at + _HEAD.unpack_from(data)[5]]).get("code", "?")
            else:
                code = "closed"
            refused[code] = refused.get(code, 0) + 1
        during, _ = paths.send("grpc", program, tensor, good, 8)
        peak = memory(pid)
    finally:
        for conn in conns:
            conn.close()
    time.sleep(0.5)
    after, _ = paths.send("tcp", program, tensor, good, 9)
    return {"connections": n, "refused": refused, "grpc_during": during, "tcp_after": after,
            "rss_before_mib": before["rss_mib"], "rss_during_mib": peak["rss_mib"],
            "rss_after_mib": memory(pid)["rss_mib"]}


def soak(program, address, paths: Paths, tensor, shape, pid, seconds: float
         ) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    counts = {"ok": 0, "errors": 0, "bad_rejected": 0, "bad_other": 0}
    lock = threading.Lock()
    bad = list(malformed(shape).values())

    def good_loop() -> None:
        while time.monotonic() < stop:
            r = run_requests(program, address, requests=20, concurrency=1,
                             client_options={"shape": False, "timeout_s": 30})
            with lock:
                counts["ok"] += r["ok"]
                counts["errors"] += r["errors"]

    def bad_loop() -> None:
        k = 0
        while time.monotonic() < stop:
            code, _ = paths.send(PLANES[k % 2], program, tensor, bad[k % len(bad)], k)
            with lock:
                counts["bad_rejected" if code == "INVALID_ARGUMENT" else "bad_other"] += 1
            k += 1

    samples = [{"t_s": 0.0, **memory(pid)}]
    threads = [threading.Thread(target=good_loop) for _ in range(4)] + \
        [threading.Thread(target=bad_loop)]
    start = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(min(5.0, max(0.1, stop - time.monotonic())))
        samples.append({"t_s": time.monotonic() - start, **memory(pid)})
    return {"seconds": seconds, **counts, "samples": samples}


def render(doc: dict[str, Any]) -> str:
    lines = ["# A served plan under hostile and heavy use", "",
             f"digits_cnn, cut after `down1.0` (tensor `{doc['tensor']}`, shape {doc['shape']}); "
             "the server is an `edgesplit serve` subprocess on loopback, its memory read from "
             f"/proc. Load average before {doc['load_before']:.2f}, after "
             f"{doc['load_after']:.2f} (the benchmark's own soak: five client threads and the "
             "server on this machine's cores).", "",
             "## Decompression bombs (zstd frames that claim and hold far more than declared)",
             "", f"Server before: {doc['bombs']['before']['rss_mib']:.0f} MiB RSS, peak "
             f"{doc['bombs']['before']['peak_mib']:.0f} MiB.", "",
             "| decompresses to | message | path | status | slowest ms | RSS after MiB | "
             "peak MiB |", "|---:|---:|---|---|---:|---:|---:|"]
    for r in doc["bombs"]["rows"]:
        lines.append(f"| {r['claimed_mib']:.0f} MiB | {r['message_kib']:.0f} KiB | "
                     f"{_PLANE[r['plane']]} | {', '.join(r['codes'])} | {r['max_ms']:.1f} | "
                     f"{r['rss_mib']:.0f} | {r['peak_mib']:.0f} |")
    lines += ["", "## Malformed messages with a valid CRC", "",
              "| case | path | status | ms |", "|---|---|---|---:|"]
    lines += [f"| {r['case']} | {_PLANE[r['plane']]} | {r['code']} | {r['ms']:.1f} |"
              for r in doc["malformed"]]
    lines += _render_frames(doc["frames"])
    load = doc["load"]
    lines += ["", "## Load: 32 clients x 50 requests", "",
              f"{load['ok']} of {load['requests']} answered, {load['errors']} errors, largest "
              f"difference from the unsplit model {load['max_abs_diff']:.2e}, "
              f"{load['throughput_rps']:.0f} requests/s.", ""]
    s = doc["soak"]
    first, last = s["samples"][0], s["samples"][-1]
    lines += [f"## Soak: {s['seconds']:.0f} s of good and bad requests", "",
              f"{s['ok']} good requests answered ({s['errors']} errors); {s['bad_rejected']} bad "
              f"ones rejected with INVALID_ARGUMENT ({s['bad_other']} otherwise). RSS "
              f"{first['rss_mib']:.0f} MiB at the start, {last['rss_mib']:.0f} MiB at the end, "
              f"peak {last['peak_mib']:.0f} MiB.", "", "| t (s) | RSS MiB |", "|---:|---:|"]
    lines += [f"| {p['t_s']:.0f} | {p['rss_mib']:.0f} |" for p in s["samples"]]
    return "\n".join(lines) + "\n"


_PLANE = {"grpc": "gRPC", "tcp": "data plane"}


def _render_frames(frames: dict[str, Any]) -> list[str]:
    lines = ["", "## The data plane's own attacks", "",
             "Each frame on a connection of its own, its answer read after the sender stops "
             "writing; then a good request over the data plane.", "",
             "| frame | status | ms | next request |", "|---|---|---:|---|"]
    lines += [f"| {r['case']} | {r['code']} | {r['ms']:.1f} | {r['next_request']} |"
              for r in frames["rows"]]
    f = frames["flood"]
    refused = ", ".join(f"{n} {code}" for code, n in sorted(f["refused"].items())) or "none"
    lines += ["", f"Flood: {f['connections']} idle connections at once (the server holds 256): "
              f"refused {refused}; a gRPC request while they were open: {f['grpc_during']}; "
              f"a data-plane request after they closed: {f['tcp_after']}. Server RSS "
              f"{f['rss_before_mib']:.0f} MiB before, {f['rss_during_mib']:.0f} during, "
              f"{f['rss_after_mib']:.0f} after."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    args = parser.parse_args()
    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")))
    plan = Manual(["down1.0"]).plan(problem)
    program = PlanProgram.load(plan)
    tensor = program.step("cloud").receives[0]
    shape = list(program.graph.tensors[tensor].shape)
    doc: dict[str, Any] = {"tensor": tensor, "shape": shape,
                           "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        plan.save(path)
        proc, address = start_server(path)
        try:
            with grpc.insecure_channel(address, options=[
                    ("grpc.max_send_message_length", 64 * MIB)]) as channel:
                stub = pb_grpc.PartitionServiceStub(channel)
                host = address.rsplit(":", 1)[0]
                frames_at = (host, data_port(stub))
                paths = Paths(stub, FrameClient(*frames_at, limit=64 * MIB))
                doc["bombs"] = bombs(paths, program, tensor, shape, proc.pid)
                doc["malformed"] = bad_messages(paths, program, tensor, shape)
                doc["frames"] = frame_attacks(frames_at, paths, program, tensor, shape,
                                              proc.pid)
                load = run_requests(program, address, requests=32 * 50, concurrency=32,
                                    client_options={"shape": False, "timeout_s": 60})
                doc["load"] = {k: load[k] for k in ("requests", "ok", "errors", "max_abs_diff",
                                                    "throughput_rps")}
                doc["soak"] = soak(program, address, paths, tensor, shape, proc.pid,
                                   args.soak_s)
                paths.frames.close()
        finally:
            proc.kill()
    doc["load_after"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hostile.json").write_text(json.dumps(doc, indent=1))
    (args.out / "hostile.md").write_text(render(doc))
    print(render(doc))


if __name__ == "__main__":
    main()
