"""The ``edgesplit`` command line: a thin layer over the library.

Every command builds the same objects a Python user would, calls the library, and renders a rich
table or, with ``--json``, one JSON document on stdout. User mistakes (EdgesplitError) print one
line on stderr and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console

from edgesplit.errors import EdgesplitError

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Where to cut a PyTorch model across devices and links, and how to run it.")
# Piped output is not a terminal and rich would wrap at 80 columns; tables need more room.
out = Console() if Console().is_terminal else Console(width=200)
err = Console(stderr=True)


@app.callback()
def _setup(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details.")
           ) -> None:
    """The one logging setup: library modules log, only the CLI configures handlers."""
    if verbose:
        import logging

        from rich.logging import RichHandler

        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s",
                            handlers=[RichHandler(console=err, show_path=False)])
        for noisy in ("torch", "transformers", "filelock"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EdgesplitError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def _emit_json(doc: Any, path: Optional[Path] = None) -> None:
    text = json.dumps(doc, indent=2)
    if path is not None:
        path.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


@app.command()
@_user_errors
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
           ) -> None:
    """List the built-in models."""
    from edgesplit.models import get_model_spec, list_models

    specs = [get_model_spec(name) for name in list_models()]
    if as_json:
        _emit_json({"version": 1, "models": [
            {"name": s.name, "family": s.family, "input_shape": list(s.input_shape),
             "source": s.source, "description": s.description} for s in specs]})
        return
    out.print(models_table_for(specs))


def models_table_for(specs):  # small indirection keeps rich imports out of `--json` paths
    from edgesplit.report import models_table

    return models_table(specs)


_TRUST_HELP = ("Load a .pt2 model file even if it holds pickled data, which runs code when "
               "loaded: only for files whose author you trust.")


def _model_ref(model: str, trust_model_file: bool) -> str:
    """MODEL as given, marked trusted with --trust-model-file: the library captures it again
    in several places and each inherits the decision."""
    from edgesplit.graph import TrustedModelFile

    return TrustedModelFile(model) if trust_model_file else model


@app.command()
@_user_errors
def inspect(
    model: str = typer.Argument(..., help="Built-in model name or a .pt2 file (torch.export.save)."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", "-s",
                                              help="Input shape for built-ins, e.g. 1,3,224,224."),
    raw: bool = typer.Option(False, "--raw", help="Keep one layer per operator (no BN folding or "
                                                   "activation fusion), the graph DADS plans on."),
    split_after: Optional[str] = typer.Option(
        None, "--split-after", help="Layer name(s), comma-separated: show the tensors crossing "
                                    "and the edge peak memory when the edge runs these layers and "
                                    "everything they depend on."),
    cuts_only: bool = typer.Option(False, "--cuts-only", help="Only the cut-point table."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Show only the first N layers."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=_TRUST_HELP),
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
        _emit_json(doc)
        return
    from edgesplit.report import cuts_table, human_bytes, layers_table

    if not cuts_only:
        out.print(layers_table(graph, limit))
    out.print(cuts_table(graph, graph.single_tensor_cuts()))
    if split is not None:
        out.print(f"edge part: {split['edge_layers']} layers; crossing: "
                  f"{', '.join(split['crossing'])} ({human_bytes(split['crossing_bytes'])}); "
                  f"edge peak memory {human_bytes(split['memory']['total_bytes'])} "
                  f"(weights {human_bytes(split['memory']['weight_bytes'])}, activations "
                  f"{human_bytes(split['memory']['activation_bytes'])} at "
                  f"{split['memory']['peak_layer']})")


def _split_report(graph, split_after: str) -> dict[str, Any]:
    edge = graph.ancestors_closure([s.strip() for s in split_after.split(",") if s.strip()])
    crossing = graph.crossing_tensors(edge)
    return {
        "edge_layers": len(edge),
        "crossing": [t.name for t in crossing],
        "crossing_elements": sum(t.elements for t in crossing),
        "crossing_bytes": sum(t.bytes for t in crossing),
        "memory": graph.peak_memory(edge).to_dict(),
    }


@app.command()
@_user_errors
def devices(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
            ) -> None:
    """List the device presets (this-machine is measured live, about a second)."""
    from edgesplit.hardware import get_device, list_devices

    found = [get_device(name) for name in list_devices()]
    if as_json:
        _emit_json({"version": 1, "devices": [d.model_dump(mode="json") for d in found]})
        return
    from edgesplit.report.hardware_tables import devices_table

    out.print(devices_table(found))


@app.command()
@_user_errors
def links(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
          ) -> None:
    """List the link presets."""
    from edgesplit.hardware import get_link, list_links

    found = [get_link(name) for name in list_links()]
    if as_json:
        _emit_json({"version": 1, "links": [link.model_dump(mode="json") for link in found]})
        return
    from edgesplit.report.hardware_tables import links_table

    out.print(links_table(found))


@app.command()
@_user_errors
def topologies(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the topology presets (devices and links, from source to sink)."""
    from edgesplit.hardware import get_topology, list_topologies

    found = [get_topology(name) for name in list_topologies()]
    if as_json:
        _emit_json({"version": 1, "topologies": [t.model_dump(mode="json") for t in found]})
        return
    from edgesplit.report.hardware_tables import topologies_table

    out.print(topologies_table(found))


