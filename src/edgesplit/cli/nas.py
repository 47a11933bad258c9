"""`edgesplit nas ...`: neural architecture search, a command group of its own.

``nas_app`` is a typer sub-app mounted as ``nas``; a new search command is one more
``@nas_app.command(...)`` here, reusing :func:`progress_bar` for long work and the SPACE argument
convention (a built-in name or a JSON/YAML/TOML file of ``SearchSpace.to_dict()``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from edgesplit.cli._app import (
    TORCH_DEVICE_HELP,
    app,
    check_torch_device,
    emit_json,
    err,
    out,
    require_positive,
    user_errors,
)

__all__ = ["SPACE_HELP", "nas_app", "progress_bar"]

nas_app = typer.Typer(no_args_is_help=True,
                      help="Neural architecture search: JMSNAS, SplitNets and AdaptiveNet, with "
                           "the search spaces and latency tables they use.")
app.add_typer(nas_app, name="nas")

SPACE_HELP = "Built-in search space name (`edgesplit nas spaces`) or a JSON file of one."


@contextmanager
def progress_bar(description: str) -> Iterator[Callable[[str, int, int], None]]:
    """A transient bar on stderr, fed by the library's ``progress(stage, done, total)``; where
    stderr is no terminal (a log, CI), plain lines instead (:func:`progress_lines`)."""
    if not err.is_terminal:
        yield progress_lines(description)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def report(stage: str, done: int, total: int) -> None:
            bar.update(task, description=f"{description}: {stage}", completed=done, total=total)

        yield report


PROGRESS_LINE_S = 10.0  # a log gets a line at least this often while a stage runs


def progress_lines(description: str, *, every_s: float = PROGRESS_LINE_S,
                   clock: Callable[[], float] = time.monotonic
                   ) -> Callable[[str, int, int], None]:
    """``progress(stage, done, total)`` as lines on stderr for a log: nothing in the first
    ``every_s`` seconds (a quick run, or one refused early, stays quiet or one line); then one
    when a stage starts, when it finishes, and otherwise at most every ``every_s`` seconds (a
    bar's redraws would be thousands of lines; nothing at all left minutes of silence)."""
    start = clock()
    last: dict[str, float | str] = {"stage": "", "at": -math.inf}

    def report(stage: str, done: int, total: int) -> None:
        now = clock()
        if now - start < every_s:
            return
        if stage == last["stage"] and done < total and now - float(last["at"]) < every_s:
            return
        last.update(stage=stage, at=now)
        err.print(f"{description}: {stage} {done}/{total} ({now - start:.0f} s)",
                  highlight=False)

    return report


def _space_for(space, labelled):
    """``space`` for ``labelled``'s sample shape and classes, saying so on stderr when that
    changes it (a 3-class RGB folder through the 1-channel 10-class digits space)."""
    fitted = space.for_data(labelled.sample_shape, len(labelled.classes))
    if fitted is not space:
        c, h, w = fitted.input_shape
        err.print(f"space {space.name} built for the data: {c}x{h}x{w} input (was "
                  f"{'x'.join(map(str, space.input_shape))}), {fitted.num_classes} classes "
                  f"(was {space.num_classes})", highlight=False, soft_wrap=True)
    return fitted


@nas_app.command("spaces")
@user_errors
def spaces(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
           ) -> None:
    """List the built-in search spaces."""
    from edgesplit.nas.jmsnas import get_space, list_spaces

    found = [get_space(name) for name in list_spaces()]
    if as_json:
        emit_json({"version": 1, "spaces": [{**s.to_dict(), "architectures": s.size}
                                            for s in found]})
        return
    from edgesplit.report.nas_tables import spaces_table

    out.print(spaces_table(found))


@nas_app.command("latency-table")
@user_errors
def latency_table(
    space: str = typer.Argument(..., help=SPACE_HELP),
    device: str = typer.Option(..., "--device", "-d",
                               help="this-machine (measured here) or a preset/device file "
                                    "(estimated from its device model)."),
    out_path: Path | None = typer.Option(None, "--out", "-o", help="Write the table (JSON)."),
    batch: int = typer.Option(1, "--batch", "-b", min=1, help="Batch size."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Untimed rounds first (measured)."),
    repeats: int = typer.Option(50, "--repeats", min=1,
                                help="Timed rounds; each op is timed at least twice per "
                                     "round (measured)."),
    threads: int | None = typer.Option(None, "--threads", min=1,
                                       help="Torch threads while measuring (default: torch's "
                                            "setting, what a deployment here would use)."),
    calibration: int = typer.Option(5, "--calibration", min=0,
                                    help="Random networks timed whole to measure the overhead "
                                         "the per-op times miss (measured; 0: none)."),
    validate: int = typer.Option(0, "--validate", min=0,
                                 help="Also time N other random networks whole and report the "
                                      "table's error (this-machine only)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random networks."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Per-op latency table of SPACE on DEVICE: measured here, derived for presets."""
    from edgesplit.errors import ConfigError
    from edgesplit.nas.jmsnas import (
        THIS_MACHINE,
        build_latency_table,
        resolve_space,
        validate_latency_table,
    )

    resolved = resolve_space(space)
    if validate and device != THIS_MACHINE:
        from edgesplit.hardware import resolve_device

        if resolve_device(device).name != THIS_MACHINE:
            raise ConfigError(f"--validate times whole networks on this machine, so it needs "
                              f"--device {THIS_MACHINE}, not {device!r}")
    with progress_bar(f"{resolved.name} on {device}") as progress:
        table = build_latency_table(resolved, device, batch=batch, warmup=warmup,
                                    repeats=repeats, threads=threads, calibration=calibration,
                                    seed=seed, progress=progress)
        report = (validate_latency_table(table, resolved, samples=validate, seed=seed,
                                         warmup=warmup, repeats=repeats, progress=progress)
                  if validate else None)
    if out_path is not None:
        table.save(out_path)
    if as_json:
        emit_json({"version": 1, "table": table.to_dict(), "validation": report,
                   "written_to": str(out_path) if out_path is not None else None})
        return
    from edgesplit.report.nas_tables import latency_table_table, latency_validation_table

    out.print(latency_table_table(table, resolved))
    if report is not None:
        out.print(latency_validation_table(report))
    if out_path is not None:
        err.print(f"latency table written to {out_path}")


def _counts(text: str) -> list[int]:
    from edgesplit.errors import ConfigError

    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--placement {text!r}: give whole numbers of units per device, "
                          "e.g. 4,3,3,0") from None


def _section(text: str) -> tuple[int, int]:
    from edgesplit.errors import ConfigError

    fork, _, join = text.partition(":")
    try:
        return int(fork), int(join)
    except ValueError:
        raise ConfigError(f"--branch-section {text!r}: write FORK:JOIN, the first layer copied "
                          "per branch device and the first after them, e.g. 4:6") from None


@nas_app.command("jmsnas")
@user_errors
def jmsnas(
    topology: str = typer.Option(..., "--topology", "-t",
                                 help="A chain or mesh topology preset (jmsnas-chain, "
                                      "jmsnas-mesh) or file."),
    budget_ms: float = typer.Option(..., "--latency-budget-ms", "-b",
                                    help="T_const: the completion latency to search for (ms)."),
    space: str = typer.Option("digits-mbconv", "--space", "-s", help=SPACE_HELP),
    data: str = typer.Option("digits", "--data",
                             help="digits, a folder of class sub-folders of images, or an "
                                  ".npz/.pt of inputs and labels."),
    table: list[str] = typer.Option([], "--table",
                                    help="DEVICE=FILE: a latency table built with `edgesplit "
                                         "nas latency-table` (repeatable; devices without one "
                                         "get a table built now)."),
    placement: str | None = typer.Option(None, "--placement",
                                         help="Chain: units (stem, layers, head) per device "
                                              "along it, e.g. 4,3,3,0 (default: planned)."),
    section: str | None = typer.Option(None, "--branch-section",
                                       help="Mesh: the layers FORK:JOIN copied onto each "
                                            "branch device, e.g. 4:6 (default: planned)."),
    warmup_epochs: int = typer.Option(2, "--warmup-epochs", min=0),
    epochs: int = typer.Option(8, "--epochs", min=1, help="Search epochs after warm-up."),
    retrain_epochs: int = typer.Option(10, "--retrain-epochs", min=0,
                                       help="Stage 2: epochs training the derived network."),
    batch_size: int = typer.Option(64, "--batch-size", min=1),
    lambda1: float = typer.Option(4e-5, "--lambda1", min=0.0, help="Weight decay of loss (4)."),
    lambda2: float | None = typer.Option(None, "--lambda2", min=0.0,
                                         help="Latency penalty of loss (4) (default 1/T_const^2)."),
    seed: int = typer.Option(0, "--seed"),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
    out_dir: Path | None = typer.Option(None, "--out", "-o",
                                        help="Folder for the network, model.pt2, plan.json "
                                             "and search.json."),
    plot: Path | None = typer.Option(None, "--plot", help="Write Fig. 5 (PNG)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """JMSNAS: search a network for a chain or mesh of devices under a budget, then plan it.

    Stage 1 searches the architecture with the expected latency in the loss, stage 2 retrains
    the derived network; --out writes it with a plan that `edgesplit serve/run` executes."""
    from edgesplit.data.training import load_labelled
    from edgesplit.hardware import resolve_topology
    from edgesplit.nas.jmsnas import resolve_space
    from edgesplit.nas.jmsnas.run import parse_table_options, run_jmsnas

    require_positive(latency_budget_ms=budget_ms)  # before minutes of tables and training
    check_torch_device(torch_device)
    resolved = resolve_space(space)
    topo = resolve_topology(topology)
    files = parse_table_options(table)
    counts = _counts(placement) if placement else None
    fork_join = _section(section) if section else None
    # the data as it is (an RGB folder stays RGB), and the space's network built for it
    labelled = load_labelled(data, image_size=resolved.input_shape[1:], grayscale=None)
    resolved = _space_for(resolved, labelled)
    with progress_bar(f"JMSNAS {resolved.name} on {topo.name}") as progress:
        run = run_jmsnas(resolved, topo, labelled, budget_ms=budget_ms, table_files=files,
                         placement=counts, section=fork_join, out=out_dir,
                         progress=progress,
                         warmup_epochs=warmup_epochs, epochs=epochs,
                         retrain_epochs=retrain_epochs, batch_size=batch_size,
                         lambda1=lambda1, lambda2=lambda2, seed=seed,
                         torch_device=torch_device)
    doc = run.summary()
    if plot is not None:
        from edgesplit.report.plots import plot_search_progress

        plot_search_progress({f"{topo.name}, {budget_ms:g} ms": doc}, plot)
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.nas_tables import jmsnas_epochs_table, jmsnas_result_table

    out.print(jmsnas_epochs_table(doc))
    out.print(jmsnas_result_table(doc))
    if plot is not None:
        err.print(f"Fig. 5 written to {plot}")
