"""The Ray Serve engine (``serve --engine ray``) against the local server: what the hop to a
deployment costs, and requests/s from 1 to N replicas.

1. Hop at 1 MiB: a probe model whose cloud part is almost nothing (relu on the edge; mean and
   a 64x10 linear in the cloud), so a request carries 1 MiB of float32 up and 40 bytes back
   and the difference between two servers is their serving, not compute. One client in this
   process sends requests over the data plane to an ``edgesplit serve`` process (local
   engine) and to one with ``--engine ray --replicas 1``, in turn round by round; per server
   the median request time. The added hop is the Ray server's median minus the local one's
   (goal, issue 21: <= 5 ms at p50, judged on the median of ``--hop-runs``
   runs, each with fresh servers; every run is listed). The Ray server's own view of the hop
   (``cloud.engine_ms``: its call to the deployment minus the replica's compute) is reported
   beside it. Then the same without batching (``--max-batch 1``), against the local server.
2. Replicas: a probe whose cloud part is compute-bound (eight 3x3 convolutions of 64
   channels at 32x32, ~0.3 GMAC a request; 256 KiB up, 40 bytes back; the edge computes a
   relu), 16 clients (4 client processes x 4 threads) against the local server (torch's
   threads on every core, batching on) and against 1, 2 and 4 replicas (one thread each,
   batching on; 4 replicas share 2 cores at 0.5 CPU each on this machine). On this 2-core
   machine the replicas compete with the clients, the ingress and Ray's own processes for
   the cores: the rows show Ray's overhead and how far 2 replicas get; a larger machine
   shows the scaling.

Every server is an ``edgesplit serve`` process; a Ray one starts its own local cluster
(``num_cpus`` = this machine's cores) and stops it on exit, as a user's would. Every reply is
checked against the unsplit model. Refuses to start on a busy machine (1-minute load above 1.0;
``--allow-load`` for a trial run, with ``--out`` elsewhere); the load is recorded before and
after (the load test itself raises it). Writes ray.md, ray.json and ray.png (requests/s by
replicas) to benchmarks/results/ by default.

    python benchmarks/bench_ray.py [--rounds 200] [--hop-runs 5] [--replicas 1,2,4] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from bench_llm import _quiet  # benchmarks/ is on the path
from bench_runtime import _load_run, serve_process

from edgesplit.graph import export_model
from edgesplit.hardware import Link, get_device
from edgesplit.hardware.profile import machine_info
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, get_planner, load_plan
from edgesplit.report.plots import plot_replica_scaling
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.client import ChainClient

RESULTS = Path(__file__).parent / "results"
QUIET_LOAD = 1.0
GOAL_HOP_MS = 5.0
UNSHAPED = Link(name="loopback", bandwidth_mbps=10_000.0, rtt_ms=0.0, medium="wired")
CLIENT_PROCESSES, CLIENT_THREADS, LOAD_REQUESTS = 4, 4, 40
CONVS = 8  # the heavy probe's cloud part


class Probe(torch.nn.Module):
    """1 MiB in (64x64x64 float32), 40 bytes out, next to no compute in the cloud part."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(x).mean(dim=(2, 3)))


