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

Those five are the ``wire`` section. ``http``: a real ``edgesplit llm api --api-key`` over a
real ``edgesplit llm serve`` (SmolLM2-135M-Instruct in two stages, ``--sessions 1``) under
issue 55's attacks on the API: a 10 MB message, 100 MB bodies with a wrong key, a Content-Length
with no body, idle and slow-header connections, descriptor exhaustion under ``prlimit
--nofile=1024``, clients that leave while queued, key guessing. ``serving``: the star sink's
join table flooded from one host (tests/runtime/test_runtime_star's star, its aggregator an
``edgesplit serve`` subprocess), a whole join in one call, and the per-host token throttle.
Each of their rows shows the issue's number before the fix (``render_hostile.BEFORE``) beside
this run's.

Loopback only; every loop is bounded in count and time and the server is killed at the end.
Writes benchmarks/results/hostile.json, then hostile.md from it alone (render_hostile.py, where
the tables and their words live; ``--render-only`` renders again without measuring).

    python benchmarks/bench_hostile.py [--sections wire,http,serving] [--soak-s 120] [--out DIR]
        [--render-only]
    python benchmarks/bench_hostile.py --small --out /tmp/hostile-smoke   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import select
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
import render_hostile  # hostile.md from hostile.json (benchmarks/ is on the path)
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
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
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


# ---- the HTTP API (`edgesplit llm api` over a two-stage SmolLM2 split) -------------------------
API_KEY = "hostile-bench-key"
CHAT = "/v1/chat/completions"


class Processes:
    """Every subprocess this benchmark starts, killed (and reaped) by :meth:`close`."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.procs = folder, []

    def start(self, name: str, cmd: list[str], ready: str, *, nofile: int | None = None,
              timeout_s: float = 180.0) -> tuple[subprocess.Popen, str]:
        """Start ``cmd`` (prefixed with ``prlimit`` for an open-file limit) and wait for its
        first stdout line, which must start with ``ready``; stderr goes to a file."""
        if nofile is not None:
            cmd = ["prlimit", f"--nofile={nofile}:{nofile}", *cmd]
        log = open(self.folder / f"{name}.err", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        self.procs.append((proc, log))
        line = _first_line(proc, timeout_s)
        if not line.startswith(ready):
            self.close()
            tail = (self.folder / f"{name}.err").read_text()[-2000:]
            raise SystemExit(f"{name} did not start: {line!r}\n{tail}")
        return proc, line

    def stop(self, proc: subprocess.Popen) -> None:
        for p, log in list(self.procs):
            if p is proc:
                _kill(p)
                log.close()
                self.procs.remove((p, log))

    def close(self) -> None:
        for proc, log in self.procs:
            _kill(proc)
            log.close()
        self.procs = []


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0] if box else ""


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def edgesplit_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgesplit.cli", *args]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def reset_peak(pid: int) -> bool:
    """Reset ``pid``'s peak RSS (VmHWM) to its current RSS (Linux clear_refs 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class Api:
    """One `edgesplit llm api` process: its address, pid and key."""

    def __init__(self, proc: subprocess.Popen, line: str) -> None:
        self.proc, self.pid = proc, proc.pid
        url = line.split()[3]  # api listening on http://127.0.0.1:PORT/v1 model=...
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        self.address = (host, int(port))

    def request(self, method: str, path: str, *, key: str | None = API_KEY,
                body: dict | None = None, source: str = "127.0.0.1", timeout_s: float = 120
                ) -> tuple[int | str, float, bytes]:
        """One request on a connection of its own: (status or what went wrong, seconds,
        body)."""
        import http.client

        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(*self.address, timeout=timeout_s,
                                          source_address=(source, 0))
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers=headers)
            response = conn.getresponse()
            data = response.read()
            return response.status, time.perf_counter() - t0, data
        except (OSError, http.client.HTTPException) as exc:
            return type(exc).__name__, time.perf_counter() - t0, b""
        finally:
            conn.close()


def _status_of(reply: bytes) -> int | str:
    if not reply:
        return "closed without an answer"
    try:
        return int(reply.split(b"\r\n", 1)[0].split()[1])
    except (IndexError, ValueError):
        return "not HTTP"


