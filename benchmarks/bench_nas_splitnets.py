"""SplitNets on the head-mounted system model (paper 004, Tables 4-6, Fig. 12, appendix H).

1. Sampler (appendix D, Fig. 12): the single-view supernet of ``digits-split`` trained with the
   five-subnet sampler and, as long, with the sandwich baseline; held-out accuracy of the
   bounds (largest / smallest, zero / all splitting modules), the gap between "max zero hot"
   and "min all hot", and the mean of the same 16 random one-module networks.
2. Single view (Table 4 style) on ``hmd-star``'s first sensor with Mem_sen scaled to these
   networks: the searched front (512 candidates: population 32, 20 generations, timed) against
   fair baselines: plain networks of the same supernet (no splitting module, not searched)
   across the size range, smallest to largest, each all on the aggregator and split at its
   best block boundary that fits the sensor (Neurosurgeon's baseline: every block-boundary
   cut priced, the fastest kept). Each searched network is compared at equal accuracy, as
   Table 4 does: against the fastest baseline at >= its held-out accuracy. ``--seeds N``
   repeats this part with N supernet and search seeds.
3. Multi-view (Table 6 style), ``shapes-split`` on the four sensors: the searched front against
   networks across the size range run wholly on the aggregator (all four views sent raw) and
   fused late (the splitting module in the last phase), compared at equal accuracy too.
4. Appendix H: the single-view search again with 4x faster sensors, no retraining.

Latency is eq. 1 on the preset devices (T_sen + T_comm + T_agg), the same model every plan
uses (float32; ``--paper-convention``: 8-bit, T = OP / Comp, as the paper's Tables 4/6);
accuracy is held-out (the search scores on a validation part of the training data).
Writes benchmarks/results/nas_splitnets.{md,json} and nas_splitnets_{single,multi}.png.
Run it on a quiet machine: the load average is recorded before and after.

    python benchmarks/bench_nas_splitnets.py [--out DIR] [--render-only] [--seeds N]
        [--paper-convention] [--baselines K]

``EDGESPLIT_BENCH_QUICK=1`` runs a smoke setting and writes into a temporary folder.
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
import torch

from edgesplit.nas.splitnets import (
    FLOAT32,
    PAPER,
    SplitHardware,
    SplitPricing,
    SplitSpace,
    SplitSupernet,
    get_split_space,
    random_split_arch,
)
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
FASHION_EPOCHS = 1 if QUICK else 6  # 3,000 images a pass: 6 passes fit ~35 min with 3 seeds
MEMORY_KIB = 128  # Mem_sen scaled with the networks (2 MB on the paper's ImageNet models)
POPULATION, GENERATIONS = (8, 1) if QUICK else (32, 20)  # 32 + 20 x 24 = 512 candidates
RANDOM_NETS = 4 if QUICK else 16
BASELINES = 3 if QUICK else 6  # plain networks across the size range, ends included


def _train(space_name: str, sampler: str, folder: Path, seed: int = 0
           ) -> tuple[Any, dict[str, Any]]:
    trainer = SupernetTrainer(epochs=EPOCHS[space_name], sampler=sampler, seed=seed)
    return train_supernet(get_split_space(space_name), _data(space_name), out=folder,
                          trainer=trainer)


# the data each space is trained and searched on; --single-data fashion-mnist points the
# single-view space at a Fashion-MNIST slice (digits' validation part saturates: it cannot rank)
DATA = {"digits-split": "digits", "shapes-split": "multiview-shapes"}


def _data(space_name: str) -> str:
    return DATA[space_name]


def fashion_slice(folder: Path, samples: int) -> Path:
    """The first ``samples`` Fashion-MNIST training images as an .npz the SplitNets loader
    reads (28x28 gray in [-1, 1]; the networks resize to their resolution). The loader holds
    out a quarter for the final accuracies and 15 % of the rest for the search's
    validation: 12,000 samples give 1,350 validation images, digits 204."""
    from edgesplit.data.images import fashion_mnist

    source = fashion_mnist("train")
    images = source.images[:samples].astype(np.float32) / 127.5 - 1.0
    path = folder / f"fashion-mnist-{samples}.npz"
    np.savez(path, inputs=images, labels=source.labels[:samples])
    return path


def sampler_rows(supernets: dict[str, tuple[Any, dict[str, Any]]]) -> list[dict[str, Any]]:
    space = get_split_space("digits-split")
    data = load_split_data(_data("digits-split"), space)
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


def size_range(space: SplitSpace, count: int, splits: tuple[int, ...] = (),
               seed: int = 0) -> list[Any]:
    """``count`` architectures of ``space`` with ``splits`` from the smallest to the largest:
    the two ends and random ones between, spread evenly by MACs."""
    ends = [space.smallest(splits), space.largest(splits)]
    if count <= 2:
        return ends[:count]
    rng = np.random.default_rng(seed)
    pool = sorted({random_split_arch(space, rng).with_splits(splits) for _ in range(16 * count)}
                  - set(ends), key=lambda a: _macs(space, a))
    picks = [pool[round(i * (len(pool) - 1) / (count - 3))] for i in range(count - 2)] \
        if count > 3 else [pool[len(pool) // 2]]
    return [ends[0], *picks, ends[1]]


def _macs(space: SplitSpace, arch: Any) -> int:
    from edgesplit.nas.splitnets.cost import plain_layers, split_layers

    if arch.splits:
        sensor, agg, _, _ = split_layers(space, arch)
        return sum(l.macs for l in sensor.layers) * space.views + \
            sum(l.macs for l in agg.layers)
    part, _, _ = plain_layers(space, arch)
    return sum(l.macs for l in part.layers)


def train_alone(space: SplitSpace, arch: Any, data: Any, epochs: int, seed: int) -> Any:
    """``arch`` trained by itself from scratch on the supernet's training part, with its
    recipe and epochs (the same budget, no weight sharing): an independently trained
    baseline. Returns a supernet of which only ``arch``'s weights were trained."""
    torch.manual_seed(seed)
    net = SplitSupernet(space)
    SupernetTrainer(epochs=epochs, seed=seed, alone=arch).fit(net, data.fit)
    return net