class HeavyProbe(torch.nn.Module):
    """256 KiB in (64x32x32 float32), 40 bytes out; ~0.3 GMAC of convolutions in the cloud."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.Sequential(*[torch.nn.Conv2d(64, 64, 3, padding=1)
                                           for _ in range(CONVS)])
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.convs(torch.relu(x)).mean(dim=(2, 3)))


def _saved_plan(tmp: Path, name: str, model: torch.nn.Module, x: torch.Tensor) -> Path:
    """``model`` saved as a .pt2 and planned edge = cloud = this machine, cut after its relu."""
    torch.export.save(export_model(model.eval(), (x,), name=name), str(tmp / f"{name}.pt2"))
    device = get_device("this-machine")
    setting = EdgeCloudSetting(edge=device, cloud=device, link=UNSHAPED)
    plan = get_planner("manual", split_after=["relu"]).plan(
        PlanningProblem(str(tmp / f"{name}.pt2"), setting))
    plan.save(tmp / f"{name}.json")
    return tmp / f"{name}.json"


def _ray_flags(replicas: int, *extra: str) -> tuple[str, ...]:
    """An `edgesplit serve --engine ray` that starts its own local cluster, as a user's
    would (this process stays out of Ray: no driver threads beside the client)."""
    cpus = os.cpu_count() or 2
    return ("--engine", "ray", "--replicas",
            str(replicas), "--replica-cpus", f"{min(1.0, cpus / replicas):g}", "--threads", "1",
            *extra)


# ---- 1. the hop -----------------------------------------------------------------------------
def bench_hop(tmp: Path, rounds: int) -> dict[str, Any]:
    x = torch.randn(1, 64, 64, 64)
    path = _saved_plan(tmp, "probe", Probe(), x)
    program = PlanProgram.load(load_plan(path))
    reference = program.unsplit((x,))[0]
    rows = []
    for label, flags in (("ray", ()), ("ray, no batching", ("--max-batch", "1"))):
        setups = {"local": ("--threads", "1"), label: _ray_flags(1, *flags)}
        with contextlib.ExitStack() as stack:
            clients = {name: stack.enter_context(ChainClient(
                program, stack.enter_context(serve_process(path, *f)), shape=False,
                data_plane="tcp")) for name, f in setups.items()}
            times: dict[str, list[float]] = {name: [] for name in setups}
            hop: list[float] = []
            for i in range(rounds + 10):  # 10 warm-up rounds
                for name, client in clients.items():
                    result = client.request((x,))
                    assert torch.allclose(result.outputs[0], reference, atol=1e-5), name
                    if i >= 10:
                        times[name].append(result.breakdown_ms["total"])
                        if name != "local":
                            hop.append(result.hops_ms["cloud.engine_ms"])
        local, p50 = statistics.median(times["local"]), statistics.median(times[label])
        rows.append({"server": label, "p50_ms": p50, "p90_ms": _pct(times[label], 90),
                     "local_p50_ms": local, "local_p90_ms": _pct(times["local"], 90),
                     "added_ms": p50 - local, "engine_ms_p50": statistics.median(hop)})
        print(f"hop {label}: p50 {p50:.2f} ms, local {local:.2f} ms (added {p50 - local:+.2f})")
    step = program.steps[0]
    request_bytes = sum(len(d) for d in program.encode(
        step, step.compute(program.input_values((x,))), step.sends).values())
    return {"request_bytes": request_bytes, "reply_bytes": 40, "rounds": rounds, "rows": rows}


# Ray Serve's own call, without edgesplit: a deployment that takes a dict of numpy arrays and
# answers 40 bytes, called from a driver as our ingress calls its deployment, with the same
# Ray settings. What any Serve-based ingress pays on this machine.
_FLOOR = """
import json, statistics, sys, time
import numpy as np, ray
from ray import serve
ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
serve.start(proxy_location="Disabled")
env = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}}
@serve.deployment(ray_actor_options={"num_cpus": 1, "runtime_env": env})
class Echo:
    async def __call__(self, arrays):
        return {"y": np.zeros(10, np.float32)}
handle = serve.run(Echo.bind(), name="floor", route_prefix=None,
                   logging_config={"log_level": "ERROR"})
by_value = handle.options(_by_reference=False)  # Serve's direct gRPC transport
out = {}
for label, nbytes, h in (("empty", 0, handle), ("1 MiB", 1 << 20, handle),
                         ("1 MiB by value", 1 << 20, by_value)):
    arrays = {"x": np.random.rand(1, 64, 64, nbytes // 16384).astype(np.float32)}
    times = []
    for i in range(int(sys.argv[1]) + 50):  # gRPC's flow-control window grows meanwhile
        t = time.perf_counter()
        h.remote(arrays).result()
        if i >= 50:
            times.append((time.perf_counter() - t) * 1e3)
    out[label] = statistics.median(times)
print(json.dumps(out))
serve.shutdown()
ray.shutdown()
"""


def bench_floor(rounds: int) -> dict[str, float]:
    """Ray Serve's own handle call (p50 ms), empty and at 1 MiB, in a process of its own."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FLOOR, str(rounds)], capture_output=True,
                          text=True, timeout=600, check=True)
    # Ray's own processes may print after the result line
    floor = json.loads(next(line for line in reversed(done.stdout.splitlines())
                            if line.startswith("{")))
    print("floor: Ray Serve's call p50 " + ", ".join(f"{k} {v:.2f} ms" for k, v in floor.items()))
    return floor


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q / 100))]


