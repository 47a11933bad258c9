"""Figures of architecture searches: JMSNAS's Fig. 5 (stage-1 accuracy and expected latency
per epoch, one curve per latency budget), Fig. 6 (final accuracy against latency) and the
accuracy/latency front of an evolutionary search (SplitNets, AdaptiveNet).

Every drawable point stays inside the axes (the limits are set from the data, with room for
the labels), series that land on the same point are drawn as concentric markers so none hides
another, and points that cannot be drawn (no value) are named under the axis."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import (
    _COLORS,
    _MARKERS,
    _bytes_scale,
    _new_figure,
    _save,
)

__all__ = ["plot_accuracy_latency", "plot_search_front", "plot_search_progress"]

_MARKER_PT = 6.0  # marker diameter in points (scatter's default size is 36 pt^2)
_LABEL_ROOM = 0.08  # extra top margin (fraction of the span) where points carry labels


def _value(x: Any) -> float:
    """``x`` as a float, NaN where it is missing or not finite."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _drawable(p: Mapping[str, Any], log_x: bool = False) -> bool:
    x, y = _value(p.get("latency_ms")), _value(p.get("accuracy"))
    return not (math.isnan(x) or math.isnan(y) or (log_x and x <= 0))


def _key(x: float, y: float) -> tuple[float, float]:
    return float(f"{x:.9g}"), float(f"{y:.9g}")


def _stacked_sizes(series: Sequence[Sequence[Mapping[str, Any]]]
                   ) -> tuple[list[list[float]], dict[tuple[float, float], int]]:
    """Scatter sizes (pt^2) for each point of each series, drawn in this order: where several
    points share a position the first drawn is the largest and each later one smaller, so all
    of them show as concentric markers. Also the positions shared by more than one point."""
    keys = [[_key(_value(p["latency_ms"]), _value(p["accuracy"])) for p in s] for s in series]
    total = Counter(k for row in keys for k in row)
    seen: Counter[tuple[float, float]] = Counter()
    sizes = []
    for row in keys:
        out = []
        for k in row:
            above = total[k] - 1 - seen[k]  # points still to be drawn on top of this one
            seen[k] += 1
            out.append((_MARKER_PT * (1 + 0.6 * above)) ** 2)
        sizes.append(out)
    return sizes, {k: n for k, n in total.items() if n > 1}


def _span(lo: float, hi: float, log: bool, low_pad: float, high_pad: float
          ) -> tuple[float, float]:
    if log:
        a, b = _span(math.log10(lo), math.log10(hi), False, low_pad, high_pad)
        return 10 ** a, 10 ** b
    width = hi - lo or (abs(hi) * 0.1 or 1.0)
    return lo - low_pad * width, hi + high_pad * width


def _show_all(ax: Axes, xs: Sequence[float], ys: Sequence[float], *, log_x: bool = False,
              labels: bool = False) -> None:
    """Axis limits that hold every finite point (``xs``/``ys``) with a margin, and room above
    for point labels."""
    fx = [x for x in xs if not math.isnan(x) and (x > 0 or not log_x)]
    fy = [y for y in ys if not math.isnan(y)]
    if fx:
        ax.set_xlim(*_span(min(fx), max(fx), log_x, 0.05, 0.05))
    if fy:
        ax.set_ylim(*_span(min(fy), max(fy), False, 0.05, 0.05 + (_LABEL_ROOM if labels else 0)))


def _annotate(ax: Axes, text: str, x: float, y: float, **kw: Any) -> None:
    """A point's label, to its right, or to its left in the right quarter of the axes (so it
    stays inside them)."""
    lo, hi = ax.get_xlim()
    if ax.get_xscale() == "log":
        frac = math.log10(x / lo) / math.log10(hi / lo)
    else:
        frac = (x - lo) / (hi - lo)
    left = frac > 0.75
    ax.annotate(text, (x, y), xytext=(-6 if left else 4, 4), textcoords="offset points",
                ha="right" if left else "left", fontsize=7, **kw)


def _mark_coincident(ax: Axes, shared: Mapping[tuple[float, float], int]) -> None:
    """Say how many points share a position, under its (stacked) markers."""
    for (x, y), n in shared.items():
        size = _MARKER_PT * (1 + 0.6 * (n - 1))
        ax.annotate(f"{n} at one point", (x, y), xytext=(0, -size / 2 - 2),
                    textcoords="offset points", ha="center", va="top", fontsize=7,
                    color="0.35")


def _legend(owner: Axes | Figure, *args: Any, **kw: Any) -> None:
    """The legend (of an axes, or of the figure), its scatter markers no larger than one
    plain marker whatever their (stacked) size in the plot."""
    legend = owner.legend(*args, **kw)
    for handle in legend.legend_handles:
        if isinstance(handle, PathCollection) and len(handle.get_sizes()):
            handle.set_sizes([min(_MARKER_PT ** 2, float(max(handle.get_sizes())))])


