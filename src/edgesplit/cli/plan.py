"""`edgesplit plan`: compare the planners on an edge-cloud setting or a topology, and write the
chosen plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from edgesplit.units import parse_bytes
from edgesplit.cli._app import TRUST_HELP, app, emit_json, err, model_ref, out, user_errors


@app.command()
@user_errors
def plan(
    model: str = typer.Argument(..., help="Built-in model name or a .pt2 file."),
    edge: str = typer.Option("jetson-nano", "--edge", help="Edge device: preset or file."),
    cloud: str = typer.Option("v100-server", "--cloud", help="Cloud device: preset or file."),
    link: str = typer.Option("wifi", "--link", help="Edge-cloud link: preset or file."),
    method: str = typer.Option("all", "--method", "-m",
                               help="neurosurgeon, dads, qdmp, cloud_only, edge_only, qdmp_e, "
                                    "qdmp_e_u4, u8, cloud16, autosplit, manual, or all "
                                    "(comma-separated lists work too)."),
    edge_memory: Optional[str] = typer.Option(None, "--edge-memory",
                                              help="Edge memory limit (bytes, or 2MiB, 64MB); "
                                                   "default: the edge device's memory."),
    privacy_layer: Optional[str] = typer.Option(None, "--privacy-layer",
                                                help="No cut before this layer (L2S eq. 1)."),
    result_at: str = typer.Option("edge", "--result-at",
                                  help="Where the result is needed: edge or cloud."),
    split_after: Optional[str] = typer.Option(None, "--split-after",
                                              help="Manual plan: these layers and all they "
                                                   "depend on run on the edge."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", "-s"),
    topology: Optional[str] = typer.Option(
        None, "--topology", "-t", help="Plan over a chain of devices (preset such as "
                                       "jmsnas-chain, or a file) instead of edge/cloud/link."),
    objective: str = typer.Option("latency", "--objective",
                                  help="With --topology: latency, or throughput (the slowest "
                                       "stage when frames stream through)."),
    max_latency_ms: Optional[float] = typer.Option(
        None, "--max-latency-ms", help="With --objective throughput: latency bound."),
    draw: Optional[Path] = typer.Option(None, "--draw", help="With --topology: draw the chosen "
                                                            "assignment over the topology."),
    sweep: bool = typer.Option(False, "--sweep-link", help="Sweep the uplink from 0.1 to 1000 "
                                                           "Mbps and plot how the best split moves."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Where to write the sweep plot "
                                                             "(default sweep-MODEL.png)."),
    breakdown_plot: Optional[Path] = typer.Option(
        None, "--breakdown-plot", help="Write an L2S Fig. 1 style latency breakdown at every "
                                       "single-tensor cut."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o",
                                            help="Write the chosen plan as JSON: the manual "
                                                 "split with --split-after, the one --method "
                                                 "names, or else the fastest feasible one."),
    accept_unmeasured: bool = typer.Option(
        False, "--accept-unmeasured", help="Let a quantized plan whose accuracy was not "
                                           "measured (no --eval-data) be chosen."),
    eval_data: Optional[str] = typer.Option(
        None, "--eval-data", help="Measure quantized plans' accuracy on this data: a built-in "
                                  "data set (digits, sentences) or a .pt/.npz file of inputs "
                                  "and labels."),
    max_acc_drop: Optional[float] = typer.Option(
        None, "--max-acc-drop", help="AUTO-SPLIT: largest accuracy drop allowed, in percentage "
                                     "points (default 1; needs --eval-data)."),
    calibration_samples: Optional[int] = typer.Option(
        None, "--calibration-samples", help="Samples taken from the front of --eval-data to "
                                            "calibrate activation ranges (default: a fifth, at "
                                            "most 128); the rest are held out."),
    bits: Optional[str] = typer.Option(None, "--bits", help="AUTO-SPLIT bit-widths to search, "
                                                            "e.g. 2,4,8 (default: the edge "
                                                            "device's)."),
    input_bits: int = typer.Option(8, "--input-bits", help="Width the raw float input is sent "
                                                           "at (8: a camera frame; 32: float)."),
    pareto_plot: Optional[Path] = typer.Option(
        None, "--pareto-plot", help="AUTO-SPLIT: plot its candidates' latency against accuracy "
                                    "drop (or distortion) with the baselines (Fig. 5)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
) -> None:
    """Where to cut MODEL between an edge device and the cloud (or over a --topology of
    devices): compare the planners, AUTO-SPLIT and its quantized baselines included."""
    from edgesplit.graph import parse_shape

    if topology is not None:
        two_tier = {"--sweep-link": sweep, "--breakdown-plot": breakdown_plot,
                    "--split-after": split_after, "--privacy-layer": privacy_layer,
                    "--edge-memory": edge_memory, "--method": method != "all",
                    "--eval-data": eval_data, "--max-acc-drop": max_acc_drop is not None,
                    "--bits": bits, "--pareto-plot": pareto_plot,
                    "--calibration-samples": calibration_samples is not None,
                    "--input-bits": input_bits != 8, "--accept-unmeasured": accept_unmeasured}
        used = [flag for flag, value in two_tier.items() if value]
        if used:
            from edgesplit.errors import ConfigError

            raise ConfigError(f"{', '.join(used)} apply to the edge-cloud planner, not to "
                              "--topology (device memory comes from each device's memory_bytes; "
                              "--draw plots the chosen assignment)")
        _plan_topology(model_ref(model, trust_model_file), topology, objective, max_latency_ms,
                       input_shape, draw, out_path, as_json)
        return
    if objective != "latency" or max_latency_ms is not None or draw is not None:
        from edgesplit.errors import ConfigError

        raise ConfigError("--objective, --max-latency-ms and --draw apply to --topology planning")
    from edgesplit.hardware import resolve_device, resolve_link
    from edgesplit.plan import ALL_METHODS, EdgeCloudSetting, PlanningProblem, plan_document

    memory = parse_bytes(edge_memory, "--edge-memory")
    setting = EdgeCloudSetting(edge=resolve_device(edge), cloud=resolve_device(cloud),
                               link=resolve_link(link), edge_memory_bytes=memory,
                               privacy_layer=privacy_layer, result_at=result_at,
                               input_bits=input_bits)
    problem = PlanningProblem(model_ref(model, trust_model_file), setting,
                              input_shape=parse_shape(input_shape) if input_shape else None,
                              eval_data=_eval_data(eval_data),
                              calibration_samples=calibration_samples)
    methods = list(ALL_METHODS) if method == "all" else [m.strip() for m in method.split(",")]
    _check_accuracy_options(methods, eval_data, max_acc_drop, pareto_plot)
    split = [s.strip() for s in split_after.split(",")] if split_after else []
    options = {"autosplit": {"max_acc_drop": max_acc_drop,
                             "bits": [int(b) for b in parse_shape(bits)] if bits else None}}
    plans = _compare_with_progress(problem, methods, split, options, model)
    chosen_method, chosen = _choose(plans, methods, method, split, accept_unmeasured)
    if out_path is not None:
        chosen.save(out_path)
    if pareto_plot is not None:
        _pareto_plot(plans, pareto_plot, model, setting)
    sweep_doc = _plan_sweep(problem, methods, model, plot) if sweep else None
    if breakdown_plot is not None:
        from edgesplit.plan import cut_breakdown
        from edgesplit.report.plots import plot_cut_breakdown

        plot_cut_breakdown(cut_breakdown(problem), breakdown_plot,
                           title=f"{model}: latency at every cut ({setting.edge.name} -> "
                                 f"{setting.link.name} -> {setting.cloud.name})")
    if as_json:
        doc = plan_document(problem, plans, accept_unmeasured=accept_unmeasured)
        doc["chosen"] = chosen_method
        if sweep_doc is not None:
            doc["sweep"] = sweep_doc
        emit_json(doc)
        return
    from edgesplit.report.plan_tables import plans_table, sweep_table

    out.print(plans_table(problem, plans, chosen_method))
    if sweep_doc is not None:
        out.print(sweep_table(sweep_doc))
    for path in (out_path, breakdown_plot, pareto_plot, sweep_doc and sweep_doc["plot"]):
        if path:
            err.print(f"wrote {path}")


def _choose(plans, methods, method: str, split, accept_unmeasured: bool):
    """What the user asked for: the manual split when they named one, the one method they
    named, or the fastest feasible plan that is lossless or was measured (saying which faster
    ones were set aside)."""
    from edgesplit.plan import best_plan, passed_over

    if split:
        return "manual", plans["manual"]
    if method != "all" and len(methods) == 1:
        return methods[0], plans[methods[0]]
    chosen_method, chosen = best_plan(plans, accept_unmeasured=accept_unmeasured)
    skipped = [] if accept_unmeasured else passed_over(plans, chosen)
    if skipped:
        err.print(f"note: chose {chosen_method}; faster {', '.join(skipped)} quantize without "
                  "measured accuracy (measure with --eval-data, or --accept-unmeasured)")
    return chosen_method, chosen


def _check_accuracy_options(methods, eval_data, max_acc_drop, pareto_plot) -> None:
    """Fail before any planning work on options that cannot apply."""
    from edgesplit.errors import ConfigError

    if max_acc_drop is not None and eval_data is None:
        raise ConfigError("--max-acc-drop needs evaluation data to measure accuracy on: pass "
                          "--eval-data (a built-in data set or a .pt/.npz file)")
    if pareto_plot is not None and "autosplit" not in methods:
        raise ConfigError("--pareto-plot shows AUTO-SPLIT's candidates: include autosplit in "
                          "--method")


def _eval_data(spec: Optional[str]):
    if spec is None:
        return None
    from edgesplit.data import load_eval_data

    return load_eval_data(spec)


def _compare_with_progress(problem, methods, split, options, model: str):
    """Plan every method; a progress bar while AUTO-SPLIT measures its candidates."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

    from edgesplit.plan import compare_methods

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"planning {model}", total=None)

        def report(what: str, done: int, total: int) -> None:
            progress.update(task, description=f"{model}: {what}", completed=done, total=total)

        problem.progress = report
        return compare_methods(problem, methods, split_after=split, options=options)


