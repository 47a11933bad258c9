"""A served plan under hostile and heavy use, measured from outside: the server is a real
``edgesplit serve`` subprocess and its memory is read from /proc.

1. Decompression bombs: small messages whose zstd frame claims (and holds) far more than the
   tensor they declare. Reported: the status each got and the server's peak RSS before/after.
2. Malformed messages with a valid CRC (so they reach the deep checks): every status code.
3. Load: 32 concurrent clients x 50 requests, every reply checked against the unsplit model.
4. Soak: clients sending good and bad requests for ``--soak-s`` seconds; RSS sampled along the
   way (flat memory: no leak per request).

Loopback only; every loop is bounded in count and time and the server is killed at the end.
Writes benchmarks/results/hostile.md and hostile.json.

    python benchmarks/bench_hostile.py [--soak-s 120]
"""

from __future__ import annotations

import argparse
import json
import os
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


def send_raw(stub, program: PlanProgram, tensor: str, data: bytes, rid: int
             ) -> tuple[str, float]:
    bundle = pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION, request_id=rid,
                       tensors=[pb.Tensor(name=tensor, data=data)])
    t0 = time.perf_counter()
    try:
        stub.Run(bundle, timeout=30)
        code = "OK"
    except grpc.RpcError as exc:
        code = exc.code().name
    return code, (time.perf_counter() - t0) * 1e3


# ---- the runs ---------------------------------------------------------------------------------
def bombs(stub, program, tensor, shape, pid) -> dict[str, Any]:
    before = memory(pid)
    rows = []
    for claimed in (64 * MIB, 256 * MIB, 1024 * MIB):
        msg = zstd_bomb(shape, claimed)
        codes = [send_raw(stub, program, tensor, msg, k) for k in range(5)]
        rows.append({"claimed_mib": claimed / MIB, "message_kib": len(msg) / 1024,
                     "codes": sorted({c for c, _ in codes}),
                     "max_ms": max(ms for _, ms in codes), **memory(pid)})
    return {"before": before, "rows": rows}


def bad_messages(stub, program, tensor, shape) -> list[dict[str, Any]]:
    rows = []
    for name, msg in malformed(shape).items():
        code, ms = send_raw(stub, program, tensor, msg, 1)
        rows.append({"case": name, "code": code, "ms": ms})
    return rows


def soak(program, address, stub, tensor, shape, pid, seconds: float) -> dict[str, Any]:
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
            code, _ = send_raw(stub, program, tensor, bad[k % len(bad)], k)
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
             "| decompresses to | message | status | slowest ms | RSS after MiB | peak MiB |",
             "|---:|---:|---|---:|---:|---:|"]
    for r in doc["bombs"]["rows"]:
        lines.append(f"| {r['claimed_mib']:.0f} MiB | {r['message_kib']:.0f} KiB | "
                     f"{', '.join(r['codes'])} | {r['max_ms']:.1f} | {r['rss_mib']:.0f} | "
                     f"{r['peak_mib']:.0f} |")
    lines += ["", "## Malformed messages with a valid CRC", "", "| case | status | ms |",
              "|---|---|---:|"]
    lines += [f"| {r['case']} | {r['code']} | {r['ms']:.1f} |" for r in doc["malformed"]]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak-s", type=float, default=120.0)
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
                doc["bombs"] = bombs(stub, program, tensor, shape, proc.pid)
                doc["malformed"] = bad_messages(stub, program, tensor, shape)
                load = run_requests(program, address, requests=50, concurrency=32,
                                    client_options={"shape": False, "timeout_s": 60})
                doc["load"] = {k: load[k] for k in ("requests", "ok", "errors", "max_abs_diff",
                                                    "throughput_rps")}
                doc["soak"] = soak(program, address, stub, tensor, shape, proc.pid, args.soak_s)
        finally:
            proc.kill()
    doc["load_after"] = os.getloadavg()[0]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "hostile.json").write_text(json.dumps(doc, indent=1))
    (RESULTS / "hostile.md").write_text(render(doc))
    print(render(doc))


if __name__ == "__main__":
    main()
