"""`edgesplit devices | links | topologies | profile | calibrate`: the hardware presets, per-layer
profiles, and a roofline calibrated to this machine."""

from __future__ import annotations

from pathlib import Path

import typer

from edgesplit.cli._app import (
    THREADS_HELP,
    TORCH_DEVICE_HELP,
    TRUST_HELP,
    app,
    check_torch_device,
    emit_json,
    err,
    out,
    set_threads,
    user_errors,
)


@app.command()
@user_errors
def devices(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure this-machine again "
                                   "(it is measured once per machine, seconds, and cached)."),
) -> None:
    """List the device presets (this-machine: measured on this machine once, then cached)."""
    from edgesplit.hardware import get_device, list_devices

    if remeasure:
        from edgesplit.hardware.this_machine import remeasure_this_machine

        with err.status("measuring this machine ...", spinner="dots"):
            remeasure_this_machine()
    found = [get_device(name) for name in list_devices()]
    if as_json:
        emit_json({"version": 1, "devices": [d.model_dump(mode="json") for d in found]})
        return
    from edgesplit.report.hardware_tables import devices_table

    out.print(devices_table(found))


@app.command()
@user_errors
def links(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
          ) -> None:
    """List the link presets."""
    from edgesplit.hardware import get_link, list_links

    found = [get_link(name) for name in list_links()]
    if as_json:
        emit_json({"version": 1, "links": [link.model_dump(mode="json") for link in found]})
        return
    from edgesplit.report.hardware_tables import links_table

    out.print(links_table(found))


@app.command()
@user_errors
def topologies(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the topology presets (devices and links, from source to sink)."""
    from edgesplit.hardware import get_topology, list_topologies

    found = [get_topology(name) for name in list_topologies()]
    if as_json:
        emit_json({"version": 1, "topologies": [t.model_dump(mode="json") for t in found]})
        return
    from edgesplit.report.hardware_tables import topologies_table

    out.print(topologies_table(found))


@app.command()
@user_errors
def profile(
    model: str = typer.Argument(..., help="Built-in model name or a .pt2 file."),
    out_path: Path | None = typer.Option(None, "--out", "-o", help="Write the profile JSON."),
    input_shape: str | None = typer.Option(None, "--input-shape", "-s",
                                           help="Input shape for built-ins."),
    batch_size: int | None = typer.Option(None, "--batch-size", "-b", min=1,
                                          help="Batch size (built-ins: replaces the first "
                                               "dimension of the input shape)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed runs first."),
    repeats: int = typer.Option(20, "--repeats", min=1, help="Timed runs."),
    idle_ms: float = typer.Option(0.0, "--idle-ms", min=0.0,
                                  help="Sleep this long before each PyTorch pass, as a split's "
                                       "partition idles on its link between requests (0: back "
                                       "to back, the machine warm)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help=THREADS_HELP),
    no_onnx: bool = typer.Option(False, "--no-onnx", help="Skip ONNX Runtime timings."),
    validate: bool = typer.Option(False, "--validate", help="Also measure the whole model and "
                                  "partitions as one piece and report each estimator's error."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
) -> None:
    """Measure each layer's latency on this machine (eager and ONNX Runtime; on an accelerator,
    --torch-device, eager only)."""
    from rich.progress import BarColumn, Progress, TextColumn

    from edgesplit.graph import capture, parse_shape
    from edgesplit.hardware.profile import profile_graph, save_profile

    set_threads(threads)
    device = check_torch_device(torch_device)
    if validate and device.type != "cpu":
        from edgesplit.errors import ConfigError

        raise ConfigError("--validate checks the estimators against CPU timings: leave it out "
                          f"with --torch-device {device}")
    shape = _batch_shape(model, parse_shape(input_shape) if input_shape else None, batch_size,
                         trust_model_file)
    with err.status(f"capturing {model} ...", spinner="dots"):
        graph = capture(model, input_shape=shape, trust_model_file=trust_model_file)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), console=err, transient=True) as bar:
        task = bar.add_task("profiling", total=1)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        prof = profile_graph(graph, warmup=warmup, repeats=repeats, onnx=not no_onnx,
                             progress=progress, idle_ms=idle_ms, device=device)
        report = _validate(graph, prof, warmup, repeats) if validate else None
    if report is not None:
        prof["validation"] = report
    if out_path is not None:
        save_profile(prof, out_path)
    if as_json:
        emit_json(prof)
        return
    from edgesplit.report.hardware_tables import profile_table, validation_table

    out.print(profile_table(prof))
    if report is not None:
        out.print(validation_table(report))
    if out_path is not None:
        err.print(f"profile written to {out_path}")


def _batch_shape(model: str, shape, batch_size, trust_model_file: bool = False):
    if batch_size is None:
        return shape
    from edgesplit.graph import is_model_file

    if shape is None and is_model_file(model):  # the shape it was exported at
        from edgesplit.errors import ConfigError
        from edgesplit.graph import check_input_shape, saved_input_shape

        saved = saved_input_shape(model, trust_model_file=trust_model_file)
        shape = (batch_size, *saved[1:])
        try:
            check_input_shape(model, shape)  # a batch its dynamic dimension allows, or why not
        except ConfigError as exc:
            raise ConfigError(f"--batch-size {batch_size}: {exc}") from None
        return shape
    elif shape is None:
        from edgesplit.models import get_model_spec

        shape = get_model_spec(model).input_shape
    return (batch_size, *tuple(shape)[1:])


def _validate(graph, prof, warmup: int, repeats: int):
    from edgesplit.hardware import get_device
    from edgesplit.hardware.validate import default_estimators, validate_estimators

    return validate_estimators(graph, default_estimators(prof, get_device("this-machine")),
                               warmup=warmup, repeats=repeats)


@app.command()
@user_errors
def calibrate(
    models: list[str] = typer.Argument(..., help="Built-in model names or .pt2 files to fit "
                                                 "on (several kinds of layers fit best)."),
    out_path: Path = typer.Option(Path("this-machine-calibrated.json"), "--out", "-o",
                                  help="Write the calibrated device file here."),
    name: str = typer.Option("this-machine-calibrated", "--name", help="The device's name."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed runs first."),
    repeats: int = typer.Option(20, "--repeats", min=1, help="Timed runs per model."),
    as_json: bool = typer.Option(False, "--json", help="Print the device JSON."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
) -> None:
    """Fit this-machine's roofline (per-op-class efficiency, per-layer overhead) to per-layer
    profiles of MODELS measured now, under its memory bandwidths measured by working-set size
    (caches, off-chip), and measure its wire codec: a device file whose roofline predicts this
    machine (use it as --edge/--cloud)."""
    from edgesplit.graph import capture
    from edgesplit.hardware import get_device
    from edgesplit.hardware.calibrate import calibrate_roofline
    from edgesplit.hardware.profile import profile_graph
    from edgesplit.plan.codec import measure_wire_codec

    profiles = []
    for model in models:
        with err.status(f"profiling {model} ...", spinner="dots"):
            graph = capture(model, trust_model_file=trust_model_file)
            profiles.append(profile_graph(graph, warmup=warmup, repeats=repeats, onnx=False))
    with err.status("fitting the roofline, timing the wire codec ...", spinner="dots"):
        device = calibrate_roofline(get_device("this-machine"), profiles, name=name)
        device = device.model_copy(update={"wire": measure_wire_codec()})
    doc = device.model_dump(mode="json")
    emit_json(doc, out_path)
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.hardware_tables import calibration_table

    out.print(calibration_table(device))
    err.print(f"device written to {out_path}")