@app.command()
@_user_errors
def profile(
    model: str = typer.Argument(..., help="Built-in model name or a .pt2 file."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the profile JSON."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", "-s",
                                              help="Input shape for built-ins."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", min=1,
                                             help="Batch size (built-ins: replaces the first "
                                                  "dimension of the input shape)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed runs first."),
    repeats: int = typer.Option(20, "--repeats", min=1, help="Timed runs."),
    no_onnx: bool = typer.Option(False, "--no-onnx", help="Skip ONNX Runtime timings."),
    validate: bool = typer.Option(False, "--validate", help="Also measure the whole model and "
                                  "partitions as one piece and report each estimator's error."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=_TRUST_HELP),
) -> None:
    """Measure each layer's latency on this machine (eager and ONNX Runtime)."""
    from rich.progress import BarColumn, Progress, TextColumn

    from edgesplit.graph import capture, parse_shape
    from edgesplit.hardware.profile import profile_graph, save_profile

    shape = _batch_shape(model, parse_shape(input_shape) if input_shape else None, batch_size)
    with err.status(f"capturing {model} ...", spinner="dots"):
        graph = capture(model, input_shape=shape, trust_model_file=trust_model_file)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), console=err, transient=True) as bar:
        task = bar.add_task("profiling", total=1)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        prof = profile_graph(graph, warmup=warmup, repeats=repeats, onnx=not no_onnx,
                             progress=progress)
        report = _validate(graph, prof, warmup, repeats) if validate else None
    if report is not None:
        prof["validation"] = report
    if out_path is not None:
        save_profile(prof, out_path)
    if as_json:
        _emit_json(prof)
        return
    from edgesplit.report.hardware_tables import profile_table, validation_table

    out.print(profile_table(prof))
    if report is not None:
        out.print(validation_table(report))
    if out_path is not None:
        err.print(f"profile written to {out_path}")


def _batch_shape(model: str, shape, batch_size):
    if batch_size is None:
        return shape
    if shape is None:
        from edgesplit.models import get_model_spec

        shape = get_model_spec(model).input_shape
    return (batch_size, *tuple(shape)[1:])


def _validate(graph, prof, warmup: int, repeats: int):
    from edgesplit.hardware import get_device
    from edgesplit.hardware.validate import default_estimators, validate_estimators

    return validate_estimators(graph, default_estimators(prof, get_device("this-machine")),
                               warmup=warmup, repeats=repeats)


def _parse_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    import re

    from edgesplit.errors import ConfigError

    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
             "gib": 2**30}
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in units:
        raise ConfigError(f"--edge-memory {text!r} is not a size: use bytes or a unit, e.g. "
                          "2097152, 2MiB, 64MB")
    return int(float(match.group(1)) * units[match.group(2).lower()])


