"""Drive a served chain or star with many requests (optionally from many concurrent clients)
and report measured against predicted latency: the document behind ``edgesplit run --json``."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgesplit.errors import ConfigError, EdgesplitError, option
from edgesplit.hardware.threads import release_thread_pool
from edgesplit.runtime.client import ChainClient, RequestResult
from edgesplit.runtime.outputs import Batch, load_rows
from edgesplit.runtime.program import PlanProgram
from edgesplit.runtime.star import StarClient, check_addresses
from edgesplit.transport import LoopbackChannel

__all__ = ["REPORT_VERSION", "client_shares", "load_inputs", "make_client", "run_requests"]

REPORT_VERSION = 1
BREAKDOWN_KEYS = ("edge", "serialize", "transfer", "remote", "total")


def load_inputs(path: str | Path, program: PlanProgram) -> list[tuple[torch.Tensor, ...]]:
    """Request inputs from a .pt/.npz file (``inputs`` as in evaluation data files): samples
    along dimension 0, cut into the plan's batch size; each request takes the next batch
    (:func:`edgesplit.runtime.outputs.load_rows` keeps the file's labels too)."""
    return load_rows(path, program).batches


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "p95": float("nan"),
                "max": float("nan")}
    arr = np.asarray(values)
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)),
            "p95": float(np.percentile(arr, 95)), "max": float(arr.max())}


Address = str | LoopbackChannel


def make_client(program: PlanProgram, address: Address | Mapping[str, Address],
                **options: Any) -> ChainClient | StarClient:
    """The client that drives ``program``: a ChainClient to the second device's ``address``
    (a mesh whose root is the first device: every branch's, by name), or, for a star, a
    StarClient to every source (``address``: source -> its address)."""
    if program.kind == "star":
        if not isinstance(address, Mapping):
            raise ConfigError(f"this plan is a star: give every source's address "
                              f"({option('addresses', flag='--source')} NAME=HOST:PORT each), "
                              "not one server")
        return StarClient(program, address, **options)
    if isinstance(address, Mapping) and program.root != program.steps[0].name:
        check_addresses(program, address)  # says that a chain takes one address
        raise AssertionError("unreachable")
    return ChainClient(program, address, **options)


def run_requests(program: PlanProgram, address: Address | Mapping[str, Address], *,
                 requests: int = 1, concurrency: int = 1,
                 inputs: Sequence[tuple[torch.Tensor, ...]] | None = None,
                 client_options: dict[str, Any] | None = None, warmup: int = 0,
                 on_done: Callable[[int], None] | None = None,
                 on_result: Callable[[int, RequestResult, Batch], None] | None = None
                 ) -> dict[str, Any]:
    """Send ``requests`` requests in all, shared by ``concurrency`` concurrent clients (each
    sends its share, ``requests // concurrency`` or one more; never more clients than
    requests), after ``warmup`` unreported requests per client; check every output against the
    unsplit model on the same input and that every reply matches its request. The inputs are
    taken in order, request ``i`` of the run getting ``inputs[i % len(inputs)]``.
    ``on_result(i, result, reference)``: each answered request's index into ``inputs``, its
    result (the outputs too) and the unsplit model's outputs on the same input (an
    :class:`~edgesplit.runtime.outputs.OutputCollector`'s ``add`` gathers them).
    ``address``: the second device's, or for a star plan every source's, by name."""
    if requests < 1 or concurrency < 1:
        raise ConfigError(f"{option('requests')} and {option('concurrency')} must be at least 1")
    shares = client_shares(requests, concurrency)
    concurrency = len(shares)
    if program.kind == "star" or isinstance(address, Mapping):
        make_client(program, address, **(client_options or {})).close()  # fails here, once
    batches = list(inputs) if inputs else [tuple(program.graph.example_inputs)]
    references = [program.unsplit(b) for b in batches]
    lock = threading.Lock()
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    # the clock starts when every client has connected and warmed up
    ready = threading.Barrier(concurrency, action=lambda: started.append(time.perf_counter()))
    started: list[float] = []

    def client_loop(client_index: int) -> None:
        with make_client(program, address, **(client_options or {})) as client:
            try:  # a chain that fails its warm-up is unusable: the run stops with its error
                for _ in range(warmup):
                    client.request(batches[0])
            except BaseException:
                ready.abort()
                raise
            try:
                ready.wait()
            except threading.BrokenBarrierError:
                return  # another client's warm-up failed; its error ends the run
            first = sum(shares[:client_index])  # this client's requests in the run's order
            for k in range(shares[client_index]):
                which = (first + k) % len(batches)
                try:
                    r = client.request(batches[which])
                except EdgesplitError as exc:
                    with lock:
                        errors.append(str(exc))
                    continue
                # this thread ran the first device's compute: what it slept emulating is here
                row = {"client": client_index,
                       **_row(r, references[which], program.steps[0].emulation_timings())}
                with lock:
                    results.append(row)
                if on_result:
                    on_result(which, r, references[which])
                if on_done:
                    on_done(1)

    if concurrency == 1:
        # on this thread: it computed the references, its OpenMP team is warm, and no second
        # team makes libgomp throttle both (hardware/threads.py)
        client_loop(0)
    else:
        # this thread only waits now: its OpenMP team must not throttle the clients'
        release_thread_pool()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            # each client in a copy of this context: errors then name options as the caller
            # writes them (``--retries`` under the CLI, errors.option), not as Python does
            for f in [pool.submit(contextvars.copy_context().run, client_loop, i)
                      for i in range(concurrency)]:
                f.result()
    wall_s = time.perf_counter() - started[0]
    return _report(program, results, errors, requests, concurrency, wall_s)


