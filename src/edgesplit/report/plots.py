"""PNG figures of planning results: link sweeps, per-cut latency breakdowns, layer profiles.

Figures are built on :class:`matplotlib.figure.Figure` with an Agg canvas attached directly, so
no display, no pyplot state and no global backend switch is involved; each figure is released
after saving.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from edgesplit.errors import ConfigError

__all__ = ["plot_assignment", "plot_cut_breakdown", "plot_l2s", "plot_l2s_curves",
           "plot_link_sweep", "plot_train_split", "plot_pareto", "plot_profile", "short_layer_name"]

DPI = 120
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]
_DASHES = ["-", "--", "-.", ":"]
_MAX_TICK_LABELS = 40


def short_layer_name(name: str | None, parts: int = 2) -> str:
    """The last ``parts`` dotted components of a layer name; ``"input"`` for ``None``."""
    if name is None:
        return "input"
    return ".".join(name.split(".")[-parts:])


def _unique_short_names(names: Sequence[str | None]) -> list[str]:
    """:func:`short_layer_name` of each name, with more components kept for names whose two
    last components collide (``stages.0.layers.1.add`` and ``stages.1.layers.1.add``)."""
    parts = {name: 2 for name in names}
    while True:
        labels = {name: short_layer_name(name, parts[name]) for name in names}
        seen: dict[str, list[str | None]] = {}
        for name, label in labels.items():
            seen.setdefault(label, []).append(name)
        grow = [name for group in seen.values() if len(group) > 1 for name in group
                if name is not None and parts[name] < len(name.split("."))]
        if not grow:
            return [labels[name] for name in names]
        for name in grow:
            parts[name] += 1


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=DPI, format="png")
    finally:
        fig.clear()  # the figure is not registered with pyplot; dropping its artists frees it
    return out


def _finite_positive(value: Any) -> float:
    """``value`` as a float, NaN where it cannot be drawn on a log axis."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) and v > 0 else math.nan


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


def _thinned_ticks(n: int, keep: Iterable[int]) -> list[int]:
    """About ``_MAX_TICK_LABELS`` evenly spaced tick positions, plus the ends and ``keep``
    (regular ticks too close to a kept one are dropped so labels do not collide)."""
    step = max(1, math.ceil(n / _MAX_TICK_LABELS))
    kept = {0, n - 1} | {k for k in keep if 0 <= k < n}
    gap = max(1, (step + 1) // 2)
    regular = {t for t in range(0, n, step) if all(t == k or abs(t - k) >= gap for k in kept)}
    return sorted(regular | kept)


def _bytes_scale(max_bytes: float) -> tuple[float, str]:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= scale:
            return float(scale), unit
    return 1.0, "B"


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
    link = [float(r["transfer_ms"]) + float(r.get("rtt_ms", 0.0)) for r in rows]
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
           label="transfer + RTT")
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


def _shorten(text: str, limit: int = 42) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def _error(stats: dict[str, float]) -> tuple[float, float]:
    median = float(stats["median"])
    low = max(0.0, median - float(stats.get("p10", median)))
    high = max(0.0, float(stats.get("p90", median)) - median)
    return low, high