def raw_post(address: tuple[str, int], path: str, key: str, body: bytes | int, *,
             content_length: int | None = None, limit_s: float = 60.0,
             source: str = "127.0.0.1") -> dict[str, Any]:
    """A POST sent as fast as the socket takes it, a chunk at a time, until the server
    answers or stops reading: ``body`` is the bytes or a count of zero bytes; a
    ``content_length`` over what is sent declares a body that never comes. Returns the
    status, the bytes of body the client managed to send and the seconds to the answer."""
    size = len(body) if isinstance(body, bytes) else body
    declared = size if content_length is None else content_length
    head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n").encode()
    zeros = bytes(256 * 1024)
    t0 = time.perf_counter()
    deadline = time.monotonic() + limit_s
    sent, reply, ended = 0, bytearray(), ""
    sock = socket.create_connection(address, timeout=10, source_address=(source, 0))
    try:
        sock.sendall(head)
        sock.setblocking(False)
        while time.monotonic() < deadline:
            want_write = [sock] if sent < size else []
            readable, writable, _ = select.select([sock], want_write, [], 0.2)
            if readable:
                try:
                    chunk = sock.recv(65536)
                except (ConnectionResetError, BrokenPipeError):
                    ended = "reset"
                    break
                if not chunk:
                    break
                reply += chunk
                if b"\r\n\r\n" in reply:
                    break  # the status line and headers are in: that is the answer
                continue
            if writable:
                piece = body[sent:sent + len(zeros)] if isinstance(body, bytes) else \
                    zeros[:size - sent]
                try:
                    sent += sock.send(piece)
                except BlockingIOError:
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    ended = "reset while sending"
                    # the answer may still be in the receive buffer
                    with contextlib.suppress(OSError):
                        reply += sock.recv(65536)
                    break
        seconds = time.perf_counter() - t0
    finally:
        sock.close()
    status = _status_of(bytes(reply)) if reply or not ended else ended
    if not reply and not ended and time.monotonic() >= deadline:
        status = f"no answer in {limit_s:g} s"
    return {"status": status, "sent_mib": sent / MIB, "seconds": seconds}


def _chat_body(text: str, max_tokens: int, **more: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **more}


def big_message(api: Api, mib: float) -> dict[str, Any]:
    """One chat message of ``mib`` MiB with the right key, default limits."""
    text = b"a" * int(mib * MIB)
    body = b'{"messages": [{"role": "user", "content": "' + text + b'"}], "max_tokens": 4}'
    before = memory(api.pid)
    reset_peak(api.pid)
    got = raw_post(api.address, CHAT, API_KEY, body, limit_s=120)
    time.sleep(0.5)
    after = memory(api.pid)
    return {"mib": mib, **got, "rss_before_mib": before["rss_mib"],
            "peak_delta_mib": after["peak_mib"] - before["rss_mib"],
            "after_delta_mib": after["rss_mib"] - before["rss_mib"]}


def wrong_key_bodies(api: Api, count: int, mib: float) -> dict[str, Any]:
    """``count`` bodies of ``mib`` MiB at once, each with a wrong key."""
    before = memory(api.pid)
    reset_peak(api.pid)
    results: list[dict[str, Any]] = [{} for _ in range(count)]

    def one(i: int) -> None:
        results[i] = raw_post(api.address, CHAT, f"wrong-{i}", int(mib * MIB), limit_s=60)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = memory(api.pid)
    return {"count": count, "mib": mib, "statuses": [r["status"] for r in results],
            "sent_mib": [r["sent_mib"] for r in results],
            "seconds": max(r["seconds"] for r in results),
            "peak_delta_mib": after["peak_mib"] - before["rss_mib"],
            "after_delta_mib": after["rss_mib"] - before["rss_mib"]}


def empty_content_length(api: Api, mib: float, limit_s: float = 30.0) -> dict[str, Any]:
    """A ``mib`` MiB Content-Length (right key) and no body."""
    got = raw_post(api.address, CHAT, API_KEY, 0, content_length=int(mib * MIB),
                   limit_s=limit_s)
    return {"mib": mib, **got}


def _sock_state(sock: socket.socket) -> str:
    """"open" (nothing from the server yet), else the status it was answered with or
    "closed"."""
    sock.settimeout(0)  # a socket with a timeout would wait for the answer in recv
    try:
        data = sock.recv(4096, socket.MSG_PEEK)
    except BlockingIOError:
        return "open"
    except OSError:
        return "reset"
    return str(_status_of(data)) if data else "closed"


def _connect_many(address: tuple[str, int], n: int, sources: list[str]) -> list[socket.socket]:
    socks = []
    for i in range(n):
        try:
            socks.append(socket.create_connection(address, timeout=10,
                                                  source_address=(sources[i % len(sources)],
                                                                  0)))
        except OSError:
            break
    return socks