@app.command()
@_user_errors
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
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=_TRUST_HELP),
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
        _plan_topology(_model_ref(model, trust_model_file), topology, objective, max_latency_ms,
                       input_shape, draw, out_path, as_json)
        return
    if objective != "latency" or max_latency_ms is not None or draw is not None:
        from edgesplit.errors import ConfigError

        raise ConfigError("--objective, --max-latency-ms and --draw apply to --topology planning")
    from edgesplit.hardware import resolve_device, resolve_link
    from edgesplit.plan import ALL_METHODS, EdgeCloudSetting, PlanningProblem, plan_document

    setting = EdgeCloudSetting(edge=resolve_device(edge), cloud=resolve_device(cloud),
                               link=resolve_link(link), edge_memory_bytes=_parse_bytes(edge_memory),
                               privacy_layer=privacy_layer, result_at=result_at,
                               input_bits=input_bits)
    problem = PlanningProblem(_model_ref(model, trust_model_file), setting,
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
        _emit_json(doc)
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
    from edgesplit.graph import capture, parse_shape
    from edgesplit.hardware import resolve_topology
    from edgesplit.plan.topology_run import compare_topology_methods, topology_document

    topo = resolve_topology(topology)
    with err.status(f"planning {model} over {topo.name} ...", spinner="dots"):
        graph = capture(model, input_shape=parse_shape(input_shape) if input_shape else None)
        _, plans = compare_topology_methods(graph, topo, source=model,
                                                objective=objective,  # type: ignore[arg-type]
                                                max_latency_ms=max_latency_ms)
    doc = topology_document(graph, topo, plans, objective=objective)
    if doc["best"] is None:
        from edgesplit.errors import InfeasibleError

        raise InfeasibleError("no method found a plan that meets the constraints: "
                              + "; ".join(sorted({p.reason or "" for p in plans.values()})))
    chosen = plans[doc["best"]]
    if out_path is not None:
        chosen.save(out_path)
    if draw is not None:
        from edgesplit.report.plots import plot_assignment

        plot_assignment(chosen, draw, title=f"{graph.model} over {topo.name}: {doc['best']} "
                                            f"({objective})")
    if as_json:
        _emit_json(doc)
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


def _tls(cert: Optional[Path], key: Optional[Path], ca: Optional[Path]):
    if cert is None and key is None and ca is None:
        return None
    from edgesplit.errors import ConfigError
    from edgesplit.runtime.transport import TlsFiles

    def read(path: Optional[Path]) -> bytes | None:
        if path is None:
            return None
        if not path.is_file():
            raise ConfigError(f"TLS file {str(path)!r} does not exist")
        return path.read_bytes()

    return TlsFiles(cert=read(cert), key=read(key), ca=read(ca))


def _load_program(plan_path: Path, backend: str = "torch", trust_model_file: bool = False):
    from edgesplit.plan import load_plan
    from edgesplit.runtime import PlanProgram

    with err.status(f"loading {plan_path} ...", spinner="dots"):
        return PlanProgram.load(load_plan(plan_path), backend=backend,
                                trust_model_file=trust_model_file)


_BACKEND_HELP = "torch (the captured program) or onnxruntime (each part exported to ONNX)."
_TOKEN_HELP = ("Bearer token (both sides give the same). Visible in `ps`: prefer --token-file "
               "or the EDGESPLIT_TOKEN environment variable.")
_TOKEN_FILE_HELP = "Read the bearer token from this file (one line)."


@app.command()
@_user_errors
def export(
    plan_path: Path = typer.Argument(..., help="A plan written by `edgesplit plan --out`."),
    out_dir: Path = typer.Option(Path("export"), "--out", "-o", help="Folder to write into."),
    fmt: str = typer.Option("onnx", "--format", help="onnx (one file per device)."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=_TRUST_HELP),
) -> None:
    """Write every device's part of PLAN as its own ONNX model (inputs and outputs named by
    tensor), plus manifest.json saying what each device receives, sends and at which bits."""
    from edgesplit.errors import ConfigError

    if fmt != "onnx":
        raise ConfigError(f"unknown export format {fmt!r}: use onnx")
    program = _load_program(plan_path, trust_model_file=trust_model_file)
    out_dir.mkdir(parents=True, exist_ok=True)
    with err.status("exporting ...", spinner="dots"):
        models = program.export_onnx()
    for device, data in models.items():
        (out_dir / f"{device}.onnx").write_bytes(data)
        err.print(f"wrote {out_dir / f'{device}.onnx'} ({len(data):,} bytes)")
    _emit_json(program.manifest(), out_dir / "manifest.json")
    err.print(f"wrote {out_dir / 'manifest.json'}")


@app.command()
@_user_errors
def serve(
    plan_path: Path = typer.Argument(..., help="A plan written by `edgesplit plan --out`."),
    device: str = typer.Option(..., "--device", "-d", help="The plan device this server runs "
                                                           "(e.g. cloud, or a middle hop)."),
    port: int = typer.Option(50051, "--port", "-p", help="Port (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: all)."),
    next_hop: Optional[str] = typer.Option(None, "--next", help="HOST:PORT of the next device "
                                                                "(middle hops of a chain)."),
    token: Optional[str] = typer.Option(None, "--token", help=_TOKEN_HELP),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help=_TOKEN_FILE_HELP),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="Serve TLS: certificate."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="Serve TLS: private key."),
    tls_ca: Optional[Path] = typer.Option(None, "--tls-ca", help="Reach --next over TLS, "
                                                                 "trusting this CA."),
    no_shape: bool = typer.Option(False, "--no-shape", help="Do not emulate the plan's links."),
    workers: int = typer.Option(32, "--workers", help="Concurrent requests served."),
    backend: str = typer.Option("torch", "--backend", help=_BACKEND_HELP),
    max_batch: int = typer.Option(1, "--max-batch", help="Batch up to this many concurrent "
                                                          "requests (1: no batching)."),
    max_wait_ms: float = typer.Option(2.0, "--max-wait-ms", help="With --max-batch: longest "
                                                                 "wait for a batch to fill."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=_TRUST_HELP),
) -> None:
    """Serve one device's part of PLAN over gRPC until interrupted (Ctrl-C / SIGTERM stop it
    gracefully)."""
    from edgesplit.runtime.transport import PartitionServer, read_token, serve_forever

    token = read_token(token, token_file)
    program = _load_program(plan_path, backend, trust_model_file)
    server = PartitionServer(program, device, next_address=next_hop, token=token,
                             tls=_tls(tls_cert, tls_key, tls_ca), shape=not no_shape,
                             max_workers=workers, max_batch=max_batch,
                             max_wait_ms=max_wait_ms)
    bound = server.start(host, port)
    # one machine-readable line on stdout: scripts and tests wait for it
    print(f"listening on {host}:{bound} device={device} plan={program.plan_id}", flush=True)
    serve_forever(server)


