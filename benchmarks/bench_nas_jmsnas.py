"""JMSNAS on Fashion-MNIST over jmsnas-chain, where splitting pays (paper 000, Figs. 5 and 6).

The setting: Fashion-MNIST upsampled to 64x64 and the ``fashion-mbconv`` space. The raw 16 KB
input costs 5.2 ms over the 25 Mbps UE->SBS link, so cloud-only and SBS-only are slow; the
space's wide late layers are slow on the Raspberry-Pi-class UE; a UE->SBS split after the early
stride-2 layers (a 2.5 KB tensor) beats every single device for the space's largest,
MobileNetV2-style and smallest networks (numbers in the space's docstring and the markdown).

1. Three latency budgets between the fastest and the largest network of the space under the
   search's placement, three seeds each: stage 1 + 2 (``run_jmsnas``), accuracy on the full
   10,000-image test set, the deployed plan (the search's own device assignment or the
   ``multisplit`` re-plan, both priced by the same estimator, the faster kept), cloud-only
   for the same network (Fig. 6) and every single device alone.
2. The baseline, three seeds: the MobileNetV2-style network of the same space trained from
   scratch on the same data for as many epochs as JMSNAS's search and retraining together,
   split by the exact DP (``multisplit``) and by a HiveMind-style linear search (``linear``),
   and cloud-only.
The mesh part, the measured column (the plan over shaped loopback links, every part computed
at this machine's speed, not the preset devices') and the this-machine latency-table check of
earlier versions are not rerun (time budget: the whole run should take about 20 minutes on two
quiet cores). Writes benchmarks/results/
nas_jmsnas.md, nas_jmsnas.json, nas_jmsnas_fig5.png and nas_jmsnas_fig6.png. Run it on a quiet
machine: the load average is recorded before and after. ``EDGESPLIT_BENCH_QUICK=1`` runs a
smoke setting (tiny data and epochs, one seed) into a temporary folder.

    python benchmarks/bench_nas_jmsnas.py [--out DIR] [--render-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from edgesplit.data.training import LabelledData, load_fashion_mnist
from edgesplit.hardware import Topology, get_topology
from edgesplit.nas.jmsnas import ArchNet, get_space
from edgesplit.nas.jmsnas.chain_latency import ChainLatency
from edgesplit.nas.jmsnas.result import export_network
from edgesplit.nas.jmsnas.run import latency_tables, run_jmsnas
from edgesplit.nas.jmsnas.search import accuracy, recalibrate_bn, train_network
from edgesplit.plan import PlanningProblem, get_planner
from edgesplit.plan.chain_planners import chain_costs
from edgesplit.plan.multisplit import evaluate_boundaries
from edgesplit.report.plots import plot_accuracy_latency, plot_search_progress

RESULTS = Path(__file__).parent / "results"
QUICK = os.environ.get("EDGESPLIT_BENCH_QUICK") == "1"  # a smoke run of the script itself
SPACE = get_space("fashion-mbconv")
TOPOLOGY = "jmsnas-chain"
RESOLUTION = SPACE.input_shape[-1]
TRAIN_SAMPLES, TEST_SAMPLES = (300, 500) if QUICK else (5000, None)  # None: all 10,000
SEEDS = (0,) if QUICK else (0, 1, 2)
FRACTIONS = (0.25, 0.5, 0.75)  # budgets between the fastest and the largest network
RECIPE = ({"warmup_epochs": 1, "epochs": 1, "retrain_epochs": 1, "batch_size": 64} if QUICK
          else {"warmup_epochs": 1, "epochs": 2, "retrain_epochs": 2, "batch_size": 64})
TOTAL_EPOCHS = RECIPE["warmup_epochs"] + RECIPE["epochs"] + RECIPE["retrain_epochs"]
BASELINE_PLANNERS = {"multisplit": "exact multi-split", "linear": "linear split (HiveMind)"}


def plan_latencies(net: ArchNet, folder: Path, topology: Topology) -> dict[str, Any]:
    """The network's predicted latency under the planners and on each device alone (the
    input relayed to it, the result to the chain's last device), one estimator for all."""
    model = export_network(net, folder / "model.pt2")
    problem = PlanningProblem(model=str(model), setting=topology)
    costs, _ = chain_costs(problem)
    n, m = costs.n, len(costs.devices)
    alone = {d: evaluate_boundaries(costs, (0, *([0] * k), *([n] * (m - k)))).total_ms
             for k, d in enumerate(costs.devices)}
    plans = {p: get_planner(p).plan(problem) for p in (*BASELINE_PLANNERS, "sink_only")}
    return {"single_device_ms": alone,
            "plans": {p: {"predicted_ms": plan.predicted.total_ms,
                          "layers_per_device": {d.name: len(d.layers) for d in plan.devices}}
                      for p, plan in plans.items()}}