def _tally(states: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in states:
        out[s] = out.get(s, 0) + 1
    return out


def idle_and_slow(api: Api, idle: int, slow: int, header_timeout_s: float,
                  per_host: int = 50) -> dict[str, Any]:
    """``idle`` connections that send nothing and ``slow`` that send their head a byte a
    second, from several loopback addresses (``per_host`` each, under the per-host cap, so
    the header deadline is what is measured); a legitimate request while they are open;
    how many are still open at the header deadline + 2 s."""
    idle_from = [f"127.0.1.{1 + i}" for i in range(max(1, -(-idle // per_host)))]
    slow_from = [f"127.0.2.{1 + i}" for i in range(max(1, -(-slow // per_host)))]
    fds_before = open_fds(api.pid)
    t0 = time.monotonic()
    idles = _connect_many(api.address, idle, idle_from)
    slows = _connect_many(api.address, slow, slow_from)
    stop = threading.Event()

    def trickle() -> None:
        for s in slows:
            with contextlib.suppress(OSError):
                s.send(b"GET /v1/models HTTP/1.1\r\nHost: bench\r\nX-Slow: ")
        while not stop.wait(1.0):
            for s in slows:
                with contextlib.suppress(OSError):
                    s.send(b"a")

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(0.5)
        fds_during = open_fds(api.pid)
        legit, legit_s, _ = api.request("GET", "/v1/models")
        open_at_start = {"idle": sum(_sock_state(s) == "open" for s in idles),
                         "slow": sum(_sock_state(s) == "open" for s in slows)}
        time.sleep(max(0.0, t0 + header_timeout_s + 2.0 - time.monotonic()))
        states = {"idle": [_sock_state(s) for s in idles],
                  "slow": [_sock_state(s) for s in slows]}
        fds_after = open_fds(api.pid)
    finally:
        stop.set()
        trickler.join(5)
        for s in idles + slows:
            s.close()
    return {"idle": len(idles), "slow": len(slows), "header_timeout_s": header_timeout_s,
            "hosts": len(idle_from) + len(slow_from), "open_at_start": open_at_start,
            "still_open": {k: v.count("open") for k, v in states.items()},
            "answers": {k: _tally(v) for k, v in states.items()},
            "legit_during": legit, "legit_s": legit_s, "fds_before": fds_before,
            "fds_during": fds_during, "fds_after": fds_after}


def fd_exhaustion(api: Api, sockets: int, nofile: int, requests: int = 5) -> dict[str, Any]:
    """``sockets`` idle connections from 127.0.0.2 against a server whose open-file limit
    is ``nofile``, then legitimate requests from 127.0.0.1 and 127.0.0.2."""
    limit = next((line.split()[3] for line in Path(f"/proc/{api.pid}/limits").read_text()
                  .splitlines() if line.startswith("Max open files")), "?")
    socks = _connect_many(api.address, sockets, ["127.0.0.2"])
    try:
        time.sleep(0.5)
        fds = open_fds(api.pid)
        still = sum(_sock_state(s) == "open" for s in socks)
        statuses = {src: [api.request("GET", "/v1/models", source=src, timeout_s=30)[0]
                          for _ in range(requests)] for src in ("127.0.0.1", "127.0.0.2")}
        chat = {src: api.request("POST", CHAT, body=_chat_body("Hi!", 4), source=src)[0]
                for src in ("127.0.0.1", "127.0.0.2")}
    finally:
        for s in socks:
            s.close()
    return {"sockets": len(socks), "nofile": nofile, "server_limit": limit,
            "server_fds": fds, "flood_still_open": still, "models": statuses, "chat": chat}


def leavers(api: Api, counts: list[int], busy_tokens: int, stay_tokens: int,
            leaver_words: int) -> dict[str, Any]:
    """The plan has one session. A long generation holds it; ``n`` clients send a long
    prompt and hang up while queued; then one that stays. Its extra delay: from the busy
    generation's end to its answer, less the same request unloaded."""
    stay = _chat_body("What is the capital of France?", stay_tokens)
    api.request("POST", CHAT, body=stay)  # warm
    unloaded = [api.request("POST", CHAT, body=stay)[1] for _ in range(2)]
    t_unloaded = min(unloaded)
    rows = []
    for n in counts:
        busy_box: dict[str, Any] = {}

        def busy() -> None:
            busy_box["status"], _, _ = api.request("POST", "/v1/completions", body={
                "prompt": "Once upon a time, in a small village by the sea,",
                "max_tokens": busy_tokens, "temperature": 0})
            busy_box["end"] = time.monotonic()

        busy_thread = threading.Thread(target=busy)
        busy_thread.start()
        time.sleep(0.5)  # its prefill has started: the one session is taken
        long_prompt = json.dumps(_chat_body("word " * leaver_words, 64)).encode()
        head = (f"POST {CHAT} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {API_KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(long_prompt)}"
                "\r\n\r\n").encode()
        gone = []
        for _ in range(n):
            s = socket.create_connection(api.address, timeout=10)
            s.sendall(head + long_prompt)
            gone.append(s)
        stay_box: dict[str, Any] = {}

        def stayer() -> None:
            stay_box["start"] = time.monotonic()
            stay_box["status"], stay_box["seconds"], _ = api.request("POST", CHAT, body=stay)
            stay_box["end"] = time.monotonic()

        stay_thread = threading.Thread(target=stayer)
        stay_thread.start()
        time.sleep(0.5)  # all queued behind the busy generation
        for s in gone:
            s.close()
        busy_thread.join(300)
        stay_thread.join(300)
        busy_still = busy_box.get("end", 0) > stay_box.get("start", 0)
        waited_from = max(busy_box.get("end", 0), stay_box.get("start", 0))
        rows.append({"leavers": n, "busy_status": busy_box.get("status"),
                     "busy_outlasted": busy_still,
                     "stayer_status": stay_box.get("status"),
                     "stayer_s": stay_box.get("seconds"),
                     "extra_s": stay_box.get("end", 0) - waited_from - t_unloaded})
    return {"unloaded_s": t_unloaded, "busy_tokens": busy_tokens, "stay_tokens": stay_tokens,
            "leaver_words": leaver_words, "rows": rows}


def guessing(api: Api, mixed_s: float, flood_s: float) -> dict[str, Any]:
    """First ``mixed_s`` seconds of 3 wrong keys and one right key a second from 127.0.0.1
    (the right key counted when refused); then wrong keys as fast as one client sends them,
    for ``flood_s`` seconds."""
    import random

    rng = random.Random(55)

    def guess() -> str:
        return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=24))

    right_refused, right_sent, wrong_mixed = 0, 0, {}
    start = time.monotonic()
    for second in range(int(mixed_s)):
        for _ in range(3):
            code = api.request("GET", "/v1/models", key=guess(), timeout_s=10)[0]
            wrong_mixed[str(code)] = wrong_mixed.get(str(code), 0) + 1
        code = api.request("GET", "/v1/models", timeout_s=10)[0]
        right_sent += 1
        right_refused += code != 200
        time.sleep(max(0.0, start + second + 1 - time.monotonic()))
    counts: dict[str, int] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < flood_s:
        code = str(api.request("GET", "/v1/models", key=guess(), timeout_s=10)[0])
        counts[code] = counts.get(code, 0) + 1
    seconds = time.monotonic() - t0
    right_after = api.request("GET", "/v1/models", timeout_s=10)[0]
    return {"mixed_s": int(mixed_s), "right_sent": right_sent, "right_refused": right_refused,
            "wrong_mixed": wrong_mixed, "flood_s": seconds, "flood": counts,
            "per_s": {k: v / seconds for k, v in counts.items()},
            "right_after_flood": right_after}


def http_section(args, tmp: Path, procs: Processes, log) -> dict[str, Any]:
    plan = tmp / "llm-plan.json"
    subprocess.run(edgesplit_cmd("llm", "plan", "smollm2-135m-instruct", "-t",
                                 str(EXAMPLES / "llm-phone-laptop.yaml"), "--max-context",
                                 "1024", "--sessions", "1", "--out", str(plan)),
                   check=True, stdout=subprocess.DEVNULL)
    _, line = procs.start("llm-serve", edgesplit_cmd(
        "llm", "serve", str(plan), "--device", "laptop", "--port", "0", "--threads", "1",
        "--no-shape"), "listening on ")
    stage = line.split()[2]
    api_cmd = edgesplit_cmd("llm", "api", str(plan), "--server", stage, "--port", "0",
                            "--api-key", API_KEY, "--threads", "1")
    doc: dict[str, Any] = {"plan": "smollm2-135m-instruct, phone (embed..block.11) | laptop "
                                   "(block.12..head), --sessions 1, --max-context 1024"}
    want = set(args.http_rows)
    api = Api(*procs.start("llm-api", api_cmd, "api listening on "))
    log(f"http: llm api pid {api.pid} at {api.address}")
    doc["api_rss_mib"] = memory(api.pid)["rss_mib"]
    if "big" in want:
        doc["big_message"] = big_message(api, args.api_body_mib)
        log(f"  big message: {doc['big_message']}")
    if "wrongkey" in want:
        doc["wrong_key_bodies"] = wrong_key_bodies(api, args.api_wrong_bodies,
                                                   args.api_wrong_mib)
        log(f"  wrong-key bodies: {doc['wrong_key_bodies']}")
    if "emptycl" in want:
        doc["empty_content_length"] = empty_content_length(api, args.api_cl_mib)
        log(f"  empty content-length: {doc['empty_content_length']}")
    if "leavers" in want:
        doc["leavers"] = leavers(api, args.api_leavers, args.api_busy_tokens,
                                 args.api_stay_tokens, args.api_leaver_words)
        log(f"  leavers: {doc['leavers']}")
    if "guess" in want:
        doc["guessing"] = guessing(api, args.api_mixed_s, args.api_guess_s)
        log(f"  guessing: {doc['guessing']}")
    procs.stop(api.proc)
    if "idle" in want:
        short = Api(*procs.start("llm-api-short", [*api_cmd, "--header-timeout-s",
                                                   f"{args.header_timeout_s:g}"],
                                 "api listening on "))
        doc["idle_slow"] = idle_and_slow(short, args.api_idle, args.api_slow,
                                         args.header_timeout_s)
        log(f"  idle/slow: {doc['idle_slow']}")
        procs.stop(short.proc)
    if "fds" in want:
        low = Api(*procs.start("llm-api-nofile", api_cmd, "api listening on ",
                               nofile=args.api_nofile))
        doc["fd_exhaustion"] = fd_exhaustion(low, args.api_fd_sockets, args.api_nofile)
        log(f"  fd exhaustion: {doc['fd_exhaustion']}")
        procs.stop(low.proc)
    return doc


# ---- serving: the star sink and the token throttle (`edgesplit serve` subprocesses) -----------
def _star_helpers():
    """tests/runtime/test_runtime_star's three-camera star (its model, plan and the bundles each
    sensor sends) and tests/helpers.py's Relay (calls from 127.0.0.2 and up): imported, not
    copied, so the benchmark floods the star the tests check."""
    tests = Path(__file__).resolve().parent.parent / "tests"
    for folder in (str(tests), str(tests / "runtime")):  # as pytest's import path has them
        if folder not in sys.path:
            sys.path.insert(0, folder)
    import helpers
    import test_runtime_star

    return test_runtime_star, helpers.Relay


def star_section(args, tmp: Path, procs: Processes, log) -> dict[str, Any]:
    from edgesplit.graph import capture, export_model
    from edgesplit.runtime.star import JOIN_KEY

    star, Relay = _star_helpers()
    torch.manual_seed(0)
    module = star.MultiView().eval()
    model_file = tmp / "multiview.pt2"
    torch.export.save(export_model(module, tuple(star._views(0)), name="multiview"),
                      str(model_file))
    graph = capture(model_file)
    plan = star._star_plan(graph, model_file, input_devices={
        f"v{i}": s for i, s in enumerate(star.SENSORS)})
    plan_path = tmp / "star-plan.json"
    plan.save(plan_path)
    program = PlanProgram.load(plan, graph)
    proc, line = procs.start("star-sink", edgesplit_cmd(
        "serve", str(plan_path), "--device", "aggregator", "--port", "0", "--no-shape",
        "--join-timeout-s", f"{args.star_join_timeout_s:g}"), "listening on")
    address = line.split()[2]
    port = int(address.rsplit(":", 1)[1])
    log(f"serving: star sink pid {proc.pid} at {address}")
    doc: dict[str, Any] = {"join_timeout_s": args.star_join_timeout_s}
    # 10 first: the flood below leaves parts parked until their join timeout
    doc["one_call_join"] = one_call_join(program, address, star, JOIN_KEY)
    log(f"  one-call join: {doc['one_call_join']}")
    doc["star_flood"] = star_flood(program, port, address, star, Relay, JOIN_KEY, args)
    log(f"  star flood: {doc['star_flood']}")
    procs.stop(proc)
    return doc


def _rpc(stub, bundle, key: str, timeout: float, JOIN_KEY: str):
    try:
        return stub.Run(bundle, timeout=timeout, metadata=[(JOIN_KEY, key)])
    except grpc.RpcError as exc:
        return exc


def one_call_join(program, address: str, star, JOIN_KEY: str) -> dict[str, Any]:
    """Every sensor's tensors in one call (one join key)."""
    from edgesplit.quant import decode_tensor

    xs = star._views(24)
    whole = pb.Bundle()
    for bundle in star._sent(program, xs).values():
        whole.request_id = bundle.request_id
        whole.plan_id, whole.plan_version = bundle.plan_id, bundle.plan_version
        whole.tensors.extend(bundle.tensors)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.PartitionServiceStub(channel)
        t0 = time.perf_counter()
        reply = _rpc(stub, whole, "whole", 60, JOIN_KEY)
        ms = (time.perf_counter() - t0) * 1e3
        again = _rpc(stub, whole, "whole", 60, JOIN_KEY)
    ok = isinstance(reply, pb.Bundle)
    return {"status": "OK" if ok else reply.code().name, "ms": ms,
            "matches_unsplit": ok and bool(torch.allclose(
                decode_tensor(reply.tensors[0].data), program.unsplit(xs)[0], atol=1e-5)),
            "same_key_again": "OK" if isinstance(again, pb.Bundle) else again.code().name}


def star_flood(program, port: int, address: str, star, Relay, JOIN_KEY: str, args
               ) -> dict[str, Any]:
    """127.0.0.1 floods sensor0's one-source parts under fresh join keys over
    ``--star-flood-connections`` connections (``--star-flood`` parts each, then one more
    every few ms on each while the legitimate requests run); the three sensors call from
    127.0.0.2-4 through relays, ``--star-requests`` whole requests one after another."""
    from edgesplit.quant import decode_tensor

    flood_bundle = star._sent(program, star._views(20))["sensor0"]
    floods = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
              for _ in range(args.star_flood_connections)]
    relays = {s: Relay(port, f"127.0.0.{2 + i}") for i, s in enumerate(star.SENSORS)}
    channels = {s: grpc.insecure_channel(relay.address) for s, relay in relays.items()}
    calls: list[grpc.Future] = []
    stop = threading.Event()
    n = [0]

    def send_flood(channel, c: int) -> grpc.Future:
        n[0] += 1
        return pb_grpc.PartitionServiceStub(channel).Run.future(
            flood_bundle, timeout=args.star_join_timeout_s + 30,
            metadata=[(JOIN_KEY, f"flood{c}-{n[0]}")])

    def keep_flooding() -> None:
        sent = 0
        while not stop.wait(0.005) and sent < 20000:
            for c, channel in enumerate(floods):
                calls.append(send_flood(channel, c))
                sent += 1

    try:
        for c, channel in enumerate(floods):
            calls.extend(send_flood(channel, c) for _ in range(args.star_flood))
        time.sleep(1.0)  # parked or refused
        held = sum(not call.done() for call in calls)
        refiller = threading.Thread(target=keep_flooding, daemon=True)
        refiller.start()
        served, refused, wrong = 0, {}, 0
        t0 = time.monotonic()
        for r in range(args.star_requests):
            xs = star._views(1000 + r)
            sent = star._sent(program, xs)
            boxes: dict[str, Any] = {}
            threads = [threading.Thread(target=lambda s=s: boxes.__setitem__(s, _rpc(
                pb_grpc.PartitionServiceStub(channels[s]), sent[s], f"legit{r}", 30,
                JOIN_KEY))) for s in star.SENSORS]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            replies = [boxes.get(s) for s in star.SENSORS]
            if all(isinstance(x, pb.Bundle) for x in replies):
                want = program.unsplit(xs)[0]
                if all(torch.allclose(decode_tensor(x.tensors[0].data), want, atol=1e-5)
                       for x in replies):
                    served += 1
                else:
                    wrong += 1
            else:
                for x in replies:
                    if not isinstance(x, pb.Bundle):
                        code = x.code().name if isinstance(x, grpc.RpcError) else "none"
                        refused[code] = refused.get(code, 0) + 1
        legit_s = time.monotonic() - t0
        stop.set()
        refiller.join(10)
        flood_codes: dict[str, int] = {}
        for call in calls:
            code = "parked" if not call.done() else (
                "OK" if call.exception() is None else call.exception().code().name)
            flood_codes[code] = flood_codes.get(code, 0) + 1
    finally:
        stop.set()
        for call in calls:
            call.cancel()
        for channel in [*floods, *channels.values()]:
            channel.close()
        for relay in relays.values():
            relay.close()
    return {"flood_connections": len(floods), "flood_first": args.star_flood * len(floods),
            "flood_parts": len(calls), "held_after_first": held, "flood_codes": flood_codes,
            "requests": args.star_requests, "served": served, "wrong_output": wrong,
            "refused": refused, "legit_s": legit_s, "max_joins": 256}


def token_throttle(plan_path: Path, tmp: Path, procs: Processes, seconds: int, log
                   ) -> dict[str, Any]:
    """An `edgesplit serve` with a token: each second 127.0.0.1 sends three wrong tokens,
    then a new client there the right one (each a new gRPC connection, Describe)."""
    import random

    from edgesplit.transport.auth import bearer_metadata

    token = "bench-token-55"
    (tmp / "token").write_text(token + "\n")
    proc, line = procs.start("serve-token", edgesplit_cmd(
        "serve", str(plan_path), "--device", "cloud", "--port", "0", "--no-shape",
        "--token-file", str(tmp / "token")), "listening on")
    address = line.split()[2]
    log(f"serving: token server pid {proc.pid} at {address}")
    rng = random.Random(9)

    def describe(sent: str) -> str:
        with grpc.insecure_channel(address, options=[
                ("grpc.use_local_subchannel_pool", 1)]) as channel:
            try:
                pb_grpc.PartitionServiceStub(channel).Describe(
                    pb.DescribeRequest(), timeout=10, metadata=bearer_metadata(sent))
                return "OK"
            except grpc.RpcError as exc:
                return exc.code().name + (" (throttled)" if "too many" in
                                          (exc.details() or "") else "")

    wrong: dict[str, int] = {}
    right: dict[str, int] = {}
    start = time.monotonic()
    try:
        for second in range(seconds):
            for _ in range(3):
                code = describe("".join(rng.choices("abcdefghijklmnop0123456789", k=16)))
                wrong[code] = wrong.get(code, 0) + 1
            code = describe(token)
            right[code] = right.get(code, 0) + 1
            time.sleep(max(0.0, start + second + 1 - time.monotonic()))
    finally:
        procs.stop(proc)
    return {"seconds": seconds, "right_clients": seconds, "right": right, "wrong": wrong,
            "right_refused": seconds - right.get("OK", 0)}


SECTIONS = ("wire", "http", "serving")
HTTP_ROWS = ("big", "wrongkey", "emptycl", "idle", "fds", "leavers", "guess")
# --small: sizes for a smoke run of about a minute per section
SMALL = {"soak_s": 5.0, "load_clients": 4, "load_requests": 5, "api_body_mib": 10.0,
         "api_wrong_mib": 10.0, "api_wrong_bodies": 2, "api_cl_mib": 50.0, "api_idle": 60,
         "api_slow": 20, "header_timeout_s": 2.0, "api_fd_sockets": 200, "api_leavers": [2],
         "api_busy_tokens": 48, "api_leaver_words": 100, "api_mixed_s": 3, "api_guess_s": 2.0,
         "star_requests": 5, "star_flood": 60, "throttle_s": 4}


def _csv(kind, allowed: tuple[str, ...] | None = None):
    def parse(text: str) -> list:
        items = [kind(x) for x in text.split(",") if x.strip()]
        if allowed is not None and (bad := [x for x in items if x not in allowed]):
            raise argparse.ArgumentTypeError(f"unknown {bad}: choose from {', '.join(allowed)}")
        return items
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite hostile.md from hostile.json without measuring")
    parser.add_argument("--sections", type=_csv(str, SECTIONS), default=list(SECTIONS),
                        help="comma-separated, of: " + ", ".join(SECTIONS))
    parser.add_argument("--small", action="store_true",
                        help="smoke-run sizes (about a minute a section); flags given "
                             "explicitly still win")
    wire = parser.add_argument_group("wire (digits_cnn over gRPC and the data plane)")
    wire.add_argument("--soak-s", type=float, default=120.0)
    wire.add_argument("--load-clients", type=int, default=32)
    wire.add_argument("--load-requests", type=int, default=50, help="per client")
    http = parser.add_argument_group("http (`edgesplit llm api` over SmolLM2 in two stages)")
    http.add_argument("--http-rows", type=_csv(str, HTTP_ROWS), default=list(HTTP_ROWS),
                      help="comma-separated, of: " + ", ".join(HTTP_ROWS))
    http.add_argument("--api-body-mib", type=float, default=10.0,
                      help="the one big chat message, right key")
    http.add_argument("--api-wrong-mib", type=float, default=100.0,
                      help="each wrong-key body")
    http.add_argument("--api-wrong-bodies", type=int, default=4)
    http.add_argument("--api-cl-mib", type=float, default=50.0,
                      help="the Content-Length declared with no body")
    http.add_argument("--api-idle", type=int, default=500, help="idle connections")
    http.add_argument("--api-slow", type=int, default=200, help="slow-header connections")
    http.add_argument("--header-timeout-s", type=float, default=5.0,
                      help="llm api --header-timeout-s for the idle/slow row (default 10 "
                           "there; shortened to keep the run short)")
    http.add_argument("--api-fd-sockets", type=int, default=1100,
                      help="idle sockets from 127.0.0.2 against the low-fd server")
    http.add_argument("--api-nofile", type=int, default=1024,
                      help="that server's open-file limit (prlimit, soft and hard)")
    http.add_argument("--api-leavers", type=_csv(int), default=[10, 20],
                      help="comma-separated counts of clients that leave while queued")
    http.add_argument("--api-busy-tokens", type=int, default=128,
                      help="tokens of the generation that holds the one session")
    http.add_argument("--api-stay-tokens", type=int, default=16)
    http.add_argument("--api-leaver-words", type=int, default=400,
                      help="words of each leaver's prompt (their prefill, if it ran)")
    http.add_argument("--api-mixed-s", type=int, default=30,
                      help="seconds of 3 wrong keys + 1 right key a second")
    http.add_argument("--api-guess-s", type=float, default=10.0,
                      help="seconds of guessing as fast as one client can")
    serving = parser.add_argument_group("serving (`edgesplit serve`: star sink, token)")
    serving.add_argument("--star-requests", type=int, default=93)
    serving.add_argument("--star-flood", type=int, default=100,
                         help="fresh-key parts per flood connection at first")
    serving.add_argument("--star-flood-connections", type=int, default=3)
    serving.add_argument("--star-join-timeout-s", type=float, default=60.0)
    serving.add_argument("--throttle-s", type=int, default=49,
                         help="seconds of 3 wrong tokens + 1 right-token client a second")
    args = parser.parse_args(argv)
    if args.small:
        given = {a.dest for a in parser._actions
                 if any(opt in (argv if argv is not None else sys.argv[1:])
                        for opt in a.option_strings)}
        for key, value in SMALL.items():
            if key not in given:
                setattr(args, key, value)
    return args


def wire_section(args, tmp: Path, doc: dict[str, Any], log) -> Path:
    """The original sections (bombs, malformed, frames, load, soak) on digits_cnn; returns
    the plan's path (the serving section's token server serves it too)."""
    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")))
    plan = Manual(["down1.0"]).plan(problem)
    path = tmp / "plan.json"
    plan.save(path)
    if "wire" not in args.sections:
        return path
    program = PlanProgram.load(plan)
    tensor = program.step("cloud").receives[0]
    shape = list(program.graph.tensors[tensor].shape)
    doc.update({"tensor": tensor, "shape": shape})
    proc, address = start_server(path)
    log(f"wire: serve pid {proc.pid} at {address}")
    try:
        with grpc.insecure_channel(address, options=[
                ("grpc.max_send_message_length", 64 * MIB)]) as channel:
            stub = pb_grpc.PartitionServiceStub(channel)
            host = address.rsplit(":", 1)[0]
            frames_at = (host, data_port(stub))
            paths = Paths(stub, FrameClient(*frames_at, limit=64 * MIB))
            doc["bombs"] = bombs(paths, program, tensor, shape, proc.pid)
            doc["malformed"] = bad_messages(paths, program, tensor, shape)
            doc["frames"] = frame_attacks(frames_at, paths, program, tensor, shape, proc.pid)
            load = run_requests(program, address,
                                requests=args.load_clients * args.load_requests,
                                concurrency=args.load_clients,
                                client_options={"shape": False, "timeout_s": 60})
            doc["load"] = {"clients": args.load_clients,
                           **{k: load[k] for k in ("requests", "ok", "errors", "max_abs_diff",
                                                   "throughput_rps")}}
            doc["soak"] = soak(program, address, paths, tensor, shape, proc.pid, args.soak_s)
            paths.frames.close()
    finally:
        proc.kill()
        proc.wait(30)
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.render_only:
        doc = json.loads((args.out / "hostile.json").read_text())
        print(render_hostile.write_report(doc, args.out))
        return
    t_start = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f} s] {text}", file=sys.stderr, flush=True)

    # the client side holds up to ~1,300 sockets at once
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    doc: dict[str, Any] = {"sections": args.sections, "load_before": os.getloadavg()[0],
                           "sizes": {k: v for k, v in vars(args).items()
                                     if k not in ("out", "sections", "render_only")}}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        procs = Processes(tmp)
        try:
            plan_path = wire_section(args, tmp, doc, log)
            if "http" in args.sections:
                doc["http"] = http_section(args, tmp, procs, log)
            if "serving" in args.sections:
                doc["serving"] = star_section(args, tmp, procs, log)
                doc["serving"]["token_throttle"] = token_throttle(plan_path, tmp, procs,
                                                                  args.throttle_s, log)
                log(f"  token throttle: {doc['serving']['token_throttle']}")
        finally:
            procs.close()
    doc["load_after"] = os.getloadavg()[0]
    doc["seconds"] = time.monotonic() - t_start
    args.out.mkdir(parents=True, exist_ok=True)
    saved = json.dumps(doc, indent=1, default=str)
    (args.out / "hostile.json").write_text(saved)
    print(render_hostile.write_report(json.loads(saved), args.out))  # what the file holds


if __name__ == "__main__":
    main()