@app.command()
@_user_errors
def run(
    plan_path: Path = typer.Argument(..., help="A plan written by `edgesplit plan --out`."),
    server: str = typer.Option(..., "--server", help="HOST:PORT of the second device's server."),
    input_path: Optional[Path] = typer.Option(None, "--input", help=".pt/.npz of inputs "
                                                                    "(default: the example)."),
    requests: int = typer.Option(1, "--requests", "-n", help="Requests per client."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="Concurrent clients."),
    token: Optional[str] = typer.Option(None, "--token", help=_TOKEN_HELP),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help=_TOKEN_FILE_HELP),
    tls_ca: Optional[Path] = typer.Option(None, "--tls-ca", help="Use TLS, trusting this CA."),
    no_shape: bool = typer.Option(False, "--no-shape", help="Do not emulate the plan's links."),
    retries: int = typer.Option(0, "--retries", help="Retry unavailable servers this often."),
    timeout_s: float = typer.Option(60.0, "--timeout-s", help="Per-request deadline."),
    warmup: int = typer.Option(1, "--warmup", help="Unreported requests first, per client."),
    backend: str = typer.Option("torch", "--backend", help=_BACKEND_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=_TRUST_HELP),
) -> None:
    """Run the first device's part of PLAN here and the rest on the served chain; report
    measured against predicted latency and the difference from the unsplit model."""
    from edgesplit.runtime.session import load_inputs, run_requests
    from edgesplit.runtime.transport import read_token

    token = read_token(token, token_file)
    program = _load_program(plan_path, backend, trust_model_file)
    batches = load_inputs(input_path, program) if input_path else None
    options = {"token": token, "tls": _tls(None, None, tls_ca), "shape": not no_shape,
               "retries": retries, "timeout_s": timeout_s}
    with err.status(f"{requests * concurrency} request(s) to {server} ...", spinner="dots"):
        report = run_requests(program, server, requests=requests, concurrency=concurrency,
                              inputs=batches, client_options=options, warmup=warmup)
    if as_json:
        _emit_json(report)
    else:
        from edgesplit.report.plan_tables import run_table

        out.print(run_table(report))
    if report["errors"]:
        raise typer.Exit(1)