def _not_drawn(points: Sequence[Mapping[str, Any]], log_x: bool = False) -> str:
    """The methods of points with no value to draw, for a line under the axis."""
    missing = list(dict.fromkeys(str(p.get("method", "?")) for p in points
                                 if not _drawable(p, log_x)))
    return "\nnot drawn (no value): " + ", ".join(missing) if missing else ""


def plot_search_progress(runs: Mapping[str, Mapping[str, Any]], path: str | Path, *,
                         title: str = "") -> Path:
    """Fig. 5: for each run (label -> a JMSNAS summary with ``history`` and
    ``latency_budget_ms``), the derived network's accuracy and the expected latency E[T] per
    epoch, the budget dashed; warm-up epochs shaded."""
    if not runs:
        raise ConfigError("no search runs to plot")
    fig = _new_figure(9.0, 6.4)
    ax_acc, ax_lat = fig.subplots(2, 1, sharex=True)
    warmup = 0
    accs: list[float] = []
    lats: list[float] = []
    for i, (label, run) in enumerate(runs.items()):
        history = run.get("history") or []
        if not history:
            raise ConfigError(f"run {label!r} has no history to plot")
        color = _COLORS[i % len(_COLORS)]
        epochs = [h["epoch"] + 1 for h in history]
        warmup = max(warmup, sum(h["phase"] == "warm-up" for h in history))
        acc = [_value(h["accuracy"]) for h in history]
        lat = [_value(h["expected_ms"]) for h in history]
        ax_acc.plot(epochs, acc, color=color, marker="o", markersize=3, label=label)
        ax_lat.plot(epochs, lat, color=color, label=label)
        budget = _value(run["latency_budget_ms"])
        if not math.isnan(budget):
            ax_lat.axhline(budget, color=color, linestyle="--", linewidth=0.9)
        accs += acc
        lats += [*lat, budget]
    _show_all(ax_acc, [], accs)
    _show_all(ax_lat, [], lats)
    for ax in (ax_acc, ax_lat):
        if warmup:
            ax.axvspan(0.5, warmup + 0.5, color="0.9", zorder=0)
        ax.grid(True, alpha=0.3)
    ax_acc.set_ylabel("top-1 of the derived network (%)")
    ax_lat.set_ylabel("expected latency E[T] (ms)")
    ax_lat.set_xlabel("epoch (shaded: warm-up; dashed: T_const)")
    ax_acc.legend(fontsize=8)
    ax_acc.set_title(title or "JMSNAS stage 1 (Fig. 5)", fontsize=10)
    return _save(fig, path)


def plot_accuracy_latency(points: Sequence[Mapping[str, Any]], path: str | Path, *,
                          title: str = "") -> Path:
    """Fig. 6: final accuracy against latency, one marker per (method, point); each point a
    mapping with ``method``, ``latency_ms``, ``accuracy`` and optionally ``label``. Methods
    at the same point are drawn as concentric markers; every point is inside the axes."""
    if not points:
        raise ConfigError("no points to plot")
    fig = _new_figure(7.5, 5.0)
    ax = fig.add_subplot()
    methods = list(dict.fromkeys(str(p["method"]) for p in points))
    series = [[p for p in points if str(p["method"]) == m and _drawable(p)] for m in methods]
    sizes, shared = _stacked_sizes(series)
    for i, (method, mine, size) in enumerate(zip(methods, series, sizes, strict=True)):
        if not mine:
            continue  # nothing to draw: named under the axis
        ax.scatter([_value(p["latency_ms"]) for p in mine], [_value(p["accuracy"]) for p in mine],
                   s=size, color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)],
                   label=method, zorder=3)
    drawn = [p for s in series for p in s]
    _show_all(ax, [_value(p["latency_ms"]) for p in drawn],
              [_value(p["accuracy"]) for p in drawn], labels=any(p.get("label") for p in drawn))
    for p in drawn:
        if p.get("label"):
            _annotate(ax, str(p["label"]), _value(p["latency_ms"]), _value(p["accuracy"]))
    _mark_coincident(ax, shared)
    ax.set_xlabel("latency (ms)" + _not_drawn(points))
    ax.set_ylabel("held-out top-1 (%)")
    ax.grid(True, alpha=0.3)
    _legend(ax, fontsize=8)
    ax.set_title(title or "accuracy vs latency (JMSNAS Fig. 6)", fontsize=10)
    return _save(fig, path)


def _infeasible(p: Mapping[str, Any], limit: float | None) -> bool:
    """Over the sensor memory: ``fits`` is False, or ``sensor_memory_bytes`` exceeds
    ``limit``."""
    if p.get("fits") is False:
        return True
    memory = _value(p.get("sensor_memory_bytes"))
    return limit is not None and not math.isnan(memory) and memory > limit