def _baseline(net: Any, arch: Any, data: Any, epochs: int, seed: int
              ) -> tuple[float, dict[str, Any]]:
    """The held-out accuracy of ``arch`` trained alone, and what to record beside it: its
    accuracy as a sub-network of the shared supernet, and its training time."""
    calib = calibration_batches(data.fit)
    start = time.perf_counter()
    alone = train_alone(net.space, arch, data, epochs, seed)
    seconds = time.perf_counter() - start
    acc = subnet_accuracy(alone, arch, data.test, calib)
    return acc, {"arch": arch.describe(), "train_seconds": seconds,
                 "shared_accuracy": subnet_accuracy(net, arch, data.test, calib)}


def plain_baselines(net: Any, hardware: SplitHardware, data: Any, limit: int, count: int,
                    epochs: int, seed: int = 0) -> list[dict[str, Any]]:
    """Plain networks across the size range of the space, each trained alone (same data and
    epochs as the supernet), all on the aggregator and at its best cut that fits the sensor
    (Neurosurgeon: every block-boundary cut priced)."""
    space = net.space
    rows = []
    for i, arch in enumerate(size_range(space, count)):  # the same networks every seed
        acc, extra = _baseline(net, arch, data, epochs, seed)
        cuts = hardware.plain_costs(space, arch)
        fitting = [c for c in cuts if c.cost.sensor_memory_bytes <= limit]
        best = min(fitting, key=lambda c: c.cost.total_ms)
        name = f"plain {i} ({_macs(space, arch) / 1e6:.2f} MMAC)"
        rows.append({**_row("all on aggregator", acc, cuts[0].cost, limit, name), **extra})
        rows.append({**_row("Neurosurgeon", acc, best.cost, limit,
                            f"{name}, cut after {best.cut}/{best.layers} layers"), **extra})
    return rows


def multi_baselines(net: Any, hardware: SplitHardware, data: Any, limit: int, count: int,
                    epochs: int) -> list[dict[str, Any]]:
    """Multi-view networks across the size range, fused in the last phase and each trained
    alone (same data and epochs as the supernet): run wholly on the aggregator (every view
    sent raw) and fused late (the sensors run all but the last phase's end)."""
    space = net.space
    rows = []
    for i, arch in enumerate(size_range(space, count, (len(space.phases) - 1,))):
        acc, extra = _baseline(net, arch, data, epochs, 0)
        name = f"size {i} ({_macs(space, arch) / 1e6:.2f} MMAC)"
        rows.append({**_row("all on aggregator", acc, hardware.all_on_aggregator(space, arch),
                            limit, name), **extra})
        rows.append({**_row("late fusion", acc, hardware.cost(space, arch), limit, name),
                     **extra})
    return rows


