"""Figures of split LLM generation: each placement method's measured decode tokens/s and time
to first token next to its plan's prediction (``benchmarks/bench_llm.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import _COLORS, _new_figure, _save

__all__ = ["plot_llm_methods"]

_PANELS = (("tokens_per_s", "decode tokens/s", "higher is better"),
           ("ttft_ms", "time to first token, ms", "lower is better"))


def plot_llm_methods(methods: Mapping[str, Mapping[str, Any]], path: str | Path, *,
                     title: str = "") -> Path:
    """Two panels (tokens/s, TTFT): a bar per method for the measured value and a marker for
    the plan's; ``methods`` maps a method to its ``tokens_per_s``, ``ttft_ms`` and
    ``predicted`` (the same keys)."""
    if not methods:
        raise ConfigError("no methods to plot")
    names = list(methods)
    fig = _new_figure(9.0, 4.0)
    for k, (key, label, hint) in enumerate(_PANELS):
        ax = fig.add_subplot(1, 2, k + 1)
        measured = [float(methods[n][key] or 0.0) for n in names]
        predicted = [float(methods[n]["predicted"][key] or 0.0) for n in names]
        xs = range(len(names))
        ax.bar(xs, measured, color=[_COLORS[i % len(_COLORS)] for i in xs], alpha=0.8,
               label="measured")
        ax.scatter(xs, predicted, color="black", marker="_", s=400, zorder=3, label="plan")
        for x, value in zip(xs, measured, strict=True):  # inside the bar: clear of the marker
            ax.annotate(f"{value:.1f}", (x, value / 2), ha="center", va="center", fontsize=8)
        ax.set_xticks(list(xs), [n.replace("_", "\n") for n in names], fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(hint, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        if k == 0:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)
