"""Figures of serving at scale: requests/s by Ray Serve replicas against the local server
(``benchmarks/bench_ray.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import _COLORS, _MARKERS, _new_figure, _save

__all__ = ["plot_replica_scaling"]


def plot_replica_scaling(rows: Sequence[Mapping[str, Any]], path: str | Path, *,
                         title: str = "") -> Path:
    """Requests/s against replicas (``engine`` ray, ``replicas``), with the local server
    (``engine`` local) as a dashed level. Each row: ``engine``, ``replicas`` (None for
    local) and ``throughput_rps``."""
    ray = sorted((int(r["replicas"]), float(r["throughput_rps"])) for r in rows
                 if r["engine"] == "ray")
    if not ray:
        raise ConfigError("no Ray rows to plot")
    fig = _new_figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([n for n, _ in ray], [v for _, v in ray], marker=_MARKERS[0], color=_COLORS[0],
            label="Ray Serve replicas")
    for n, v in ray:
        ax.annotate(f"{v:.0f}", (n, v), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    for r in rows:
        if r["engine"] == "local":
            ax.axhline(float(r["throughput_rps"]), color=_COLORS[1], linestyle="--",
                       label=f"local server ({float(r['throughput_rps']):.0f})")
    ax.set_xticks([n for n, _ in ray])
    ax.set_xlabel("replicas")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)