def client_shares(requests: int, concurrency: int) -> list[int]:
    """How many of ``requests`` each of (at most ``concurrency``) clients sends: as even as
    possible, the first ones one more; no client without a request."""
    clients = min(requests, concurrency)
    return [requests // clients + int(i < requests % clients) for i in range(clients)]


def _predicted(program: PlanProgram) -> dict[str, float]:
    """The plan's own breakdown in the measured one's terms (``serialize``: the encode and
    decode it prices, 0 in plans written before it did). A star's edge is its critical
    source's compute (the slowest with its transfer); a mesh's remote counts its slowest
    branch's compute."""
    p = program.plan.predicted
    if program.kind == "star":
        def branch_ms(source: str) -> float:
            return p.compute_ms.get(source, 0.0) + sum(
                t.ms + t.latency_ms + t.serialize_ms for t in program.plan.transfers
                if t.src == source)

        critical = max(program.sources, key=branch_ms)
        return {"edge": p.compute_ms.get(critical, 0.0), "serialize": p.serialize_ms,
                "transfer": p.transfer_ms + p.rtt_ms,
                "remote": p.compute_ms.get(program.sink or "", 0.0), "total": p.total_ms}
    first = program.steps[0].name
    # a mesh's branches run side by side: only the slowest one's compute is on the path
    serial = sum(ms for d, ms in p.compute_ms.items() if d != first and d not in program.sources)
    branch = max((p.compute_ms.get(b, 0.0) for b in program.sources), default=0.0)
    return {"edge": p.compute_ms.get(first, 0.0), "serialize": p.serialize_ms,
            "transfer": p.transfer_ms + p.rtt_ms, "remote": serial + branch,
            "total": p.total_ms}


def _row(r: RequestResult, reference: tuple[torch.Tensor, ...],
         local_timings: Mapping[str, float] | None = None) -> dict[str, Any]:
    diff = max(float((o.float() - ref.float()).abs().max()) for o, ref in
               zip(r.outputs, reference, strict=True))
    row = {"request_id": r.request_id, "max_abs_diff": diff, "breakdown_ms": r.breakdown_ms,
           "hops_ms": r.hops_ms}
    # compute emulation: the time each device slept (part of its compute), by device
    slept = {k: v for k, v in {**r.hops_ms, **(local_timings or {})}.items()
             if k.endswith(".emulated_ms")}
    if slept:
        row["emulated_ms"] = {k.removesuffix(".emulated_ms"): v for k, v in slept.items()}
    return row


def _emulated(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean time slept emulating per device over the requests (compute emulation)."""
    devices = sorted({d for r in rows for d in r.get("emulated_ms", {})})
    return {d: float(np.mean([r.get("emulated_ms", {}).get(d, 0.0) for r in rows]))
            for d in devices}


def _report(program: PlanProgram, rows: list[dict[str, Any]], errors: list[str], sent: int,
            concurrency: int, wall_s: float) -> dict[str, Any]:
    return _no_nan(_document(program, rows, errors, sent, concurrency, wall_s))


def _no_nan(value: Any) -> Any:
    """JSON has no NaN: a statistic over zero successful requests is null."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def _document(program: PlanProgram, rows: list[dict[str, Any]], errors: list[str], sent: int,
              concurrency: int, wall_s: float) -> dict[str, Any]:
    totals = [r["breakdown_ms"]["total"] for r in rows]
    return {
        "version": REPORT_VERSION,
        "plan_id": program.plan_id,
        "method": program.plan.method,
        "model": program.graph.model,
        "devices": [s.name for s in program.steps],
        **({"sources": list(program.sources), "sink": program.sink}
           if program.kind == "star" else {}),
        **({"root": program.root, "branches": list(program.sources),
            "aggregator": program.sink} if program.kind == "mesh" else {}),
        "requests": sent,
        "concurrency": concurrency,
        "ok": len(rows),
        "errors": len(errors),
        "error_messages": sorted(set(errors))[:10],
        "max_abs_diff": max((r["max_abs_diff"] for r in rows), default=float("nan")),
        "latency_ms": _percentiles(totals),
        "breakdown_ms": {k: float(np.mean([r["breakdown_ms"][k] for r in rows])) if rows
                         else float("nan") for k in BREAKDOWN_KEYS},
        **({"emulated_ms": _emulated(rows)} if any("emulated_ms" in r for r in rows) else {}),
        "predicted_ms": program.plan.predicted.total_ms,
        "predicted_breakdown_ms": _predicted(program),
        "throughput_rps": len(rows) / wall_s if wall_s > 0 else float("nan"),
        "per_request": rows,
    }
