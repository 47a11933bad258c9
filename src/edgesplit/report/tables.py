"""Rich tables for the CLI. Each takes library objects and returns a ``rich.table.Table``."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from edgesplit.graph import Cut, LayerGraph
from edgesplit.models import ModelSpec
from edgesplit.report.format import human_bytes, human_count

__all__ = ["cuts_table", "layers_table", "models_table", "split_points_table"]


def layers_table(graph: LayerGraph, limit: int | None = None) -> Table:
    macs = human_count(graph.total_macs)
    table = Table(title=f"{graph.model}: {len(graph)} layers, {macs} MACs, "
                        f"{human_count(graph.total_params)} params "
                        f"({'optimised' if graph.optimized else 'raw'} graph)")
    for col, justify in (("#", "right"), ("name", "left"), ("module", "left"), ("op", "left"),
                         ("MACs", "right"),
                         ("params", "right"), ("out shape", "left"), ("out elements", "right"),
                         ("out bytes", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    layers = graph.layers if limit is None else graph.layers[:limit]
    for layer in layers:
        outs = [graph.tensors[t] for t in layer.outputs]
        table.add_row(
            str(layer.index), layer.name, layer.module_path, layer.kind, human_count(layer.macs),
            human_count(layer.params),
            " ".join("x".join(map(str, t.shape)) for t in outs),
            f"{sum(t.elements for t in outs):,}", human_bytes(sum(t.bytes for t in outs)),
        )
    if limit is not None and len(graph) > limit:
        table.caption = f"first {limit} of {len(graph)} layers (--limit)"
    return table


def cuts_table(graph: LayerGraph, cuts: Sequence[Cut]) -> Table:
    table = Table(title=f"{graph.model}: {len(cuts)} single-tensor cut points")
    # "after module": the outermost module a cut after which (--split-after MODULE) is this
    # cut, the natural split points for a user who thinks in modules
    for col, justify in (("after #", "right"), ("after layer", "left"), ("after module", "left"),
                         ("tensor", "left"), ("shape", "left"), ("elements", "right"),
                         ("bytes", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for cut in cuts:
        tensor = cut.tensors[0]
        modules = graph.modules_ending_at(cut.after) if cut.after else []
        table.add_row(str(cut.index), cut.after or "(input)", modules[0] if modules else "",
                      tensor.name, "x".join(map(str, tensor.shape)), f"{cut.elements:,}",
                      human_bytes(cut.bytes))
    return table


def split_points_table(graph: LayerGraph) -> Table:
    """The split points marked in the model's code (``split_point(x, name)``), in the order it
    computes them, with what a cut at each sends."""
    table = Table(title=f"{graph.model}: {len(graph.split_points)} split points marked in the "
                        "model (--split-after NAME)")
    for col, justify in (("split point", "left"), ("after layer", "left"), ("tensor", "left"),
                         ("shape", "left"), ("crossing", "left"), ("bytes", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name in graph.split_points:
        info = graph.describe_split_point(name)
        tensor = graph.tensors[info["tensor"]]
        table.add_row(name, info["after"] or "(input)", tensor.name,
                      "x".join(map(str, tensor.shape)), ", ".join(info["crossing"]),
                      human_bytes(info["crossing_bytes"]))
    return table


def models_table(specs: Sequence[ModelSpec]) -> Table:
    table = Table(title="built-in models")
    for col in ("name", "family", "input shape", "defined by", "description"):
        table.add_column(col)
    for spec in specs:
        table.add_row(spec.name, spec.family, ",".join(map(str, spec.input_shape)), spec.source,
                      spec.description)
    return table
