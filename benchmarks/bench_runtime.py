"""The split-inference runtime on this machine: what serving a plan over gRPC costs, how exactly
link shaping delays messages, how well plans predict measured end-to-end latency, and how one
server holds up under concurrent clients.

1. Overhead (loopback, no shaping): a served chain (client runs the edge part, a
   ``PartitionServer`` the cloud part) against ``PlanProgram.run_local()`` (the same partitions
   and wire encoding in one process) and against a raw TCP round trip of the same bytes.
2. Shaping accuracy: the runtime's measured transfer time against the physical limit
   bytes*8/bandwidth + RTT at 3, 25 and 100 Mbps for messages of three splits.
3. Predicted vs measured: plans for edge = cloud = ``this-machine`` over a shaped 25 Mbps /
   10 ms link, predicted by the roofline of ``this-machine`` and by a per-layer profile measured
   just before, against the mean of 10 shaped requests.
4. Load: 32 concurrent clients x 50 requests against one digits_cnn server.

Servers run in this process (gRPC server threads beside the client threads): both sides share
the machine's cores and the Python interpreter. Every server is stopped in a ``finally``.
Writes benchmarks/results/runtime.md and runtime.json; quote the ratios, not absolute times.

    python benchmarks/bench_runtime.py [--models a,b,c] [--requests 10] [--render-only]
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
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgesplit.hardware import Device, Link, MeasuredCompute, get_device
from edgesplit.hardware.profile import machine_info, profile_graph, save_profile, time_call
from edgesplit.plan import (
    EdgeCloudSetting,
    PlanningProblem,
    best_plan,
    compare_methods,
    get_planner,
)
from edgesplit.plan.model import Plan
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.session import run_requests
from edgesplit.runtime.transport import ChainClient, PartitionServer

RESULTS = Path(__file__).parent / "results"
HOST = "127.0.0.1"

# 1. overhead: (model, --split-after layer), one mid-network split each
OVERHEAD_SPLITS = [("resnet18", "resnet.encoder.stages.1.layers.1.add"),
                   ("digits_cnn", "down2.0"),
                   ("bert_mini", "encoder.layer.1.output.LayerNorm")]
# 2. shaping: three message sizes (16 KiB, 98 KiB, 392 KiB of float32 activation)
SHAPING_SPLITS = [("digits_cnn", "down2.0"),
                  ("resnet18", "resnet.encoder.stages.3.layers.1.add"),
                  ("resnet18", "resnet.encoder.stages.1.layers.1.add")]
SHAPING_MBPS = (3.0, 25.0, 100.0)
SHAPING_RTT_MS = 20.0
# 3. predicted vs measured
# (efficientnet_b0 and resnet50 also work: --models; they add about two minutes)
E2E_MODELS = ["resnet18", "mobilenet_v2", "digits_cnn", "bert_mini", "alexnet", "vit_tiny",
              "googlenet", "mnasnet"]
E2E_LINK = Link(name="shaped-25mbps-10ms", bandwidth_mbps=25.0, rtt_ms=10.0, medium="wired")
UNSHAPED_LINK = Link(name="loopback", bandwidth_mbps=10_000.0, rtt_ms=0.0, medium="wired")
# 4. load
LOAD_SPLIT = ("digits_cnn", "down2.0")
LOAD_CLIENTS, LOAD_REQUESTS = 32, 50


# ---- helpers ------------------------------------------------------------------------------------
def _ms(fn) -> float:
    """One timed call (the benchmark interleaves its variants round by round instead of timing
    each in a block, so that all of them see the same machine conditions)."""
    return time_call(fn, warmup=0, repeats=1)["median"]


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


@contextlib.contextmanager
def serving(program: PlanProgram, *, shape: bool) -> Iterator[tuple[str, PartitionServer]]:
    """The plan's second device served on loopback, in this process; always stopped."""
    server = PartitionServer(program, program.steps[1].name, shape=shape)
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


