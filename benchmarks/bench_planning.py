"""Planning time for every built-in model and the 1,805-layer ResNet-1202.

Times the cost table (estimators over every layer), each planner's decision, and the min-cut
alone. Writes benchmarks/results/planning.md and planning.json; compare the ratio column (time
per layer relative to ResNet-18), not absolute times.

    python benchmarks/bench_planning.py [--models a,b,c]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.progress import Progress

from edgesplit.hardware import get_device, get_link
from edgesplit.hardware.profile import time_call
from edgesplit.models import list_models
from edgesplit.plan import CostTable, EdgeCloudSetting, PlanningProblem
from edgesplit.plan.mincut import min_cut_edge_set
from edgesplit.plan.planners import get_planner

RESULTS = Path(__file__).parent / "results"
METHODS = ("neurosurgeon", "dads", "qdmp")


def _ms(fn, repeats: int = 5) -> float:
    """Median of a few calls: single calls catch garbage-collector pauses of the big graphs."""
    return time_call(fn, warmup=0, repeats=repeats)["median"]


def bench(name: str, setting: EdgeCloudSetting) -> dict:
    problem = PlanningProblem(name, setting)
    row = {"model": name, "layers": len(problem.graph),
           "raw_layers": len(problem.graph_of("raw"))}
    row["cost_table_ms"] = _ms(lambda: CostTable.build(problem.graph, setting))
    problem.costs("raw")
    for method in METHODS:
        planner = get_planner(method)
        row[f"{method}_ms"] = _ms(lambda: planner.choose(problem.costs(planner.graph_kind)))
    row["min_cut_only_ms"] = _ms(lambda: min_cut_edge_set(problem.costs("optimized")))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None)
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list_models()
    setting = EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                               link=get_link("4g"), input_bits=8)  # camera frames
    rows = []
    with Progress() as progress:
        task = progress.add_task("planning", total=len(names))
        for name in names:
            progress.update(task, description=f"planning {name}")
            rows.append(bench(name, setting))
            progress.advance(task)
    base = next((r for r in rows if r["model"] == "resnet18"), rows[0])
    per_layer = base["qdmp_ms"] / base["layers"]
    for r in rows:
        r["qdmp_per_layer_vs_" + base["model"]] = (r["qdmp_ms"] / r["layers"]) / per_layer
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "planning.json").write_text(json.dumps({"version": 1, "results": rows}, indent=2)
                                           + "\n")
    lines = ["# Planning time (jetson-nano -> 4g -> v100-server)", "",
             "Milliseconds (median of 5 calls) from one run on a shared 2-core machine; the "
             "model capture is not included. `qdmp` includes its edge-only comparison and "
             "constraint checks.", "",
             "| model | layers (opt/raw) | cost table | neurosurgeon | dads | qdmp | min-cut only "
             f"| qdmp ms/layer vs {base['model']} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['layers']}/{r['raw_layers']} | "
                     f"{r['cost_table_ms']:.1f} | {r['neurosurgeon_ms']:.1f} | {r['dads_ms']:.1f}"
                     f" | {r['qdmp_ms']:.1f} | {r['min_cut_only_ms']:.1f} | "
                     f"{r['qdmp_per_layer_vs_' + base['model']]:.2f} |")
    (RESULTS / "planning.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
