"""Figures of measured hardware: per-layer profiles and estimator error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import _new_figure, _save, _shorten

__all__ = ["plot_profile"]


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