@app.command("simulate-l2s")
@_user_errors
def simulate_l2s(
    model: str = typer.Option("alexnet", "--model", help="Built-in model name or .pt2 file."),
    bandwidth_mbps: float = typer.Option(60.0, "--bandwidth-mbps", help="Link bandwidth."),
    rounds: int = typer.Option(500, "--rounds", help="Training rounds to simulate."),
    drop_at: Optional[int] = typer.Option(None, "--drop-at", help="Round of a bandwidth drop."),
    drop_to: Optional[float] = typer.Option(None, "--drop-to", help="Bandwidth after the drop."),
    restore_at: Optional[int] = typer.Option(
        None, "--restore-at", help="Round where the bandwidth returns to --bandwidth-mbps."),
    device: str = typer.Option("raspberry-pi-4", "--device", help="End device preset or file."),
    server: str = typer.Option("gtx1080ti-server", "--server", help="Edge server."),
    rtt_ms: float = typer.Option(5.0, "--rtt-ms", help="Round-trip time of the link."),
    privacy_split: Optional[int] = typer.Option(
        None, "--privacy-split", help="P^c: at least this many layers stay on the device."),
    privacy_kl: Optional[float] = typer.Option(
        None, "--privacy-kl", help="P^c from the KL privacy analysis: every cut sent must "
        "reach this divergence (pre-trained models with built-in data, e.g. digits_cnn)."),
    seed: int = typer.Option(0, "--seed"),
    noise: float = typer.Option(0.05, "--noise", help="Relative noise of each delay."),
    alpha: Optional[float] = typer.Option(
        None, "--alpha", help="Exploration weight, in units of the on-device delay."),
    random_reentry: float = typer.Option(
        0.0, "--random-reentry", help="r_d: chance per regular round to re-enter adaptation."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Delay and partition per round."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=_TRUST_HELP),
) -> None:
    """Simulate L2S split training (trace-driven): Oracle, FPT, PDT, LinUCB, L2S and L2S-FWS
    on the same model, devices and bandwidth trace."""
    from edgesplit.graph import capture
    from edgesplit.hardware import resolve_device
    from edgesplit.errors import ConfigError
    from edgesplit.train.l2s import L2S_ALPHA, compare_policies
    from edgesplit.train.modes import ModeConfig
    from edgesplit.train.privacy import analyse_privacy
    from edgesplit.train.simulator import BandwidthTrace

    if privacy_split is not None and privacy_kl is not None:
        raise ConfigError("give --privacy-split or --privacy-kl, not both")
    trace = BandwidthTrace(bandwidth_mbps, rtt_ms, drop_at, drop_to, restore_at)
    modes = ModeConfig(r_d=random_reentry, seed=seed)
    with err.status(f"simulating {rounds} rounds of {model} ...", spinner="dots"):
        graph = capture(model, optimize=False,  # L2S splits the framework's own layers
                        trust_model_file=trust_model_file)
        privacy = None
        if privacy_kl is not None:
            privacy = analyse_privacy(model, privacy_kl, graph)
            privacy_split = privacy["privacy_split"]
        doc = compare_policies(graph, resolve_device(device), resolve_device(server), trace,
                               rounds, privacy_split=privacy_split, seed=seed, noise=noise,
                               alpha=L2S_ALPHA if alpha is None else alpha, modes=modes,
                               privacy=privacy)
    if plot is not None:
        from edgesplit.report.plots import plot_l2s

        plot_l2s(doc, plot)
    if as_json:
        _emit_json(doc)
        return
    from rich.table import Table

    table = Table(title=f"{model}: {doc['device']} -> {doc['server']}, {bandwidth_mbps:g} Mbps"
                        + (f", {drop_to:g} Mbps from round {drop_at}" if drop_at else "")
                        + (f", back at {restore_at}" if restore_at else "")
                        + f"; privacy point {doc['privacy_point']} layers")
    for col in ("policy", "mean delay ms", "last 20 % ms", "final partition", "sync MB"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, run in doc["policies"].items():
        tail = run["delays_ms"][-max(1, rounds // 5):]
        table.add_row(name, f"{run['mean_delay_ms']:.1f}", f"{sum(tail) / len(tail):.1f}",
                      str(run["partitions"][-1]), f"{sum(run['sync_bytes']) / 1e6:.1f}")
    out.print(table)
    if plot is not None:
        err.print(f"wrote {plot}")


@app.command("serve-training")
@_user_errors
def serve_training_cmd(
    model: str = typer.Option("digits_cnn", "--model", help="Model to train (untrained)."),
    lr: float = typer.Option(0.01, "--lr", help="SGD learning rate of the server's layers."),
    momentum: float = typer.Option(0.9, "--momentum", help="SGD momentum."),
    seed: int = typer.Option(0, "--seed", help="Initial weights (the device must match)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(50052, "--port", "-p", help="Port (0: any free port)."),
    token: Optional[str] = typer.Option(None, "--token", help=_TOKEN_HELP),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help=_TOKEN_FILE_HELP),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="Serve TLS: certificate."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="Serve TLS: private key."),
    max_batch: int = typer.Option(256, "--max-batch", help="Most samples per training round "
                                                           "(sizes the message limit)."),
    session_timeout_s: float = typer.Option(
        600.0, "--session-timeout-s", help="Idle time after which another device may start "
                                           "a session."),
) -> None:
    """Serve the edge-server side of split training (L2S) until interrupted: one device's
    session at a time (another is refused until it closes, idles out, or a device takes it
    over with `train-split --take-over`)."""
    from edgesplit.runtime.transport import read_token
    from edgesplit.train.remote import serve_training

    serve_training(model, lr=lr, momentum=momentum, seed=seed, host=host, port=port,
                   token=read_token(token, token_file), tls=_tls(tls_cert, tls_key, None),
                   max_batch=max_batch, session_timeout_s=session_timeout_s,
                   on_ready=lambda bound: print(f"listening on {host}:{bound} model={model}",
                                                flush=True))


@app.command("train-split")
@_user_errors
def train_split_cmd(
    model: str = typer.Option("digits_cnn", "--model", help="Model to train from scratch."),
    server: Optional[str] = typer.Option(
        None, "--server", help="HOST:PORT of `edgesplit serve-training` (default: start one)."),
    epochs: int = typer.Option(8, "--epochs"),
    batch_size: int = typer.Option(32, "--batch-size"),
    lr: float = typer.Option(0.01, "--lr"),
    momentum: float = typer.Option(0.9, "--momentum"),
    seed: int = typer.Option(0, "--seed"),
    bandwidth_mbps: float = typer.Option(400.0, "--bandwidth-mbps", help="Emulated link."),
    rtt_ms: float = typer.Option(2.0, "--rtt-ms"),
    drop_at: Optional[int] = typer.Option(None, "--drop-at", help="Round of a bandwidth drop."),
    drop_to: Optional[float] = typer.Option(None, "--drop-to", help="Bandwidth after the drop."),
    restore_at: Optional[int] = typer.Option(None, "--restore-at",
                                             help="Round where the bandwidth comes back."),
    device_slowdown: float = typer.Option(
        20.0, "--device-slowdown", help="How much slower the device computes than the server."),
    policy: str = typer.Option("l2s", "--policy", help="l2s (learn the cut) or fixed."),
    cut: Optional[int] = typer.Option(None, "--cut", help="Fixed policy: last device element."),
    sync: str = typer.Option("fws", "--sync", help="Weight sync: fws or periodic."),
    sync_every: int = typer.Option(100, "--sync-every", help="Periodic sync interval."),
    privacy_kl: Optional[float] = typer.Option(
        1.0, "--privacy-kl", help="P^c: every cut sent must reach this KL divergence."),
    no_privacy: bool = typer.Option(False, "--no-privacy", help="Allow every cut."),
    horizon: int = typer.Option(30, "--horizon", help="Rounds of one adaptation phase."),
    random_reentry: float = typer.Option(0.0, "--random-reentry", help="r_d per round."),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline",
                                  help="Also train unsplit, to compare accuracy."),
    token: Optional[str] = typer.Option(None, "--token", help=_TOKEN_HELP),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help=_TOKEN_FILE_HELP),
    tls_ca: Optional[Path] = typer.Option(None, "--tls-ca", help="Reach --server over TLS, "
                                                                 "trusting this CA."),
    take_over: bool = typer.Option(False, "--take-over", help="End the session the server "
                                   "has open (this device's, before a crash) and start over."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Delay and cut per round."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Split training over two processes (L2S): the device trains the front layers on the
    digits, the server the back ones; L2S learns the cut as the emulated link changes."""
    from contextlib import nullcontext

    from edgesplit.errors import ConfigError
    from edgesplit.runtime.transport import read_token
    from edgesplit.train.remote import DEFAULT_MAX_BATCH
    from edgesplit.train.session import (TrainSplitConfig, local_training_server,
                                         one_core_per_side, train_split)

    if server is None and (tls_ca is not None or take_over):
        raise ConfigError("--tls-ca and --take-over are for a server you started (--server "
                          "HOST:PORT); without --server, train-split starts its own on "
                          "127.0.0.1")
    token = read_token(token, token_file)
    tls = _tls(None, None, tls_ca)

    config = TrainSplitConfig(
        model=model, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, seed=seed,
        bandwidth_mbps=bandwidth_mbps, rtt_ms=rtt_ms, drop_at=drop_at, drop_to=drop_to,
        restore_at=restore_at, device_slowdown=device_slowdown, policy=policy, cut=cut,
        sync=sync, sync_every=sync_every, privacy_kl=None if no_privacy else privacy_kl,
        horizon=horizon, random_reentry=random_reentry, baseline=baseline)
    if server is None:
        one_core_per_side()
    spawn = local_training_server(model, lr=lr, momentum=momentum, seed=seed, token=token,
                                  max_batch=max(batch_size, DEFAULT_MAX_BATCH)) \
        if server is None else nullcontext(server)
    with spawn as address:
        doc = train_split(config, address, token=token, tls=tls, take_over=take_over,
                          progress=not as_json)
    if plot is not None:
        from edgesplit.report.plots import plot_train_split

        plot_train_split(doc, plot)
    if as_json:
        _emit_json(doc)
        return
    _print_train_split(doc)
    if plot is not None:
        err.print(f"wrote {plot}")


def _print_train_split(doc: dict) -> None:
    from rich.table import Table

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
    out.print(table)
    line = f"held-out accuracy {doc['accuracy']:.2f} % on {doc['test_samples']} digits"
    if "baseline_accuracy" in doc:
        line += f" (unsplit training: {doc['baseline_accuracy']:.2f} %)"
    out.print(line)
    if doc["adaptations"]:
        out.print("adaptation phases began at rounds "
                  + ", ".join(f"{a['round']} ({a['reason']})" for a in doc["adaptations"])
                  + "; settled at "
                  + ", ".join(f"round {s['round']} on cut {s['cut']}" for s in doc["settled"]))


def _segments(mbps: list, n: int, size: int = 25) -> list[tuple[int, int]]:
    """Row ranges: a new row at every bandwidth change and every ``size`` rounds."""
    bounds, lo = [], 0
    for t in range(1, n + 1):
        if t == n or mbps[t] != mbps[lo] or t - lo == size:
            bounds.append((lo, t))
            lo = t
    return bounds


def main() -> None:
    app()


if __name__ == "__main__":
    main()