def equal_accuracy(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table 4's comparison: for each searched network, the fastest baseline that fits the
    sensor at >= its held-out accuracy, and how many times slower that baseline is (below 1:
    the baseline is faster)."""
    bases = [r for r in rows if r["method"] != "SplitNets" and r["fits"]]
    out = []
    for r in rows:
        if r["method"] != "SplitNets":
            continue
        ok = [b for b in bases if b["accuracy"] >= r["accuracy"]]
        base = min(ok, key=lambda b: b["latency_ms"]) if ok else None
        out.append({"searched": r["label"], "accuracy": r["accuracy"],
                    "latency_ms": r["latency_ms"],
                    "baseline": None if base is None else f"{base['method']}: {base['label']}",
                    "baseline_accuracy": None if base is None else base["accuracy"],
                    "baseline_ms": None if base is None else base["latency_ms"],
                    "speedup": None if base is None else base["latency_ms"] / r["latency_ms"]})
    return out


def single_view(folder: Path, net: Any, work: Path, pricing: SplitPricing = FLOAT32,
                seed: int = 0, appendix: bool = True) -> dict[str, Any]:
    space = get_split_space("digits-split")
    limit = MEMORY_KIB * 1024
    doc = json.loads((folder / "supernet.json").read_text())["training"]
    run = search_supernet(folder, "hmd-star", out=work / f"single-{seed}",
                          memory_limit_bytes=limit, population=POPULATION,
                          generations=GENERATIONS, save_front=3, supernet=net, doc=doc,
                          pricing=pricing, seed=seed)
    hardware = run.search.hardware
    data = load_split_data(_data("digits-split"), space, seed)
    rows = [*_searched(run, limit),
            *plain_baselines(net, hardware, data, limit, BASELINES, EPOCHS["digits-split"],
                             seed)]
    part = {"seed": seed, "rows": rows, "equal_accuracy": equal_accuracy(rows),
            "search_seconds": run.summary["search_seconds"],
            "evaluated": run.summary["evaluated"], "rejected": run.summary["rejected_by_memory"],
            "history": [dict(c.metrics) for c in run.search.search_.history_],
            "front": [dict(c.metrics) for c in run.search.front_],
            "hardware": hardware.describe()}
    if appendix:
        faster = search_supernet(folder, "hmd-star", memory_limit_bytes=limit,
                                 sensor_speedup=4, population=POPULATION,
                                 generations=GENERATIONS, supernet=net, doc=doc,
                                 pricing=pricing, seed=seed)
        part["appendix_h"] = [_adapt("default sensors", run.summary["best"]),
                              _adapt("4x faster sensors", faster.summary["best"])]
    return part


def sandwich_searched(folder: Path, net: Any, work: Path, pricing: SplitPricing
                      ) -> list[dict[str, Any]]:
    """The sandwich supernet searched as the five-subnet one is (seed 0): the deployable
    networks (one splitting module) each sampler's weights give, held-out."""
    doc = json.loads((folder / "supernet.json").read_text())["training"]
    limit = MEMORY_KIB * 1024
    run = search_supernet(folder, "hmd-star", out=work / "single-sandwich",
                          memory_limit_bytes=limit, population=POPULATION,
                          generations=GENERATIONS, save_front=3, supernet=net, doc=doc,
                          pricing=pricing, seed=0)
    return _searched(run, limit)


def _adapt(label: str, best: dict[str, Any]) -> dict[str, Any]:
    share = best["sensor_macs"] / (best["sensor_macs"] + best["aggregator_macs"])
    return {"setting": label, "arch": best["describe"], "accuracy": best["accuracy"],
            "latency_ms": best["latency_ms"], "sensor_mac_share": share,
            "split_phase": best["arch"]["splits"][0]}


def multi_view(folder: Path, net: Any, doc: dict[str, Any], work: Path,
               pricing: SplitPricing = FLOAT32) -> dict[str, Any]:
    space = get_split_space("shapes-split")
    limit = MEMORY_KIB * 1024
    run = search_supernet(folder, "hmd-star", out=work / "multi", memory_limit_bytes=limit,
                          population=POPULATION, generations=GENERATIONS, save_front=3,
                          supernet=net, doc=doc, pricing=pricing)
    hardware: SplitHardware = run.search.hardware
    data = load_split_data("multiview-shapes", space)
    rows = [*_searched(run, limit),
            *multi_baselines(net, hardware, data, limit, BASELINES, EPOCHS["shapes-split"])]
    return {"rows": rows, "equal_accuracy": equal_accuracy(rows),
            "search_seconds": run.summary["search_seconds"],
            "evaluated": run.summary["evaluated"], "rejected": run.summary["rejected_by_memory"],
            "history": [dict(c.metrics) for c in run.search.search_.history_],
            "front": [dict(c.metrics) for c in run.search.front_],
            "hardware": hardware.describe(), "bounds": doc["test_accuracy"],
            "train_seconds": doc["train_seconds"]}


def _cell(text: str) -> str:
    """``text`` safe inside a markdown table cell (architectures mark a split as ``|d8|``)."""
    return text.replace("|", "\\|")


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| method | network | held-out top-1 % | T_sen ms | T_comm ms | T_agg ms | "
             "total ms | sensor KiB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mark = "" if r["fits"] else " (over)"
        lines.append(f"| {r['method']} | {_cell(r.get('arch') or r['label'])} | "
                     f"{r['accuracy']:.1f} | "
                     f"{r['sensor_ms']:.4f} | {r['comm_ms']:.4f} | {r['aggregator_ms']:.4f} | "
                     f"{r['latency_ms']:.4f} | {r['sensor_memory_bytes'] / 1024:.0f}{mark} |")
    return lines


def _equal_table(pairs: list[dict[str, Any]]) -> list[str]:
    lines = ["| searched | held-out % | ms | fastest baseline at >= its accuracy | its % | "
             "its ms | baseline ms / searched ms |", "|---|---:|---:|---|---:|---:|---:|"]
    for p in pairs:
        if p["baseline"] is None:
            lines.append(f"| {p['searched']} | {p['accuracy']:.1f} | {p['latency_ms']:.4f} | "
                         "none as accurate | | | |")
            continue
        lines.append(f"| {p['searched']} | {p['accuracy']:.1f} | {p['latency_ms']:.4f} | "
                     f"{p['baseline']} | {p['baseline_accuracy']:.1f} | "
                     f"{p['baseline_ms']:.4f} | {p['speedup']:.2f}x |")
    return lines


def _summary(pairs: list[dict[str, Any]]) -> str:
    """Whether the searched networks beat the fair baselines at equal accuracy (Table 4:
    76.98 % at 1.49 ms against EfficientNet-B0's 77.13 % at 4.32 ms all on the aggregator)."""
    rated = [p for p in pairs if p["speedup"] is not None]
    wins = [p for p in rated if p["speedup"] > 1]
    if not rated:
        return ("No baseline reaches the accuracy of any searched network: the searched "
                "networks are the more accurate ones.")
    best = max(rated, key=lambda p: p["speedup"])
    return (f"At equal accuracy, {len(wins)} of {len(pairs)} searched networks are faster than "
            f"every baseline at least as accurate ({len(pairs) - len(rated)} have no baseline "
            f"as accurate); the largest ratio is {best['speedup']:.2f}x ({best['searched']}: "
            f"{best['accuracy']:.1f} % at {best['latency_ms']:.4f} ms against "
            f"{best['baseline']} at {best['baseline_ms']:.4f} ms).")


def _legacy_summary(rows: list[dict[str, Any]]) -> str:
    """A run saved before the fair baselines (no ``pricing`` in its JSON): its one line
    against the largest plain network all on the aggregator, as it was written."""
    best = next(r for r in rows if r["method"] == "SplitNets" and r["label"] == "best")
    fastest = min((r for r in rows if r["method"] == "SplitNets"),
                  key=lambda r: r["latency_ms"])
    base = next(r for r in rows if r["method"] == "all on aggregator")
    return (f"Best searched: {best['accuracy']:.1f} % at {best['latency_ms']:.4f} ms, "
            f"{base['latency_ms'] / best['latency_ms']:.1f}x faster than all on the aggregator "
            f"({base['accuracy']:.1f} %, {best['accuracy'] - base['accuracy']:+.1f} points); "
            f"fastest saved: {fastest['accuracy']:.1f} % at {fastest['latency_ms']:.4f} ms "
            f"({base['latency_ms'] / fastest['latency_ms']:.1f}x).")


def _seed_table(parts: list[dict[str, Any]]) -> list[str]:
    """Per seed: the best searched network against the most accurate and the fastest plain
    baseline (all on the aggregator), then mean and standard deviation over the seeds."""
    lines = ["| seed | best searched % | its ms | most accurate baseline % | its ms | "
             "fastest baseline % | its ms |", "|---:|---:|---:|---:|---:|---:|---:|"]
    cols: list[list[float]] = [[] for _ in range(6)]
    for part in parts:
        best = next(r for r in part["rows"] if r["method"] == "SplitNets"
                    and r["label"] == "best")
        plain = [r for r in part["rows"] if r["method"] == "all on aggregator"]
        top = max(plain, key=lambda r: r["accuracy"])
        fast = min(plain, key=lambda r: r["latency_ms"])
        values = [best["accuracy"], best["latency_ms"], top["accuracy"], top["latency_ms"],
                  fast["accuracy"], fast["latency_ms"]]
        for col, v in zip(cols, values, strict=True):
            col.append(v)
        lines.append(f"| {part['seed']} | " + " | ".join(
            f"{v:.1f}" if k % 2 == 0 else f"{v:.4f}" for k, v in enumerate(values)) + " |")
    lines.append("| mean +- sd | " + " | ".join(
        f"{np.mean(c):.1f} +- {np.std(c):.1f}" if k % 2 == 0 else
        f"{np.mean(c):.4f} +- {np.std(c):.4f}" for k, c in enumerate(cols)) + " |")
    return lines


def _seed_summary(parts: list[dict[str, Any]]) -> str:
    """The best searched network's equal-accuracy ratio over the seeds: median and range."""
    ratios = [p["speedup"] for part in parts for p in part["equal_accuracy"]
              if p["searched"] == "best" and p["speedup"] is not None]
    if not ratios:
        return f"Over {len(parts)} seed(s), no baseline was as accurate as the best searched."
    return (f"Over {len(parts)} seed(s), the best searched network's baseline ms / searched ms "
            f"at equal accuracy: median {float(np.median(ratios)):.2f}x, range "
            f"{min(ratios):.2f}-{max(ratios):.2f}x ({len(ratios)} seed(s) with an as-accurate "
            "baseline).")


def _markdown(doc: dict[str, Any]) -> str:
    legacy = "pricing" not in doc  # saved before the fair baselines: rendered as written
    setting = ("Latency: eq. 1 on the preset devices; accuracy: held-out." if legacy else
               f"Latency: eq. 1 on the preset devices, {_pricing_words(doc['pricing'])}; "
               f"accuracy: held-out. {_baseline_words(doc)}")
    lines = ["# SplitNets: split-aware NAS on the head-mounted system (paper 004)", "",
             f"Load average before {doc['load_before']}, after {doc['load_after']} (2 cores); "
             f"total {doc['seconds'] / 60:.1f} min. Mem_sen = {doc['memory_kib']} KiB (scaled with "
             f"these networks). {setting}", "",
             *([] if legacy else [_verdict(doc), ""]),
             "## Sampler (appendix D, Fig. 12): digits-split"
             f"{_on(doc)}, {doc['epochs']['digits-split']} epochs each", "",
             "| sampler | max zero hot | max all hot | min zero hot | min all hot | gap max0 - "
             "minAll | random one-hot mean (min) | train s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["sampler"]:
        lines.append(f"| {r['sampler']} | {r['max-zero-hot']:.1f} | {r['max-all-hot']:.1f} | "
                     f"{r['min-zero-hot']:.1f} | {r['min-all-hot']:.1f} | {r['gap']:.1f} | "
                     f"{r['random_one_hot_mean']:.1f} ({r['random_one_hot_min']:.1f}) | "
                     f"{r['train_seconds']:.0f} |")
    if doc.get("sampler_searched"):
        lines += ["", *_sampler_searched(doc["sampler_searched"])]
    for key, title in (("single", f"Single view (Table 4 style): digits-split{_on(doc)} on "
                                  "hmd-star"),
                       ("multi", "Multi-view (Table 6 style): shapes-split, 4 views on "
                                 "hmd-star")):
        part = doc[key]
        lines += ["", f"## {title}", "", f"{part['hardware']}. Search: {part['evaluated']} "
                  f"candidates evaluated in {part['search_seconds']:.1f} s "
                  f"({part['rejected']} drawn over the memory limit and skipped). "
                  f"{_ties(part['history'])}", ""]
        lines += _table(part["rows"])
        if legacy:
            lines += ["", _legacy_summary(part["rows"])]
            continue
        pairs = part["equal_accuracy"]
        lines += ["", "At equal accuracy (Table 4 style):", "", *_equal_table(pairs), "",
                  _summary(pairs)]
        if key == "single" and doc.get("single_seeds"):
            parts = [part, *doc["single_seeds"]]
            lines += ["", *_seed_table(parts), "", _seed_summary(parts)]
    multi = doc["multi"]
    lines += ["", f"Multi-view supernet ({doc['epochs']['shapes-split']} epochs, sandwich, "
              f"{multi['train_seconds']:.0f} s), held-out: " + ", ".join(
                  f"{k} {v:.1f} %" for k, v in multi["bounds"].items()) + "."]
    lines += ["", "## Appendix H: the same supernet searched for 4x faster sensors", "",
              "| sensors | best network | validation top-1 % | total ms | sensor share of "
              "MACs | split phase |", "|---|---|---:|---:|---:|---:|"]
    for r in doc["single"]["appendix_h"]:
        lines.append(f"| {r['setting']} | {_cell(r['arch'])} | {r['accuracy']:.1f} | "
                     f"{r['latency_ms']:.4f} | {100 * r['sensor_mac_share']:.0f} % | "
                     f"{r['split_phase']} |")
    return "\n".join(lines) + "\n"


def _verdict(doc: dict[str, Any]) -> str:
    """One sentence: does any searched network beat the fair baselines at equal accuracy (the
    claim of the paper's Tables 4 and 6), over every seed and both parts?"""
    parts = [doc["single"], *doc.get("single_seeds", []), doc["multi"]]
    pairs = [p for part in parts for p in part["equal_accuracy"]]
    wins = [p for p in pairs if p["speedup"] is not None and p["speedup"] > 1]
    if not wins:
        return ("**The paper's claim (Tables 4 and 6: searched networks faster at equal "
                "accuracy) is not reproduced here:** none of the "
                f"{len(pairs)} searched networks saved (single view over "
                f"{len(parts) - 1} seed(s), and multi-view) is faster than a baseline at least "
                "as accurate.")
    return (f"{len(wins)} of the {len(pairs)} searched networks saved (single view over "
            f"{len(parts) - 1} seed(s), and multi-view) are faster than every baseline at "
            "least as accurate (the paper's Tables 4 and 6 claim all are).")


def _baseline_words(doc: dict[str, Any]) -> str:
    if doc.get("baselines_trained") == "alone":
        return ("Baselines: networks across the size range without a splitting module (late "
                "fusion for multi-view), each trained alone from scratch on the supernet's "
                "data for its epochs (not searched, no shared weights; their accuracy as "
                "sub-networks of the supernet is `shared_accuracy` in the JSON).")
    return ("Baselines: networks of the same supernet across the size range (not searched, "
            "not trained independently).")


def _ties(history: list[dict[str, Any]]) -> str:
    """How many candidates share the top validation accuracy: a search can only rank what
    its validation part separates (the digits' 204 images left 53 of 512 at 100 %)."""
    if not history:
        return ""
    top = max(c["accuracy"] for c in history)
    tied = sum(c["accuracy"] == top for c in history)
    return f"{tied} of {len(history)} candidates tie at the top validation accuracy ({top:.1f} %)."


def _sampler_searched(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The deployable networks each sampler's supernet yields (the search's saved ones)."""
    lines = ["Deployable networks (exactly one splitting module) the search saves from each "
             "supernet (seed 0, same search), held-out:", "",
             "| sampler | saved networks: top-1 % at ms | mean top-1 % |", "|---|---|---:|"]
    means = {}
    for sampler, rows in found.items():
        means[sampler] = float(np.mean([r["accuracy"] for r in rows]))
        cells = ", ".join(f"{r['accuracy']:.1f} % at {r['latency_ms']:.4f}" for r in rows)
        lines.append(f"| {sampler} | {cells} | {means[sampler]:.1f} |")
    better = max(means, key=lambda k: means[k])
    return [*lines, "", f"The {better} sampler's supernet gives the more accurate deployable "
            "networks on average here (the bounds above measure networks with zero or all "
            "modules, which are not deployed)."]


def _on(doc: dict[str, Any]) -> str:
    """The single-view data when it is not the space's own digits."""
    data = doc.get("single_data", "digits")
    return "" if data == "digits" else f" on {data}"


def _pricing_words(name: str) -> str:
    return {"float32": "float32 weights and activations, the devices' estimators",
            "paper": "the paper's convention (8-bit, T = OP / Comp)"}.get(name, name)


def main() -> None:
    global BASELINES  # the script's settings are module constants, as EPOCHS and DATA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--seeds", type=int, default=2 if QUICK else 3,
                        help="repeat the single-view part with this many supernet and search "
                             "seeds (3 for a spread)")
    parser.add_argument("--single-data", choices=("digits", "fashion-mnist"),
                        default="fashion-mnist",
                        help="the single-view part's data (fashion-mnist: a slice large "
                             "enough for the search to rank)")
    parser.add_argument("--fashion-samples", type=int, default=1200 if QUICK else 4000,
                        help="Fashion-MNIST training images used (a quarter held out)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="single-view supernet epochs, also each baseline's (default "
                             f"{FASHION_EPOCHS} on fashion-mnist, {EPOCHS['digits-split']} on "
                             "digits)")
    parser.add_argument("--baselines", type=int, default=BASELINES,
                        help="plain networks across the size range, ends included, each "
                             "trained alone")
    parser.add_argument("--paper-convention", action="store_true",
                        help="price as the paper's Tables 4/6: 8-bit, T = OP / Comp")
    parser.add_argument("--render-only", "--replot", action="store_true",
                        help=f"rewrite {NAME}.md and the figures from {NAME}.json without "
                             "measuring")
    args = parser.parse_args()
    if args.render_only:
        write_report(json.loads((args.out / f"{NAME}.json").read_text()), args.out)
        return
    for flag, value in (("--seeds", args.seeds), ("--epochs", args.epochs or 1),
                        ("--baselines", args.baselines - 1)):
        if value < 1:
            parser.error(f"{flag} is too small")
    if args.epochs or args.single_data == "fashion-mnist":
        EPOCHS["digits-split"] = args.epochs or FASHION_EPOCHS
    BASELINES = args.baselines
    fashion = args.fashion_samples if args.single_data == "fashion-mnist" else None
    measure(args.out, seeds=args.seeds, pricing=PAPER if args.paper_convention else FLOAT32,
            fashion_samples=fashion)


def measure(out: Path, *, seeds: int = 1, pricing: SplitPricing = FLOAT32,
            fashion_samples: int | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if fashion_samples is not None:
            DATA["digits-split"] = str(fashion_slice(work, fashion_samples))
        single_data = ("digits" if fashion_samples is None
                       else f"fashion-mnist (first {fashion_samples} training images)")
        supernets = {s: _train("digits-split", s, work / f"digits-{s}")
                     for s in ("five", "sandwich")}
        sampler = sampler_rows(supernets)
        single = single_view(work / "digits-five", supernets["five"][0], work, pricing)
        searched = {"five": [r for r in single["rows"] if r["method"] == "SplitNets"],
                    "sandwich": sandwich_searched(work / "digits-sandwich",
                                                  supernets["sandwich"][0], work, pricing)}
        repeats = []
        for seed in range(1, seeds):
            folder = work / f"digits-five-{seed}"
            net, _ = _train("digits-split", "five", folder, seed)
            repeats.append(single_view(folder, net, work, pricing, seed, appendix=False))
        multi_net, multi_doc = _train("shapes-split", "sandwich", work / "shapes")
        multi = multi_view(work / "shapes", multi_net, multi_doc, work, pricing)
    doc = {"sampler": sampler, "sampler_searched": searched, "single": single,
           "single_seeds": repeats, "multi": multi, "pricing": pricing.name,
           "baselines": BASELINES, "baselines_trained": "alone", "single_data": single_data,
           "epochs": EPOCHS,
           "memory_kib": MEMORY_KIB, "population": POPULATION, "generations": GENERATIONS,
           "seconds": time.perf_counter() - start, "load_before": load_before,
           "load_after": [round(x, 2) for x in os.getloadavg()], "quick": QUICK}
    # a quick run only checks the script: its numbers stay out of the results
    results = Path(tempfile.mkdtemp()) if QUICK and out == RESULTS else out
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
