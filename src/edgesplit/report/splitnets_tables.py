"""Tables of SplitNets runs: supernet training per epoch, and the search's front."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

__all__ = ["splitnets_front_table", "splitnets_train_table"]


def splitnets_train_table(doc: Mapping[str, Any]) -> Table:
    """Mean loss per epoch of each sub-network kind the sampler trains, then the held-out
    accuracy of the bounds (Fig. 11's max / min, zero / all hot)."""
    history = doc.get("history") or []
    kinds = [k for k in (history[0] if history else {}) if k.startswith("loss/")]
    table = Table(title=f"SplitNets supernet: {doc.get('space', '')} on {doc['data']}, "
                        f"sampler {doc['sampler']}, init {doc['init']}, "
                        f"{doc['train_seconds']:.0f} s")
    table.add_column("epoch", justify="right")
    for k in kinds:
        table.add_column(k.removeprefix("loss/") + " loss", justify="right")
    for i, row in enumerate(history):
        table.add_row(str(i + 1), *(f"{row[k]:.3f}" for k in kinds))
    acc = doc.get("test_accuracy") or {}
    if acc:
        table.caption = "held-out top-1: " + ", ".join(f"{k} {v:.1f} %" for k, v in acc.items())
    return table


def splitnets_front_table(doc: Mapping[str, Any]) -> Table:
    """The accuracy/latency front of the search (best marked), eq. 1's terms and the sensor
    memory against the limit."""
    limit = doc.get("memory_limit_bytes")
    table = Table(title=f"SplitNets search on {doc['hardware']}: {doc['evaluated']} evaluated, "
                        f"{doc['rejected_by_memory']} over the sensor memory, "
                        f"{doc['search_seconds']:.1f} s")
    for name in ("", "val top-1 %", "T_sen ms", "T_comm ms", "T_agg ms", "total ms",
                 "sensor KiB", "architecture"):
        table.add_column(name, justify="left" if name in ("", "architecture") else "right")
    best = doc["best"]["describe"]
    for row in doc["front"]:
        memory = row["sensor_memory_bytes"] / 1024
        table.add_row("best" if row["describe"] == best else "", f"{row['accuracy']:.1f}",
                      f"{row['sensor_ms']:.4f}", f"{row['comm_ms']:.4f}",
                      f"{row['aggregator_ms']:.4f}", f"{row['latency_ms']:.4f}",
                      f"{memory:.0f}" + (f"/{limit / 1024:.0f}" if limit else ""),
                      row["describe"])
    results = doc.get("results") or {}
    if results:
        table.caption = "saved: " + ", ".join(
            f"{k} ({v['test_accuracy']:.1f} % held-out, plan {v['predicted_ms']:.4f} ms)"
            for k, v in results.items())
    return table