def _row(method: str, seed: int, budget: float | None, arch: Iterable[str], acc: float,
         table_ms: float | None, deployed: dict[str, Any], latencies: dict[str, Any],
         seconds: float) -> dict[str, Any]:
    alone = latencies["single_device_ms"]
    return {"method": method, "seed": seed, "budget_ms": budget, "arch": list(arch),
            "accuracy": acc, "table_ms": table_ms, "planned_ms": deployed["predicted_ms"],
            "layers_per_device": deployed["layers_per_device"],
            "cloud_only_ms": latencies["plans"]["sink_only"]["predicted_ms"],
            "single_device_ms": alone, "best_single_device_ms": min(alone.values()),
            "seconds": seconds}


def jmsnas_rows(data: LabelledData, topology: Topology, tables: dict, budgets: list[float],
                work: Path) -> tuple[list[dict], dict]:
    rows, runs = [], {}
    for seed in SEEDS:
        for budget in budgets:
            started = time.perf_counter()
            folder = work / f"jmsnas-{budget:.3f}-seed{seed}"
            run = run_jmsnas(SPACE, topology, data, budget_ms=budget, tables=tables,
                             out=folder, seed=seed, **RECIPE)
            seconds = time.perf_counter() - started
            doc = run.summary()
            runs[f"T_const {budget:.3f} ms, seed {seed}"] = doc
            kept = doc["plans"][doc["kept"]]
            deployed = {"predicted_ms": kept["predicted_ms"],
                        "layers_per_device": kept["devices"]}
            row = _row("JMSNAS", seed, budget, doc["arch"]["ops"], doc["accuracy"],
                       doc["arch_ms"], deployed,
                       plan_latencies(run.search.model_, folder, topology), seconds)
            row["kept"] = doc["kept"]
            row["own_ms"] = doc["plans"]["own"]["predicted_ms"]
            row["replan_ms"] = doc["plans"]["replan"]["predicted_ms"]
            rows.append(row)
    return rows, runs


def baseline_net(data: LabelledData, seed: int) -> tuple[ArchNet, float]:
    """The MobileNetV2-style network of the space, trained from scratch on the same data for
    as many epochs as JMSNAS's search and retraining together."""
    torch.manual_seed(seed)
    net = ArchNet(SPACE, SPACE.fixed_arch("mobilenetv2"))
    train_network(net, data.train, epochs=TOTAL_EPOCHS, lr=2e-3, weight_decay=8e-5,
                  batch_size=RECIPE["batch_size"], seed=seed)
    recalibrate_bn(net, data.train, RECIPE["batch_size"], batches=None)
    return net.eval(), accuracy(net, data.test)


def baseline_rows(data: LabelledData, topology: Topology, model: ChainLatency, work: Path
                  ) -> list[dict]:
    rows = []
    for seed in SEEDS:
        started = time.perf_counter()
        net, acc = baseline_net(data, seed)
        seconds = time.perf_counter() - started
        folder = work / f"mobilenetv2-seed{seed}"
        folder.mkdir()
        latencies = plan_latencies(net, folder, topology)
        rows += [_row(f"MobileNetV2-style, {label}", seed, None, net.arch.names, acc,
                      model.of_arch(net.arch), latencies["plans"][planner], latencies, seconds)
                 for planner, label in BASELINE_PLANNERS.items()]
    return rows


