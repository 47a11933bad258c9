"""Section 3 of the runtime benchmark, runnable alone: predicted vs measured end-to-end latency
of forced edge-cloud splits, by three predictors of the same plan.

- ``profile``: a per-layer profile of the model measured right before its requests (the less
  disturbed of two), its layer times scaled to the whole forward pass it timed alongside
  (a request pays for the whole pass; the per-layer ticks and a median per layer do not).
- ``calibrated``: ``this-machine``'s roofline fitted (``edgesplit calibrate``) to profiles of
  the *other* models only (leave one model out: it never saw the model it predicts).
- ``preset``: the hand-set ``this-machine`` roofline, for reference.

Every predictor prices the serialisation of crossing tensors with the wire codec measured here.
Plans: ``best (unconstrained)`` (edge-only with identical devices: compute only) and a
``forced split`` (QDMP with a privacy layer a third of the way in and an edge memory limit met
at two thirds), both planned with the calibrated roofline, and the profile's forced split when
it differs. Each plan is served as deployed, its cloud part by an `edgesplit serve` process
and its edge part by a client in this one, on loopback shaped 25 Mbps / 10 ms, and measured
over ``--requests`` after 2 warm-ups.

Quiet machine: the 1-minute load average is read before and after. With more than
``--max-load`` before, or a rise beyond what the benchmark's own threads explain (its torch
threads) plus ``--max-load``, it prints why and exits 3 without writing anything.

    python benchmarks/bench_predicted.py [--models a,b] [--requests 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgesplit.graph import LayerGraph
from edgesplit.hardware import Device, Link, MeasuredCompute, get_device
from edgesplit.hardware.calibrate import calibrate_roofline
from edgesplit.hardware.profile import machine_info, profile_graph, save_profile
from edgesplit.plan import (
    EdgeCloudSetting,
    PlanningProblem,
    best_plan,
    compare_methods,
    get_planner,
)
from edgesplit.plan.codec import measure_wire_codec
from edgesplit.plan.model import Plan
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.session import run_requests

RESULTS = Path(__file__).parent / "results"
MODELS = ["resnet18", "mobilenet_v2", "digits_cnn", "bert_mini", "alexnet", "vit_tiny",
          "googlenet", "mnasnet"]
LINK = Link(name="shaped-25mbps-10ms", bandwidth_mbps=25.0, rtt_ms=10.0, medium="wired")
PREDICTORS = ("profile", "calibrated", "preset")
GOAL_MAPE = 15.0
# torch threads per device: edge and cloud share this machine, one core each. Two teams of two
# OpenMP threads on two shared cores make each other wait: a request's compute then took up to
# x20 (digits_cnn) its time on one thread.
THREADS = 1
# profiles time each pass after this much sleep: a forced split's partitions here wait 15-105 ms
# on the shaped link between their computes, and a pass after idle is slower than back to back
IDLE_MS = 50.0


# ---- quiet machine --------------------------------------------------------------------------
def quiet_problem(before: float, after: float, max_load: float) -> str | None:
    """Why the run was not on a quiet machine, or None. The benchmark's own threads (torch's
    intra-op threads, busy while a partition computes) explain up to that many of the rise."""
    own = torch.get_num_threads()
    if before > max_load:
        return (f"the 1-minute load average was {before:.2f} before the run (more than "
                f"{max_load:g}): other work is running; wait for a quiet machine")
    if after - before > own + max_load:
        return (f"the 1-minute load average rose from {before:.2f} to {after:.2f}, more than "
                f"this benchmark's {own} threads explain: other work ran meanwhile")
    return None


# ---- planning and predicting ----------------------------------------------------------------
def _constraints(graph) -> tuple[str, int]:
    """A privacy layer a third of the way through the single-tensor cuts and an edge memory
    limit that the prefix up to two thirds just meets: with identical edge and cloud the best
    plan is otherwise edge-only, so these force a real split in between."""
    cuts = [c for c in graph.single_tensor_cuts() if 0 <= c.index < len(graph.layers) - 1]
    lo, hi = cuts[len(cuts) // 3], cuts[(2 * len(cuts)) // 3]
    prefix = [layer.name for layer in graph.layers[: hi.index + 1]]
    return lo.after, graph.peak_memory(prefix).total_bytes


def _scaled_to_whole(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile with its layer medians scaled to add up to its whole-model median (kept as
    is beyond x0.5-x2: then the machine changed between the two)."""
    out = copy.deepcopy(profile)
    total = sum(r["eager_ms"]["median"] for r in out["layers"])
    ratio = out["whole_model"]["eager_ms"]["median"] / total if total else 1.0
    if 0.5 <= ratio <= 2.0:
        for r in out["layers"]:
            r["eager_ms"]["median"] *= ratio
    out["scaled_to_whole"] = ratio
    return out