def plot_search_front(candidates: Sequence[Mapping[str, Any]], front: Sequence[Mapping[str, Any]],
                      path: str | Path, *, baselines: Sequence[Mapping[str, Any]] = (),
                      title: str = "", searched_on: str = "validation",
                      xlabel: str = "latency T_sen + T_comm + T_agg (ms, log)",
                      ylabel: str = "top-1 (%)", memory_limit_bytes: float | None = None,
                      rejected: int | None = None) -> Path:
    """Accuracy against latency of every candidate an evolutionary search evaluated (grey),
    its Pareto front (a line), both as the search scored them (``searched_on``), and optional
    points measured elsewhere (``method``, ``latency_ms``, ``accuracy``, ``label``: baselines
    and the saved networks on held-out data), as SplitNets' Tables 4-6 compare them.

    Infeasible points, those over the sensor memory (``fits`` False, or ``sensor_memory_bytes``
    above ``memory_limit_bytes``), are drawn hollow (candidates as x) with their memory noted,
    under a legend entry of their own; ``rejected`` counts candidates the search drew over the
    limit and skipped (not evaluated, so not drawn)."""
    if not candidates:
        raise ConfigError("no candidates to plot")
    fig = _new_figure(7.5, 5.8)
    ax = fig.add_subplot()
    good = [c for c in candidates if _drawable(c, True) and not _infeasible(c, memory_limit_bytes)]
    over = [c for c in candidates if _drawable(c, True) and _infeasible(c, memory_limit_bytes)]
    ax.scatter([c["latency_ms"] for c in good], [c["accuracy"] for c in good],
               s=10, color="0.7", label=f"candidates ({len(candidates)}, {searched_on})",
               zorder=2)
    if over:
        ax.scatter([c["latency_ms"] for c in over], [c["accuracy"] for c in over], s=14,
                   color="0.45", marker="x", linewidths=0.8, zorder=2,
                   label=f"candidates over the sensor memory ({len(over)})")
    ax.plot([c["latency_ms"] for c in front], [c["accuracy"] for c in front],
            color=_COLORS[0], marker="o", markersize=4, label=f"front ({searched_on})", zorder=3)
    methods = list(dict.fromkeys(str(b["method"]) for b in baselines))
    series = [[b for b in baselines if str(b["method"]) == m and _drawable(b, True)]
              for m in methods]
    sizes, shared = _stacked_sizes(series)
    hollow = False
    for i, (method, mine, size) in enumerate(zip(methods, series, sizes, strict=True), start=1):
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        bad = [_infeasible(b, memory_limit_bytes) for b in mine]
        hollow |= any(bad)
        for infeasible in (False, True):
            pick = [j for j, flag in enumerate(bad) if flag is infeasible]
            if not pick:
                continue
            face: dict[str, Any] = ({"facecolors": "none", "edgecolors": color,
                                     "linewidths": 1.4} if infeasible else {"color": color})
            first = infeasible is False or all(bad)  # one legend entry per method
            ax.scatter([mine[j]["latency_ms"] for j in pick], [mine[j]["accuracy"] for j in pick],
                       s=[size[j] for j in pick], marker=marker, zorder=4,
                       label=method if first else None, **face)
    drawn = [*good, *over, *front, *(b for s in series for b in s)]
    labelled = [b for s in series for b in s
                if b.get("label") or _infeasible(b, memory_limit_bytes)]
    ax.set_xscale("log")
    _show_all(ax, [_value(p["latency_ms"]) for p in drawn], [_value(p["accuracy"]) for p in drawn],
              log_x=True, labels=bool(labelled))
    for b in labelled:
        text = str(b.get("label") or "")
        if _infeasible(b, memory_limit_bytes):
            text = ", ".join(t for t in (text, _memory_note(b, memory_limit_bytes)) if t)
        _annotate(ax, text, _value(b["latency_ms"]), _value(b["accuracy"]))
    _mark_coincident(ax, shared)
    handles, names = ax.get_legend_handles_labels()
    if hollow or over:
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none",
                              markeredgecolor="0.3", markersize=7))
        names.append("hollow: infeasible (over the "
                     f"{_memory(memory_limit_bytes) + ' ' if memory_limit_bytes else ''}"
                     "sensor memory)")
    if rejected:
        handles.append(Line2D([], [], linestyle="none"))
        names.append(f"{rejected} more drawn over the memory limit and skipped (not drawn)")
    ax.set_xlabel(xlabel + _not_drawn(baselines, log_x=True))
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    # below the axes: the candidates fill the plot, a legend inside would hide some
    _legend(fig, handles, names, loc="outside lower center", ncol=2, fontsize=8)
    ax.set_title(title or "accuracy vs latency", fontsize=10)
    return _save(fig, path)


def _memory(n: float) -> str:
    scale, unit = _bytes_scale(n)
    return f"{n / scale:.0f} {unit}"


def _memory_note(p: Mapping[str, Any], limit: float | None) -> str:
    memory = _value(p.get("sensor_memory_bytes"))
    if math.isnan(memory):
        return "over the sensor memory"
    return f"{_memory(memory)} > {_memory(limit)}" if limit else f"{_memory(memory)}, over"