def _pareto_plot(plans, path: Path, model: str, setting) -> None:
    from edgesplit.report.plots import plot_pareto

    plot_pareto(plans, path, title=f"{model}: {setting.edge.name} -> {setting.link.name} -> "
                                   f"{setting.cloud.name}")


def _plan_topology(model: str, topology: str, objective: str, max_latency_ms, input_shape,
                   draw: Optional[Path], out_path: Optional[Path], as_json: bool) -> None:
    from edgesplit.graph import parse_shape
    from edgesplit.hardware import resolve_topology
    from edgesplit.plan import PlanningProblem, compare_methods, plan_document

    topo = resolve_topology(topology)
    problem = PlanningProblem(model, topo, input_shape=parse_shape(input_shape) if input_shape
                              else None, objective=objective,  # type: ignore[arg-type]
                              max_latency_ms=max_latency_ms)
    with err.status(f"planning {model} over {topo.name} ...", spinner="dots"):
        plans = compare_methods(problem)
    doc = plan_document(problem, plans)
    if doc["best"] is None:
        from edgesplit.errors import InfeasibleError

        raise InfeasibleError("no method found a plan that meets the constraints: "
                              + "; ".join(sorted({p.reason or "" for p in plans.values()})))
    chosen = plans[doc["best"]]
    if out_path is not None:
        chosen.save(out_path)
    if draw is not None:
        from edgesplit.report.plots import plot_assignment

        plot_assignment(chosen, draw, title=f"{problem.graph.model} over {topo.name}: "
                                            f"{doc['best']} ({objective})")
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.plan_tables import topology_table

    out.print(topology_table(doc, plans))
    for path in (out_path, draw):
        if path:
            err.print(f"wrote {path}")


def _plan_sweep(problem, methods, model: str, plot: Optional[Path]) -> dict[str, Any]:
    from edgesplit.plan import sweep_link
    from edgesplit.report.plots import plot_link_sweep

    with err.status("sweeping the link bandwidth ...", spinner="dots"):
        doc = sweep_link(problem, [m for m in methods if m != "manual"])
    path = plot or Path(f"sweep-{Path(model).stem}.png")
    plot_link_sweep(doc, path)
    doc["plot"] = str(path)
    return doc
