"""What every figure shares: an Agg-canvas Figure without pyplot, saving to PNG, colours,
markers and label shortening. Private to ``edgesplit.report.plots``.

Figures are built on :class:`matplotlib.figure.Figure` with an Agg canvas attached directly, so
no display, no pyplot state and no global backend switch is involved; each figure is released
after saving.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["DPI", "short_layer_name"]

DPI = 120
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]
_DASHES: list[Literal["-", "--", "-.", ":"]] = ["-", "--", "-.", ":"]
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


def _shorten(text: str, limit: int = 42) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1):]
