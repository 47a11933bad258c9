"""Rich tables for neural architecture search: search spaces, latency tables and their error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from edgesplit.nas.jmsnas.latency import LatencyTable
from edgesplit.nas.jmsnas.space import SearchSpace
from edgesplit.report.format import human_count

__all__ = ["jmsnas_epochs_table", "jmsnas_result_table", "latency_table_table",
           "latency_validation_table", "spaces_table"]


def spaces_table(spaces: Sequence[SearchSpace]) -> Table:
    """One row per space: input, classes, searchable layers, candidates, architectures."""
    table = Table(title="search spaces")
    for col in ("name", "input", "classes", "layers", "ops per layer", "architectures",
                "stem", "head"):
        table.add_column(col, overflow="fold")
    for space in spaces:
        counts = [len(layer.ops) for layer in space.layers]
        ops = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
        head = f"1x1 to {space.head.channels}" if space.head.channels else "pool"
        table.add_row(space.name, "x".join(map(str, space.input_shape)), str(space.num_classes),
                      str(len(space.layers)), ops, _count(space.size),
                      f"{space.stem.kernel}x{space.stem.kernel} to {space.stem.out_channels}, "
                      f"stride {space.stem.stride}", head)
    return table


def _count(value: int) -> str:
    """Architecture counts run to 1e16 and beyond, past the prefixes of human_count."""
    return human_count(value) if value < 1e12 else f"{value:.3g}"


def latency_table_table(table: LatencyTable, space: SearchSpace | None = None) -> Table:
    """Layers as rows, candidate ops as columns, ms in the cells ("-": not allowed there); with
    ``space``, each layer's shape too. The caption holds what every network pays."""
    names = list(dict.fromkeys(name for row in table.layers for name in row))
    title = (f"latency table: {table.space} on {table.device} ({table.method}, batch "
             f"{table.batch}), ms")
    caption = (f"stem {table.stem_ms:.3f} + head {table.head_ms:.3f} + overhead "
               f"{table.overhead_ms:.3f} = {table.fixed_ms:.3f} ms per network")
    if table.measurement:
        caption += (f"; {table.measurement.get('threads')} threads, "
                    f"{table.measurement.get('repeats')} rounds")
    if table.build_seconds:
        caption += f"; built in {table.build_seconds:.1f} s"
    out = Table(title=title, caption=caption)
    out.add_column("layer", justify="right")
    if space is not None:
        out.add_column("shape")
    for name in names:
        out.add_column(name, justify="right")
    for i, row in enumerate(table.layers):
        cells = [str(i)]
        if space is not None and i < len(space.layers):
            layer = space.layers[i]
            h, w = space.in_size(i)
            cells.append(f"{space.in_channels(i)}->{layer.out_channels} s{layer.stride} "
                         f"{h}x{w}")
        elif space is not None:
            cells.append("")
        cells += [f"{row[name]:.3f}" if name in row else "-" for name in names]
        out.add_row(*cells)
    return out


def _load(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values) if values else "n/a"


def latency_validation_table(result: Mapping[str, Any]) -> Table:
    """The summary of :func:`~edgesplit.nas.validate_latency_table`: error statistics and the
    load averages that say whether the machine was quiet while measuring."""
    table = Table(title=f"latency table error on {result['samples']} random networks of "
                        f"{result['space']} (predicted vs measured whole network)")
    table.add_column("")
    table.add_column("value", justify="right")
    measured = sorted(row["measured_ms"] for row in result["archs"])
    load = result.get("load_average", {})
    for name, value in (
        ("MAPE", f"{result['mape_pct']:.1f} %"),
        ("worst error", f"{result['worst_error_pct']:+.1f} %"),
        ("within +-10 %", f"{100 * result['fraction_within_10pct']:.0f} %"),
        ("measured", f"{measured[0]:.3f} - {measured[-1]:.3f} ms"),
        ("threads / batch", f"{result['threads']} / {result['batch']}"),
        ("drift since the build (calibration networks)",
         f"{result['drift_pct']:+.1f} %" if result.get("drift_pct") is not None else "n/a"),
        (f"load average before (1/5/15 min, {result.get('cpus', '?')} CPUs)",
         _load(load.get("before", []))),
        ("load average after", _load(load.get("after", []))),
    ):
        table.add_row(name, value)
    return table


def jmsnas_epochs_table(doc: Mapping[str, Any]) -> Table:
    """Stage 1 per epoch: the derived network's accuracy, E[T] and the derived arch's latency
    (what Fig. 5 plots)."""
    table = Table(title=f"JMSNAS stage 1: {doc['space']} on {doc['topology']}, "
                        f"T_const {doc['latency_budget_ms']:.3f} ms")
    for name in ("epoch", "phase", "weight loss", "arch loss", "E[T] ms", "argmax ms",
                 "top-1 %", "argmax architecture"):
        table.add_column(name, justify="left" if name in ("phase", "argmax architecture")
                         else "right")
    for h in doc["history"]:
        table.add_row(str(h["epoch"] + 1), h["phase"], f"{h['weight_loss']:.3f}",
                      "" if h["arch_loss"] is None else f"{h['arch_loss']:.3f}",
                      f"{h['expected_ms']:.3f}", f"{h['arch_ms']:.3f}", f"{h['accuracy']:.1f}",
                      h["arch"])
    return table


def jmsnas_result_table(doc: Mapping[str, Any]) -> Table:
    """The derived network: architecture, latency by the tables, per device, accuracy, plan."""
    table = Table(title="JMSNAS result", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("architecture", " ".join(doc["arch"]["ops"]))
    table.add_row("latency (tables)", f"{doc['arch_ms']:.3f} ms of {doc['latency_budget_ms']:.3f}")
    per_device = ", ".join(f"{k} {v:.3f}" for k, v in doc["breakdown_ms"].items())
    table.add_row("per device (ms)", per_device)
    if doc.get("layout"):
        layout = doc["layout"]
        table.add_row("branch section", f"layers {layout['fork']}:{layout['join']} copied "
                                        f"{layout['branches']}x, joined by their mean")
    table.add_row("held-out top-1", f"{doc['accuracy']:.2f} %" if "accuracy" in doc else "-")
    plan = doc.get("plan")
    if plan:
        table.add_row("plan", f"{plan['method']}: {plan['predicted_ms']:.3f} ms predicted, "
                              f"layers per device {plan['devices']}")
        other = {"own": "replan", "replan": "own"}.get(doc.get("kept", ""))
        if other in doc.get("plans", {}):
            alt = doc["plans"][other]
            table.add_row("not kept", f"{alt['method']} ({alt['file']}): "
                                      f"{alt['predicted_ms']:.3f} ms predicted")
        chain = doc.get("runnable_plan")
        if chain:
            table.add_row("runs", f"{plan['method']} over the mesh only predicts; "
                                  f"{chain['file']} ({chain['method']}, "
                                  f"{chain['predicted_ms']:.3f} ms) is the one that runs")
        table.add_row("folder", doc.get("folder", ""))
    return table
