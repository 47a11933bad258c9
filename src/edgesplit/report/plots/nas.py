"""Figures of architecture searches: JMSNAS's Fig. 5 (stage-1 accuracy and expected latency
per epoch, one curve per latency budget) and Fig. 6 (final accuracy against latency)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import _COLORS, _MARKERS, _new_figure, _save

__all__ = ["plot_accuracy_latency", "plot_search_front", "plot_search_progress"]


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
    for i, (label, run) in enumerate(runs.items()):
        history = run.get("history") or []
        if not history:
            raise ConfigError(f"run {label!r} has no history to plot")
        color = _COLORS[i % len(_COLORS)]
        epochs = [h["epoch"] + 1 for h in history]
        warmup = max(warmup, sum(h["phase"] == "warm-up" for h in history))
        ax_acc.plot(epochs, [h["accuracy"] for h in history], color=color, marker="o",
                    markersize=3, label=label)
        ax_lat.plot(epochs, [h["expected_ms"] for h in history], color=color, label=label)
        ax_lat.axhline(run["latency_budget_ms"], color=color, linestyle="--", linewidth=0.9)
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
    mapping with ``method``, ``latency_ms``, ``accuracy`` and optionally ``label``."""
    if not points:
        raise ConfigError("no points to plot")
    fig = _new_figure(7.5, 5.0)
    ax = fig.add_subplot()
    methods = list(dict.fromkeys(str(p["method"]) for p in points))
    for i, method in enumerate(methods):
        mine = [p for p in points if p["method"] == method]
        ax.scatter([p["latency_ms"] for p in mine], [p["accuracy"] for p in mine],
                   color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)],
                   label=method, zorder=3)
        for p in mine:
            if p.get("label"):
                ax.annotate(str(p["label"]), (p["latency_ms"], p["accuracy"]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("held-out top-1 (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "accuracy vs latency (JMSNAS Fig. 6)", fontsize=10)
    return _save(fig, path)


def plot_search_front(candidates: Sequence[Mapping[str, Any]], front: Sequence[Mapping[str, Any]],
                      path: str | Path, *, baselines: Sequence[Mapping[str, Any]] = (),
                      title: str = "", searched_on: str = "validation",
                      xlabel: str = "latency T_sen + T_comm + T_agg (ms, log)",
                      ylabel: str = "top-1 (%)") -> Path:
    """Accuracy against latency of every candidate an evolutionary search evaluated (grey),
    its Pareto front (a line), both as the search scored them (``searched_on``), and optional
    points measured elsewhere (``method``, ``latency_ms``, ``accuracy``, ``label``: baselines
    and the saved networks on held-out data), as SplitNets' Tables 4-6 compare them."""
    if not candidates:
        raise ConfigError("no candidates to plot")
    fig = _new_figure(7.5, 5.0)
    ax = fig.add_subplot()
    ax.scatter([c["latency_ms"] for c in candidates], [c["accuracy"] for c in candidates],
               s=10, color="0.7", label=f"candidates ({len(candidates)}, {searched_on})",
               zorder=2)
    ax.plot([c["latency_ms"] for c in front], [c["accuracy"] for c in front],
            color=_COLORS[0], marker="o", markersize=4, label=f"front ({searched_on})", zorder=3)
    methods = list(dict.fromkeys(str(b["method"]) for b in baselines))
    for i, method in enumerate(methods, start=1):
        mine = [b for b in baselines if b["method"] == method]
        ax.scatter([b["latency_ms"] for b in mine], [b["accuracy"] for b in mine],
                   color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)],
                   label=method, zorder=4)
        for b in mine:
            if b.get("label"):
                ax.annotate(str(b["label"]), (b["latency_ms"], b["accuracy"]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "accuracy vs latency", fontsize=10)
    return _save(fig, path)
