"""`edgesplit nas ...`: neural architecture search, a command group of its own.

``nas_app`` is a typer sub-app mounted as ``nas``; a new search command is one more
``@nas_app.command(...)`` here, reusing :func:`progress_bar` for long work and the SPACE argument
convention (a built-in name or a JSON/YAML/TOML file of ``SearchSpace.to_dict()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from edgesplit.cli._app import app, emit_json, err, out, user_errors

__all__ = ["SPACE_HELP", "nas_app", "progress_bar"]

nas_app = typer.Typer(no_args_is_help=True,
                      help="Neural architecture search: search spaces and latency tables.")
app.add_typer(nas_app, name="nas")

SPACE_HELP = "Built-in search space name (`edgesplit nas spaces`) or a JSON file of one."


@contextmanager
def progress_bar(description: str) -> Iterator[Callable[[str, int, int], None]]:
    """A transient bar on stderr, fed by the library's ``progress(stage, done, total)``."""
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


@nas_app.command("spaces")
@user_errors
def spaces(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
           ) -> None:
    """List the built-in search spaces."""
    from edgesplit.nas import get_space, list_spaces

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
    from edgesplit.nas import (
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
