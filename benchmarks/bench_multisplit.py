"""Multi-split over device chains: JMSNAS's setting, and planning time vs layers and devices.

1. JMSNAS section V-A / Table I (UE Raspberry Pi 4 -> SBS laptop RTX 3050 -> MBS Jetson AGX
   Xavier -> cloud V100; 25/50/200 Mbps) for MobileNetV2 and ResNet-50: the exact DP against
   cloud-only, UE-only and a HiveMind-style linear search, for latency and throughput.
2. Planning time as layers (ResNet-18 ... ResNet-1202) and devices (2..5) grow.
Writes benchmarks/results/multisplit.md and multisplit.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.progress import Progress

from edgesplit.graph import capture
from edgesplit.hardware import chain, get_device, get_link, get_topology
from edgesplit.hardware.profile import time_call
from edgesplit.plan.mesh import plan_period_ms
from edgesplit.plan.multisplit import ChainCosts, solve_chain_latency, solve_chain_throughput
from edgesplit.plan.topology_run import compare_topology_methods

RESULTS = Path(__file__).parent / "results"
DEVICES = ["raspberry-pi-4", "rtx3050-laptop", "jetson-agx-xavier", "jetson-tx2", "v100-server"]
LINKS = ["jmsnas-ue-sbs", "jmsnas-sbs-mbs", "wifi", "jmsnas-mbs-cloud"]


def _median_ms(fn, repeats: int = 3) -> float:
    return time_call(fn, warmup=0, repeats=repeats)["median"]


def jmsnas_rows(progress) -> list[dict]:
    rows = []
    for topology, models in (("jmsnas-chain", ("mobilenet_v2", "resnet50")),
                             ("jmsnas-mesh", ("mobilenet_v2", "resnet50", "googlenet"))):
        topo = get_topology(topology)
        for model in models:
            graph = capture(model)
            for objective in ("latency", "throughput"):
                _, plans = compare_topology_methods(graph, topo, source=model,
                                                    objective=objective)
                for method, plan in plans.items():
                    rows.append({"topology": topology, "model": model, "objective": objective,
                                 "method": method, "total_ms": plan.predicted.total_ms,
                                 "period_ms": plan_period_ms(plan),
                                 "layers_per_device": {d.name: len(d.layers)
                                                       for d in plan.devices}})
            progress()
    return rows


def scaling_rows(progress) -> list[dict]:
    rows = []
    for model in ("resnet18", "resnet101", "bert_large", "resnet1202"):
        graph = capture(model)
        for m in range(2, 6):
            devices = [get_device(d).model_copy(update={"name": f"d{i}"})
                       for i, d in enumerate(DEVICES[-m:] if m < 5 else DEVICES)]
            links = [get_link(name) for name in LINKS[-(m - 1):]]
            topo = chain(f"chain{m}", devices, links)
            costs = ChainCosts.build(graph, topo)
            rows.append({"model": model, "layers": len(graph), "devices": m,
                         "build_ms": _median_ms(lambda: ChainCosts.build(graph, topo), 1),
                         "latency_dp_ms": _median_ms(lambda: solve_chain_latency(costs)),
                         "throughput_ms": _median_ms(lambda: solve_chain_throughput(costs), 1)})
        progress()
    return rows


def main() -> None:
    with Progress() as bar:
        task = bar.add_task("multi-split", total=9)
        advance = lambda: bar.advance(task)  # noqa: E731
        jmsnas = jmsnas_rows(advance)
        scaling = scaling_rows(advance)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "multisplit.json").write_text(json.dumps(
        {"version": 1, "jmsnas": jmsnas, "scaling": scaling}, indent=2) + "\n")
    lines = ["# Multi-split over chains and meshes of devices", "",
             "## JMSNAS setting (Table I links; UE Raspberry Pi 4, SBS RTX 3050 laptop, MBS "
             "Jetson AGX Xavier (three of them in the mesh), cloud V100; roofline estimates)", "",
             "| topology | model | objective | method | latency ms | period ms "
             "| layers per device |",
             "|---|---|---|---|---:|---:|---|"]
    for r in jmsnas:
        placed = ", ".join(f"{d} {k}" for d, k in r["layers_per_device"].items() if k)
        lines.append(f"| {r['topology']} | {r['model']} | {r['objective']} | {r['method']} | "
                     f"{r['total_ms']:.2f} | {r['period_ms']:.2f} | {placed} |")
    lines += ["", "## Planning time (ms, one run on a shared 2-core machine)", "",
              "| model | layers | devices | cost tables | latency DP | throughput (bisection) |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in scaling:
        lines.append(f"| {r['model']} | {r['layers']} | {r['devices']} | {r['build_ms']:.0f} | "
                     f"{r['latency_dp_ms']:.1f} | {r['throughput_ms']:.0f} |")
    (RESULTS / "multisplit.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
