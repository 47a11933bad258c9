"""SplitNets on the head-mounted system model (paper 004, Tables 4-6, Fig. 12, appendix H).

1. Sampler (appendix D, Fig. 12): the single-view supernet of ``digits-split`` trained with the
   five-subnet sampler and, as long, with the sandwich baseline; held-out accuracy of the
   bounds (largest / smallest, zero / all splitting modules), the gap between "max zero hot"
   and "min all hot", and the mean of the same 16 random one-module networks.
2. Single view (Table 4 style) on ``hmd-star``'s first sensor with Mem_sen scaled to these
   networks: the searched front (512 candidates: population 32, 20 generations, timed) against
   the largest plain network (no splitting module) all on the aggregator and split at its best
   block boundary that fits the sensor (Neurosurgeon's baseline).
3. Multi-view (Table 6 style), ``shapes-split`` on the four sensors: the searched front against
   the best network run wholly on the aggregator (all four views sent raw) and fused late (its
   architecture with the splitting module in the last phase).
4. Appendix H: the single-view search again with 4x faster sensors, no retraining.

Latency is eq. 1 on the preset devices (T_sen + T_comm + T_agg), the same model every plan
uses; accuracy is held-out (the search scores on a validation part of the training data).
Writes benchmarks/results/nas_splitnets.{md,json} and nas_splitnets_{single,multi}.png.
Run it on a quiet machine: the load average is recorded before and after.

    python benchmarks/bench_nas_splitnets.py [--out DIR] [--render-only]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgesplit.nas.splitnets import SplitHardware, get_split_space, random_split_arch
from edgesplit.nas.splitnets.run import load_split_data, search_supernet, train_supernet
from edgesplit.nas.splitnets.train import (
    SupernetTrainer,
    calibration_batches,
    subnet_accuracy,
)
from edgesplit.report.plots import plot_search_front

RESULTS = Path(__file__).parent / "results"
QUICK = os.environ.get("EDGESPLIT_BENCH_QUICK") == "1"  # a smoke run of the script itself
EPOCHS = {"digits-split": 2 if QUICK else 20, "shapes-split": 1 if QUICK else 30}
MEMORY_KIB = 128  # Mem_sen scaled with the networks (2 MB on the paper's ImageNet models)
POPULATION, GENERATIONS = (8, 1) if QUICK else (32, 20)  # 32 + 20 x 24 = 512 candidates
RANDOM_NETS = 4 if QUICK else 16


def _train(space_name: str, sampler: str, folder: Path) -> tuple[Any, dict[str, Any]]:
    trainer = SupernetTrainer(epochs=EPOCHS[space_name], sampler=sampler)
    return train_supernet(get_split_space(space_name), _data(space_name), out=folder,
                          trainer=trainer)


def _data(space_name: str) -> str:
    return {"digits-split": "digits", "shapes-split": "multiview-shapes"}[space_name]


def sampler_rows(supernets: dict[str, tuple[Any, dict[str, Any]]]) -> list[dict[str, Any]]:
    space = get_split_space("digits-split")
    data = load_split_data("digits", space)
    rng = np.random.default_rng(0)
    randoms = [random_split_arch(space, rng) for _ in range(RANDOM_NETS)]
    rows = []
    for sampler, (net, doc) in supernets.items():
        calib = calibration_batches(data.fit)
        accs = [subnet_accuracy(net, arch, data.test, calib) for arch in randoms]
        bounds = doc["test_accuracy"]
        rows.append({"sampler": sampler, **bounds,
                     "gap": bounds["max-zero-hot"] - bounds["min-all-hot"],
                     "random_one_hot_mean": float(np.mean(accs)),
                     "random_one_hot_min": float(np.min(accs)),
                     "train_seconds": doc["train_seconds"]})
    return rows


def _row(method: str, accuracy: float, cost: Any, limit: int, label: str = "") -> dict[str, Any]:
    d = cost if isinstance(cost, dict) else cost.to_dict()
    return {"method": method, "label": label, "accuracy": accuracy,
            "sensor_ms": d["sensor_ms"], "comm_ms": d["comm_ms"],
            "aggregator_ms": d["aggregator_ms"], "latency_ms": d["total_ms"],
            "sensor_memory_bytes": d["sensor_memory_bytes"],
            "fits": d["sensor_memory_bytes"] <= limit}


def _searched(run: Any, limit: int) -> list[dict[str, Any]]:
    rows = []
    for r in run.results:
        s = r.summary
        rows.append({**_row("SplitNets", s["test_accuracy"], s["cost"], limit,
                            r.folder.name), "arch": s["describe"],
                     "plan_ms": s["plan"]["predicted_ms"],
                     "graph_memory_bytes": s["sensor_memory"]["total_bytes"]})
    return rows


def single_view(folder: Path, net: Any, work: Path) -> dict[str, Any]:
    space = get_split_space("digits-split")
    limit = MEMORY_KIB * 1024
    run = search_supernet(folder, "hmd-star", out=work / "single", memory_limit_bytes=limit,
                          population=POPULATION, generations=GENERATIONS, save_front=3,
                          supernet=net, doc=json.loads((folder / "supernet.json").read_text()
                                                       )["training"])
    hardware = run.search.hardware
    data = load_split_data("digits", space)
    largest = space.largest()
    acc = subnet_accuracy(net, largest, data.test, calibration_batches(data.fit))
    cuts = hardware.plain_costs(space, largest)
    fitting = [c for c in cuts if c.cost.sensor_memory_bytes <= limit]
    best_cut = min(fitting, key=lambda c: c.cost.total_ms)
    rows = [*_searched(run, limit),
            _row("all on aggregator", acc, cuts[0].cost, limit, "largest plain"),
            _row("Neurosurgeon", acc, best_cut.cost, limit,
                 f"largest plain, cut after {best_cut.cut}/{best_cut.layers} layers")]
    faster = search_supernet(folder, "hmd-star", memory_limit_bytes=limit, sensor_speedup=4,
                             population=POPULATION, generations=GENERATIONS, supernet=net,
                             doc=json.loads((folder / "supernet.json").read_text())["training"])
    appendix_h = [_adapt("default sensors", run.summary["best"]),
                  _adapt("4x faster sensors", faster.summary["best"])]
    return {"rows": rows, "search_seconds": run.summary["search_seconds"],
            "evaluated": run.summary["evaluated"], "rejected": run.summary["rejected_by_memory"],
            "history": [dict(c.metrics) for c in run.search.search_.history_],
            "front": [dict(c.metrics) for c in run.search.front_], "appendix_h": appendix_h,
            "hardware": hardware.describe()}


def _adapt(label: str, best: dict[str, Any]) -> dict[str, Any]:
    share = best["sensor_macs"] / (best["sensor_macs"] + best["aggregator_macs"])
    return {"setting": label, "arch": best["describe"], "accuracy": best["accuracy"],
            "latency_ms": best["latency_ms"], "sensor_mac_share": share,
            "split_phase": best["arch"]["splits"][0]}


def multi_view(folder: Path, net: Any, doc: dict[str, Any], work: Path) -> dict[str, Any]:
    space = get_split_space("shapes-split")
    limit = MEMORY_KIB * 1024
    run = search_supernet(folder, "hmd-star", out=work / "multi", memory_limit_bytes=limit,
                          population=POPULATION, generations=GENERATIONS, save_front=3,
                          supernet=net, doc=doc)
    hardware: SplitHardware = run.search.hardware
    data = load_split_data("multiview-shapes", space)
    best = run.search.best_.arch
    best_acc = run.results[0].summary["test_accuracy"]
    late = best.with_splits([len(space.phases) - 1])
    late_acc = subnet_accuracy(net, late, data.test, calibration_batches(data.fit))
    rows = [*_searched(run, limit),
            _row("all on aggregator", best_acc, hardware.all_on_aggregator(space, best), limit,
                 "best searched"),
            _row("late fusion", late_acc, hardware.cost(space, late), limit,
                 "best searched, fused in the last phase")]
    return {"rows": rows, "search_seconds": run.summary["search_seconds"],
            "evaluated": run.summary["evaluated"], "rejected": run.summary["rejected_by_memory"],
            "history": [dict(c.metrics) for c in run.search.search_.history_],
            "front": [dict(c.metrics) for c in run.search.front_],
            "hardware": hardware.describe(), "bounds": doc["test_accuracy"],
            "train_seconds": doc["train_seconds"]}


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| method | network | held-out top-1 % | T_sen ms | T_comm ms | T_agg ms | "
             "total ms | sensor KiB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mark = "" if r["fits"] else " (over)"
        lines.append(f"| {r['method']} | {r.get('arch') or r['label']} | {r['accuracy']:.1f} | "
                     f"{r['sensor_ms']:.4f} | {r['comm_ms']:.4f} | {r['aggregator_ms']:.4f} | "
                     f"{r['latency_ms']:.4f} | {r['sensor_memory_bytes'] / 1024:.0f}{mark} |")
    return lines


def _summary(rows: list[dict[str, Any]]) -> str:
    """The best searched network against the all-on-aggregator baseline, as the paper
    compares them (Table 4: 76.98 % at 1.49 ms against EfficientNet-B0's 77.13 % at 4.32 ms,
    2.9x)."""
    best = next(r for r in rows if r["method"] == "SplitNets" and r["label"] == "best")
    fastest = min((r for r in rows if r["method"] == "SplitNets"),
                  key=lambda r: r["latency_ms"])
    base = next(r for r in rows if r["method"] == "all on aggregator")
    return (f"Best searched: {best['accuracy']:.1f} % at {best['latency_ms']:.4f} ms, "
            f"{base['latency_ms'] / best['latency_ms']:.1f}x faster than all on the aggregator "
            f"({base['accuracy']:.1f} %, {best['accuracy'] - base['accuracy']:+.1f} points); "
            f"fastest saved: {fastest['accuracy']:.1f} % at {fastest['latency_ms']:.4f} ms "
            f"({base['latency_ms'] / fastest['latency_ms']:.1f}x).")


def _markdown(doc: dict[str, Any]) -> str:
    lines = ["# SplitNets: split-aware NAS on the head-mounted system (paper 004)", "",
             f"Load average before {doc['load_before']}, after {doc['load_after']} (2 cores); "
             f"total {doc['seconds'] / 60:.1f} min. Mem_sen = {doc['memory_kib']} KiB (scaled with "
             "these networks). Latency: eq. 1 on the preset devices; accuracy: held-out.", "",
             "## Sampler (appendix D, Fig. 12): digits-split, "
             f"{doc['epochs']['digits-split']} epochs each", "",
             "| sampler | max zero hot | max all hot | min zero hot | min all hot | gap max0 - "
             "minAll | random one-hot mean (min) | train s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["sampler"]:
        lines.append(f"| {r['sampler']} | {r['max-zero-hot']:.1f} | {r['max-all-hot']:.1f} | "
                     f"{r['min-zero-hot']:.1f} | {r['min-all-hot']:.1f} | {r['gap']:.1f} | "
                     f"{r['random_one_hot_mean']:.1f} ({r['random_one_hot_min']:.1f}) | "
                     f"{r['train_seconds']:.0f} |")
    for key, title in (("single", "Single view (Table 4 style): digits-split on hmd-star"),
                       ("multi", "Multi-view (Table 6 style): shapes-split, 4 views on "
                                 "hmd-star")):
        part = doc[key]
        lines += ["", f"## {title}", "", f"{part['hardware']}. Search: {part['evaluated']} "
                  f"candidates evaluated in {part['search_seconds']:.1f} s "
                  f"({part['rejected']} drawn over the memory limit and skipped).", ""]
        lines += _table(part["rows"])
        lines += ["", _summary(part["rows"])]
    multi = doc["multi"]
    lines += ["", f"Multi-view supernet ({doc['epochs']['shapes-split']} epochs, sandwich, "
              f"{multi['train_seconds']:.0f} s), held-out: " + ", ".join(
                  f"{k} {v:.1f} %" for k, v in multi["bounds"].items()) + "."]
    lines += ["", "## Appendix H: the same supernet searched for 4x faster sensors", "",
              "| sensors | best network | validation top-1 % | total ms | sensor share of "
              "MACs | split phase |", "|---|---|---:|---:|---:|---:|"]
    for r in doc["single"]["appendix_h"]:
        lines.append(f"| {r['setting']} | {r['arch']} | {r['accuracy']:.1f} | "
                     f"{r['latency_ms']:.4f} | {100 * r['sensor_mac_share']:.0f} % | "
                     f"{r['split_phase']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--render-only", "--replot", action="store_true",
                        help=f"rewrite {NAME}.md and the figures from {NAME}.json without "
                             "measuring")
    args = parser.parse_args()
    if args.render_only:
        write_report(json.loads((args.out / f"{NAME}.json").read_text()), args.out)
        return
    measure(args.out)


def measure(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        supernets = {s: _train("digits-split", s, work / f"digits-{s}")
                     for s in ("five", "sandwich")}
        sampler = sampler_rows(supernets)
        single = single_view(work / "digits-five", supernets["five"][0], work)
        multi_net, multi_doc = _train("shapes-split", "sandwich", work / "shapes")
        multi = multi_view(work / "shapes", multi_net, multi_doc, work)
    doc = {"sampler": sampler, "single": single, "multi": multi, "epochs": EPOCHS,
           "memory_kib": MEMORY_KIB, "population": POPULATION, "generations": GENERATIONS,
           "seconds": time.perf_counter() - start, "load_before": load_before,
           "load_after": [round(x, 2) for x in os.getloadavg()], "quick": QUICK}
    # a quick run only checks the script: its numbers stay out of the results
    results = Path(tempfile.mkdtemp()) if QUICK else out
    (results / f"{NAME}.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_report(doc, results)


NAME = "nas_splitnets"


def write_report(doc: dict[str, Any], results: Path) -> None:
    """The markdown and the two figures from a run's document (``--render-only`` redraws
    them from the saved JSON without running again). Rows over the sensor memory (``fits``
    false, "(over)" in the tables) are drawn hollow."""
    (results / f"{NAME}.md").write_text(_markdown(doc))
    for key in ("single", "multi"):
        part = doc[key]
        points = [{**r, "method": f"{r['method']} (held-out)"} if r["method"] == "SplitNets"
                  else {**r, "method": f"{r['method']} (held-out)", "label": ""}
                  for r in part["rows"] if r.get("label") != "best"]
        plot_search_front(part["history"], part["front"], results / f"{NAME}_{key}.png",
                          baselines=points, title=f"SplitNets {key}-view on hmd-star "
                          f"(Mem_sen {doc['memory_kib']} KiB)",
                          memory_limit_bytes=doc["memory_kib"] * 1024,
                          rejected=part["rejected"])
    print((results / f"{NAME}.md").read_text())


if __name__ == "__main__":
    main()
