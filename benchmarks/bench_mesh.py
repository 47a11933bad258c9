"""Section 5 of the runtime benchmark, runnable alone: a JMSNAS mesh plan (Fig. 2b) served by
real `edgesplit serve` processes on this machine, its measured end-to-end latency against the
plan's own prediction (eq. 2), and the same problem's best chain served beside it.

The model, ``TwoBranch``, is JMSNAS's searched shape in miniature: a stem, two independent
branches of equal depth joined by a sum, and a head. The topology is a mesh of this machine's
devices (``ue -> root -> b0 | b1 -> agg``, every link shaped 2 Gbps / 0.2 ms): root, branches
and aggregator are priced by a per-layer profile of this machine measured just before (one
torch thread, as every served process computes on one), the UE ten times slower, so that it
only relays the input (it computes nothing in either plan, which the section checks: its speed
never enters a measurement). ``multisplit`` (JMSNAS's exact search) makes the mesh plan, whose
predicted total is eq. 2::

    T = chain part (UE -> root, root's compute)
        + max over branches (root->branch transfer + branch compute + branch->aggregator)
        + aggregator compute

and ``best_chain`` the best plain chain over the same devices (no parallel branches). Each plan
is served by one `edgesplit serve --shape --threads 1` process per device that computes or
relays, the root reaching its branches with ``--next NAME=HOST:PORT``; this process is the UE
(a ``ChainClient`` shaping its upload). Compute is real (nothing sleeps to a predicted time),
only the links are shaped, so the measurement can disagree with the model. Requests alternate
between the two plans in blocks; every output is compared with the unsplit model's.

    python benchmarks/bench_mesh.py [--requests 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bench_predicted as predicted
import numpy as np
import torch
from torch import nn

from edgesplit.graph import export_model
from edgesplit.hardware import Device, Link, MeasuredCompute, get_device, mesh
from edgesplit.hardware.profile import profile_graph, save_profile
from edgesplit.plan import Plan, PlanningProblem, get_planner, mesh_layout
from edgesplit.plan.codec import measure_wire_codec
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.client import ChainClient

RESULTS = Path(__file__).parent / "results"
LINK = Link(name="shaped-2000mbps-0.2ms", bandwidth_mbps=2000.0, rtt_ms=0.2, medium="wired")
UE_SLOWER = 10.0  # the UE's profile times this: a weak sensor that relays its input
BRANCHES = ("b0", "b1")
BLOCK = 10  # requests of one plan back to back, then the other's
INPUT_SHAPE = (1, 3, 64, 64)


class TwoBranch(nn.Module):
    """A stride-2 stem, two branches of ``depth`` 3x3 convolutions at ``width`` channels, their
    sum, a pooled linear head: the branches are the parallel region a mesh spreads."""

    def __init__(self, width: int = 64, depth: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.left, self.right = self._branch(width, depth), self._branch(width, depth)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))

    @staticmethod
    def _branch(width: int, depth: int) -> nn.Sequential:
        return nn.Sequential(*[m for _ in range(depth)
                               for m in (nn.Conv2d(width, width, 3, padding=1), nn.ReLU())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(self.left(h) + self.right(h))


# ---- planning -----------------------------------------------------------------------------------
def _profiled(path: Path, profile: dict[str, Any], codec: Any, slower: float = 1.0) -> Device:
    """A device priced by ``profile`` (its layer times x ``slower``), saved at ``path``."""
    doc = json.loads(json.dumps(profile))
    for row in doc["layers"]:
        row["eager_ms"]["median"] *= slower
    doc["whole_model"]["eager_ms"]["median"] *= slower
    save_profile(doc, path)
    base = get_device("this-machine")
    return Device(name="this-machine-profiled", kind="cpu",
                  compute=MeasuredCompute(profile=str(path)), memory_bytes=base.memory_bytes,
                  wire=codec, description="this machine, per-layer eager profile")


def _topology(device: Device, ue: Device) -> Any:
    def named(name: str, d: Device = device) -> Device:
        return d.model_copy(update={"name": name})
    return mesh("bench-mesh", [named("ue", ue)], [LINK], named("root"),
                [named(b) for b in BRANCHES], LINK, named("agg"), LINK)


def plan_mesh(tmp: Path, repeats: int = 20
              ) -> tuple[nn.Module, torch.Tensor, dict[str, Plan], dict[str, Any]]:
    """The model, its example input, the mesh and best-chain plans (their model exported to a
    ``.pt2`` the servers load) and what priced them."""
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(*INPUT_SHAPE)
    codec = measure_wire_codec()
    graph = PlanningProblem(model, _topology(get_device("this-machine"),
                                             get_device("this-machine")),
                            example_inputs=x).graph
    profile = min((profile_graph(graph, warmup=3, repeats=repeats, onnx=False) for _ in range(2)),
                  key=lambda p: p["sum_of_layers_ms"]["eager"])
    # per-layer medians as measured: the whole pass timed alongside is recorded, not scaled
    # to (section 3 scales profiles taken after idle; back to back, in trial runs, the served
    # compute matched the layers' sum and the scaled profile overpriced it)
    whole = profile["whole_model"]["eager_ms"]["median"]
    device = _profiled(tmp / "mesh.profile.json", profile, codec)
    ue = _profiled(tmp / "mesh-ue.profile.json", profile, codec, UE_SLOWER)
    problem = PlanningProblem(model, _topology(device, ue), example_inputs=x)
    source = tmp / "twobranch.pt2"
    torch.export.save(export_model(model, (x,), name="twobranch"), str(source))
    plans = {}
    for label, method in (("mesh", "multisplit"), ("best chain", "best_chain")):
        plan = get_planner(method).plan(problem)
        plan = plan.model_copy(update={"model": plan.model.model_copy(
            update={"source": str(source)})})
        if plan.devices[0].layers:
            raise RuntimeError(f"the {label} plan computes on the UE: its speed would enter the "
                               "measurement; raise UE_SLOWER")
        plans[label] = plan
    if plans["mesh"].shape != "mesh":
        raise RuntimeError("multisplit chose a chain for TwoBranch: no mesh to measure")
    return model, x, plans, {"sum_of_layers_ms": profile["sum_of_layers_ms"]["eager"],
                             "whole_model_ms": whole}


# ---- serving ------------------------------------------------------------------------------------
@contextlib.contextmanager
def serve_plan(plan: Plan, program: PlanProgram, path: Path) -> Iterator[tuple[str, list[str]]]:
    """Every device after the UE that computes or relays, as an `edgesplit serve` process; the
    address the UE calls and the devices a request passes (one branch of a mesh's)."""
    plan.save(path)
    with contextlib.ExitStack() as stack:
        def serve(device: str, *nexts: str) -> str:
            return stack.enter_context(predicted.serve_process(
                path, "--threads", "1", *(f"--next={n}" for n in nexts), device=device,
                shape=True))

        if program.kind == "mesh":
            layout = mesh_layout(plan)
            if layout.tail or layout.head != ("ue", "root"):
                raise RuntimeError(f"bench_mesh serves ue -> root -> branches -> agg, not "
                                   f"{layout}")
            agg = serve(layout.aggregator)
            branches = [f"{b}={serve(b, agg)}" for b in layout.branches]
            first = serve("root", *branches)
            path_devices = ["root", "|".join(layout.branches), layout.aggregator]
        else:
            hops, step = [], program.steps[0]
            while (nxt := program.next_device(step)) is not None:
                hops.append(nxt)
                step = program.step(nxt)
            first = ""
            for device in reversed(hops):
                first = serve(device, *([first] if first else []))
            path_devices = hops
        yield first, path_devices


# ---- measuring ----------------------------------------------------------------------------------
def _requests(plans: dict[str, Plan], model: nn.Module, x: torch.Tensor, requests: int,
              tmp: Path) -> dict[str, dict[str, Any]]:
    """``requests`` per plan after 3 warm-ups each, in alternating blocks of BLOCK."""
    inputs = [torch.randn(*INPUT_SHAPE) for _ in range(16)]
    with torch.no_grad():
        references = [model(i) for i in inputs]
    programs = {k: PlanProgram.load(p) for k, p in plans.items()}
    out: dict[str, dict[str, Any]] = {k: {"latencies_ms": [], "diffs": [], "errors": []}
                                      for k in plans}
    for k in plans:
        out[k]["served"], out[k]["breakdowns"], out[k]["hops"] = [], [], []
    with contextlib.ExitStack() as stack:
        clients = {}
        for k, plan in plans.items():
            address, path_devices = stack.enter_context(serve_plan(
                plan, programs[k], tmp / f"mesh-{k.replace(' ', '-')}.plan.json"))
            out[k]["served"] = path_devices
            clients[k] = stack.enter_context(ChainClient(programs[k], address, shape=True,
                                                         timeout_s=30.0))
        for client in clients.values():
            for _ in range(3):
                client.request((inputs[0],))
        for r in range(-(-requests // BLOCK)):
            for k in (list(plans) if r % 2 == 0 else list(reversed(plans))):
                for i in range(BLOCK):
                    _one(clients[k], inputs, references, (r * BLOCK + i) % 16, out[k])
    return out


def _one(client: ChainClient, inputs: list, references: list, i: int, out: dict) -> None:
    start = time.perf_counter()
    try:
        result = client.request((inputs[i],))
    except Exception as exc:  # counted and reported, never dropped
        out["errors"].append(str(exc))
        return
    out["latencies_ms"].append((time.perf_counter() - start) * 1e3)
    out["breakdowns"].append(result.breakdown_ms)
    out["hops"].append(dict(result.hops_ms))
    out["diffs"].append(float((result.outputs[0] - references[i]).abs().max()))


def _med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _computing(plan: Plan) -> list[str]:
    """The devices that compute in ``plan``."""
    return [d.name for d in plan.devices if d.layers]


def _breakdown(plan: Plan, measured: dict[str, Any]) -> dict[str, float]:
    """Medians over the requests of: ``compute``, the compute on a request's path as the
    servers report it (every serial device's, the slowest branch's: the client's own
    ``remote`` adds both branches up), ``serialize`` (every encode and decode), and
    ``transfer``, the rest of the request (links, hops, broadcast and join)."""
    parallel = set(plan.parallel_devices)
    rows = []
    for b, hops in zip(measured["breakdowns"], measured["hops"], strict=True):
        compute = {k.removesuffix(".compute_ms"): v for k, v in hops.items()
                   if k.endswith(".compute_ms")}
        path = b["edge"] + sum(v for d, v in compute.items() if d not in parallel) + max(
            (v for d, v in compute.items() if d in parallel), default=0.0)
        rows.append({"compute": path, "serialize": b["serialize"],
                     "transfer": max(0.0, b["total"] - path - b["serialize"]),
                     "total": b["total"]})
    return {k: _med([r[k] for r in rows]) for k in ("compute", "serialize", "transfer",
                                                     "total")} if rows else {}


def _row(label: str, plan: Plan, measured: dict[str, Any]) -> dict[str, Any]:
    lat = measured["latencies_ms"]
    p = plan.predicted
    median = float(statistics.median(lat)) if lat else float("nan")
    return {
        "plan": label, "method": plan.method, "shape": plan.shape,
        "parallel_devices": list(plan.parallel_devices),
        "layers": {d.name: len(d.layers) for d in plan.devices},
        "served_path": measured["served"],
        "predicted_ms": p.total_ms,
        "predicted_parts_ms": {"compute": dict(p.compute_ms), "transfer": p.transfer_ms,
                               "rtt": p.rtt_ms, "serialize": p.serialize_ms},
        "requests": len(lat) + len(measured["errors"]), "ok": len(lat),
        "errors": len(measured["errors"]), "error_messages": measured["errors"][:5],
        "measured_ms": {"median": median, "mean": float(np.mean(lat)) if lat else median,
                        "p95": float(np.percentile(lat, 95)) if lat else median,
                        "min": min(lat, default=median)},
        "measured_over_predicted": median / p.total_ms,
        "max_abs_diff": max(measured["diffs"], default=float("nan")),
        "breakdown_ms": _breakdown(plan, measured),
        "device_compute_ms": {d: _med([h.get(f"{d}.compute_ms", 0.0) for h in measured["hops"]])
                              for d in _computing(plan)},
    }


def bench_mesh(requests: int, tmp: Path, profile_repeats: int = 20) -> dict[str, Any]:
    """The section: both plans planned (priced by a profile of ``profile_repeats`` passes, the
    better of two), served and measured; load before and after."""
    before = os.getloadavg()[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this process is the UE: one core, as every device here
    try:
        model, x, plans, priced = plan_mesh(tmp, profile_repeats)
        measured = _requests(plans, model, x, requests, tmp)
    finally:
        torch.set_num_threads(threads)
    rows = [_row(k, plans[k], measured[k]) for k in plans]
    by = {r["plan"]: r for r in rows}
    return {"rows": rows, "link": LINK.model_dump(mode="json"), "ue_slower": UE_SLOWER,
            "requests": requests, "block": BLOCK, "input_shape": list(INPUT_SHAPE),
            "profile": priced, "load_before": before, "load_after": os.getloadavg()[0],
            "measured_gain": by["best chain"]["measured_ms"]["median"]
            / by["mesh"]["measured_ms"]["median"],
            "predicted_gain": by["best chain"]["predicted_ms"] / by["mesh"]["predicted_ms"]}


# ---- report -------------------------------------------------------------------------------------
def render(section: dict[str, Any]) -> list[str]:
    link = section["link"]
    lines = [f"## 5. A mesh plan served: measured vs JMSNAS eq. 2 ({section['requests']} "
             "requests per plan)", "",
             f"`TwoBranch` (input {'x'.join(map(str, section['input_shape']))}: a stride-2 "
             "stem, two independent branches of six 3x3 convolutions at 64 channels, their "
             "sum, a pooled linear head) planned over a mesh `ue -> root -> b0 | b1 -> agg` of "
             "this machine's devices, every link shaped "
             f"{link['bandwidth_mbps']:g} Mbps / {link['rtt_ms']:g} ms. Root, branches and "
             "aggregator are priced by a per-layer profile measured just before on one torch "
             f"thread, back to back (layers' medians as measured, "
             f"{section['profile']['sum_of_layers_ms']:.2f} ms in all; the whole pass timed "
             f"alongside took {section['profile']['whole_model_ms']:.2f} ms), the UE "
             f"{section['ue_slower']:g}x slower so that it only relays its input (it computes "
             "nothing in either plan). `mesh` is `multisplit`'s plan (JMSNAS's exact search; "
             "its prediction is eq. 2: chain part + the slowest branch with its two transfers "
             "+ the aggregator), `best chain` is `best_chain`'s over the same devices. Each "
             "device that computes or relays is an `edgesplit serve --shape --threads 1` "
             "process (the root reaches its branches with `--next NAME=HOST:PORT`); this "
             "process is the UE, a `ChainClient` shaping its upload. Compute is real, only the "
             "links are shaped (nothing sleeps to a predicted time), so the measurement can "
             f"disagree with the model. Requests alternate between the plans in blocks of "
             f"{section['block']} after 3 warm-ups each; every output is compared with the "
             "unsplit model's. The measured parts are medians over the requests: `compute` "
             "the compute on a request's path as the servers report it (each serial device's "
             "and the slower branch's), `serialize` every encode and decode, `transfer` the "
             "rest (links, hops, the broadcast and the join); `device compute` each device's "
             "median compute, where the branches show what computing at once costs them. "
             f"Load average {section['load_before']:.2f} before, "
             f"{section['load_after']:.2f} after.", "",
             "| plan | layers per device | predicted ms | compute / transfer+RTT / serialize ms "
             "| measured median ms | p95 ms | measured compute / transfer / serialize ms "
             "| device compute ms | measured / predicted | ok | errors | max abs diff |",
             "|---|---|---:|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in section["rows"]:
        parts = r["predicted_parts_ms"]
        compute = ", ".join(f"{d} {v:.2f}" for d, v in parts["compute"].items() if v)
        layers = ", ".join(f"{d} {n}" for d, n in r["layers"].items() if n)
        m = r["measured_ms"]
        devices = ", ".join(f"{d} {v:.2f}" for d, v in r.get("device_compute_ms", {}).items())
        lines.append(f"| {r['plan']} (`{r['method']}`) | {layers} | {r['predicted_ms']:.2f} | "
                     f"{compute} / {parts['transfer'] + parts['rtt']:.2f} / "
                     f"{parts['serialize']:.2f} | {m['median']:.2f} | {m['p95']:.2f} | "
                     f"{_parts(r.get('breakdown_ms', {}))} | {devices or '-'} | "
                     f"x{r['measured_over_predicted']:.2f} | {r['ok']} | {r['errors']} | "
                     f"{r['max_abs_diff']:.2g} |")
    return [*lines, "", note(section), "",
            "![mesh plan and best chain, predicted and measured by part (medians of each "
            "part; dot: the median request, bar: p95)](runtime_mesh.png)"]


def _parts(b: dict[str, float]) -> str:
    keys = ("compute", "transfer", "serialize")
    return " / ".join(f"{b[k]:.2f}" for k in keys) if all(k in b for k in keys) else "-"


def _path(row: dict[str, Any]) -> str:
    """The served processes a request passes, those without layers named as relays."""
    path = row.get("served_path", [])
    relays = [d for d in path if not any(row["layers"].get(x) for x in d.split("|"))]
    return (f"{len(path)} served processes in turn ({', '.join(path)}"
            + (f"; {', '.join(relays)} only relay" if relays else "") + ")")


def _where(mesh_row: dict[str, Any], chain: dict[str, Any]) -> str:
    """Where the measured time went against the predicted, by part, for both plans."""
    parts = []
    for name, r in (("mesh", mesh_row), ("best chain", chain)):
        b, p = r.get("breakdown_ms", {}), r["predicted_parts_ms"]
        if not b:
            return ""
        links = p["transfer"] + p["rtt"]
        compute = r["predicted_ms"] - links - p["serialize"]
        parts.append(f"the {name}'s compute on the path {b['compute']:.2f} ms against "
                     f"{compute:.2f} predicted, its links and hops {b['transfer']:.2f} against "
                     f"{links:.2f}")
    return "By part (medians): " + "; ".join(parts) + "."


def note(section: dict[str, Any]) -> str:
    """What this run's numbers say (derived, so it stays true when they change)."""
    by = {r["plan"]: r for r in section["rows"]}
    mesh_row, chain = by["mesh"], by["best chain"]
    excess = {k: r["measured_ms"]["median"] - r["predicted_ms"] for k, r in by.items()}
    bad = sum(r["errors"] for r in section["rows"])
    diff = max(r["max_abs_diff"] for r in section["rows"])
    return (f"The mesh measured x{mesh_row['measured_over_predicted']:.2f} its eq. 2 prediction "
            f"({mesh_row['measured_ms']['median']:.2f} vs {mesh_row['predicted_ms']:.2f} ms, "
            f"{excess['mesh']:+.2f} ms) and the best chain x{chain['measured_over_predicted']:.2f}"
            f" its own ({excess['best chain']:+.2f} ms); the parallel branches made a request "
            f"x{section['measured_gain']:.2f} as fast as the best chain, where the plans "
            f"predicted x{section['predicted_gain']:.2f}. {_where(mesh_row, chain)} "
            "A mesh request passes "
            f"{_path(mesh_row)}, the chain's {_path(chain)}: eq. 2 prices their links and "
            "compute but not each hop's own serving cost (framing, thread wake-ups; sections 1 "
            "and 2), nor the root's broadcast and the aggregator's join, and the two branches "
            "compute at once on a 2-core machine that the UE and the other servers share. "
            f"{bad} errors; outputs equal to the unsplit model within {diff:.2g}.")


def plot(section: dict[str, Any], path: Path) -> Path:
    """Per plan, its prediction and its measurement side by side, each stacked by part
    (compute on the request's path, links and hops, serialisation: the measured parts are
    medians of each, so their sum need not be the median request); the measured median and
    p95 as markers."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = {"compute": "#1f77b4", "links and hops": "#ff7f0e", "serialize": "#2ca02c"}
    ticks, labels = [], []
    for i, r in enumerate(section["rows"]):
        p, b = r["predicted_parts_ms"], r.get("breakdown_ms", {})
        links = p["transfer"] + p["rtt"]
        stacks = {"predicted": (r["predicted_ms"] - links - p["serialize"], links,
                                p["serialize"]),
                  "measured": (b.get("compute", 0.0), b.get("transfer", 0.0),
                               b.get("serialize", 0.0))}
        for j, (kind, parts) in enumerate(stacks.items()):
            x, bottom = 3 * i + j, 0.0
            for (name, color), value in zip(colors.items(), parts, strict=True):
                ax.bar(x, value, bottom=bottom, color=color, alpha=0.5 if j == 0 else 0.9,
                       label=name if i == 0 and j == 1 else None)
                bottom += value
            ticks.append(x)
            labels.append(f"{r['plan']}\n{kind}")
        ax.scatter([3 * i + 1], [r["measured_ms"]["median"]], color="black", marker="o",
                   zorder=3, label="measured median" if i == 0 else None)
        ax.scatter([3 * i + 1], [r["measured_ms"]["p95"]], color="black", marker="_", s=300,
                   zorder=3, label="measured p95" if i == 0 else None)
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("latency per request, ms")
    ax.set_title("mesh plan vs best chain: eq. 2 prediction and measurement", fontsize=9)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=120, format="png")
    finally:
        fig.clear()
    return path


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None,
                        help="write mesh.json here (default: print only)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgesplit-mesh-") as tmp:
        section = bench_mesh(args.requests, Path(tmp))
    print("\n".join(render(section)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mesh.json").write_text(json.dumps(section, indent=2) + "\n")
        plot(section, args.out / "runtime_mesh.png")


if __name__ == "__main__":
    sys.exit(main())
