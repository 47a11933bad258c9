"""`edgesplit plan`: compare the planners on an edge-cloud setting or a topology, and write the
chosen plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from edgesplit.cli._app import TRUST_HELP, app, emit_json, err, model_ref, out, user_errors
from edgesplit.units import parse_bytes

_SETTING = "Edge-cloud setting"
_TOPOLOGY = "Topology"
_ACCURACY = "Accuracy (AUTO-SPLIT and its quantized baselines)"
_OUTPUT = "Output"

# Flags that set a planner option or a problem field: they apply when a chosen method declares
# that name (Planner.options or Planner.reads), so the check follows the planners.
PLANNER_FLAGS = {"--split-after": "split_after", "--eval-data": "eval_data",
                 "--calibration-samples": "calibration_samples",
                 "--max-acc-drop": "max_acc_drop", "--bits": "bits",
                 "--measure-all": "measure_all"}


@app.command()
@user_errors
def plan(
    model: str = typer.Argument(..., help="Built-in model name, your own model as "
                                          "my_net.py:MyNet (with --input-shape), or a .pt2 "
                                          "file."),
    method: str = typer.Option("all", "--method", "-m",
                               help="Planning methods, comma-separated, or all. Edge-cloud: "
                                    "neurosurgeon, dads, qdmp, cloud_only, edge_only, qdmp_e, "
                                    "qdmp_e_u4, u8, cloud16, autosplit, manual; topology: "
                                    "multisplit, linear, best_chain, source_only, sink_only."),
    input_shape: str | None = typer.Option(None, "--input-shape", "-s",
                                           help="Input shape for built-ins and your own "
                                                "models, e.g. 1,3,224,224."),
    edge: str = typer.Option("jetson-nano", "--edge", help="Edge device: preset or file.",
                             rich_help_panel=_SETTING),
    cloud: str = typer.Option("v100-server", "--cloud", help="Cloud device: preset or file.",
                              rich_help_panel=_SETTING),
    link: str = typer.Option("wifi", "--link", help="Edge-cloud link: preset or file.",
                             rich_help_panel=_SETTING),
    edge_memory: str | None = typer.Option(None, "--edge-memory",
                                              help="Edge memory limit (bytes, or 2MiB, 64MB); "
                                                   "default: the edge device's memory.",
                                              rich_help_panel=_SETTING),
    privacy_layer: str | None = typer.Option(None, "--privacy-layer",
                                                help="No cut before this layer or module "
                                                     "(L2S eq. 1).",
                                                rich_help_panel=_SETTING),
    result_at: str = typer.Option("edge", "--result-at",
                                  help="Where the result is needed: edge or cloud.",
                                  rich_help_panel=_SETTING),
    input_bits: int = typer.Option(32, "--input-bits", help="Width a raw float input is sent "
                                   "at (32: exactly as given; 8: a camera frame, as AUTO-SPLIT "
                                   "assumes, rounded).",
                                   rich_help_panel=_SETTING),
    split_after: str | None = typer.Option(None, "--split-after",
                                              help="Manual plan: these layers, module paths "
                                                   "or split points marked in the model, and "
                                                   "all they depend on, run on the edge.",
                                              rich_help_panel=_SETTING),
    topology: str | None = typer.Option(
        None, "--topology", "-t", help="Plan over a chain or mesh of devices (preset such as "
                                       "jmsnas-chain, or a file) instead of edge/cloud/link.",
        rich_help_panel=_TOPOLOGY),
    objective: str = typer.Option("latency", "--objective",
                                  help="latency, or throughput (the slowest stage when frames "
                                       "stream through).", rich_help_panel=_TOPOLOGY),
    max_latency_ms: float | None = typer.Option(
        None, "--max-latency-ms", help="With --objective throughput: latency bound.",
        rich_help_panel=_TOPOLOGY),
    draw: Path | None = typer.Option(None, "--draw", help="Draw the chosen assignment over "
                                                            "the topology.",
                                        rich_help_panel=_TOPOLOGY),
    eval_data: str | None = typer.Option(
        None, "--eval-data", help="Measure quantized plans' accuracy on this data: a built-in "
                                  "data set (digits, sentences) or a .pt/.npz file of inputs "
                                  "and labels.", rich_help_panel=_ACCURACY),
    max_acc_drop: float | None = typer.Option(
        None, "--max-acc-drop", help="AUTO-SPLIT: largest accuracy drop allowed, in percentage "
                                     "points (default 1; needs --eval-data).",
        rich_help_panel=_ACCURACY),
    measure_all: bool = typer.Option(
        False, "--measure-all", help="AUTO-SPLIT: measure every candidate (a measured Pareto "
                                     "front; minutes each on real data), not only those up to "
                                     "the choice in latency order (the same choice).",
        rich_help_panel=_ACCURACY),
    calibration_samples: int | None = typer.Option(
        None, "--calibration-samples", help="Samples taken from the front of --eval-data to "
                                            "calibrate activation ranges (default: a fifth, at "
                                            "most 128); the rest are held out.",
        rich_help_panel=_ACCURACY),
    bits: str | None = typer.Option(None, "--bits", help="AUTO-SPLIT bit-widths to search, "
                                                            "e.g. 2,4,8 (default: the edge "
                                                            "device's).",
                                       rich_help_panel=_ACCURACY),
    accept_unmeasured: bool = typer.Option(
        False, "--accept-unmeasured", help="Let a quantized plan whose accuracy was not "
                                           "measured (no --eval-data) be chosen.",
        rich_help_panel=_ACCURACY),
    pareto_plot: Path | None = typer.Option(
        None, "--pareto-plot", help="AUTO-SPLIT: plot its candidates' latency against accuracy "
                                    "drop (or distortion) with the baselines (Fig. 5).",
        rich_help_panel=_OUTPUT),
    sweep: bool = typer.Option(False, "--sweep-link", help="Sweep the uplink from 0.1 to 1000 "
                                                           "Mbps and plot how the best split "
                                                           "moves.", rich_help_panel=_OUTPUT),
    plot: Path | None = typer.Option(None, "--plot", help="Where to write the sweep plot "
                                                             "(default sweep-MODEL.png).",
                                        rich_help_panel=_OUTPUT),
    breakdown_plot: Path | None = typer.Option(
        None, "--breakdown-plot", help="Write an L2S Fig. 1 style latency breakdown at every "
                                       "single-tensor cut.", rich_help_panel=_OUTPUT),
    out_path: Path | None = typer.Option(None, "--out", "-o",
                                            help="Write the chosen plan as JSON: the manual "
                                                 "split with --split-after, the one --method "
                                                 "names, or else the best feasible one.",
                                            rich_help_panel=_OUTPUT),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document.",
                                 rich_help_panel=_OUTPUT),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
) -> None:
    """Where to cut MODEL between an edge device and the cloud (or over a --topology of
    devices): compare the planners, AUTO-SPLIT and its quantized baselines included."""
    from edgesplit.graph import check_input_shape, parse_shape

    source = model_ref(model, trust_model_file)
    check_input_shape(source, parse_shape(input_shape) if input_shape else None)
    planner_flags = {"--split-after": split_after, "--eval-data": eval_data,
                     "--calibration-samples": calibration_samples,
                     "--max-acc-drop": max_acc_drop, "--bits": bits,
                     "--measure-all": measure_all or None}
    if topology is not None:
        _refuse({"--sweep-link": sweep, "--breakdown-plot": breakdown_plot,
                 "--privacy-layer": privacy_layer, "--edge-memory": edge_memory,
                 "--pareto-plot": pareto_plot, "--input-bits": input_bits != 32,
                 "--accept-unmeasured": accept_unmeasured, **planner_flags},
                "apply to the edge-cloud planner, not to --topology (device memory comes from "
                "each device's memory_bytes; --draw plots the chosen assignment)")
        problem = _topology_problem(source, topology, input_shape, objective, max_latency_ms)
        _plan_topology(problem, _methods(method, problem), draw, out_path, as_json)
        return
    _refuse({"--objective": objective != "latency", "--max-latency-ms": max_latency_ms,
             "--draw": draw}, "apply to --topology planning")
    problem = _edge_cloud_problem(source, input_shape, edge, cloud, link, edge_memory,
                                  privacy_layer, result_at, input_bits, eval_data,
                                  calibration_samples)
    methods = _methods(method, problem)
    _check_planner_flags(planner_flags, methods, split_after)
    _check_accuracy_options(methods, eval_data, max_acc_drop, pareto_plot, measure_all)
    split = [s.strip() for s in split_after.split(",")] if split_after else []
    options = {"autosplit": _autosplit_options(max_acc_drop, bits, measure_all)}
    plans = _compare_with_progress(problem, methods, split, options, model)
    chosen_method, chosen = _choose(plans, methods, method, split, accept_unmeasured)
    if out_path is not None:
        chosen.save(out_path)
    if pareto_plot is not None:
        _pareto_plot(plans, pareto_plot, model, problem.edge_cloud)
    sweep_doc = _plan_sweep(problem, methods, model, plot) if sweep else None
    if breakdown_plot is not None:
        _breakdown_plot(problem, breakdown_plot, model)
    _report(problem, plans, chosen_method, accept_unmeasured, sweep_doc, as_json,
            (out_path, breakdown_plot, pareto_plot, sweep_doc and sweep_doc["plot"]))


def _refuse(flags: dict[str, Any], why: str) -> None:
    """ConfigError naming the given flags of ``flags`` (name -> value; falsy: not given)."""
    used = [flag for flag, value in flags.items() if value]
    if used:
        from edgesplit.errors import ConfigError

        raise ConfigError(f"{', '.join(used)} {why}")


def _methods(method: str, problem) -> list[str]:
    """The methods --method names; ``all``: every edge-cloud method, or the topology's."""
    from edgesplit.plan import ALL_METHODS, default_methods

    if method != "all":
        return [m.strip() for m in method.split(",")]
    return list(ALL_METHODS if problem.kind == "edge_cloud" else default_methods(problem))