def predicted_setting(topology: Topology, work: Path) -> dict[str, Any]:
    """Untrained largest, MobileNetV2-style and smallest networks of the space: each device
    alone against the best plan (prediction only: why this setting)."""
    found = {}
    for kind in ("largest", "mobilenetv2", "smallest"):
        folder = work / f"setting-{kind}"
        folder.mkdir()
        found[kind] = plan_latencies(ArchNet(SPACE, SPACE.fixed_arch(kind)), folder, topology)
    return found


# ---- the report ------------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _spread(values: list[float], digits: int = 2) -> str:
    """mean, and min-max over the seeds."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.mean(values):.{digits}f} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")


def _groups(rows: list[dict]) -> dict[tuple[str, float | None], list[dict]]:
    groups: dict[tuple[str, float | None], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["budget_ms"]), []).append(r)
    return groups


def _setting_lines(setting: dict[str, Any]) -> list[str]:
    lines = ["| network | " + " | ".join(f"{d} alone ms" for d in
                                        next(iter(setting.values()))["single_device_ms"])
             + " | best plan ms | best plan layers per device |",
             "|---" * (len(next(iter(setting.values()))["single_device_ms"]) + 3) + "|"]
    for kind, s in setting.items():
        best = s["plans"]["multisplit"]
        lines.append(f"| {kind} | " + " | ".join(_ms(v) for v in s["single_device_ms"].values())
                     + f" | {_ms(best['predicted_ms'])} | {best['layers_per_device']} |")
    return lines


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# JMSNAS on Fashion-MNIST over jmsnas-chain", "",
        f"Load average before {doc['load_before']}, after {doc['load_after']} (2 cores); "
        f"torch {doc.get('torch', torch.__version__)}; {doc['train_samples']} training images "
        f"at {doc['resolution']}x{doc['resolution']}, accuracy on {doc['test_samples']} test "
        f"images; recipe {doc['recipe']}; seeds {doc['seeds']}. Latency tables of the preset "
        "devices are estimated from their device models (roofline).", "",
        "Why this setting: the raw 64x64 input is 16 KB, 5.2 ms over the 25 Mbps UE->SBS link, "
        "so sending it (SBS-only, cloud-only) is slow; the space's wide late layers (80-320 "
        "channels at 4x4, a 1280-channel head) are slow on the Raspberry-Pi-class UE; and the "
        "UE shrinks the image to a 2.5 KB tensor in its first stride-2 layers, so a plan that "
        "cuts there and runs the rest on the SBS beats every single device (untrained "
        "networks of the space, by the same estimator):", "",
        *_setting_lines(doc["setting"]), "",
        "Columns: `tables` is the network's latency by the search's own model (eq. 1 under the "
        "search's placement); `planned` the deployed plan's prediction (JMSNAS: the faster of "
        "its own device assignment and the `multisplit` re-plan, `kept` says which; priced "
        "alike, the exact re-plan is never slower, so `own` means the search's assignment was "
        "optimal); `best single device` the fastest device running the whole network alone; "
        "`cloud-only` the whole network on the cloud. `planned` can exceed `tables` (and "
        "T_const): a Plan also prices each transfer's encoding and decoding, which eq. 1 "
        "leaves out. Values: mean (min-max) over the seeds; "
        "every run is in `nas_jmsnas.json`. The MobileNetV2-style baseline trains from "
        f"scratch for {doc['total_epochs']} epochs, as many as JMSNAS's warm-up, search and "
        "retraining together, on the same images. Not rerun (time budget): the mesh part, the "
        "plan measured over shaped loopback links, the latency table's check on this "
        "machine.", "",
        "| method | T_const ms | test top-1 % | tables ms | planned ms | kept | "
        "best single device ms | cloud-only ms | vs cloud-only | layers per device (seed "
        f"{doc['seeds'][0]}) |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for (method, budget), group in _groups(doc["rows"]).items():
        planned = [r["planned_ms"] for r in group]
        cloud = [r["cloud_only_ms"] for r in group]
        saving = [100 * (1 - p / c) for p, c in zip(planned, cloud, strict=True)]
        kept = ", ".join(sorted({r["kept"] for r in group if "kept" in r})) or "-"
        tables = [r["table_ms"] for r in group if r["table_ms"] is not None]
        lines.append(
            f"| {method} | {_ms(budget)} | {_spread([r['accuracy'] for r in group])} | "
            f"{_spread(tables, 3) if tables else '-'} | {_spread(planned, 3)} | {kept} | "
            f"{_spread([r['best_single_device_ms'] for r in group], 3)} | "
            f"{_spread(cloud, 3)} | {_spread(saving, 1)} % below | "
            f"{group[0]['layers_per_device']} |")
    return "\n".join([*lines, "", "![Fig. 5](nas_jmsnas_fig5.png)", "",
                      "![Fig. 6](nas_jmsnas_fig6.png)", ""])


def write(doc: dict[str, Any], out: Path) -> None:
    """The markdown and Figs. 5 and 6 from a run's document (the saved JSON, with its
    ``runs``): what ``--render-only`` redraws without measuring."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "nas_jmsnas.md").write_text(_markdown(doc))
    plot_search_progress(doc["runs"], out / "nas_jmsnas_fig5.png",
                         title="JMSNAS stage 1 on Fashion-MNIST (Fig. 5)")
    points = [{"method": r["method"], "latency_ms": r["planned_ms"], "accuracy": r["accuracy"],
               "label": "" if r["budget_ms"] is None else f"{r['budget_ms']:.2f} ms"}
              for r in doc["rows"]]
    points += [{"method": "cloud-only", "latency_ms": r["cloud_only_ms"],
                "accuracy": r["accuracy"]} for r in doc["rows"] if r["method"] == "JMSNAS"]
    plot_accuracy_latency(points, out / "nas_jmsnas_fig6.png",
                          title="test accuracy vs planned latency (Fig. 6; labels: T_const)")
    print(_markdown(doc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite nas_jmsnas.md and the figures from nas_jmsnas.json "
                             "without measuring")
    args = parser.parse_args()
    if args.render_only:
        write(json.loads((args.out / "nas_jmsnas.json").read_text()), args.out)
        return
    out = Path(tempfile.mkdtemp()) if QUICK and args.out == RESULTS else args.out
    measure(out)


def measure(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.perf_counter()
    data = load_fashion_mnist(RESOLUTION, train_samples=TRAIN_SAMPLES, test_samples=TEST_SAMPLES)
    topology = get_topology(TOPOLOGY)
    tables = latency_tables(SPACE, topology)
    model = ChainLatency.best_placement(SPACE, topology, tables)
    fastest, _ = model.fastest()
    largest = model.of_arch(SPACE.fixed_arch("largest"))
    budgets = [fastest + f * (largest - fastest) for f in FRACTIONS]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setting = predicted_setting(topology, work)
        rows, runs = jmsnas_rows(data, topology, tables, budgets, work)
        rows += baseline_rows(data, topology, model, work)
    doc = {"version": 3, "space": SPACE.name, "topology": TOPOLOGY, "resolution": RESOLUTION,
           "train_samples": len(data.train), "test_samples": len(data.test),
           "recipe": RECIPE, "total_epochs": TOTAL_EPOCHS, "seeds": list(SEEDS),
           "placement": model.placement.counts(), "budgets_ms": budgets, "quick": QUICK,
           "torch": torch.__version__, "setting": setting, "rows": rows,
           "seconds": time.perf_counter() - started, "load_before": load_before,
           "load_after": [round(x, 2) for x in os.getloadavg()], "runs": runs}
    (out / "nas_jmsnas.json").write_text(json.dumps(doc, indent=2) + "\n")
    write(doc, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
