"""Tables of AdaptiveNet runs: elastification and training, the on-device search, and the
switching of the running subnet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from edgesplit.report.format import human_count

__all__ = ["elastify_table", "indicator_table"]


def elastify_table(doc: Mapping[str, Any]) -> Table:
    """What elastification made (blocks, branches, subnets) and the training per epoch."""
    training = doc["training"]
    branches = doc["branches"]
    table = Table(title=f"AdaptiveNet supernet of {doc['model']}: {doc['blocks']} blocks, "
                        f"{branches['merged']} merged + {branches['shrunk']} shrunk branches, "
                        f"{human_count(doc['subnets'])} subnets; trained on "
                        f"{training['data']} ({training['task']}) in "
                        f"{training['seconds']:.0f} s")
    for name in ("phase", "epoch", "loss", "seconds"):
        table.add_column(name, justify="left" if name == "phase" else "right")
    for row in training["history"]:
        table.add_row(row["phase"], str(row["epoch"] + 1), f"{row['loss']:.4f}",
                      f"{row['seconds']:.1f}")
    table.caption = (f"pretrained {human_count(doc['params'])} parameters (frozen), added "
                     f"{human_count(doc['added_params'])}")
    return table


def indicator_table(before: list[Mapping[str, Any]], after: list[Mapping[str, Any]],
                    metric: str) -> Table:
    """The latency-range accuracy (mean over random subnets per range of relative cost),
    before and after training."""
    table = Table(title=f"Latency-range accuracy ({metric} on the search data)")
    for name in ("relative MACs", "subnets", "before", "after"):
        table.add_column(name, justify="right")
    earlier = {(round(r["low"], 6), round(r["high"], 6)): r for r in before}
    for row in after:
        old = earlier.get((round(row["low"], 6), round(row["high"], 6)))
        table.add_row(f"{row['low']:.2f}-{row['high']:.2f}", str(row["count"]),
                      f"{old['accuracy']:.3f}" if old else "-", f"{row['accuracy']:.3f}")
    return table