def _check_planner_flags(flags: dict[str, Any], methods: list[str], split_after) -> None:
    """A planner flag must be declared by a chosen method (Planner.options / reads)."""
    from edgesplit.plan import PLANNERS

    declared = {name for m in methods if m in PLANNERS
                for name in (*PLANNERS.get(m).options, *PLANNERS.get(m).reads)}
    if split_after:
        declared.add("split_after")  # --split-after adds the manual plan
    for flag, value in flags.items():
        if value is not None and PLANNER_FLAGS[flag] not in declared:
            users = [n for n, cls in PLANNERS.items()
                     if PLANNER_FLAGS[flag] in (*cls.options, *cls.reads)]
            _refuse({flag: True}, f"applies to {', '.join(users)}: include one in --method")


def _edge_cloud_problem(source: str, input_shape, edge: str, cloud: str, link: str,
                        edge_memory, privacy_layer, result_at: str, input_bits: int,
                        eval_data, calibration_samples):
    """The edge-cloud PlanningProblem the setting flags describe."""
    from edgesplit.graph import parse_shape
    from edgesplit.hardware import resolve_device, resolve_link
    from edgesplit.plan import EdgeCloudSetting, PlanningProblem

    setting = EdgeCloudSetting(edge=resolve_device(edge), cloud=resolve_device(cloud),
                               link=resolve_link(link),
                               edge_memory_bytes=parse_bytes(edge_memory, "--edge-memory"),
                               privacy_layer=privacy_layer, result_at=result_at,  # type: ignore[arg-type]
                               input_bits=input_bits)
    return PlanningProblem(source, setting,
                           input_shape=parse_shape(input_shape) if input_shape else None,
                           eval_data=_eval_data(eval_data),
                           calibration_samples=calibration_samples)