# ---- 2. replicas ----------------------------------------------------------------------------
def bench_replicas(tmp: Path, replicas: list[int]) -> dict[str, Any]:
    path = _saved_plan(tmp, "heavy", HeavyProbe(), torch.randn(1, 64, 32, 32))
    out: dict[str, Any] = {"model": f"a probe with {CONVS} 3x3 convolutions in the cloud",
                           "clients": CLIENT_PROCESSES * CLIENT_THREADS, "rows": []}
    setups = [("local", None, ())] + [("ray", n, _ray_flags(n))
                                      for n in replicas]
    for engine, n, flags in setups:
        with serve_process(path, *flags) as address:
            run = _load_run(path, address, "tcp", CLIENT_PROCESSES, CLIENT_THREADS,
                            LOAD_REQUESTS)
        row = {"engine": engine, "replicas": n, "throughput_rps": run["throughput_rps"],
               "p50_ms": run["latency_ms"]["p50"], "p95_ms": run["latency_ms"]["p95"],
               "errors": run["errors"], "max_abs_diff": run["max_abs_diff"]}
        out["rows"].append(row)
        print(f"{engine} x{n or 1}: {row['throughput_rps']:.0f} req/s, p50 "
              f"{row['p50_ms']:.1f} ms, {row['errors']} errors")
    return out


