"""Tables of AdaptiveNet runs: elastification and training, the on-device search, and the
switching of the running subnet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from edgesplit.report.format import human_count

__all__ = ["elastify_table", "indicator_table", "search_table", "switching_table"]

# A task's score as a column names it: a cosine similarity shown as "acc" would read as a
# classifier's accuracy (kept here so rendering a saved document never imports torch)
_SHORT = {"labels": "acc", "agreement": "acc", "cosine": "cos"}
_LONG = {"labels": "accuracy", "agreement": "agreement", "cosine": "cosine similarity"}


def _short(task: str) -> str:
    return _SHORT.get(task, task)


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
    table = Table(title=f"Latency-range {_LONG.get(metric, metric)} ({metric} on the search "
                        "data)")
    for name in ("relative MACs", "subnets", "before", "after"):
        table.add_column(name, justify="right")
    earlier = {(round(r["low"], 6), round(r["high"], 6)): r for r in before}
    for row in after:
        old = earlier.get((round(row["low"], 6), round(row["high"], 6)))
        table.add_row(f"{row['low']:.2f}-{row['high']:.2f}", str(row["count"]),
                      f"{old['accuracy']:.3f}" if old else "-", f"{row['accuracy']:.3f}")
    return table


def _arch(arch: list[str]) -> str:
    return "-".join(arch)


def search_table(doc: Mapping[str, Any]) -> Table:
    """The pool (accuracy/latency front within the band) with the best and the pretrained
    model on held-out data, and what the prefix cache saved."""
    ev = doc["evaluation"]
    model = "joint edge-cloud plan" if doc["latency_model"] == "joint" else "block table"
    table = Table(title=f"AdaptiveNet search of {doc['model']}: budget {doc['budget_ms']:.4g} "
                        f"ms +- {doc['delta_ms']:.3g} ({model}), {doc['evaluated']} subnets "
                        f"evaluated in {doc['search_seconds']:.1f} s")
    score = _short(doc.get("metric", "labels"))
    for name in ("", "latency ms", f"search {score}", f"held-out {score}", "rel. MACs",
                 "subnet"):
        table.add_column(name, justify="left" if name in ("", "subnet") else "right")
    best = doc["best"]
    for entry in doc["pool"]:
        is_best = entry["arch"] == best["arch"]
        table.add_row("best" if is_best else "pool", f"{entry['latency_s'] * 1000:.4g}",
                      f"{entry['accuracy']:.3f}",
                      f"{best['test_accuracy']:.3f}" if is_best else "",
                      f"{best['relative_macs']:.2f}" if is_best else "", _arch(entry["arch"]))
    orig = doc["original"]
    table.add_row("pretrained", f"{orig['latency_ms']:.4g}", "", f"{orig['test_accuracy']:.3f}",
                  "1.00", _arch(orig["arch"]))
    caption = (f"{ev['branch_calls']} branch calls for {ev['subnets']} subnets x "
               f"{ev['batches']} batches, at most {ev['peak_cached']} features cached")
    split = doc.get("split")
    if split:
        link = split["transfer_ms"] + split["rtt_ms"]
        caption += (f"; best split after block {split['edge_blocks']} of {split['blocks']}: "
                    f"edge {split['edge_ms']:.3g} + link {link:.3g} + cloud "
                    f"{split['cloud_ms']:.3g} ms")
    table.caption = caption
    return table


def switching_table(doc: Mapping[str, Any]) -> Table:
    """Every switch the latency monitor made, and how fast it reacted to the load."""
    load = (f"{doc['processes']} background processes" if doc["load"] == "cpu"
            else f"a {doc['factor']}x slowdown")
    table = Table(title=f"AdaptiveNet serving {doc['requests']} requests, budget "
                        f"{doc['budget_ms']:.3g} ms; {load} from {doc['load_on_s']:.2f} s to "
                        f"{doc['load_off_s']:.2f} s")
    for name in ("time s", "r", "reason", "to subnet"):
        table.add_column(name, justify="left" if name in ("reason", "to subnet") else "right")
    for event in doc["events"]:
        table.add_row(f"{event['time_s']:.3f}", f"{event['r']:.2f}", event["reason"],
                      _arch(event["to"]))

    def seconds(value: float | None) -> str:
        return "none" if value is None else f"{value:.3f} s"

    table.caption = (f"reaction {seconds(doc['reaction_s'])}, back within budget "
                     f"{seconds(doc['recovery_s'])}, switch back after the load "
                     f"{seconds(doc['switch_back_s'])}; {doc['over_budget']} requests over "
                     f"budget; {doc.get('flaps', 0)} switches no load change asked for "
                     "(flapping)")
    return table