def plot_profile(profile: dict[str, Any], path: str | Path, *, top: int = 30) -> Path:
    """Horizontal bars of the ``top`` slowest layers of a profile document: PyTorch eager
    median with p10-p90 whiskers, ONNX Runtime median beside it when measured."""
    if top < 1:
        raise ConfigError(f"top must be at least 1, got {top}")
    layers = profile.get("layers") or []
    if not layers:
        raise ConfigError("the profile has no layers to plot")
    rows = sorted(layers, key=lambda r: -float(r["eager_ms"]["median"]))[:top]
    k = len(rows)
    has_onnx = any(r.get("onnx_ms") for r in rows)

    fig = _new_figure(9.0, min(max(3.0, 0.32 * k + 1.6), 30.0))
    ax = fig.subplots()
    ys = list(range(k))
    height = 0.4 if has_onnx else 0.7
    offset = height / 2 if has_onnx else 0.0
    eager = [float(r["eager_ms"]["median"]) for r in rows]
    eager_err = [_error(r["eager_ms"]) for r in rows]
    ax.barh([y - offset for y in ys], eager, height,
            xerr=[[e[0] for e in eager_err], [e[1] for e in eager_err]],
            color="#4c72b0", error_kw={"elinewidth": 0.9, "capsize": 2, "ecolor": "0.2"},
            label="PyTorch eager (median, p10-p90)")
    if has_onnx:
        onnx_y = [y + offset for y, r in zip(ys, rows, strict=True) if r.get("onnx_ms")]
        onnx = [float(r["onnx_ms"]["median"]) for r in rows if r.get("onnx_ms")]
        onnx_err = [_error(r["onnx_ms"]) for r in rows if r.get("onnx_ms")]
        ax.barh(onnx_y, onnx, height,
                xerr=[[e[0] for e in onnx_err], [e[1] for e in onnx_err]],
                color="#dd8452", error_kw={"elinewidth": 0.9, "capsize": 2, "ecolor": "0.2"},
                label="ONNX Runtime (median, p10-p90)")
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{_shorten(str(r['name']))} [{r.get('op', '?')}]" for r in rows],
                       fontsize="small")
    ax.invert_yaxis()  # slowest on top
    ax.set_xlabel("latency per layer (ms)")
    ax.set_xlim(left=0)
    ax.grid(True, axis="x", alpha=0.4)
    ax.set_axisbelow(True)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, fontsize="small",
              frameon=False, borderaxespad=0.2)

    model = profile.get("model", "model")
    title = f"{model}: slowest {k} of {len(layers)} layers"
    whole = (profile.get("whole_model") or {}).get("eager_ms")
    if whole and "median" in whole:
        title += f" (whole model {float(whole['median']):.3g} ms eager)"
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
    g = nx.DiGraph()
    g.add_nodes_from(devices)
    g.add_edges_from((l.src, l.dst) for l in plan.links if l.src in devices and l.dst in devices)
    levels = list(nx.topological_generations(g)) if nx.is_directed_acyclic_graph(g) \
        else [[n] for n in devices]
    where: dict[str, tuple[float, float]] = {}
    for x, level in enumerate(levels):
        for k, name in enumerate(sorted(level, key=list(devices).index)):
            where[name] = (x + 0.5, (k + 0.5) / len(level))
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
    measured = auto.quality is not None
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
        if q is None and any(layer.w_bits for layer in plan.layers):
            continue  # a quantized plan whose accuracy was not measured has no place here
        ax.scatter([x], [plan.predicted.total_ms / base], marker=_MARKERS[(i + 1) % len(_MARKERS)],
                   color=_COLORS[(i + 1) % len(_COLORS)], s=46, zorder=4, label=name)
    chosen_x = auto.quality.drop if measured else auto_distortion(auto)
    ax.scatter([chosen_x], [auto.predicted.total_ms / base], marker="*", s=220, color="#d6336c",
               edgecolor="black", zorder=5, label="AUTO-SPLIT choice")
    ax.set_xscale("symlog", linthresh=0.1 if measured else 1e-4)
    ax.set_xlabel("accuracy drop (percentage points)" if measured
                  else "total distortion (sum of weight and activation MSE; accuracy not measured)")
    ax.set_ylabel("end-to-end latency / cloud-only")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or "AUTO-SPLIT: latency vs accuracy", fontsize=10)
    return _save(fig, path)


def auto_distortion(plan: Any) -> float:
    """The chosen AUTO-SPLIT plan's total distortion (its entry among the candidates)."""
    return next((alt.distortion for alt in plan.alternatives if alt.chosen), 0.0)


def plot_l2s(doc: dict[str, Any], path: str | Path, *, window: int = 20) -> Path:
    """L2S Figs. 10, 11 and 17: per-round delay (moving average over ``window`` rounds) with
    the bandwidth, the chosen partition of every policy, and the learners' relative error in
    predicting the edge delay, from :func:`edgesplit.train.l2s.compare_policies`."""
    policies = doc.get("policies") or {}
    if not policies:
        raise ConfigError("the simulation has no policies to plot")
    fig = _new_figure(9.0, 8.4)
    ax_delay, ax_part, ax_err = fig.subplots(3, 1, sharex=True, height_ratios=[3, 2, 2])
    for i, (name, run) in enumerate(policies.items()):
        if run.get("prediction_error"):  # Fig. 10
            r, err = _moving_mean(run["prediction_error"], 5)
            ax_err.plot(r, err, color=_COLORS[i % len(_COLORS)], linewidth=1.0)
        delays = [float(d) for d in run["delays_ms"]]
        k = max(1, min(window, len(delays)))
        smooth = np.convolve(delays, np.full(k, 1.0 / k), mode="valid")
        rounds = range(k, len(delays) + 1)
        color = _COLORS[i % len(_COLORS)]
        ax_delay.plot(list(rounds), smooth, color=color, label=name, linewidth=1.4)
        ax_part.step(range(1, len(delays) + 1), run["partitions"], where="post", color=color,
                     linewidth=1.0)
    trace = doc.get("trace", {})
    speeds = trace.get("mbps_per_round")
    if speeds:  # Fig. 17: the network speed next to the delay
        ax_speed = ax_delay.twinx()
        ax_speed.step(range(1, len(speeds) + 1), speeds, where="post", color="black",
                      linestyle=":", linewidth=1.2, label="bandwidth")
        ax_speed.set_ylabel("bandwidth, Mbps")
        ax_speed.set_ylim(0, max(speeds) * 1.15)
    for entry in (policies.get("l2s") or {}).get("adaptations", [])[1:]:
        ax_part.axvline(entry["round"], color=_COLORS[4], linewidth=0.8, alpha=0.6)
    for ax in (ax_delay, ax_part, ax_err):
        ax.grid(True, alpha=0.3)
    ax_delay.set_yscale("log")
    ax_err.set_yscale("log")
    ax_delay.set_ylabel(f"delay per round, ms ({window}-round mean)")
    ax_part.set_ylabel("layers on the device")
    ax_err.set_ylabel("edge-delay prediction\nerror (5 offloads)")
    ax_err.set_xlabel("training round (vertical lines: L2S re-enters adaptation)")
    ax_delay.legend(fontsize=8, loc="upper left")
    drop = trace.get("drop_at")
    ax_delay.set_title(f"{doc.get('model')}: {doc.get('device')} -> {doc.get('server')}, "
                       f"{trace.get('mbps')} Mbps"
                       + (f" -> {trace.get('drop_to')} Mbps at round {drop}" if drop else "")
                       + (f", back at {trace['restore_at']}" if trace.get("restore_at") else ""),
                       fontsize=10)
    return _save(fig, path)