# ---- report ---------------------------------------------------------------------------------
def render(doc: dict[str, Any]) -> list[str]:
    hop, rep = doc["hop"], doc["replicas"]
    ray_row = next(r for r in hop["rows"] if r["server"] == "ray")
    lines = [
        "# Ray Serve engine: the added hop and replicas",
        "",
        f"One run, {doc['wall_s']:.0f} s; load average {doc['load_before']:.2f} before, "
        f"{doc['load_after']:.2f} after (the load test's own processes); {os.cpu_count()} "
        f"cores, Ray {doc['ray_version']}. Every server an `edgesplit serve` process; a Ray one "
        "starts its own local cluster.",
        "",
        f"## 1. The hop at {hop['request_bytes'] / 2**20:.2f} MiB",
        "",
        f"A probe whose cloud part is almost nothing ({hop['reply_bytes']} bytes back); one "
        f"client over the data plane, the two servers in turn for {hop['rounds']} rounds.",
        "",
        "| server | p50 ms | p90 ms | local p50 ms (same run) | added vs local (p50) | "
        "its hop to the deployment (p50) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in hop["rows"]:
        lines.append(f"| {r['server']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | "
                     f"{r['local_p50_ms']:.2f} | {r['added_ms']:+.2f} ms | "
                     f"{r['engine_ms_p50']:.2f} ms |")
    floor = hop.get("ray_floor_ms")
    lines += ["", *_hop_verdict(doc.get("hop_runs") or [hop])]
    if floor:
        lines += [
            "",
            f"Ray Serve's own call, without edgesplit (a deployment answering 40 bytes, called "
            f"from a driver with the same Ray settings, in a process of its own): p50 "
            f"{floor['empty']:.2f} ms empty, {floor['1 MiB']:.2f} ms with 1 MiB of numpy "
            f"({floor['1 MiB by value']:.2f} ms by value over Serve's direct gRPC transport, "
            "`_by_reference=False`). The ingress's hop is "
            f"{ray_row['engine_ms_p50'] - floor['1 MiB']:+.2f} ms from Ray's own call.",
        ]
    lines += [
        "",
        f"## 2. Requests/s by replicas ({rep['clients']} clients)",
        "",
        f"{rep['model'].capitalize()} (~0.3 GMAC a request, 256 KiB up); each replica "
        "computes on one thread with batching on; the local server on every core, batching "
        "on. Every reply checked against the unsplit model.",
        "",
        "| engine | replicas | requests/s | x local | x 1 replica | p50 ms | p95 ms | errors "
        "| max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    local = next(r for r in rep["rows"] if r["engine"] == "local")["throughput_rps"]
    one = next((r["throughput_rps"] for r in rep["rows"] if r["replicas"] == 1), None)
    for r in rep["rows"]:
        vs_one = f"x{r['throughput_rps'] / one:.2f}" if one and r["engine"] == "ray" else "-"
        lines.append(f"| {r['engine']} | {r['replicas'] or '-'} | {r['throughput_rps']:.0f} | "
                     f"x{r['throughput_rps'] / local:.2f} | {vs_one} | {r['p50_ms']:.1f} | "
                     f"{r['p95_ms']:.1f} | {r['errors']} | {r['max_abs_diff']:.1e} |")
    lines += ["", *doc.get("notes", [])]
    return lines


def _added(run: dict[str, Any], server: str) -> float:
    return float(next(r["added_ms"] for r in run["rows"] if r["server"] == server))


def _hop_verdict(runs: list[dict[str, Any]]) -> list[str]:
    """The goal judged on the median added hop over the runs (each with servers of its own),
    every run listed; one run (a document from before ``--hop-runs``) says so."""
    added = [_added(run, "ray") for run in runs]
    median = statistics.median(added)
    met = "met" if median <= GOAL_HOP_MS else "MISSED"
    if len(runs) == 1:
        return [f"Goal: the added hop <= {GOAL_HOP_MS:g} ms at p50: {median:.2f} ms ({met}, "
                "from one run)."]
    lines = ["Every run (fresh servers each; the table above is run 1):", "",
             "| run | added, ray (p50) | added, ray without batching (p50) |",
             "|---:|---:|---:|"]
    lines += [f"| {i + 1} | {_added(run, 'ray'):+.2f} ms | "
              f"{_added(run, 'ray, no batching'):+.2f} ms |" for i, run in enumerate(runs)]
    return [*lines, "", f"Goal: the added hop <= {GOAL_HOP_MS:g} ms at p50: median "
            f"{median:.2f} ms over {len(runs)} runs (range {min(added):.2f}-"
            f"{max(added):.2f}): {met}."]


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = render(doc)
    (out / "ray.md").write_text("\n".join(lines) + "\n")
    plot_replica_scaling(doc["replicas"]["rows"], out / "ray.png",
                         title=f"Requests/s by Ray Serve replicas, {doc['replicas']['clients']} "
                               f"clients, {os.cpu_count()} cores")
    print("\n".join(lines))


@contextlib.contextmanager
def _tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as d:
        yield Path(d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="hop: requests per server")
    parser.add_argument("--hop-runs", type=int, default=5,
                        help="hop: runs, each with fresh servers (the goal is judged on "
                             "their median)")
    parser.add_argument("--replicas", default="1,2,4", help="replica counts to load")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    if args.render_only:
        write(json.loads((args.out / "ray.json").read_text()), args.out)
        return
    before = _quiet(args.allow_load)
    import ray

    start = time.perf_counter()
    doc: dict[str, Any] = {"version": 1, "machine": machine_info(), "load_before": before,
                           "ray_version": ray.__version__}
    with _tmp() as tmp:
        doc["hop_runs"] = [bench_hop(tmp, args.rounds) for _ in range(max(1, args.hop_runs))]
        doc["hop"] = doc["hop_runs"][0]
        doc["hop"]["ray_floor_ms"] = bench_floor(args.rounds)
        doc["replicas"] = bench_replicas(tmp, [int(n) for n in args.replicas.split(",")])
    doc["load_after"] = os.getloadavg()[0]
    doc["wall_s"] = time.perf_counter() - start
    write(doc, args.out)


if __name__ == "__main__":
    main()