class EchoServer:
    """A raw TCP peer: reads an 8-byte header (bytes up, bytes down), the upload, and answers
    with that many bytes. The baseline a transport cannot beat on loopback."""

    def __init__(self, max_reply: int) -> None:
        self._reply = memoryview(os.urandom(max_reply))
        self._listen = socket.create_server((HOST, 0))
        self.port = self._listen.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._sock = socket.create_connection((HOST, self.port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray(max_reply)

    @staticmethod
    def _recv_exact(conn: socket.socket, view: memoryview) -> bool:
        got = 0
        while got < len(view):
            n = conn.recv_into(view[got:])
            if n == 0:
                return False
            got += n
        return True

    def _serve(self) -> None:
        conn, _ = self._listen.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = bytearray(8)
        sink = bytearray(1 << 16)
        with conn:
            while self._recv_exact(conn, memoryview(header)):
                n_up, n_down = struct.unpack("<II", header)
                if len(sink) < n_up:
                    sink = bytearray(n_up)
                if not self._recv_exact(conn, memoryview(sink)[:n_up]):
                    return
                conn.sendall(self._reply[:n_down])

    def message(self, n_up: int, n_down: int) -> bytes:
        return struct.pack("<II", n_up, n_down) + os.urandom(n_up)

    def round_trip(self, message: bytes, n_down: int) -> None:
        self._sock.sendall(message)
        self._recv_exact(self._sock, memoryview(self._buf)[:n_down])

    def close(self) -> None:
        self._sock.close()  # the server's recv returns 0 and its thread ends
        self._thread.join(timeout=5)
        self._listen.close()


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
def bench_overhead(device: Device, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for model, layer in OVERHEAD_SPLITS:
        problem = _problem(model, EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED_LINK))
        _, program = _manual(problem, layer)
        up, down = [], []
        with serving(program, shape=False) as (address, server):
            _record_sizes(server.upstream, down)
            with ChainClient(program, address, shape=False) as client:
                _record_sizes(client.shaper, up)
                for _ in range(3):
                    client.request()
                    program.run_local()
                n_up, n_down = up[-1], down[-1]
                echo = EchoServer(max(n_down, 1))
                try:
                    message = echo.message(n_up, n_down)
                    for _ in range(3):
                        echo.round_trip(message, n_down)
                    served, local, raw, transfer, serialize = [], [], [], [], []
                    results, local_timings = [], []
                    for r in range(rounds):
                        variants = [  # called right away, within this iteration
                            lambda: results.append(client.request()),
                            lambda: local_timings.append(program.run_local()[1]),
                            lambda: echo.round_trip(message, n_down)]
                        order = [(r + k) % 3 for k in range(3)]  # rotate who goes first
                        for k in order:
                            t = _ms(variants[k])
                            (served, local, raw)[k].append(t)
                    for res in results:
                        transfer.append(res.breakdown_ms["transfer"])
                        serialize.append(res.breakdown_ms["serialize"])
                    served_compute = _median([res.breakdown_ms["edge"] + res.breakdown_ms["remote"]
                                              for res in results])
                    local_compute = _median([t["compute"] for t in local_timings])
                    local_serialize = _median([t["serialize"] for t in local_timings])
                finally:
                    echo.close()
        s, lo, so = _median(served), _median(local), _median(raw)
        rows.append({
            "model": model, "split_after": layer, "crossing": list(program.steps[0].sends),
            "request_bytes": n_up, "reply_bytes": n_down, "rounds": rounds,
            "served_ms": s, "run_local_ms": lo, "raw_socket_rtt_ms": so,
            "served_minus_local_ms": s - lo, "served_over_local": s / lo,
            # the non-compute cost the client measures itself: transport + extra serialisation
            # (the served - local difference also carries the compute noise of two runs)
            "overhead_ms": _median(transfer) + _median(serialize) - local_serialize,
            "grpc_over_socket_ms": _median(transfer) + _median(serialize) - local_serialize - so,
            "overhead_over_socket": (_median(transfer) + _median(serialize) - local_serialize) / so,
            "overhead_over_local": (_median(transfer) + _median(serialize) - local_serialize) / lo,
            "runtime_transfer_ms": _median(transfer), "runtime_serialize_ms": _median(serialize),
            "served_compute_ms": served_compute, "local_compute_ms": local_compute,
            "local_serialize_ms": local_serialize,
            "served_p90_ms": float(np.percentile(served, 90)),
            "run_local_p90_ms": float(np.percentile(local, 90)),
        })
        print(f"overhead {model}: served {s:.2f} ms, local {lo:.2f} ms, socket {so:.3f} ms")
    return rows


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
                _record_sizes(server.upstream, down)
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


# ---- 3. predicted vs measured -------------------------------------------------------------------
def _constraints(graph) -> tuple[str, int]:
    """A privacy layer a third of the way through the single-tensor cuts and an edge memory limit
    that the prefix up to two thirds just meets: with identical edge and cloud the best plan is
    otherwise always edge-only (no link), so these force a real split in between."""
    cuts = [c for c in graph.single_tensor_cuts() if 0 <= c.index < len(graph.layers) - 1]
    lo, hi = cuts[len(cuts) // 3], cuts[(2 * len(cuts)) // 3]
    prefix = [layer.name for layer in graph.layers[: hi.index + 1]]
    return lo.after, graph.peak_memory(prefix).total_bytes


def _prediction(problem: PlanningProblem, plan: Plan) -> dict[str, float]:
    """What ``problem``'s cost model predicts for ``plan``'s edge part."""
    b = problem.costs(plan.model.graph).evaluate(plan.edge_layers)
    return {"edge": b.edge_ms, "transfer": b.transfer_ms + b.rtt_ms, "cloud": b.cloud_ms,
            "total": b.total_ms}


def _measure(program: PlanProgram, requests: int) -> dict[str, Any]:
    with serving(program, shape=True) as (address, _server):
        report = run_requests(program, address, requests=requests, warmup=2,
                              client_options={"shape": True})
    totals = [r["breakdown_ms"]["total"] for r in report["per_request"]]
    return {"errors": report["errors"], "max_abs_diff": report["max_abs_diff"],
            "latency_ms": report["latency_ms"], "breakdown_ms": report["breakdown_ms"],
            "totals_ms": totals}


def _describe(plan: Plan) -> dict[str, Any]:
    sent = plan.transfers[0] if plan.transfers and plan.transfers[0].tensors else None
    return {"method": plan.method, "edge_layers": len(plan.edge_layers),
            "layers": len(plan.layers),
            "last_edge_layer": plan.edge_layers[-1] if plan.edge_layers else None,
            "crossing": list(sent.tensors) if sent else [],
            "sent_bytes": sent.bytes if sent else 0}


def bench_predicted(device: Device, models: list[str], requests: int, tmp: Path
                    ) -> list[dict[str, Any]]:
    rows = []
    for model in models:
        t0 = time.perf_counter()
        load_avg = os.getloadavg()[0]
        roof = _problem(model, EdgeCloudSetting(edge=device, cloud=device, link=E2E_LINK))
        graph = roof.graph
        privacy, limit = _constraints(graph)
        # a per-layer profile measured right before this model's requests (the machine drifts);
        # of two, the one with the lower sum (stalls from other jobs only ever add time)
        profile = min((profile_graph(graph, warmup=3, repeats=10, onnx=False) for _ in range(2)),
                      key=lambda p: p["sum_of_layers_ms"]["eager"])
        path = tmp / f"{model}.profile.json"
        save_profile(profile, path)
        measured_dev = Device(name="this-machine-profiled", kind="cpu",
                              compute=MeasuredCompute(profile=str(path)),
                              memory_bytes=device.memory_bytes,
                              description="this machine, per-layer eager profile")
        prof = _with_setting(roof, EdgeCloudSetting(edge=measured_dev, cloud=measured_dev,
                                                    link=E2E_LINK))
        forced = {"privacy_layer": privacy, "edge_memory_bytes": limit}
        roof_c = _with_setting(roof, dataclasses.replace(roof.setting, **forced))
        prof_c = _with_setting(prof, dataclasses.replace(prof.setting, **forced))

        best_name, best = best_plan(compare_methods(roof))
        # (kind, planned by, plan, the problems that predict it); a plan both predictors chose
        # is one row, measured once
        candidates: list[tuple[str, list[str], Plan, PlanningProblem, PlanningProblem]] = [
            ("best (unconstrained)", ["roofline"], best, roof, prof)]
        plan_r = get_planner("qdmp").plan(roof_c)
        plan_p = get_planner("qdmp").plan(prof_c)
        candidates.append(("forced split", ["roofline"], plan_r, roof_c, prof_c))
        if plan_p.edge_layers == plan_r.edge_layers:
            candidates[-1][1].append("profile")
        else:
            candidates.append(("forced split", ["profile"], plan_p, roof_c, prof_c))

        for kind, planned_by, plan, by_roof, by_prof in candidates:
            program = PlanProgram.load(plan, graph=roof.graph_of(plan.model.graph))
            m = _measure(program, requests)
            pred = {"roofline": _prediction(by_roof, plan), "profile": _prediction(by_prof, plan)}
            mean, p50 = m["breakdown_ms"]["total"], m["latency_ms"]["p50"]
            rows.append({
                "model": model, "plan": kind, "planned_by": planned_by,
                "method": best_name if kind.startswith("best") else "qdmp",
                "feasible": plan.feasible,
                "privacy_layer": privacy if kind == "forced split" else None,
                "edge_memory_limit_bytes": limit if kind == "forced split" else None,
                **_describe(plan),
                "predicted_ms": {k: v["total"] for k, v in pred.items()},
                "predicted_parts_ms": pred,
                "plan_predicted_total_ms": plan.predicted.total_ms,
                "measured_mean_ms": mean, "measured_p50_ms": p50,
                "measured": m,
                "error_pct": {k: 100 * abs(v["total"] - mean) / mean for k, v in pred.items()},
                "signed_error_pct": {k: 100 * (v["total"] - mean) / mean
                                     for k, v in pred.items()},
                "error_pct_vs_p50": {k: 100 * abs(v["total"] - p50) / p50
                                     for k, v in pred.items()},
            })
        # the same profile again after the requests: how far the machine drifted meanwhile
        after = profile_graph(graph, warmup=3, repeats=10, onnx=False)
        drift = {"load_average_at_start": load_avg,
                 "profile_sum_before_ms": profile["sum_of_layers_ms"]["eager"],
                 "profile_sum_after_ms": after["sum_of_layers_ms"]["eager"],
                 "whole_model_before_ms": profile["whole_model"]["eager_ms"]["median"],
                 "whole_model_after_ms": after["whole_model"]["eager_ms"]["median"]}
        drift["after_over_before"] = drift["profile_sum_after_ms"] / drift["profile_sum_before_ms"]
        for r in rows:
            if r["model"] == model:
                r["machine_drift"] = drift
        print(f"e2e {model}: {time.perf_counter() - t0:.1f} s")
    return rows


def _mape(rows: list[dict[str, Any]], plan: str, estimator: str, planned_by: str | None = None,
          key: str = "error_pct", agg=np.mean) -> float:
    sel = [r[key][estimator] for r in rows if r["plan"] == plan
           and (planned_by is None or planned_by in r["planned_by"])]
    return float(agg(sel)) if sel else float("nan")


# ---- 4. load ------------------------------------------------------------------------------------
def bench_load(device: Device) -> dict[str, Any]:
    model, layer = LOAD_SPLIT
    problem = _problem(model, EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED_LINK))
    _, program = _manual(problem, layer)
    out: dict[str, Any] = {"model": model, "split_after": layer}
    with serving(program, shape=False) as (address, _server):
        run_requests(program, address, requests=20, concurrency=4,
                     client_options={"shape": False})  # warm the server's threads
        # warmup=0: run_requests' wall clock (and so throughput) includes warm-up requests
        for label, clients, requests in (("single client", 1, 200),
                                         ("concurrent", LOAD_CLIENTS, LOAD_REQUESTS)):
            report = run_requests(program, address, requests=requests, concurrency=clients,
                                  client_options={"shape": False})
            totals = [r["breakdown_ms"]["total"] for r in report["per_request"]]
            out[label] = {
                "clients": clients, "requests_per_client": requests,
                "requests": report["requests"], "ok": report["ok"], "errors": report["errors"],
                "error_messages": report["error_messages"],
                "max_abs_diff": report["max_abs_diff"], "latency_ms": {
                    **report["latency_ms"],
                    "p99": float(np.percentile(totals, 99)) if totals else float("nan")},
                "breakdown_ms": report["breakdown_ms"],
                "throughput_rps": report["throughput_rps"],
            }
            print(f"load {label}: {report['throughput_rps']:.0f} req/s, "
                  f"{report['errors']} errors")
    c, s = out["concurrent"], out["single client"]
    out["throughput_ratio"] = c["throughput_rps"] / s["throughput_rps"]
    out["p50_ratio"] = c["latency_ms"]["p50"] / s["latency_ms"]["p50"]
    return out


# ---- report -------------------------------------------------------------------------------------
def write(doc: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "runtime.json").write_text(json.dumps(doc, indent=2) + "\n")
    m = doc["machine"]
    tm = doc["this_machine"]["compute"]
    lines = [
        "# Runtime: serving overhead, link shaping, predicted vs measured latency, load", "",
        f"torch {m['torch']}, Python {m['python']}, {m['threads']} threads, {m['processor']}; "
        f"this-machine measured live: {tm['peak_gops']['32']} GFLOP/s FP32, "
        f"{tm['memory_bandwidth_gb_per_s']} GB/s. One run of `benchmarks/bench_runtime.py` "
        f"({doc['wall_s']:.0f} s) on a shared 2-core machine (load average "
        f"{doc['load_average'][0]:.1f} at the start, {doc['load_average_end'][0]:.1f} at the "
        "end): quote the ratios, not the absolute times.", "",
        "**Setup.** Servers run *in this process*: a `PartitionServer` (gRPC thread pool) "
        "serves the plan's cloud part on 127.0.0.1 and a `ChainClient` (or `run_requests`' "
        "client threads) runs the edge part, so both sides share the two cores and the Python "
        "interpreter; a request's edge and cloud compute run one after the other, never at "
        "once. Between separate processes or machines the transport costs would be similar, "
        "and compute would not share the interpreter.", ""]

    lines += ["## 1. Overhead of serving a split (loopback, no shaping)", "",
              "Per-request time (median of interleaved rounds) of the served chain against "
              "`PlanProgram.run_local()` (the same partitions in one process, every hop through "
              "the same wire encoding), and a raw TCP round trip (`socket`, TCP_NODELAY, one "
              "connection) carrying the same number of bytes as the request bundle up and the "
              "reply down. The served request is split as the client reports it: compute (edge "
              "+ remote), serialisation, and `transfer` (everything else: with shaping off, the "
              "transport itself: protobuf framing, gRPC, the server's thread hand-off, decode "
              "and shape checks). `overhead` = transfer + (served - local serialisation, i.e. "
              "the reply's encode/decode, which run_local does not do): what serving adds "
              "besides compute. `served - local` is the plain difference of the two totals, "
              "which also carries the compute noise of two separate runs (on this loaded "
              "machine, milliseconds for the larger models).",
              "",
              "| model | split after | bytes up / down | local ms | served ms | served - local ms "
              "| compute served / local ms | serialize served / local ms | transfer ms | "
              "overhead ms | overhead / local | raw socket RTT ms | gRPC over socket ms | "
              "overhead / socket |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["overhead"]:
        lines.append(
            f"| {r['model']} | `{r['split_after']}` | {r['request_bytes']:,} / "
            f"{r['reply_bytes']:,} | {r['run_local_ms']:.2f} | {r['served_ms']:.2f} | "
            f"{r['served_minus_local_ms']:+.2f} | {r['served_compute_ms']:.2f} / "
            f"{r['local_compute_ms']:.2f} | {r['runtime_serialize_ms']:.2f} / "
            f"{r['local_serialize_ms']:.2f} | {r['runtime_transfer_ms']:.2f} | "
            f"{r['overhead_ms']:.2f} | {r['overhead_over_local']:.3f} | "
            f"{r['raw_socket_rtt_ms']:.3f} | {r['grpc_over_socket_ms']:.2f} | "
            f"{r['overhead_over_socket']:.1f}x |")
    lines += ["", doc["notes"]["overhead"], ""]

    lines += ["## 2. Shaping accuracy", "",
              f"Links of 3, 25 and 100 Mbps with {SHAPING_RTT_MS:g} ms RTT (custom `Link`s); "
              "`measured` is the median of the client's `transfer` (total - edge - serialize - "
              "remote) over the requests after one warm-up; the physical limit is "
              "(request + reply bytes, exactly the protobuf sizes the shaper is charged) x 8 / "
              "bandwidth + RTT. `unshaped` is the same program's transfer with shaping off "
              "(the transport alone); `shaper error` = measured - limit - unshaped. `plan` is the "
              "plan's own transfer + RTT prediction (tensor payload bytes only, no headers).",
              "",
              "| model | split after | Mbps | bytes up / down | limit ms | measured ms | "
              "measured / limit | excess ms | unshaped ms | shaper error ms | plan ms | "
              "plan / limit |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["shaping"]:
        lines.append(
            f"| {r['model']} | `{r['split_after']}` | {r['bandwidth_mbps']:g} | "
            f"{r['request_bytes']:,} / {r['reply_bytes']:,} | {r['physical_limit_ms']:.2f} | "
            f"{r['measured_transfer_ms']:.2f} | {r['measured_over_physical']:.3f} | "
            f"{r['excess_ms']:.2f} | {r['unshaped_transfer_ms']:.2f} | "
            f"{r['excess_minus_unshaped_ms']:+.2f} | {r['plan_predicted_ms']:.2f} | "
            f"{r['plan_over_physical']:.3f} |")
    lines += ["", doc["notes"]["shaping"], ""]

    s = doc["predicted_summary"]
    lines += ["## 3. Predicted vs measured end-to-end latency", "",
              f"Edge = cloud = `this-machine`, link {E2E_LINK.bandwidth_mbps:g} Mbps / "
              f"{E2E_LINK.rtt_ms:g} ms RTT, shaping on, {doc['e2e_requests']} requests per plan "
              "after 2 warm-ups. Two predictors for the *same* plan: `roofline` (the "
              "`this-machine` preset: live peaks, hand-set efficiencies) and `profile` (a device "
              "with `MeasuredCompute`: the model's per-layer eager profile measured right before "
              "its requests, the less disturbed (lower sum) of two of 10 repeats; layers the "
              "profile lacks fall back to a regression "
              "fitted on it). Plans: `best (unconstrained)` is "
              "`best_plan(compare_methods(...))`; with identical devices on both ends it always "
              "keeps everything on the edge (no link use: the client never calls the server), "
              "so it tests only the compute prediction. `forced split` is QDMP with a privacy "
              "layer a third of the way through the model's single-tensor cuts and an edge "
              "memory limit met by the prefix up to two thirds, which forces a cut in between; "
              "it is planned with each predictor (`planned by`), and a plan both chose is one "
              "row. Errors are against the mean total, signed (+: the prediction is too high). "
              "`drift` is the profile's sum of layers re-measured after the requests over the "
              "one the prediction used; `profiler's whole-model ms` is the whole forward pass "
              "the profiler timed alongside the layers (median, same moment as the profile), "
              "the direct counterpart of an edge-only request.", "",
              "| model | plan | planned by | method | edge layers | crossing | bytes sent | "
              "roofline ms | profile ms | measured mean ms | measured p50 ms | roofline err % | "
              "profile err % | max abs diff | drift | profiler's whole-model ms |",
              "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["predicted"]:
        lines.append(
            f"| {r['model']} | {r['plan']} | {' = '.join(r['planned_by'])} | {r['method']} | "
            f"{r['edge_layers']}/{r['layers']} | {', '.join(r['crossing']) or '-'} | "
            f"{r['sent_bytes']:,} | {r['predicted_ms']['roofline']:.1f} | "
            f"{r['predicted_ms']['profile']:.1f} | {r['measured_mean_ms']:.1f} | "
            f"{r['measured_p50_ms']:.1f} | "
            f"{r['signed_error_pct']['roofline']:+.1f} | {r['signed_error_pct']['profile']:+.1f}"
            f" | {r['measured']['max_abs_diff']:.2g} | "
            f"x{r['machine_drift']['after_over_before']:.2f} | "
            + (f"{r['machine_drift']['whole_model_before_ms']:.1f} |"
               if r["plan"].startswith("best") else "- |"))
    differ = s["plans_that_differ_by_predictor"]
    lines += ["", f"Error over {len(s['models'])} models: MAPE against the mean total (against "
              "the median total in brackets), and the median of the absolute errors, which one "
              "stalled measurement cannot move:", "",
              "| plans | roofline MAPE % | profile MAPE % | roofline median APE % | "
              "profile median APE % |", "|---|---:|---:|---:|---:|",
              f"| best (unconstrained: edge-only, compute only) | {s['best_roofline']:.1f} "
              f"({s['best_roofline_vs_p50']:.1f}) | {s['best_profile']:.1f} "
              f"({s['best_profile_vs_p50']:.1f}) | {s['best_roofline_median_ape']:.1f} | "
              f"{s['best_profile_median_ape']:.1f} |",
              f"| forced split planned by the roofline | {s['split_roofline']:.1f} "
              f"({s['split_roofline_vs_p50']:.1f}) | {s['split_roofline_plan_profile']:.1f} "
              f"({s['split_roofline_plan_profile_vs_p50']:.1f}) | "
              f"{s['split_roofline_median_ape']:.1f} | "
              f"{s['split_roofline_plan_profile_median_ape']:.1f} |",
              f"| forced split planned by the profile | {s['split_profile_plan_roofline']:.1f} | "
              f"{s['split_profile']:.1f} | | |", "",
              ("The two predictors chose the same forced split for every model."
               if not differ else
               f"The predictors chose different forced splits for {', '.join(differ)}."), "",
              "Per part, forced split planned by the roofline (predicted roofline / profile / "
              "measured mean, ms; predicted `transfer` = link transfer + RTT, measured = the "
              "client's transfer; `serialize` is not in the plan's prediction):", "",
              "| model | edge R / P / measured | transfer predicted / measured | "
              "cloud R / P / measured | serialize measured |", "|---|---:|---:|---:|---:|"]
    for r in doc["predicted"]:
        if r["plan"] != "forced split" or "roofline" not in r["planned_by"]:
            continue
        pr, pp, b = (r["predicted_parts_ms"]["roofline"], r["predicted_parts_ms"]["profile"],
                     r["measured"]["breakdown_ms"])
        lines.append(f"| {r['model']} | {pr['edge']:.1f} / {pp['edge']:.1f} / {b['edge']:.1f} | "
                     f"{pr['transfer']:.1f} / {b['transfer']:.1f} | {pr['cloud']:.1f} / "
                     f"{pp['cloud']:.1f} / {b['remote']:.1f} | {b['serialize']:.2f} |")
    lines += ["", doc["notes"]["predicted"], ""]

    ld = doc["load"]
    lines += [f"## 4. Load: {LOAD_CLIENTS} concurrent clients x {LOAD_REQUESTS} requests", "",
              f"One server for {ld['model']} split after `{ld['split_after']}`, no shaping; "
              "each client thread has its own channel (`run_requests`); every output is "
              "checked against the unsplit model. The single-client row (200 requests) is the "
              "reference for the ratios.", "",
              "| clients x requests | ok | errors | mean ms | p50 ms | p95 ms | p99 ms | max ms | "
              "req/s | max abs diff |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label in ("single client", "concurrent"):
        r = ld[label]
        lat = r["latency_ms"]
        lines.append(f"| {r['clients']} x {r['requests_per_client']} | {r['ok']} | "
                     f"{r['errors']} | {lat['mean']:.2f} | {lat['p50']:.2f} | {lat['p95']:.2f} | "
                     f"{lat['p99']:.2f} | {lat['max']:.2f} | {r['throughput_rps']:.0f} | "
                     f"{r['max_abs_diff']:.2g} |")
    lines += ["", f"Concurrent / single client: throughput x{ld['throughput_ratio']:.2f}, "
              f"median latency x{ld['p50_ratio']:.1f}.", "", doc["notes"]["load"], ""]
    (RESULTS / "runtime.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _notes(doc: dict[str, Any]) -> dict[str, str]:
    """Observations computed from this run's numbers (kept honest by deriving them)."""
    ov = doc["overhead"]
    notes = {}
    worst = max(ov, key=lambda r: r["overhead_ms"])
    dc = [r["served_compute_ms"] - r["local_compute_ms"] for r in ov]
    dd = [r["served_minus_local_ms"] for r in ov]
    over = [r["overhead_ms"] for r in ov]
    sock = [r["raw_socket_rtt_ms"] for r in ov]
    notes["overhead"] = (
        f"Serving adds {min(over):.2f}-{max(over):.2f}"
        f" ms per request besides compute ({100 * min(r['overhead_over_local'] for r in ov):.0f}-"
        f"{100 * max(r['overhead_over_local'] for r in ov):.0f} % of the in-process chain's "
        f"time; the smaller the model, the larger the share). A raw socket moves the same bytes "
        f"in {min(sock):.3f}-{max(sock):.3f}"
        f" ms, at most {100 * max(r['raw_socket_rtt_ms'] / r['overhead_ms'] for r in ov):.0f} %"
        " of the overhead: the rest is gRPC/protobuf and Python work around the bytes (and "
        "the server's decode of the incoming tensors, which no hop timing covers), not moving "
        f"them ({worst['model']}: {worst['overhead_ms']:.2f} ms, "
        f"{worst['overhead_over_socket']:.0f}x its socket round trip). The plain served - "
        f"local difference ranges {min(dd):+.2f} to {max(dd):+.2f} ms: for the larger models "
        "compute noise between two runs of the same partitions (served compute was "
        f"{min(dc):+.2f} to {max(dc):+.2f} ms off run_local's) is as large as the overhead "
        "itself.")
    sh = doc["shaping"]
    ratios = [r["measured_over_physical"] for r in sh]
    errs = [r["excess_minus_unshaped_ms"] for r in sh]
    notes["shaping"] = (
        f"Measured transfer is x{min(ratios):.3f}-x{max(ratios):.3f} the physical limit"
        + (": never below it" if min(ratios) >= 1 else "") +
        " (the shaper sleeps at least bytes/bandwidth + RTT/2 per direction), above it by the "
        "transport's own cost plus sleep overshoot, so the ratio is closest to 1 for slow links "
        "and large messages. After removing the unshaped "
        f"transport cost, the shaper itself is off by {min(errs):+.2f} to {max(errs):+.2f} ms. "
        "The plan's prediction counts tensor payload bytes only, so it is slightly below the "
        "limit (wire headers and protobuf framing are a few dozen bytes per tensor, "
        "negligible next to activations).")
    pr = doc["predicted_summary"]
    rows = doc["predicted"]
    split = [r for r in rows if r["plan"] == "forced split" and "roofline" in r["planned_by"]]
    low = sum(r["signed_error_pct"]["profile"] < 0 for r in rows)
    extra = [r["measured"]["breakdown_ms"]["transfer"] - r["predicted_parts_ms"]["profile"]
             ["transfer"] for r in split]
    compute = [(r["measured"]["breakdown_ms"]["edge"] + r["measured"]["breakdown_ms"]["remote"])
               / (r["predicted_parts_ms"]["profile"]["edge"]
                  + r["predicted_parts_ms"]["profile"]["cloud"]) for r in split]
    drift = sorted({r["model"]: r["machine_drift"]["after_over_before"] for r in rows}.values())
    best = [r for r in rows if r["plan"].startswith("best")]
    whole_over_sum = sorted(r["machine_drift"]["whole_model_before_ms"]
                            / r["machine_drift"]["profile_sum_before_ms"] for r in best)
    runtime_over_whole = sorted(r["measured_mean_ms"] / r["machine_drift"]["whole_model_before_ms"]
                                for r in best)
    peak = doc["this_machine"]["compute"]["peak_gops"]["32"]
    notes["predicted"] = (
        f"The roofline is off by {pr['best_roofline']:.0f} % MAPE on the compute-only plans and "
        f"{pr['split_roofline']:.0f} % on the forced splits; the profile measured just before "
        f"gives {pr['best_profile']:.0f} % and {pr['split_roofline_plan_profile']:.0f} % on the "
        f"same plans (median absolute errors: roofline {pr['split_roofline_median_ape']:.0f} %,"
        f" profile {pr['split_roofline_plan_profile_median_ape']:.0f} % on the splits). The "
        f"profile prediction is too low in {low} of {len(rows)} rows, too high in the rest. On the "
        "split plans the shaped transfer, the largest part at 25 Mbps, is predicted to within "
        f"{min(extra):+.1f} to {max(extra):+.1f} ms (the transport overhead of section 1 plus "
        "the shaper's sleep overshoot), so the error is compute: the measured edge + cloud "
        f"compute is x{min(compute):.2f}-x{max(compute):.2f} the profile's, plus the "
        "serialisation the plan does not model. Three things drive the compute error here. "
        "(1) This 2-core machine is shared with other jobs: the same profile re-measured after "
        f"each model's requests was x{drift[0]:.2f}-x{drift[-1]:.2f} the one used for the "
        "prediction, and the roofline's peak is itself measured once at start-up "
        f"({peak} GFLOP/s in this run), so both predictors inherit the machine's state at "
        "the moment they were measured. (2) The profile predicts with the *sum of per-layer "
        "medians*; a preemption lands in one layer's sample and the median drops it, while a "
        "request pays for every stall: in the same profiling runs the whole forward pass took "
        f"x{whole_over_sum[0]:.2f}-x{whole_over_sum[-1]:.2f} the sum of layer medians, which "
        "biases the profile low under steady contention (on a quiet machine the two agree to a "
        "few per cent, `estimators.md`); a profile taken during a burst of load is high "
        "instead. Edge-only requests took "
        f"x{runtime_over_whole[0]:.2f}-x{runtime_over_whole[-1]:.2f} the profiler's own "
        "whole-model time. (3) Requests run their partitions in worker threads under "
        "`torch.no_grad()`, the profiler on the main thread in inference mode (a few per cent "
        "in a side test). None of this is the runtime's overhead, which section 1 bounds at a "
        "few milliseconds.")
    ld = doc["load"]["concurrent"]
    notes["load"] = (
        f"{ld['ok']} of {ld['requests']} requests answered, {ld['errors']} errors, outputs "
        f"equal to the unsplit model within {ld['max_abs_diff']:.2g}, and every reply carried "
        "its request's id (the client checks; ids count per client). On two cores shared "
        f"by clients and server, {LOAD_CLIENTS} clients get x{doc['load']['throughput_ratio']:.2f}"
        " the throughput of one (a lone client leaves the CPU idle during its round trips; "
        "beyond that, requests queue for the cores and for the interpreter that clients and "
        f"server share here), and median latency grows x{doc['load']['p50_ratio']:.0f}, "
        "about the number of requests in flight.")
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite runtime.md from runtime.json without measuring")
    parser.add_argument("--models", default=",".join(E2E_MODELS),
                        help="models for section 3 (predicted vs measured)")
    parser.add_argument("--requests", type=int, default=10, help="requests per plan, section 3")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds, section 1")
    parser.add_argument("--shaping-requests", type=int, default=5)
    args = parser.parse_args()
    if args.render_only:
        doc = json.loads((RESULTS / "runtime.json").read_text())
        doc["notes"] = _notes(doc)
        write(doc)
        return
    start = time.perf_counter()
    load_start = os.getloadavg()
    torch.manual_seed(0)
    device = get_device("this-machine")
    doc: dict[str, Any] = {"version": 1, "machine": machine_info(),
                           "this_machine": device.model_dump(mode="json"),
                           "load_average": list(load_start), "in_process_servers": True,
                           "e2e_link": E2E_LINK.model_dump(mode="json"),
                           "e2e_requests": args.requests}
    doc["overhead"] = bench_overhead(device, args.rounds)
    doc["shaping"] = bench_shaping(device, args.shaping_requests)
    with tempfile.TemporaryDirectory(prefix="edgesplit-bench-") as tmp:
        doc["predicted"] = bench_predicted(device, args.models.split(","), args.requests,
                                           Path(tmp))
    rows = doc["predicted"]
    doc["predicted_summary"] = {
        "best_roofline": _mape(rows, "best (unconstrained)", "roofline"),
        "best_profile": _mape(rows, "best (unconstrained)", "profile"),
        "split_roofline": _mape(rows, "forced split", "roofline", "roofline"),
        "split_roofline_plan_profile": _mape(rows, "forced split", "profile", "roofline"),
        "split_profile": _mape(rows, "forced split", "profile", "profile"),
        "split_profile_plan_roofline": _mape(rows, "forced split", "roofline", "profile"),
        "best_roofline_vs_p50": _mape(rows, "best (unconstrained)", "roofline",
                                      key="error_pct_vs_p50"),
        "best_profile_vs_p50": _mape(rows, "best (unconstrained)", "profile",
                                     key="error_pct_vs_p50"),
        "split_roofline_vs_p50": _mape(rows, "forced split", "roofline", "roofline",
                                       key="error_pct_vs_p50"),
        "split_roofline_plan_profile_vs_p50": _mape(rows, "forced split", "profile", "roofline",
                                                    key="error_pct_vs_p50"),
        "best_roofline_median_ape": _mape(rows, "best (unconstrained)", "roofline", agg=np.median),
        "best_profile_median_ape": _mape(rows, "best (unconstrained)", "profile", agg=np.median),
        "split_roofline_median_ape": _mape(rows, "forced split", "roofline", "roofline",
                                           agg=np.median),
        "split_roofline_plan_profile_median_ape": _mape(rows, "forced split", "profile",
                                                        "roofline", agg=np.median),
        "plans_that_differ_by_predictor": sorted(
            {r["model"] for r in rows if r["planned_by"] == ["profile"]}),
        "models": sorted({r["model"] for r in rows}),
    }
    doc["load"] = bench_load(device)
    doc["load_average_end"] = list(os.getloadavg())
    doc["wall_s"] = time.perf_counter() - start
    doc["notes"] = _notes(doc)
    write(doc)


if __name__ == "__main__":
    main()
