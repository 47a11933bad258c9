"""Capture + analysis time for every built-in model (and the 1,805-layer ResNet-1202).

Writes benchmarks/results/capture.md and capture.json. Absolute times on a shared machine are
noisy; the tables also give ratios measured in the same run (time per layer relative to
ResNet-18, and the share of analysis in the total).

    python benchmarks/bench_capture.py [--models a,b,c] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.progress import Progress

from edgesplit.graph import capture
from edgesplit.graph.capture import export_model, optimize_program
from edgesplit.graph.fusion import build_layer_graph
from edgesplit.models import create_model, list_models

RESULTS = Path(__file__).parent / "results"


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1e3


def bench_one(name: str) -> dict:
    built = create_model(name)
    ep, export_ms = _timed(lambda: export_model(built.module, built.example_inputs, name=name))
    gm, optimize_ms = _timed(lambda: optimize_program(ep))
    strip = getattr(built.module, "edgesplit_strip_prefix", "")
    graph, build_ms = _timed(lambda: build_layer_graph(gm, model=name, optimize=True,
                                                       strip_prefix=strip))
    cuts, cuts_ms = _timed(graph.cuts)
    singles = [c for c in cuts if len(c.tensors) == 1]

    def memory_at_every_cut():
        return [graph.peak_memory([l.name for l in graph.layers[: c.index + 1]])
                for c in singles if c.index >= 0]

    _, memory_ms = _timed(memory_at_every_cut)
    return {
        "model": name, "layers": len(graph), "fx_nodes": len(gm.graph.nodes),
        "macs": graph.total_macs, "params": graph.total_params, "single_tensor_cuts": len(singles),
        "export_ms": export_ms, "optimize_ms": optimize_ms, "build_ms": build_ms,
        "cuts_ms": cuts_ms, "memory_all_cuts_ms": memory_ms,
        "capture_ms": export_ms + optimize_ms + build_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated subset")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list_models()
    capture("resnet18")  # warm imports so the first model is not charged for them
    rows = []
    with Progress() as progress:
        task = progress.add_task("capturing", total=len(names))
        for name in names:
            progress.update(task, description=f"capturing {name}")
            rows.append(bench_one(name))
            progress.advance(task)
    base = next((r for r in rows if r["model"] == "resnet18"), rows[0])
    base_per_layer = base["capture_ms"] / base["layers"]
    for row in rows:
        row["per_layer_vs_" + base["model"]] = (row["capture_ms"] / row["layers"]) / base_per_layer
        row["analysis_share"] = (row["cuts_ms"] + row["memory_all_cuts_ms"]) / (
            row["capture_ms"] + row["cuts_ms"] + row["memory_all_cuts_ms"])
    RESULTS.mkdir(exist_ok=True)
    meta = {"version": 1, "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": torch.get_num_threads()}
    (RESULTS / "capture.json").write_text(json.dumps({**meta, "results": rows}, indent=2) + "\n")
    lines = [
        "# Capture and analysis time of the built-in models", "",
        f"torch {meta['torch']}, Python {meta['python']}, {meta['cpus']} threads. Times in ms "
        "from one run; compare the ratio columns, not absolute times.", "",
        "| model | layers | FX nodes | GMACs | single-tensor cuts | export | optimise | build "
        "| all cuts | peak memory at every cut | capture ms / layer vs "
        f"{base['model']} | analysis share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['layers']} | {r['fx_nodes']} | {r['macs'] / 1e9:.3f} | "
            f"{r['single_tensor_cuts']} | {r['export_ms']:.0f} | {r['optimize_ms']:.0f} | "
            f"{r['build_ms']:.0f} | {r['cuts_ms']:.1f} | {r['memory_all_cuts_ms']:.0f} | "
            f"{r['per_layer_vs_' + base['model']]:.2f} | {r['analysis_share']:.1%} |")
    median_share = statistics.median(r["analysis_share"] for r in rows)
    lines += ["", f"Median share of analysis (all cuts + peak memory at every cut) in the total: "
              f"{median_share:.1%}."]
    (RESULTS / "capture.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
