"""AUTO-SPLIT (paper 001) Fig. 6, Table 2 and Fig. 5 reproduced with edgesplit's planners.

1. Fig. 6 / Table 2: AUTO-SPLIT's setting (Eyeriss edge, TPU cloud, 3 Mbps uplink; Table 1)
   for built-in CNNs, every method's predicted latency normalised to CLOUD16 (cloud-only in
   FP16, the paper's normaliser), AUTO-SPLIT's split, memory and bits, and the edge model size
   of AUTO-SPLIT vs QDMP_E vs QDMP_E+U4. No evaluation data: AUTO-SPLIT selects by its
   distortion threshold (that of uniform 8-bit quantization of the whole model).
2. Fig. 5 with real accuracy: ``digits_cnn`` on 600 real digits (top-1) and the pretrained
   ``all_minilm_l6_v2`` on 320 real sentences (cosine similarity to the float embeddings), the
   AUTO-SPLIT candidates and the choice at several accuracy-drop thresholds, plus baselines.

Writes benchmarks/results/autosplit.md, autosplit.json, autosplit_fig5_digits.png and
autosplit_fig5_minilm.png. Latencies are cost-model predictions (deterministic); only the
script's own run time depends on the machine.

    python benchmarks/bench_autosplit.py [--models a,b,c] [--fig5 digits,minilm] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from edgesplit.data import load_dataset
from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, Plan, PlanningProblem, compare_methods
from edgesplit.plan.quantized import device_bits, quant_setup
from edgesplit.report.plots import plot_pareto

RESULTS = Path(__file__).parent / "results"

# ---- Fig. 6 / Table 2 ------------------------------------------------------------------------
FIG6_MODELS = ("resnet18", "resnet50", "mobilenet_v2", "mnasnet", "googlenet", "resnext50",
               "yolov3_tiny", "alexnet", "vgg16")
FIG6_METHODS = ("neurosurgeon", "qdmp", "qdmp_e", "qdmp_e_u4", "u8", "autosplit")
EXTRA_METHODS = ("cloud16", "cloud_only")  # cloud16 is the normaliser; cloud_only (FP32): JSON
# Section 5.3: "AUTO-SPLIT is faster than U8 by 25%, QDMP by 40%, Neurosurgeon by 47%, and
# CLOUD-ONLY by 70%".
PAPER_REDUCTION = {"u8": 25.0, "qdmp": 40.0, "neurosurgeon": 47.0, "cloud16": 70.0}
# Section 5.3 (Fig. 6) and Table 2: what AUTO-SPLIT chose in the paper.
PAPER_KIND = {"resnext50": "cloud-only", "resnet18": "edge-only", "mobilenet_v2": "edge-only",
              "mnasnet": "edge-only", "resnet50": "split (idx 12)", "googlenet": "split (idx 18)",
              "yolov3_tiny": "split (idx 7)"}
# Table 2: split index and MB of the edge part (AUTO-SPLIT, QDMP_E, QDMP_E+U4).
PAPER_TABLE2 = {"googlenet": (18, 0.4, 18, 3.5, 0.44), "resnet50": (12, 0.9, 53, 50.0, 12.5),
                "yolov3_tiny": (7, 8.8, 7, 18.2, 4.44)}

# ---- Fig. 5 ----------------------------------------------------------------------------------
THRESHOLDS = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0)
FIG5_BASELINES = ("u8", "qdmp_e_u4", "cloud16", "qdmp", "neurosurgeon")
PLOT_THRESHOLD = 1.0  # the star in the figures: AUTO-SPLIT's default threshold (1 point)
FIG5 = {
    "digits": {"model": "digits_cnn", "data": "digits", "edge": "eyeriss", "cloud": "tpu",
               "link": "autosplit-3mbps"},
    "minilm": {"model": "all_minilm_l6_v2", "data": "sentences", "edge": "phone-2022",
               "cloud": "tpu", "link": "autosplit-3mbps"},
}
# Settings weighed for MiniLM (distortion only, no data: cheap) to pick one with a visible
# trade-off; the chosen one is FIG5["minilm"].
MINILM_SCAN = (("eyeriss", "autosplit-3mbps"), ("eyeriss", "ble"), ("eyeriss", "3g"),
               ("eyeriss", "4g"), ("phone-2022", "autosplit-3mbps"), ("phone-2022", "ble"),
               ("phone-2022", "3g"), ("jetson-nano", "ble"), ("jetson-nano", "3g"))


DIGITS_WHY = (
    "Why this setting: it is the paper's. Every other link we tried in exploratory runs "
    "(dads-4g, dads-wifi, jmsnas-ue-sbs, l2s-wifi-60; not repeated here) gives either the same "
    "edge-only choice or cloud-only everywhere: the trade-off is flat because uniform W4A4 on "
    "the edge is lossless on these digits; only 2-bit widths cost accuracy.")
MINILM_WHY = (
    "Why this setting: MiniLM's raw input is 2 x 32 int64 token ids (512 B), while any hidden "
    "state is at least 96 B per token even at 2 bits, so AUTO-SPLIT's eq. (6) admits only the "
    "last layers (pooling / normalisation) and edge-only. On Eyeriss at 3 Mbps every edge "
    "candidate is slower than the cloud, so AUTO-SPLIT is cloud-only at every threshold. A "
    "phone NPU (`phone-2022`, INT8/FP16 only, so its mixed precision is 8/16-bit) keeps the "
    "paper's 3 Mbps link and spreads the {n} candidates' Pareto front from {lo:.2f} to "
    "{hi:.2f} of cloud-only. Eyeriss over 4g or 3g spreads them too, but with {eyeriss_n} "
    "candidates (2-16 bits) to run over the held-out set, at about 1 s each on this machine: "
    "too slow for this benchmark.")


def setting_of(edge: str, cloud: str, link: str) -> EdgeCloudSetting:
    # the paper's inputs are 8-bit camera frames / token ids (its T_0)
    return EdgeCloudSetting(edge=get_device(edge), cloud=get_device(cloud), link=get_link(link),
                            input_bits=8)


def share_quant_setup(problem: PlanningProblem) -> None:
    """Build the problem's quantization setup (distortion table and, with data, the accuracy
    meter) once and let every quantized method use it.

    ``quant_setup`` caches one setup per tuple of bit-widths, and the quantized baselines ask
    for the device's widths plus their own (CLOUD16 and QDMP_E add 32, QDMP_E+U4 adds 4 on a
    device without 4-bit support), so each would otherwise recapture the model, recalibrate and
    rebuild a distortion table it never reads (a float edge part, or a cloud part, has no
    distortion; the meter does not depend on the widths). Checked to give identical plans;
    should the cache key change, this only stops saving time."""
    bits = device_bits(None, problem.setting.edge.supported_bits)
    setup = quant_setup(problem, bits)
    for extra in (4, 8, 32):
        if extra not in bits:
            problem.cache.setdefault(f"quant:{(*bits, extra)}", setup)


# ---- describing plans ------------------------------------------------------------------------
def split_kind(plan: Plan) -> str:
    n, m = len(plan.edge_layers), len(plan.layers)
    if n == 0:
        return "cloud-only"
    if n == m:
        return "edge-only"
    return f"split after {n} of {m}"


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def bits_range(plan: Plan) -> str:
    """``W4-8 A6-16`` over the edge layers (32: float); ``-`` when nothing runs on the edge."""
    edge = set(plan.edge_layers)
    layers = [layer for layer in plan.layers if layer.name in edge]
    if not layers:
        return "-"
    w = [layer.w_bits or 32 for layer in layers]
    a = [layer.a_bits or 32 for layer in layers]
    if set(w) == {32} and set(a) == {32}:
        return "FP32"
    return f"W{_span(w)} A{_span(a)}"


def alt_bits(w_bits: dict[str, int], a_bits: dict[str, int]) -> str:
    if not w_bits:
        return "-"
    return f"W{_span(list(w_bits.values()))} A{_span(list(a_bits.values()))}"


def weight_bytes(problem: PlanningProblem, plan: Plan) -> int:
    """Bytes of the edge part's parameters at their bit-widths (the library's convention: every
    parameter of a layer at its w_bits; float layers at 32 bits)."""
    graph = problem.graph_of(plan.model.graph)
    bits = {layer.name: layer.w_bits or 32 for layer in plan.layers}
    sizes: dict[str, int] = {}
    for name in plan.edge_layers:
        for attr in graph.layer(name).param_names:
            size = math.ceil(graph.attribute_numel.get(attr, 0) * bits[name] / 8)
            sizes[attr] = max(sizes.get(attr, 0), size)
    return sum(sizes.values())


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _mb(n: float) -> str:
    mb = n / 1e6
    return "0" if n == 0 else f"{mb:.2f}" if mb >= 0.995 else f"{mb:.3g}"


def _ratio(v: float) -> str:
    return f"{v:.2f}x" if v < 0.1 else f"{v:.1f}x" if v < 100 else f"{v:,.0f}x"


# ---- Fig. 6 / Table 2 ------------------------------------------------------------------------
def fig6_row(name: str, setting: EdgeCloudSetting) -> dict[str, Any]:
    problem = PlanningProblem(name, setting)
    share_quant_setup(problem)
    plans = compare_methods(problem, ("autosplit", *FIG6_METHODS[:-1], *EXTRA_METHODS))
    base = plans["cloud16"].predicted.total_ms
    auto = plans["autosplit"]
    row: dict[str, Any] = {
        "model": name, "layers": len(problem.graph), "raw_layers": len(problem.graph_of("raw")),
        "cloud16_ms": base,
        "autosplit": {"kind": split_kind(auto), "edge_layers": len(auto.edge_layers),
                      "bits": bits_range(auto), "note": auto.reason,
                      "candidates": len(auto.alternatives),
                      "pareto": sum(a.pareto for a in auto.alternatives)},
        "methods": {},
    }
    for method, plan in plans.items():
        row["methods"][method] = {
            "total_ms": plan.predicted.total_ms,
            "vs_cloud16": plan.predicted.total_ms / base,
            "graph": plan.model.graph,
            "edge_layers": len(plan.edge_layers), "layers": len(plan.layers),
            "kind": split_kind(plan), "bits": bits_range(plan),
            "edge_memory_bytes": plan.edge_memory_bytes,
            "edge_weight_bytes": weight_bytes(problem, plan),
            "sent_bytes": plan.sent_bytes,
            "feasible": plan.feasible, "reason": plan.reason,
        }
    return row


def fig6_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    methods = (*FIG6_METHODS, "cloud16")
    feasible = {m: [r for r in rows if r["methods"][m]["feasible"]] for m in methods}
    gm = {m: geomean([r["methods"][m]["vs_cloud16"] for r in feasible[m]]) for m in methods}
    reduction = {}
    for m in methods:
        if m == "autosplit":
            continue
        both = [r for r in rows if r["methods"][m]["feasible"]
                and r["methods"]["autosplit"]["feasible"]]
        ratios = [r["methods"]["autosplit"]["total_ms"] / r["methods"][m]["total_ms"]
                  for r in both]
        reduction[m] = {
            "geomean_pct": 100.0 * (1.0 - geomean(ratios)),
            "mean_pct": 100.0 * (1.0 - sum(ratios) / len(ratios)) if ratios else math.nan,
            "range_pct": [100.0 * (1.0 - max(ratios)), 100.0 * (1.0 - min(ratios))]
            if ratios else None,
            "models": len(both), "paper_pct": PAPER_REDUCTION.get(m),
        }
    return {"geomean_vs_cloud16": gm, "autosplit_reduction": reduction}


# ---- Fig. 5 ----------------------------------------------------------------------------------
def fig5_case(key: str, spec: dict[str, str], progress: Progress) -> dict[str, Any]:
    data = load_dataset(spec["data"])
    setting = setting_of(spec["edge"], spec["cloud"], spec["link"])
    task = progress.add_task(f"{key}: measuring candidates", total=None)

    def report(what: str, done: int, total: int) -> None:
        progress.update(task, description=f"{key}: {what}", completed=done, total=total)

    problem = PlanningProblem(spec["model"], setting, eval_data=data, progress=report)
    progress.update(task, description=f"{key}: calibration and distortion table")
    share_quant_setup(problem)
    autos = {}
    for t in THRESHOLDS:  # candidates are measured once; later thresholds reuse the meter
        autos[t] = compare_methods(problem, ["autosplit"],
                                   options={"autosplit": {"max_acc_drop": t}})["autosplit"]
    progress.update(task, description=f"{key}: baselines")
    baselines = compare_methods(problem, FIG5_BASELINES)
    progress.remove_task(task)

    first = autos[THRESHOLDS[0]]
    alts = first.alternatives
    cloud_alt = next(a for a in alts if a.split == 0)
    base = cloud_alt.total_ms  # the figure's 1.0: AUTO-SPLIT's own cloud-only candidate
    c16 = baselines["cloud16"].predicted.total_ms
    quality = first.quality

    def entry(plan: Plan) -> dict[str, Any]:
        q = plan.quality
        return {"total_ms": plan.predicted.total_ms,
                "vs_cloud_only": plan.predicted.total_ms / base,
                "vs_cloud16": plan.predicted.total_ms / c16,
                "drop": q.drop if q else (0.0 if bits_range(plan) in ("-", "FP32") else None),
                "quality": q.value if q else None, "measured": q is not None,
                "kind": split_kind(plan), "graph": plan.model.graph,
                "bits": bits_range(plan), "sent_bytes": plan.sent_bytes,
                "edge_memory_bytes": plan.edge_memory_bytes,
                "feasible": plan.feasible, "reason": plan.reason}

    plot_path = RESULTS / f"autosplit_fig5_{key}.png"
    plot_pareto({"autosplit": autos[PLOT_THRESHOLD], **baselines}, plot_path,
                title=f"{spec['model']}, {quality.samples} held-out {spec['data']}: "
                      f"{spec['edge']} / {spec['link']} / {spec['cloud']}; "
                      f"star: max drop {PLOT_THRESHOLD:g} pt")
    return {
        "model": spec["model"], "data": spec["data"], "edge": spec["edge"],
        "cloud": spec["cloud"], "link": spec["link"],
        "metric": quality.metric, "reference": quality.reference,
        "held_out_samples": quality.samples, "samples": len(data),
        "calibration_samples": len(data) - quality.samples,
        "cloud_only_candidate_ms": base, "cloud16_ms": c16,
        "candidates": len(alts), "pareto": sum(a.pareto for a in alts),
        "thresholds": [{"threshold": t, **entry(p)} for t, p in autos.items()],
        "baselines": {m: entry(p) for m, p in baselines.items()},
        "alternatives": [{"split": a.split, "split_after": a.split_after,
                          "total_ms": a.total_ms, "vs_cloud_only": a.total_ms / base,
                          "drop": a.drop, "distortion": a.distortion, "pareto": a.pareto,
                          "sent_bytes": a.sent_bytes, "edge_memory_bytes": a.edge_memory_bytes,
                          "bits": alt_bits(a.w_bits, a.a_bits),
                          "w_bits": a.w_bits, "a_bits": a.a_bits} for a in alts],
        "plot": plot_path.name,
        "problem": problem,  # dropped before writing JSON; reused by the setting scan
    }


def minilm_scan(problem: PlanningProblem) -> list[dict[str, Any]]:
    """AUTO-SPLIT's candidates for MiniLM under several settings, by distortion only (no data):
    how far they spread in latency. Reuses the captured graphs."""
    rows = []
    cache: dict[str, Any] = {}  # distortion tables depend on the graph and bits only: shared
    for edge, link in MINILM_SCAN:
        sub = dataclasses.replace(problem, setting=setting_of(edge, "tpu", link), eval_data=None,
                                  progress=None, _costs={}, cache=cache)
        share_quant_setup(sub)
        plans = compare_methods(sub, ["autosplit", "u8"])
        auto = plans["autosplit"]
        base = next(a.total_ms for a in auto.alternatives if a.split == 0)
        front = [a for a in auto.alternatives if a.pareto and a.split > 0]
        rows.append({"edge": edge, "link": link, "candidates": len(auto.alternatives),
                     "splits": sorted({a.split for a in auto.alternatives}),
                     "front_points": len(front),
                     "front_vs_cloud_only": [a.total_ms / base for a in front],
                     "u8_vs_cloud_only": plans["u8"].predicted.total_ms / base,
                     "autosplit_kind": split_kind(auto)})
    return rows


# ---- markdown --------------------------------------------------------------------------------
def _x(v: float) -> str:
    return f"{v:.3f}"


def fig6_lines(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    head = " | ".join(FIG6_METHODS)
    lines = ["## Fig. 6: latency normalised to CLOUD16 (eyeriss -> autosplit-3mbps -> tpu)", "",
             ("Predicted end-to-end latency / CLOUD16 (cloud-only, FP16 cloud compute, raw "
              "input sent at 8 bits); lower is better, * = infeasible. AUTO-SPLIT selects the "
              "fastest candidate whose total distortion is at most that of U8 (no evaluation "
              "data, so accuracy is not measured here). Neurosurgeon's split counts layers of "
              "the raw graph (BN and activations separate)."), "",
             (f"| model | {head} | AUTO-SPLIT choice | paper's choice | AUTO-SPLIT edge memory "
              "MB | AUTO-SPLIT bits |"),
             "|---|" + "---:|" * len(FIG6_METHODS) + "---|---|---:|---|"]
    for r in rows:
        cells = []
        for m in FIG6_METHODS:
            e = r["methods"][m]
            cells.append(_x(e["vs_cloud16"]) + ("" if e["feasible"] else "*"))
        a = r["methods"]["autosplit"]
        lines.append(f"| {r['model']} | " + " | ".join(cells) + f" | {a['kind']} | "
                     f"{PAPER_KIND.get(r['model'], 'not in paper')} | "
                     f"{_mb(a['edge_memory_bytes'])} | {a['bits']} |")
    gm = summary["geomean_vs_cloud16"]
    lines.append("| **geomean** | " + " | ".join(f"**{_x(gm[m])}**" for m in FIG6_METHODS)
                 + " | | | | |")
    lines += ["", ("AUTO-SPLIT's latency reduction against each baseline: 1 - geometric mean "
                   "of the per-model ratio AUTO-SPLIT / baseline, its range over the models, 1 - "
                   "the arithmetic mean of the ratios, and the paper's Section 5.3 claim where "
                   "it makes one."), "",
              ("| vs | ours (geomean) | ours (per-model range) | ours (mean of per-model) | "
               "paper |"), "|---|---:|---:|---:|---:|"]
    for m, red in summary["autosplit_reduction"].items():
        lo, hi = red["range_pct"]
        paper = f"{red['paper_pct']:.0f}%" if red["paper_pct"] is not None else "-"
        label = "cloud16 (CLOUD-ONLY)" if m == "cloud16" else m
        lines.append(f"| {label} | {red['geomean_pct']:.0f}% | {lo:.0f}% .. {hi:.0f}% | "
                     f"{red['mean_pct']:.0f}% | {paper} |")
    return lines


def table2_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Table 2: edge model size (weights at their bits)", "",
             ("Split = layers on the edge (of the optimised graph); MB = parameter bytes of the "
              "edge part at the plan's weight bits (float: 32). Paper values from Table 2 "
              "(its split index counts the paper's own layer list)."), "",
             ("| model | AUTO-SPLIT split | MB | QDMP_E split | MB | QDMP_E+U4 MB | QDMP_E / "
              "AUTO-SPLIT | QDMP_E+U4 / AUTO-SPLIT | paper (AS idx, MB; QDMP_E idx, MB; +U4 MB) |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    ratios_e, ratios_u4 = [], []
    for r in rows:
        a, e, u = (r["methods"][m] for m in ("autosplit", "qdmp_e", "qdmp_e_u4"))
        aw, ew, uw = a["edge_weight_bytes"], e["edge_weight_bytes"], u["edge_weight_bytes"]
        re_ = _ratio(ew / aw) if aw and ew else "-"
        ru = _ratio(uw / aw) if aw and ew else "-"
        if aw and ew:
            ratios_e.append(ew / aw)
            ratios_u4.append(uw / aw)
        paper = PAPER_TABLE2.get(r["model"])
        ptxt = f"{paper[0]}, {paper[1]}; {paper[2]}, {paper[3]}; {paper[4]}" if paper else "-"
        lines.append(f"| {r['model']} | {a['edge_layers']}/{a['layers']} | {_mb(aw)} | "
                     f"{e['edge_layers']}/{e['layers']}{'' if e['feasible'] else '*'} | "
                     f"{_mb(ew)} | {_mb(uw)} | {re_} | {ru} | {ptxt} |")
    if ratios_e:
        lines.append(f"| **geomean** | | | | | | **{_ratio(geomean(ratios_e))}** | "
                     f"**{_ratio(geomean(ratios_u4))}** | paper (average): 14.7x, 3.1x |")
        lines.append(f"| **median** | | | | | | **{_ratio(statistics.median(ratios_e))}** | "
                     f"**{_ratio(statistics.median(ratios_u4))}** | |")
    return lines


def fig5_lines(key: str, case: dict[str, Any]) -> list[str]:
    metric = "top-1 accuracy" if case["metric"] == "top1" else \
        "cosine similarity of the embeddings to the float model's"
    lines = ["", (f"### {case['model']} on `{case['data']}`: {case['edge']} -> {case['link']} -> "
                  f"{case['cloud']}"), "",
             (f"Quality = {metric} (%), float reference **{case['reference']:.2f}%** on "
              f"**{case['held_out_samples']} held-out samples** (the first "
              f"{case['calibration_samples']} of {case['samples']} calibrate activation ranges). "
              f"{case['candidates']} AUTO-SPLIT candidates, {case['pareto']} on the measured "
              f"latency/drop Pareto front. Figure: `{case['plot']}`."), "",
             ("Latency is normalised to AUTO-SPLIT's own cloud-only candidate (FP32 cloud, the "
              "1.0 of the figure, as in the paper's Fig. 5) and to CLOUD16 (FP16 cloud). "
              "Baselines that run the edge part in float have no quantization loss (drop 0)."), "",
             ("| solution | latency / cloud-only | latency / CLOUD16 | drop (points) | quality % "
              "| placement | bits | link bytes (up + result down) | edge memory MB |"),
             "|---|---:|---:|---:|---:|---|---|---:|---:|"]

    def row(label: str, e: dict[str, Any]) -> str:
        drop = f"{e['drop']:.3f}" if e["drop"] is not None else "n/a"
        qual = f"{e['quality']:.2f}" if e["quality"] is not None else "-"
        graph = " (raw graph)" if e["graph"] == "raw" and e["kind"].startswith("split") else ""
        return (f"| {label} | {_x(e['vs_cloud_only'])} | {_x(e['vs_cloud16'])} | {drop} | "
                f"{qual} | {e['kind']}{graph}{'' if e['feasible'] else ' (infeasible)'} | "
                f"{e['bits']} | {e['sent_bytes']:,} | {_mb(e['edge_memory_bytes'])} |")

    for t in case["thresholds"]:
        lines.append(row(f"AUTO-SPLIT, max drop {t['threshold']:g}", t))
    for m, e in case["baselines"].items():
        lines.append(row(m, e))
    pct = ", ".join(f"{100 * t['vs_cloud_only']:.0f}%" for t in case["thresholds"])
    ths = ", ".join(f"{t['threshold']:g}" for t in case["thresholds"])
    lines += ["", (f"In the paper's words: for a threshold of {ths} points AUTO-SPLIT selects "
                   f"solutions with end-to-end latency of {pct} of cloud-only (paper, ResNet-50 at "
                   "0/1/5/10%: 100%, 57%, 43%, 43%).")]
    return lines


def scan_lines(rows: list[dict[str, Any]], chosen: dict[str, str]) -> list[str]:
    lines = ["", "#### Choosing the MiniLM setting", "",
             ("AUTO-SPLIT's candidates for all_minilm_l6_v2 by distortion alone (no data, "
              "cheap): the Pareto points other than cloud-only, as latency / AUTO-SPLIT's "
              "cloud-only candidate."), "",
             ("| edge | link | candidates | split points | front (non-cloud) | U8 | "
              "AUTO-SPLIT (distortion) |"), "|---|---|---:|---|---|---:|---|"]
    for r in rows:
        front = ", ".join(_x(v) for v in r["front_vs_cloud_only"]) or "none"
        mark = " **(used)**" if (r["edge"], r["link"]) == (chosen["edge"], chosen["link"]) else ""
        lines.append(f"| {r['edge']}{mark} | {r['link']} | {r['candidates']} | "
                     f"{', '.join(map(str, r['splits']))} | {front} | "
                     f"{_x(r['u8_vs_cloud_only'])} | {r['autosplit_kind']} |")
    return lines


def _model_list(models: list[str]) -> str:
    return ", ".join(models) or "none"


def observations(rows: list[dict[str, Any]], summary: dict[str, Any],
                 fig5: dict[str, dict[str, Any]]) -> list[str]:
    out = ["", "## Observations", ""]
    if rows:
        meth = {r["model"]: r["methods"] for r in rows}
        ties = [m for m, e in meth.items()
                if abs(e["autosplit"]["total_ms"] - e["u8"]["total_ms"]) < 1e-9]
        wins_u8 = [m for m, e in meth.items()
                   if e["autosplit"]["total_ms"] < e["u8"]["total_ms"] - 1e-9]
        u4_faster = [m for m, e in meth.items()
                     if e["qdmp_e_u4"]["total_ms"] < e["autosplit"]["total_ms"] - 1e-9]
        above_c16 = [m for m, e in meth.items() if e["autosplit"]["vs_cloud16"] > 1]
        kinds = {r["model"]: r["autosplit"]["kind"] for r in rows}
        edge_only = [m for m, k in kinds.items() if k == "edge-only"]
        red = summary["autosplit_reduction"]
        out.append(f"- **Ties.** AUTO-SPLIT equals U8 exactly on {len(ties)} of {len(rows)} "
                   f"models ({_model_list(ties)}). Without evaluation data its threshold is "
                   "U8's own total distortion and U8 (edge-only W8A8) is one of its candidates; "
                   "on Eyeriss at 3 Mbps the whole model on the edge is usually fastest, and no "
                   "mixed-precision edge-only variant both stays under that distortion and "
                   "moves fewer bytes. That is why our reduction vs U8 "
                   f"({red['u8']['geomean_pct']:.0f}%) is half the paper's 25%. It beats U8 on "
                   f"{_model_list(wins_u8)}.")
        out.append(f"- **Agreement.** vs QDMP {red['qdmp']['geomean_pct']:.0f}% (paper 40%), vs "
                   f"CLOUD-ONLY {red['cloud16']['geomean_pct']:.0f}% geomean / "
                   f"{red['cloud16']['mean_pct']:.0f}% mean (paper 70%). vs Neurosurgeon "
                   f"{red['neurosurgeon']['geomean_pct']:.0f}% (paper 47%): Neurosurgeon "
                   "treats the raw graph as a chain and is charged the tensors its cut really "
                   "crosses; on GoogLeNet's inception branches that is "
                   f"{meth['googlenet']['neurosurgeon']['vs_cloud16']:.1f}x CLOUD16."
                   if "googlenet" in meth and "neurosurgeon" in red and "qdmp" in red else
                   "- **Agreement.** see the reduction table.")
        paper_diff = [m for m in ("resnext50", "googlenet", "yolov3_tiny", "resnet50")
                      if m in kinds and not PAPER_KIND[m].startswith(kinds[m].split()[0])]
        out.append("- **Choices.** " + "; ".join(f"{m}: {k}" for m, k in kinds.items())
                   + ". The paper reports cloud-only for ResNeXt50, edge-only for ResNet-18, "
                   "MobileNet-v2 and MnasNet, and splits for ResNet-50, GoogLeNet and "
                   f"YOLOv3-tiny. Ours differ on {_model_list(paper_diff)}: under the roofline "
                   "Eyeriss (34 G MAC/s, each weight and activation crossing the 1 GB/s memory "
                   "once) the whole network runs in well under the time it takes to send the "
                   "8-bit frame at 3 Mbps (about 400 ms for a 224x224x3 image), so edge-only "
                   "wins "
                   f"({_model_list(edge_only)}). SCALE-SIM's Eyeriss, with a 192 KB on-chip "
                   "buffer and dataflow-dependent re-fetching, is likely far slower on the big "
                   "models, which pushes the paper toward splits and cloud-only.")
        if "resnet50" in kinds and kinds["resnet50"].startswith("split"):
            e = meth["resnet50"]["autosplit"]
            evidence = ""
            if "digits" in fig5:
                w2 = [a["drop"] for a in fig5["digits"]["alternatives"]
                      if a["w_bits"] and set(a["w_bits"].values()) == {2}]
                if w2:
                    evidence = (f" (on digits, the candidates with every weight at 2 bits lose "
                                f"{min(w2):.0f}-{max(w2):.0f} points)")
            out.append(f"- **ResNet-50** is AUTO-SPLIT's only true split ({e['kind']}, "
                       f"{e['bits']}): the distortion threshold is a sum over the quantized "
                       f"layers, so a {e['edge_layers']}-layer prefix at 2 bits sums to less "
                       f"than all {e['layers']} layers at 8 bits and passes, although 2-bit "
                       f"weights and activations would likely cost real accuracy{evidence}. A "
                       "distortion budget over the whole model favours short, very low-bit "
                       "prefixes; the paper's accuracy threshold would not.")
        if u4_faster:
            out.append(f"- **QDMP_E+U4 is faster** than AUTO-SPLIT on {_model_list(u4_faster)}: "
                       "it quantizes the same edge part to 4 bits regardless of the error (the "
                       "paper discounts its accuracy loss too); AUTO-SPLIT refuses candidates "
                       "above U8's distortion. On MiniLM (Fig. 5) U4 loses almost all quality.")
        if above_c16:
            out.append(f"- **AUTO-SPLIT is slower than CLOUD16** on {_model_list(above_c16)}: "
                       "no edge or split candidate beats the cloud, so it returns its own "
                       "cloud-only candidate, whose cloud part runs in FP32, while CLOUD16 runs "
                       "it in FP16 (library note 1). The paper's AUTO-SPLIT scores 1.0 when it "
                       "picks cloud-only.")
        t2 = [(m, e["qdmp_e"]["edge_weight_bytes"], e["autosplit"]["edge_weight_bytes"])
              for m, e in meth.items() if e["autosplit"]["edge_weight_bytes"]]
        both_edge = [m for m, q, a in t2 if kinds[m] == "edge-only"
                     and meth[m]["qdmp_e"]["kind"] == "edge-only"]
        bigger = [m for m, q, a in t2 if q and a > q]
        out.append(f"- **Table 2.** Where both AUTO-SPLIT and QDMP_E put the whole model on the "
                   f"edge ({_model_list(both_edge)}) the size ratio is just 32/8 = 4x (FP32 vs "
                   "W8) and QDMP_E+U4 is half AUTO-SPLIT's size; the paper's 14.7x and 3.1x "
                   "come from AUTO-SPLIT cutting early where QDMP_E cuts late, which our cost "
                   "model rarely rewards."
                   + (f" AUTO-SPLIT's edge part is larger than QDMP_E's on {_model_list(bigger)}"
                      " (whole model at mixed bits vs a float prefix)." if bigger else ""))
    for case in fig5.values():
        th = case["thresholds"]
        same = len({(round(t["total_ms"], 9), t["bits"], t["kind"]) for t in th}) == 1
        front = [a for a in case["alternatives"] if a["pareto"]]
        edge_drops = [a["drop"] for a in case["alternatives"] if a["split"] > 0]
        u8 = case["baselines"]["u8"]
        at1 = next(t for t in th if t["threshold"] == PLOT_THRESHOLD)
        text = (f"- **Fig. 5, {case['model']}**: {len(front)} measured Pareto points out of "
                f"{case['candidates']} candidates; ")
        if same:
            text += ("AUTO-SPLIT picks the same solution at every threshold "
                     f"({th[0]['kind']}, {th[0]['bits']}, drop {th[0]['drop']:.2f}), "
                     f"{100 * th[0]['vs_cloud_only']:.0f}% of cloud-only. ")
            faster = [a for a in case["alternatives"] if a["total_ms"] < th[0]["total_ms"]
                      - 1e-12]
            if faster:
                f0 = min(faster, key=lambda a: a["total_ms"])
                text += (f"The only faster candidates ({len(faster)}; the fastest, "
                         f"{f0['bits']}, is {100 * (1 - f0['total_ms'] / th[0]['total_ms']):.0f}%"
                         f" faster) lose {min(a['drop'] for a in faster):.0f}+ points, so the "
                         "trade-off the paper shows collapses to one point.")
        else:
            text += "the choice moves with the threshold: " + "; ".join(
                f"{t['threshold']:g} -> {t['kind']}"
                + (f" {t['bits']}" if t["bits"] != "-" else "")
                + f" ({_x(t['vs_cloud_only'])}, drop {t['drop']:.3f})" for t in th) + "."
            if min(edge_drops) > 0:
                best = min((a for a in case["alternatives"] if a["split"] > 0),
                           key=lambda a: a["drop"])
                text += (f" At threshold 0 only cloud-only qualifies: the smallest drop of any "
                         f"edge candidate ({best['bits']}) is {best['drop']:.1e} points, and "
                         "the paper's 0% threshold also returns CLOUD-ONLY.")
        text += (f" U8 is {_x(u8['vs_cloud_only'])} of cloud-only with a drop of "
                 f"{u8['drop']:.2f} points; AUTO-SPLIT at {PLOT_THRESHOLD:g} point is "
                 f"{_x(at1['vs_cloud_only'])} with {at1['drop']:.2f}.")
        out.append(text)
    out += ["", "## Library notes", "",
            ("The first run of this benchmark found three library problems, fixed since: "
             "AUTO-SPLIT's cloud-only candidate ran the cloud in FP32 only (it now also has the "
             "FP16 cloud-only candidate, so it is never slower than CLOUD16); integer raw "
             "inputs were sized at 32 bits by the quantized methods (now at their dtype, like "
             "the float planners); and the quantized baselines rebuilt the quantization setup "
             "for widths they do not use (they now share AUTO-SPLIT's). Its default distortion "
             "threshold also changed: a candidate may distort no more than uniform 8-bit on its "
             "own edge layers (a whole-model figure let ResNet-50's 2-layer prefix at W2A2 "
             "through).")]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(FIG6_MODELS),
                        help="Fig. 6 models (comma-separated; empty: skip)")
    parser.add_argument("--fig5", default=",".join(FIG5),
                        help=f"Fig. 5 cases among {', '.join(FIG5)} (empty: skip)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine two threads "
                             "ran the small fake-quantized forward passes 4-8x slower under "
                             "load)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    cases = [c for c in args.fig5.split(",") if c]
    start = time.perf_counter()
    RESULTS.mkdir(exist_ok=True)
    autosplit_setting = setting_of("eyeriss", "tpu", "autosplit-3mbps")

    rows: list[dict[str, Any]] = []
    fig5: dict[str, dict[str, Any]] = {}
    scan: list[dict[str, Any]] = []
    stage_s: dict[str, float] = {}
    with Progress() as progress:
        task = progress.add_task("Fig. 6", total=len(models))
        t0 = time.perf_counter()
        for name in models:
            progress.update(task, description=f"Fig. 6: {name}")
            rows.append(fig6_row(name, autosplit_setting))
            progress.advance(task)
        stage_s["fig6"] = time.perf_counter() - t0
        task5 = progress.add_task("Fig. 5", total=len(cases))
        for key in cases:
            t0 = time.perf_counter()
            progress.update(task5, description=f"Fig. 5: {key}")
            fig5[key] = fig5_case(key, FIG5[key], progress)
            if key == "minilm":
                progress.update(task5, description="Fig. 5: MiniLM setting scan")
                scan = minilm_scan(fig5[key]["problem"])
            del fig5[key]["problem"]
            stage_s[f"fig5_{key}"] = time.perf_counter() - t0
            progress.advance(task5)
    summary = fig6_summary(rows) if rows else {}
    wall = time.perf_counter() - start

    meta = {"torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "threads": torch.get_num_threads(),
            "wall_s": wall, "stage_s": stage_s}
    doc = {"version": 1, "meta": meta,
           "fig6": {"setting": {"edge": "eyeriss", "cloud": "tpu", "link": "autosplit-3mbps"},
                    "selection": "distortion <= U8's (no evaluation data)",
                    "rows": rows, "summary": summary},
           "fig5": fig5, "minilm_setting_scan": scan}
    (RESULTS / "autosplit.json").write_text(json.dumps(doc, indent=2) + "\n")

    lines = ["# AUTO-SPLIT: Fig. 6, Table 2 and Fig. 5", "",
             (f"torch {meta['torch']}, Python {meta['python']}, {meta['threads']} torch "
              f"thread(s); "
              f"the script ran {wall:.0f} s on a shared 2-core machine (latencies below are "
              "cost-model predictions and do not depend on the machine)."), "",
             ("**Setting.** AUTO-SPLIT's Table 1: Eyeriss edge (`eyeriss`: 34 G MAC/s INT8, "
              "1 GB/s, 4 GB), TPU cloud (`tpu`), 3 Mbps uplink and downlink with no RTT "
              "(`autosplit-3mbps`); Fig. 5's MiniLM case changes the edge device (below). The "
              "result returns to the edge over the downlink."),
             "",
             ("**Cost model.** Per-layer roofline presets (`edgesplit devices`), not the paper's "
              "cycle-accurate SCALE-SIM, so absolute numbers and some choices differ from the "
              "paper. Sub-8-bit edge layers compute at INT8 speed and only move fewer bytes "
              "(as in the paper's simulator); transmitted activations travel at their producer's "
              "activation bits; the raw input is sent at 8 bits by every method (a camera frame, "
              "AUTO-SPLIT's T_0); cloud parts run in FP32 except CLOUD16 (FP16). QDMP_E and "
              "QDMP_E+U4 keep QDMP's float split (memory limit does not move it); U8 is the "
              "whole model on the edge at W8A8."), ""]
    if rows:
        lines += fig6_lines(rows, summary) + table2_lines(rows)
    if fig5:
        lines += ["", "## Fig. 5: latency vs measured accuracy", "",
                  ("AUTO-SPLIT with real held-out data: every candidate is run fake-quantized "
                   "and the threshold is on the measured drop in percentage points of the "
                   "quality measure (the paper's thresholds are relative, % of accuracy).")]
        for key, case in fig5.items():
            lines += fig5_lines(key, case)
            if key == "digits":
                lines += ["", DIGITS_WHY]
            if key == "minilm" and scan:
                lines += scan_lines(scan, FIG5["minilm"])
                used = next(r for r in scan if (r["edge"], r["link"]) == (
                    FIG5["minilm"]["edge"], FIG5["minilm"]["link"]))
                eyeriss_n = max(r["candidates"] for r in scan if r["edge"] == "eyeriss")
                lines += ["", MINILM_WHY.format(
                    n=used["candidates"], lo=min(used["front_vs_cloud_only"]),
                    hi=max(used["front_vs_cloud_only"]), eyeriss_n=eyeriss_n)]
    lines += observations(rows, summary, fig5)
    (RESULTS / "autosplit.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
