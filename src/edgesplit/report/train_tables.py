"""Tables of split training: the L2S simulator's policies and a real run's bandwidth segments."""

from __future__ import annotations

from typing import Any

from rich.table import Table

__all__ = ["l2s_policies_table", "train_split_summary", "train_split_table"]


def l2s_policies_table(doc: dict[str, Any], title: str) -> Table:
    """One row per policy of ``compare_policies``: mean delay, the last fifth, where it ended."""
    table = Table(title=title)
    for col in ("policy", "mean delay ms", "last 20 % ms", "final partition", "sync MB"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, run in doc["policies"].items():
        tail = run["delays_ms"][-max(1, len(run["delays_ms"]) // 5):]
        table.add_row(name, f"{run['mean_delay_ms']:.1f}", f"{sum(tail) / len(tail):.1f}",
                      str(run["partitions"][-1]), f"{sum(run['sync_bytes']) / 1e6:.1f}")
    return table


def train_split_table(doc: dict[str, Any]) -> Table:
    """A real run (``train_split``) by bandwidth segment: cuts played, delay, loss."""
    rounds, cfg = doc["rounds"], doc["config"]
    table = Table(title=f"split training of {cfg['model']}: cuts {doc['cuts'][0]}.."
                        f"{doc['cuts'][-1]} allowed (privacy), sync {cfg['sync']}")
    for col in ("rounds", "Mbps", "cuts played (count)", "mean delay ms", "mean loss"):
        table.add_column(col, justify="left" if col.startswith("cuts") else "right")
    for lo, hi in _segments(rounds["bandwidth_mbps"], len(rounds["delays_ms"])):
        played: dict[int, int] = {}
        for c in rounds["partitions"][lo:hi]:
            played[c] = played.get(c, 0) + 1
        table.add_row(f"{lo + 1}-{hi}", f"{rounds['bandwidth_mbps'][lo]:g}",
                      ", ".join(f"{c} ({n})" for c, n in sorted(played.items())),
                      f"{sum(rounds['delays_ms'][lo:hi]) / (hi - lo):.1f}",
                      f"{sum(rounds['loss'][lo:hi]) / (hi - lo):.3f}")
    return table


def train_split_summary(doc: dict[str, Any]) -> list[str]:
    """The lines under the table: held-out accuracy against unsplit training, adaptations."""
    line = f"held-out accuracy {doc['accuracy']:.2f} % on {doc['test_samples']} digits"
    if "baseline_accuracy" in doc:
        line += f" (unsplit training: {doc['baseline_accuracy']:.2f} %)"
    lines = [line]
    if doc["adaptations"]:
        lines.append("adaptation phases began at rounds "
                     + ", ".join(f"{a['round']} ({a['reason']})" for a in doc["adaptations"])
                     + "; settled at "
                     + ", ".join(f"round {s['round']} on cut {s['cut']}" for s in doc["settled"]))
    return lines


def _segments(mbps: list, n: int, size: int = 25) -> list[tuple[int, int]]:
    """Row ranges: a new row at every bandwidth change and every ``size`` rounds."""
    bounds, lo = [], 0
    for t in range(1, n + 1):
        if t == n or mbps[t] != mbps[lo] or t - lo == size:
            bounds.append((lo, t))
            lo = t
    return bounds
