"""Figures of planning results: link sweeps, per-cut latency breakdowns, device assignments,
latency/accuracy Pareto fronts."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import (
    _COLORS,
    _DASHES,
    _MARKERS,
    _bytes_scale,
    _finite_positive,
    _new_figure,
    _save,
    _shorten,
    _thinned_ticks,
    _unique_short_names,
    short_layer_name,
)

__all__ = ["auto_distortion", "plot_assignment", "plot_cut_breakdown", "plot_link_sweep",
           "plot_pareto"]


def _method_names(points: Iterable[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for point in points:
        for name in point["methods"]:
            if name not in names:
                names.append(name)
    return names


def _geometric_edges(xs: Sequence[float]) -> list[float]:
    """Step edges halfway (on a log axis) between consecutive samples, ends at the samples."""
    if len(xs) == 1:
        return [xs[0] / 1.15, xs[0] * 1.15]
    mids = [math.sqrt(a * b) for a, b in itertools.pairwise(xs)]
    return [xs[0], *mids, xs[-1]]


def plot_link_sweep(sweep: dict[str, Any], path: str | Path, *, title: str | None = None
                    ) -> Path:
    """Latency (top) and layers kept on the edge (bottom) of each method against uplink
    bandwidth, from the document of :func:`edgesplit.plan.sweep_link`; returns the PNG path."""
    points = sorted(sweep.get("points") or [], key=lambda p: float(p["bandwidth_mbps"]))
    if not points:
        raise ConfigError("the link sweep has no points to plot")
    methods = _method_names(points)
    xs = [float(p["bandwidth_mbps"]) for p in points]

    fig = _new_figure(9.0, 6.4)
    ax_lat, ax_layers = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    handles: list[Line2D] = []
    any_infeasible = False
    n = len(methods)
    for i, name in enumerate(methods):
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        dash = _DASHES[i % len(_DASHES)]
        width = 1.2 + 1.6 * (n - 1 - i) / max(n - 1, 1)  # earlier methods thicker: overlaps show
        rows = [p["methods"].get(name) for p in points]
        total = [_finite_positive(r["total_ms"]) if r else math.nan for r in rows]
        feasible = [bool(r.get("feasible", True)) if r else True for r in rows]
        # Share of the method's own graph (raw-graph methods count BN/ReLU as layers too).
        layers = [100.0 * r["edge_layers"] / r["total_layers"] if r and r.get("total_layers")
                  else float(r["edge_layers"]) if r else math.nan for r in rows]

        ax_lat.plot(xs, total, linestyle=dash, color=color, linewidth=width, zorder=2)
        ax_layers.stairs(layers, _geometric_edges(xs), baseline=None, color=color,
                         linestyle=dash, linewidth=width, zorder=2)
        for ax, ys, size in ((ax_lat, total, 5), (ax_layers, layers, 4)):
            drawn = [(x, y, f) for x, y, f in zip(xs, ys, feasible, strict=True)
                     if not math.isnan(y)]
            ok = [(x, y) for x, y, f in drawn if f]
            bad = [(x, y) for x, y, f in drawn if not f]
            if ok:
                ax.plot(*zip(*ok, strict=True), linestyle="none", marker=marker, color=color,
                        markersize=size, zorder=3)
            if bad:
                any_infeasible = True
                ax.plot(*zip(*bad, strict=True), linestyle="none", marker=marker,
                        markersize=size + 3, markerfacecolor="white", markeredgecolor=color,
                        markeredgewidth=1.5, zorder=4)
        handles.append(Line2D([], [], color=color, linestyle=dash, linewidth=width,
                              marker=marker, markersize=5, label=name))
    if any_infeasible:
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=8,
                              markerfacecolor="white", markeredgecolor="black",
                              label="infeasible (hollow)"))

    ax_lat.set_xscale("log")
    ax_lat.set_yscale("log", nonpositive="mask")
    ax_lat.set_ylabel("end-to-end latency (ms)")
    ax_lat.grid(True, which="major", alpha=0.5)
    ax_lat.grid(True, which="minor", alpha=0.15)
    ax_layers.set_xlabel("uplink bandwidth (Mbps, log scale)")
    ax_layers.set_ylabel("% of layers on the edge")
    ax_layers.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_layers.set_ylim(bottom=-0.5)
    ax_layers.grid(True, which="major", alpha=0.5)
    ax_layers.grid(True, which="minor", axis="x", alpha=0.15)

    model = sweep.get("model", "model")
    fig.suptitle(title if title is not None else f"{model}: best split vs uplink bandwidth")
    link = sweep.get("link")
    fig.legend(handles=handles, loc="outside right upper", title=f"link: {link}" if link else
               None, fontsize="small", title_fontsize="small", frameon=False)
    return _save(fig, path)


def plot_cut_breakdown(rows: list[dict[str, Any]], path: str | Path, *, title: str = ""
                       ) -> Path:
    """One stacked bar (edge, transfer + RTT, cloud, in ms) per cut point, the data sent over
    the link on a second axis, and the fastest cut starred (L2S Fig. 1); returns the PNG path."""
    rows = sorted(rows, key=lambda r: int(r["index"]))
    if not rows:
        raise ConfigError("the cut breakdown has no rows to plot")
    n = len(rows)
    xs = list(range(n))
    edge = [float(r["edge_ms"]) for r in rows]
    # the link's part: wire time, latency and the tensors' encode/decode
    link = [float(r["transfer_ms"]) + float(r.get("rtt_ms", 0.0))
            + float(r.get("serialize_ms", 0.0)) for r in rows]
    cloud = [float(r["cloud_ms"]) for r in rows]
    stacked = [e + t + c for e, t, c in zip(edge, link, cloud, strict=True)]
    total = [float(r.get("total_ms", s)) for r, s in zip(rows, stacked, strict=True)]
    best = min(xs, key=lambda i: total[i])

    fig = _new_figure(min(max(8.5, 0.22 * n + 4.5), 20.0), 5.2)
    ax = fig.subplots()
    width = 0.8
    edgecolor = "white" if n <= 60 else "none"
    ax.bar(xs, edge, width, color="#4c72b0", edgecolor=edgecolor, linewidth=0.4,
           label="edge compute")
    ax.bar(xs, link, width, bottom=edge, color="#dd8452", edgecolor=edgecolor, linewidth=0.4,
           label="transfer + RTT + serialize")
    ax.bar(xs, cloud, width, bottom=[e + t for e, t in zip(edge, link, strict=True)],
           color="#55a868", edgecolor=edgecolor, linewidth=0.4, label="cloud compute")

    top = max(max(stacked), max(total))
    ax.set_ylim(0, top * 1.28)
    ax.set_xlim(-0.6, n - 0.4)

    sent = [float(r.get("sent_bytes", 0)) for r in rows]
    scale, unit = _bytes_scale(max(sent) if sent else 0.0)
    ax_bytes = ax.twinx()  # drawn above the bars: the star and its label go on it too
    sent_line, = ax_bytes.plot(xs, [s / scale for s in sent], color="0.25", linewidth=1.0,
                               marker="." if n <= 80 else None, markersize=4, alpha=0.8,
                               label=f"data sent ({unit}, right axis)")
    ax_bytes.set_ylim(0, (max(sent) / scale if max(sent) > 0 else 1.0) * 1.28)
    ax_bytes.set_ylabel(f"data sent over the link ({unit})")

    names = _unique_short_names([r["after"] for r in rows])
    star_y = max(stacked[best], total[best]) + 0.03 * top
    star, = ax_bytes.plot([best], [star_y], transform=ax.transData, linestyle="none",
                          marker="*", markersize=16, color="gold", markeredgecolor="black",
                          zorder=5, label="fastest cut")
    side = "left" if best < n / 3 else "right" if best > 2 * n / 3 else "center"
    dx = {"left": -6, "right": 6, "center": 0}[side]
    ax_bytes.annotate(f"best: {names[best]}\n{total[best]:.1f} ms", xy=(best, star_y),
                      xycoords=ax.transData, xytext=(dx, 12), textcoords="offset points",
                      ha=side, va="bottom", fontsize="small", zorder=6,
                      bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6",
                            "alpha": 0.95})

    ticks = _thinned_ticks(n, [best])
    ax.set_xticks(ticks)
    ax.set_xticklabels([names[i] for i in ticks], rotation=60, ha="right",
                       rotation_mode="anchor", fontsize="small")
    for tick_index, label in zip(ticks, ax.get_xticklabels(), strict=True):
        if tick_index == best:
            label.set_fontweight("bold")
    ax.set_xlabel("cut after layer (left: cloud-only, right: edge-only)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, axis="y", alpha=0.4)
    ax.set_axisbelow(True)

    handles, _ = ax.get_legend_handles_labels()
    fig.legend(handles=[*handles, sent_line, star], loc="outside right upper",
               fontsize="small", frameon=False)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_assignment(plan: Any, path: str | Path, *, title: str = "") -> Path:
    """The devices of a Plan laid out by hop from the source (parallel devices stacked), each
    box with its layers and compute time, each arrow with the tensors, bytes and time it
    carries."""
    import networkx as nx
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    devices = {d.name: d for d in plan.devices}
    if not devices:
        raise ConfigError("the plan has no devices to draw")
    g: nx.DiGraph[str] = nx.DiGraph()
    g.add_nodes_from(devices)
    g.add_edges_from((l.src, l.dst) for l in plan.links if l.src in devices and l.dst in devices)
    levels = list(nx.topological_generations(g)) if nx.is_directed_acyclic_graph(g) \
        else [[n] for n in devices]
    where: dict[str, tuple[float, float]] = {}
    for column, level in enumerate(levels):
        for k, name in enumerate(sorted(level, key=list(devices).index)):
            where[name] = (column + 0.5, (k + 0.5) / len(level))
    tallest = max(len(level) for level in levels)
    fig = _new_figure(max(6.0, 3.2 * len(levels)), max(3.6, 2.2 * tallest))
    ax = fig.add_subplot()
    ax.set_xlim(0, len(levels))
    ax.set_ylim(0, 1)
    ax.axis("off")
    box_h = 0.7 / tallest
    for i, (name, device) in enumerate(devices.items()):
        x, y = where[name]
        layers = device.layers
        span = (f"{short_layer_name(layers[0])} ... {short_layer_name(layers[-1])}"
                if layers else "(idle: relays)")
        color = _COLORS[i % len(_COLORS)]
        ax.add_patch(FancyBboxPatch((x - 0.4, y - box_h / 2), 0.8, box_h,
                                    boxstyle="round,pad=0.01", facecolor=color, alpha=0.25,
                                    edgecolor=color))
        what = device.device.description or device.device.name
        ax.text(x, y + box_h * 0.25, f"{name} ({_shorten(what, 26)})", ha="center",
                va="center", fontsize=8, weight="bold")
        ax.text(x, y - box_h * 0.15, f"{len(layers)} layers, {device.compute_ms:.2f} ms\n{span}",
                ha="center", va="center", fontsize=7)
    for transfer in plan.transfers:
        (x0, y0), (x1, y1) = where[transfer.src], where[transfer.dst]
        ax.add_patch(FancyArrowPatch((x0 + 0.4, y0), (x1 - 0.4, y1), arrowstyle="-|>",
                                     mutation_scale=12, color="black", linewidth=0.8))
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.02,
                f"{transfer.bytes / 1024:.1f} KiB\n{transfer.ms:.2f} ms", ha="center",
                va="bottom", fontsize=7, bbox={"facecolor": "white", "edgecolor": "none",
                                               "alpha": 0.8, "pad": 1})
    fig.suptitle(title or f"{plan.model.name}: {plan.method}, {plan.predicted.total_ms:.2f} ms")
    return _save(fig, path)


def plot_pareto(plans: dict[str, Any], path: str | Path, *, title: str | None = None) -> Path:
    """AUTO-SPLIT Fig. 5: every AUTO-SPLIT candidate's end-to-end latency (normalised to
    cloud-only) against its accuracy drop (or, unmeasured, its total distortion), the Pareto
    front, the chosen plan, and the other methods' plans as labelled points."""
    auto = plans["autosplit"]
    alts = auto.alternatives
    if not alts:
        raise ConfigError("the AUTO-SPLIT plan carries no candidates to plot")
    # one unit on the axis: drops where every candidate was measured (--measure-all, or data
    # small enough), else distortion for all (measuring stops at the choice)
    measured = auto.quality is not None and all(a.drop is not None for a in alts)
    partly = auto.quality is not None and not measured
    base = next((a.total_ms for a in alts if a.split == 0), None) or auto.predicted.total_ms

    def err(alt_drop: float | None, distortion: float) -> float:
        return alt_drop if measured and alt_drop is not None else distortion

    fig = _new_figure(8.0, 5.6)
    ax = fig.subplots()
    xs = [err(a.drop, a.distortion) for a in alts]
    ys = [a.total_ms / base for a in alts]
    ax.scatter(xs, ys, s=14, color="#9aa5b1", label="AUTO-SPLIT candidates", zorder=2)
    front = sorted((x, y) for x, y, a in zip(xs, ys, alts, strict=True) if a.pareto)
    ax.step(*zip(*front, strict=True), where="post", color=_COLORS[0], linewidth=1.6,
            label="Pareto front", zorder=3)
    for i, (name, plan) in enumerate(p for p in plans.items() if p[0] != "autosplit"):
        q = getattr(plan, "quality", None)
        x = (q.drop if q is not None else 0.0) if measured else 0.0
        if (q is None or not measured) and any(layer.w_bits for layer in plan.layers):
            continue  # a quantized plan has no place on a distortion axis
        ax.scatter([x], [plan.predicted.total_ms / base], marker=_MARKERS[(i + 1) % len(_MARKERS)],
                   color=_COLORS[(i + 1) % len(_COLORS)], s=46, zorder=4, label=name)
    chosen_x = auto.quality.drop if measured else auto_distortion(auto)
    ax.scatter([chosen_x], [auto.predicted.total_ms / base], marker="*", s=220, color="#d6336c",
               edgecolor="black", zorder=5, label="AUTO-SPLIT choice")
    ax.set_xscale("symlog", linthresh=0.1 if measured else 1e-4)
    ax.set_xlabel("accuracy drop (percentage points)" if measured
                  else "total distortion (sum of weight and activation MSE; accuracy measured "
                       "only up to the choice: --measure-all for a measured front)" if partly
                  else "total distortion (sum of weight and activation MSE; accuracy not measured)")
    ax.set_ylabel("end-to-end latency / cloud-only")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or "AUTO-SPLIT: latency vs accuracy", fontsize=10)
    return _save(fig, path)


def auto_distortion(plan: Any) -> float:
    """The chosen AUTO-SPLIT plan's total distortion (its entry among the candidates)."""
    return next((alt.distortion for alt in plan.alternatives if alt.chosen), 0.0)