def _prediction(problem: PlanningProblem, plan: Plan) -> dict[str, float]:
    """What ``problem``'s cost model predicts for ``plan``, by part."""
    b = problem.costs(plan.model.graph).evaluate(plan.edge_layers)
    return {"edge": b.edge_ms, "transfer": b.transfer_ms + b.rtt_ms, "serialize": b.serialize_ms,
            "cloud": b.cloud_ms, "total": b.total_ms}


class Served(str):
    """A served process's gRPC address (a str, as callers use it) and its process id."""

    pid: int


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def serve_process(plan_path: Path, *flags: str, shape: bool = False, device: str = "cloud",
                  env: dict[str, str] | None = None) -> Iterator[Served]:
    """`edgesplit serve` for the plan's ``device`` (its cloud part by default) in its own
    process (shaping its replies or not; ``env``: the process's environment, e.g. a
    PYTHONPATH naming another version's source); its gRPC address (with the process id)."""
    proc = subprocess.Popen([sys.executable, "-m", "edgesplit.cli", "serve", str(plan_path),
                             "--device", device, "--port", "0",
                             *(["--shape"] if shape else ["--no-shape"]), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on"):
            raise RuntimeError(f"the server did not start (exit {proc.poll()})")
        address = Served(line.split()[2])
        address.pid = proc.pid
        yield address
    finally:
        proc.terminate()
        try:  # a graceful stop gives calls in flight up to 5 s on each of its two planes
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"warning: the server for {plan_path.name} did not stop in 30 s; killed",
                  file=sys.stderr)


def _measure(plan: Plan, program: PlanProgram, requests: int, tmp: Path) -> dict[str, Any]:
    """The plan served as deployed: its cloud part by an `edgesplit serve` process, its edge
    part by a client in this one, both shaping the link. (Both parts in one process would
    measure their compute slowed by each other's OpenMP team: see hardware/threads.py.)"""
    path = tmp / f"{program.plan_id}.plan.json"
    plan.save(path)
    with serve_process(path, "--max-batch", "1", "--threads", str(THREADS), shape=True) as address:
        report = run_requests(program, address, requests=requests, warmup=2,
                              client_options={"shape": True})
    return {"errors": report["errors"], "max_abs_diff": report["max_abs_diff"],
            "latency_ms": report["latency_ms"], "breakdown_ms": report["breakdown_ms"],
            "totals_ms": [r["breakdown_ms"]["total"] for r in report["per_request"]]}


def _graph_for(problem: PlanningProblem, plan: Plan) -> LayerGraph:
    """The captured graph ``plan`` was made on: the optimized one, or the raw one DADS plans
    on (it can win the unconstrained comparison)."""
    names = [layer.name for layer in plan.layers]
    if [layer.name for layer in problem.graph.layers] == names:
        return problem.graph
    return problem.graph_of("raw")  # captured (and kept) when DADS planned


def _describe(plan: Plan) -> dict[str, Any]:
    sent = plan.transfers[0] if plan.transfers and plan.transfers[0].tensors else None
    return {"method": plan.method, "edge_layers": len(plan.edge_layers),
            "layers": len(plan.layers), "crossing": list(sent.tensors) if sent else [],
            "sent_bytes": sent.bytes if sent else 0}


def _devices(base: Device, model: str, profiles: dict[str, dict], fresh: Path, codec
             ) -> dict[str, Device]:
    others = [p for m, p in profiles.items() if m != model]
    calibrated = calibrate_roofline(base, others or list(profiles.values()),
                                    name="this-machine-calibrated")
    profiled = Device(name="this-machine-profiled", kind="cpu",
                      compute=MeasuredCompute(profile=str(fresh)), memory_bytes=base.memory_bytes,
                      description="this machine, per-layer eager profile")
    return {"profile": profiled.model_copy(update={"wire": codec}),
            "calibrated": calibrated.model_copy(update={"wire": codec}),
            "preset": base}


def bench_predicted(models: list[str], requests: int, tmp: Path, log=print
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each device gets one of this machine's cores: one torch thread here (profiles, the edge
    part) and in the server (the cloud part)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return _bench_predicted(models, requests, tmp, log)
    finally:
        torch.set_num_threads(threads)


def _bench_predicted(models: list[str], requests: int, tmp: Path, log
                     ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base = get_device("this-machine")
    codec = measure_wire_codec()
    problems = {m: PlanningProblem(m, EdgeCloudSetting(edge=base, cloud=base, link=LINK))
                for m in models}
    # profiles to calibrate on (each model's is used only for the others)
    profiles = {m: profile_graph(p.graph, warmup=3, repeats=10, onnx=False, idle_ms=IDLE_MS)
                for m, p in problems.items()}
    rows = []
    for model in models:
        t0 = time.perf_counter()
        graph = problems[model].graph
        privacy, limit = _constraints(graph)
        fresh = min((profile_graph(graph, warmup=3, repeats=10, onnx=False, idle_ms=IDLE_MS)
                     for _ in range(2)),
                    key=lambda p: p["sum_of_layers_ms"]["eager"])
        path = tmp / f"{model}.profile.json"
        save_profile(_scaled_to_whole(fresh), path)
        devices = _devices(base, model, profiles, path, codec)
        by = {k: dataclasses.replace(problems[model], setting=EdgeCloudSetting(
            edge=d, cloud=d, link=LINK), _costs={}) for k, d in devices.items()}
        forced = {k: dataclasses.replace(p, setting=dataclasses.replace(
            p.setting, privacy_layer=privacy, edge_memory_bytes=limit), _costs={})
            for k, p in by.items()}
        best_name, best = best_plan(compare_methods(by["calibrated"]))
        plan_c = get_planner("qdmp").plan(forced["calibrated"])
        plan_p = get_planner("qdmp").plan(forced["profile"])
        candidates = [("best (unconstrained)", ["calibrated"], best, by),
                      ("forced split", ["calibrated"], plan_c, forced)]
        if plan_p.edge_layers == plan_c.edge_layers:
            candidates[-1][1].append("profile")
        else:
            candidates.append(("forced split", ["profile"], plan_p, forced))
        for kind, planned_by, plan, predictors in candidates:
            program = PlanProgram.load(plan, graph=_graph_for(problems[model], plan))
            m = _measure(plan, program, requests, tmp)
            pred = {k: _prediction(p, plan) for k, p in predictors.items()}
            mean = m["breakdown_ms"]["total"]
            rows.append({
                "model": model, "plan": kind, "planned_by": planned_by,
                "method": best_name if kind.startswith("best") else "qdmp",
                "privacy_layer": privacy if kind == "forced split" else None,
                "edge_memory_limit_bytes": limit if kind == "forced split" else None,
                **_describe(plan), "predicted_parts_ms": pred,
                "predicted_ms": {k: v["total"] for k, v in pred.items()},
                "measured_mean_ms": mean, "measured_p50_ms": m["latency_ms"]["p50"],
                "measured": m,
                "signed_error_pct": {k: 100 * (v["total"] - mean) / mean for k, v in pred.items()},
                "profile_scaled_to_whole": _scaled_to_whole(fresh)["scaled_to_whole"],
            })
        log(f"predicted {model}: {time.perf_counter() - t0:.1f} s")
    return rows, {"codec": codec.model_dump(mode="json"),
                  "calibrated_on_all": calibrate_roofline(
                      base, list(profiles.values())).compute.model_dump(mode="json"),
                  "this_machine": base.model_dump(mode="json")}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE (and median APE) per predictor over the forced splits planned by the calibrated
    roofline, and over the unconstrained (compute-only) plans."""
    out: dict[str, Any] = {"models": sorted({r["model"] for r in rows})}
    for label, pick in (("forced", lambda r: r["plan"] == "forced split"
                         and "calibrated" in r["planned_by"]),
                        ("best", lambda r: r["plan"].startswith("best"))):
        sel = [r for r in rows if pick(r)]
        for k in PREDICTORS:
            ape = [abs(r["signed_error_pct"][k]) for r in sel]
            out[f"{label}_{k}_mape"] = float(np.mean(ape)) if ape else float("nan")
            out[f"{label}_{k}_median_ape"] = float(np.median(ape)) if ape else float("nan")
    return out


# ---- report ---------------------------------------------------------------------------------
def render(doc: dict[str, Any]) -> list[str]:
    """Section 3 as Markdown lines."""
    s = doc["summary"]
    lines = ["## 3. Predicted vs measured end-to-end latency", "",
             f"Edge = cloud = one core of this machine each ({doc.get('threads', THREADS)} torch "
             "thread: the cloud part in an `edgesplit serve --threads 1` process, the edge part "
             f"in this one), link {LINK.bandwidth_mbps:g} Mbps / {LINK.rtt_ms:g} "
             f"ms RTT, shaping on, {doc['requests']} requests per plan after 2 warm-ups; load "
             f"average {doc['load_before']:.2f} before, {doc['load_after']:.2f} after. "
             "Predictors (see `benchmarks/bench_predicted.py`): `profile` (fresh per-layer "
             f"profile, each pass after {doc.get('idle_ms', IDLE_MS):g} ms idle as a request's "
             "partition waits on its link, scaled to its whole forward pass), `calibrated` "
             "(roofline fitted to the *other* models' profiles), `preset` (hand-set "
             "this-machine roofline, measured with all cores: for reference). All price "
             "the crossing tensors' serialisation with the wire codec measured here. Errors are "
             "signed against the mean total (+: the prediction is too high).", "",
             "| model | plan | planned by | edge layers | crossing | bytes sent | profile ms | "
             "calibrated ms | preset ms | measured mean ms | p50 ms | profile err % | "
             "calibrated err % | preset err % | max abs diff |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        p, e = r["predicted_ms"], r["signed_error_pct"]
        lines.append(f"| {r['model']} | {r['plan']} | {' = '.join(r['planned_by'])} | "
                     f"{r['edge_layers']}/{r['layers']} | {', '.join(r['crossing']) or '-'} | "
                     f"{r['sent_bytes']:,} | {p['profile']:.1f} | {p['calibrated']:.1f} | "
                     f"{p['preset']:.1f} | {r['measured_mean_ms']:.1f} | "
                     f"{r['measured_p50_ms']:.1f} | {e['profile']:+.1f} | "
                     f"{e['calibrated']:+.1f} | {e['preset']:+.1f} | "
                     f"{r['measured']['max_abs_diff']:.2g} |")
    lines += ["", f"Error over {len(s['models'])} models (goal: MAPE <= {GOAL_MAPE:g} % on the "
              "forced splits for profile and calibrated):", "",
              "| plans | profile MAPE % | calibrated MAPE % | preset MAPE % | profile median "
              "APE % | calibrated median APE % |", "|---|---:|---:|---:|---:|---:|"]
    for label, name in (("forced", "forced split (planned by calibrated)"),
                        ("best", "best (unconstrained: edge-only, compute only)")):
        lines.append(f"| {name} | {s[f'{label}_profile_mape']:.1f} | "
                     f"{s[f'{label}_calibrated_mape']:.1f} | {s[f'{label}_preset_mape']:.1f} | "
                     f"{s[f'{label}_profile_median_ape']:.1f} | "
                     f"{s[f'{label}_calibrated_median_ape']:.1f} |")
    lines += ["", "Per part, forced splits (predicted profile / calibrated / measured mean, ms; "
              "transfer = link + RTT; serialize = encode + decode of what crosses):", "",
              "| model | edge | transfer predicted / measured | serialize predicted / measured "
              "| cloud |", "|---|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        if r["plan"] != "forced split" or "calibrated" not in r["planned_by"]:
            continue
        pp, pc = r["predicted_parts_ms"]["profile"], r["predicted_parts_ms"]["calibrated"]
        b = r["measured"]["breakdown_ms"]
        lines.append(f"| {r['model']} | {pp['edge']:.1f} / {pc['edge']:.1f} / {b['edge']:.1f} | "
                     f"{pc['transfer']:.1f} / {b['transfer']:.1f} | {pc['serialize']:.2f} / "
                     f"{b['serialize']:.2f} | {pp['cloud']:.1f} / {pc['cloud']:.1f} / "
                     f"{b['remote']:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for predicted.md/.json (a trial run: not results/)")
    parser.add_argument("--max-load", type=float, default=1.0,
                        help="the 1-minute load average a quiet machine stays under")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    start = time.perf_counter()
    torch.manual_seed(0)
    models = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="edgesplit-bench-") as tmp:
        rows, extra = bench_predicted(models, args.requests, Path(tmp),
                                      log=lambda m: print(m, file=sys.stderr))
    after = os.getloadavg()[0]
    doc = {"version": 1, "machine": machine_info(), "models": models,
           "requests": args.requests, "threads": THREADS, "idle_ms": IDLE_MS,
           "load_before": before, "load_after": after,
           "wall_s": time.perf_counter() - start, "rows": rows, **extra,
           "summary": summary(rows)}
    lines = render(doc)
    print("\n".join(lines))
    why = quiet_problem(before, after, args.max_load)
    if why is not None:
        print(f"not written: {why}", file=sys.stderr)
        sys.exit(3)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predicted.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "predicted.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'predicted.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
