"""Figures of AdaptiveNet: search efficiency (the paper's Fig. 12: best accuracy against
subnets evaluated, one curve per search method) and switching under load (Fig. 13: each
request's latency over time, the subnet serving it, the budget and the load).

Labels are the tables' names: a method by its key in the runs, a subnet by its branches
joined with "-" (as the switching and search tables and the benchmark's markdown write it),
the budget and target with their values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import _COLORS, _MARKERS, _new_figure, _save

__all__ = ["plot_search_efficiency", "plot_switching"]


def plot_search_efficiency(curves: Mapping[str, Sequence[Mapping[str, Any]]],
                           path: str | Path, *, target: float | None = None,
                           title: str = "") -> Path:
    """Best accuracy within the budget against subnets evaluated; ``curves`` maps a method
    (named as in the tables) to its steps (``evaluated``, ``best_accuracy``); ``target``
    dashed, its value in the legend."""
    if not curves:
        raise ConfigError("no search curves to plot")
    fig = _new_figure(7.5, 4.8)
    ax = fig.add_subplot()
    for i, (method, steps) in enumerate(curves.items()):
        points = [(s["evaluated"], s["best_accuracy"]) for s in steps
                  if s.get("best_accuracy") is not None]
        if points:
            ax.step([p[0] for p in points], [p[1] for p in points], where="post",
                    color=_COLORS[i % len(_COLORS)], label=method)
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=10,
                       color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)])
    if target is not None:
        ax.axhline(target, color="0.4", linestyle="--", linewidth=1,
                   label=f"target {target:.4g}")
    ax.set_xlabel("subnets evaluated")
    ax.set_ylabel("best accuracy within the budget")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "search efficiency", fontsize=10)
    return _save(fig, path)


def plot_switching(doc: Mapping[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Each request's latency against time, coloured by the pool subnet serving it (named by
    its branches, as the switching table names it), with the budget, the load period shaded
    and the switches marked (a ``serve_pool`` document)."""
    records = doc.get("records") or []
    if not records:
        raise ConfigError("no requests to plot")
    order = {tuple(e["arch"]): i for i, e in enumerate(doc["pool"])}
    fig = _new_figure(9.0, 4.8)
    ax = fig.add_subplot()
    if doc.get("load") == "cpu" and doc.get("processes"):
        load = f"load: {doc['processes']} background processes"
    elif doc.get("factor"):
        load = f"load: a {doc['factor']}x slowdown"
    else:
        load = "load"
    ax.axvspan(doc["load_on_s"], doc["load_off_s"], color="0.9", label=load)
    for arch, index in order.items():
        mine = [r for r in records if tuple(r["arch"]) == arch]
        if mine:
            ax.scatter([r["start_s"] for r in mine], [r["latency_ms"] for r in mine], s=6,
                       color=_COLORS[index % len(_COLORS)],
                       label=f"{'-'.join(arch)} ({len(mine)} requests)")
    events = doc.get("events") or []
    for i, event in enumerate(events):
        ax.axvline(event["time_s"], color="0.3", linewidth=0.8, linestyle=":",
                   label=f"switches ({len(events)})" if i == 0 else None)
    ax.axhline(doc["budget_ms"], color="black", linestyle="--", linewidth=1,
               label=f"budget {doc['budget_ms']:.3g} ms")
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("request latency (ms, log)")
    ax.grid(True, alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3,
               fontsize=7)  # below the axes: the requests fill the whole plot
    ax.set_title(title or "switching under load", fontsize=10)
    return _save(fig, path)
