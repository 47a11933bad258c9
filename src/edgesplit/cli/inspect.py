"""`edgesplit models` and `edgesplit inspect`: the model zoo, and one model's layers, tensors
and cuts."""

from __future__ import annotations

from typing import Any

import typer

from edgesplit.cli._app import TRUST_HELP, app, emit_json, err, out, user_errors


@app.command()
@user_errors
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
           ) -> None:
    """List the built-in models."""
    from edgesplit.models import get_model_spec, list_models

    specs = [get_model_spec(name) for name in list_models()]
    if as_json:
        emit_json({"version": 1, "models": [
            {"name": s.name, "family": s.family, "input_shape": list(s.input_shape),
             "source": s.source, "description": s.description} for s in specs]})
        return
    out.print(models_table_for(specs))


def models_table_for(specs):  # small indirection keeps rich imports out of `--json` paths
    from edgesplit.report import models_table

    return models_table(specs)


@app.command()
@user_errors
def inspect(
    model: str = typer.Argument(..., help="Built-in model name, your own model as "
                                          "my_net.py:MyNet or package.module:make_model "
                                          "(with --input-shape), or a .pt2 file "
                                          "(torch.export.save)."),
    input_shape: str | None = typer.Option(None, "--input-shape", "-s",
                                           help="Input shape for built-ins and your own "
                                                "models, e.g. 1,3,224,224."),
    raw: bool = typer.Option(False, "--raw", help="Keep one layer per operator (no BN folding or "
                                                   "activation fusion), the graph DADS plans on."),
    split_after: str | None = typer.Option(
        None, "--split-after", help="Layer name(s), module path(s) or split points marked in "
                                    "the model, comma-separated: show the tensors crossing and "
                                    "the edge peak memory when the edge runs these layers (or "
                                    "modules) and everything they depend on."),
    cuts_only: bool = typer.Option(False, "--cuts-only", help="Only the cut-point table."),
    limit: int | None = typer.Option(None, "--limit", help="Show only the first N layers."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
) -> None:
    """Per-layer table (MACs, params, output shape and size) and the single-tensor cut points."""
    from edgesplit.graph import capture, parse_shape

    shape = parse_shape(input_shape) if input_shape else None
    with err.status(f"capturing {model} with torch.export ...", spinner="dots"):
        graph = capture(model, input_shape=shape, optimize=not raw,
                        trust_model_file=trust_model_file)
    split = _split_report(graph, split_after) if split_after else None
    if as_json:
        doc = graph.to_dict()
        if split is not None:
            doc["split"] = split
        emit_json(doc)
        return
    from edgesplit.report import cuts_table, human_bytes, layers_table, split_points_table

    if not cuts_only:
        out.print(layers_table(graph, limit))
    out.print(cuts_table(graph, graph.single_tensor_cuts()))
    if graph.split_points:
        out.print(split_points_table(graph))
    if split is not None:
        out.print(f"split after {', '.join(a or '(input)' for a in split['after'])}: "
                  f"edge part: {split['edge_layers']} layers; crossing: "
                  f"{', '.join(split['crossing'])} ({human_bytes(split['crossing_bytes'])}); "
                  f"edge peak memory {human_bytes(split['memory']['total_bytes'])} "
                  f"(weights {human_bytes(split['memory']['weight_bytes'])}, activations "
                  f"{human_bytes(split['memory']['activation_bytes'])} at "
                  f"{split['memory']['peak_layer'] or '(input)'})")


def _split_report(graph, split_after: str) -> dict[str, Any]:
    names = [s.strip() for s in split_after.split(",") if s.strip()]
    edge = graph.split_layers(names)
    crossing = graph.crossing_tensors(edge)
    return {
        # the last layer each name resolved to: where a module path's cut falls (None: a
        # split point marked on a model input)
        "after": [(graph.resolve_split_point(name) or [None])[-1] for name in names],
        "edge_layers": len(edge),
        "crossing": [t.name for t in crossing],
        "crossing_elements": sum(t.elements for t in crossing),
        "crossing_bytes": sum(t.bytes for t in crossing),
        "memory": graph.peak_memory(edge).to_dict(),
    }