def plot_l2s_curves(series: dict[str, list[float | None]], path: str | Path, *, ylabel: str,
                    title: str, window: int = 10, log: bool = False,
                    reference: dict[str, list[float]] | None = None) -> Path:
    """L2S Figs. 10 and 11: one curve per label over training rounds, a ``window``-round mean
    (rounds without a value, None, are skipped). ``reference`` curves (e.g. the Oracle's)
    are drawn dashed in the same colour as the label they belong to."""
    if not series:
        raise ConfigError("nothing to plot")
    fig = _new_figure(8.0, 4.4)
    ax = fig.subplots()
    for i, (label, values) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        rounds, smooth = _moving_mean(values, window)
        ax.plot(rounds, smooth, color=color, label=label, linewidth=1.4)
        if reference and label in reference:
            r_rounds, r_smooth = _moving_mean(reference[label], window)
            ax.plot(r_rounds, r_smooth, color=color, linestyle="--", linewidth=1.0)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("training round")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _moving_mean(values: list[float | None], window: int) -> tuple[list[int], list[float]]:
    """(round, mean of the last ``window`` values that exist) at every round with a value."""
    rounds, out, recent = [], [], []
    for t, v in enumerate(values, start=1):
        if v is None:
            continue
        recent = (recent + [float(v)])[-window:]
        rounds.append(t)
        out.append(sum(recent) / len(recent))
    return rounds, out


def plot_train_split(doc: dict[str, Any], path: str | Path, *, window: int = 5) -> Path:
    """A real split-training run (``edgesplit train-split``): measured delay per round with
    the emulated bandwidth, the cut L2S chose, and the training loss."""
    rounds = doc["rounds"]
    delays = rounds["delays_ms"]
    if not delays:
        raise ConfigError("the run has no rounds to plot")
    fig = _new_figure(9.0, 7.0)
    ax_delay, ax_cut, ax_loss = fig.subplots(3, 1, sharex=True, height_ratios=[3, 2, 2])
    t = list(range(1, len(delays) + 1))
    ax_delay.plot(t, delays, color=_COLORS[0], alpha=0.3, linewidth=0.8)
    r, smooth = _moving_mean(delays, window)
    ax_delay.plot(r, smooth, color=_COLORS[0], linewidth=1.5, label=f"{window}-round mean")
    ax_speed = ax_delay.twinx()
    ax_speed.step(t, rounds["bandwidth_mbps"], where="post", color="black", linestyle=":",
                  linewidth=1.2)
    ax_speed.set_ylabel("emulated bandwidth, Mbps (dotted)")
    ax_speed.set_ylim(0, max(b or 0 for b in rounds["bandwidth_mbps"]) * 1.15 or 1)
    ax_cut.step(t, rounds["partitions"], where="post", color=_COLORS[1])
    for entry in doc.get("adaptations", [])[1:]:
        ax_cut.axvline(entry["round"], color=_COLORS[4], linewidth=0.8, alpha=0.6)
    ax_loss.plot(t, rounds["loss"], color=_COLORS[2], linewidth=0.9)
    ax_delay.set_ylabel("delay per round, ms")
    ax_cut.set_ylabel("cut (last device\nelement)")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_xlabel("training round (vertical lines: L2S re-enters adaptation)")
    for ax in (ax_delay, ax_cut, ax_loss):
        ax.grid(True, alpha=0.3)
    title = f"{doc['config']['model']}: split training, held-out accuracy {doc['accuracy']:.1f} %"
    if "baseline_accuracy" in doc:
        title += f" (unsplit {doc['baseline_accuracy']:.1f} %)"
    ax_delay.set_title(title, fontsize=10)
    ax_delay.legend(fontsize=8, loc="upper left")
    return _save(fig, path)