def _topology_problem(source: str, topology: str, input_shape, objective: str,
                      max_latency_ms):
    """The PlanningProblem over the --topology preset or file."""
    from edgesplit.graph import parse_shape
    from edgesplit.hardware import resolve_topology
    from edgesplit.plan import PlanningProblem

    return PlanningProblem(source, resolve_topology(topology),
                           input_shape=parse_shape(input_shape) if input_shape else None,
                           objective=objective,  # type: ignore[arg-type]
                           max_latency_ms=max_latency_ms)


def _autosplit_options(max_acc_drop, bits, measure_all) -> dict[str, Any]:
    from edgesplit.graph import parse_shape

    return {"max_acc_drop": max_acc_drop, "measure_all": measure_all,
            "bits": [int(b) for b in parse_shape(bits)] if bits else None}


def _breakdown_plot(problem, path: Path, model: str) -> None:
    from edgesplit.plan import cut_breakdown
    from edgesplit.report.plots import plot_cut_breakdown

    s = problem.edge_cloud
    plot_cut_breakdown(cut_breakdown(problem), path,
                       title=f"{model}: latency at every cut ({s.edge.name} -> "
                             f"{s.link.name} -> {s.cloud.name})")


def _report(problem, plans, chosen_method: str, accept_unmeasured: bool, sweep_doc,
            as_json: bool, written) -> None:
    """The JSON document or the tables, and what was written."""
    if as_json:
        from edgesplit.plan import plan_document

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
    for path in written:
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


def _check_accuracy_options(methods, eval_data, max_acc_drop, pareto_plot,
                            measure_all=False) -> None:
    """Fail before any planning work on options that cannot apply."""
    from edgesplit.errors import ConfigError

    if max_acc_drop is not None and eval_data is None:
        raise ConfigError("--max-acc-drop needs evaluation data to measure accuracy on: pass "
                          "--eval-data (a built-in data set or a .pt/.npz file)")
    if measure_all and eval_data is None:
        raise ConfigError("--measure-all measures accuracy: pass --eval-data (a built-in data "
                          "set, an image set such as fashion-mnist, or a .pt/.npz file)")
    if pareto_plot is not None and "autosplit" not in methods:
        raise ConfigError("--pareto-plot shows AUTO-SPLIT's candidates: include autosplit in "
                          "--method")


def _eval_data(spec: str | None):
    if spec is None:
        return None
    from edgesplit.data import load_eval_set

    return load_eval_set(spec)


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


def _plan_topology(problem, methods: list[str], draw: Path | None,
                   out_path: Path | None, as_json: bool) -> None:
    from edgesplit.plan import best_method, compare_methods, plan_document

    topo = problem.topology
    with err.status(f"planning {problem.model} over {topo.name} ...", spinner="dots"):
        plans = compare_methods(problem, methods)
    best = best_method(problem, plans)
    if best is None:
        from edgesplit.errors import InfeasibleError

        raise InfeasibleError("no method found a plan that meets the constraints: "
                              + "; ".join(sorted({p.reason or "" for p in plans.values()})))
    chosen = plans[best]
    if not chosen.runnable:
        err.print(f"note: {best} runs {', '.join(chosen.parallel_devices)} in parallel: a "
                  "prediction only (the runtime executes chains, stars and meshes of "
                  "JMSNAS's shape; best_chain can run)")
    if out_path is not None:
        chosen.save(out_path)
    if draw is not None:
        from edgesplit.report.plots import plot_assignment

        plot_assignment(chosen, draw, title=f"{problem.graph.model} over {topo.name}: {best} "
                                            f"({problem.objective})")
    if as_json:
        emit_json(plan_document(problem, plans))
        return
    from edgesplit.report.plan_tables import topology_table

    out.print(topology_table(plan_document(problem, plans), plans))
    for path in (out_path, draw):
        if path:
            err.print(f"wrote {path}")


def _plan_sweep(problem, methods, model: str, plot: Path | None) -> dict[str, Any]:
    from edgesplit.plan import sweep_link
    from edgesplit.report.plots import plot_link_sweep

    with err.status("sweeping the link bandwidth ...", spinner="dots"):
        doc = sweep_link(problem, [m for m in methods if m != "manual"])
    path = plot or Path(f"sweep-{Path(model).stem}.png")
    plot_link_sweep(doc, path)
    doc["plot"] = str(path)
    return doc
