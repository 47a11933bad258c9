"""`edgesplit nas splitnets ...`: SplitNets' two stages (train the split-aware supernet once,
search it for any sensors + aggregator system) and its spaces."""

from __future__ import annotations

from pathlib import Path

import typer

from edgesplit.cli._app import (
    TORCH_DEVICE_HELP,
    check_torch_device,
    emit_json,
    err,
    out,
    user_errors,
)
from edgesplit.cli.nas import nas_app, progress_bar

__all__ = ["splitnets_app"]

splitnets_app = typer.Typer(no_args_is_help=True,
                            help="SplitNets: a split-aware supernet for sensors + aggregator "
                                 "(train once, search per hardware).")
nas_app.add_typer(splitnets_app, name="splitnets")

SPLIT_SPACE_HELP = ("Built-in SplitNets space (`edgesplit nas splitnets spaces`) or a JSON file "
                    "of one.")


@splitnets_app.command("spaces")
@user_errors
def spaces(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
           ) -> None:
    """List the built-in SplitNets spaces."""
    from rich.table import Table

    from edgesplit.nas.splitnets.catalog import DEFAULT_DATA, get_split_space, list_split_spaces

    found = [get_split_space(n) for n in list_split_spaces()]
    if as_json:
        emit_json({"version": 1, "spaces": [{**s.to_dict(), "default_data":
                                             DEFAULT_DATA.get(s.name)} for s in found]})
        return
    table = Table(title="SplitNets spaces")
    for name in ("name", "views", "classes", "resolutions", "phases", "data", "description"):
        table.add_column(name)
    for s in found:
        table.add_row(s.name, str(s.views), str(s.num_classes),
                      ",".join(map(str, s.resolutions)), str(len(s.phases)),
                      DEFAULT_DATA.get(s.name, "-"), s.description)
    out.print(table)


@splitnets_app.command("train")
@user_errors
def train(
    out_dir: Path = typer.Option(..., "--out", "-o", help="Folder for the trained supernet."),
    space: str = typer.Option("digits-split", "--space", "-s", help=SPLIT_SPACE_HELP),
    data: str | None = typer.Option(None, "--data",
                                    help="digits, multiview-shapes[:views=4,...], a folder of "
                                         "class sub-folders or an .npz/.pt (default: the "
                                         "space's)."),
    epochs: int = typer.Option(20, "--epochs", min=1),
    batch_size: int = typer.Option(64, "--batch-size", min=1),
    lr: float = typer.Option(0.05, "--lr", min=0.0),
    sampler: str = typer.Option("five", "--sampler",
                                help="five (appendix D.1) or sandwich (the baseline)."),
    randoms: int = typer.Option(2, "--random-subnets", min=0,
                                help="Random one-module networks per step (the paper: 1; "
                                     "2 trains the middle of the space much faster)."),
    init: str = typer.Option("split-aware", "--init",
                             help="Splitting modules: split-aware, fan-in, fan-out or xavier."),
    distill: bool = typer.Option(True, "--distill/--no-distill",
                                 help="In-place distillation from the largest sub-network."),
    seed: int = typer.Option(0, "--seed"),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Stage 1: train the split-aware supernet of SPACE on DATA and save it to --out."""
    check_torch_device(torch_device)  # a missing accelerator: one line, before the data
    from edgesplit.nas.splitnets.catalog import data_for, resolve_split_space
    from edgesplit.nas.splitnets.run import train_supernet
    from edgesplit.nas.splitnets.train import SupernetTrainer

    resolved = resolve_split_space(space)
    spec = data_for(resolved, data)
    trainer = SupernetTrainer(epochs=epochs, batch_size=batch_size, lr=lr, sampler=sampler,
                              randoms=randoms, distill=distill, seed=seed,
                              torch_device=torch_device)
    trainer.validate()  # a bad option fails before the data loads
    with progress_bar(f"SplitNets {resolved.name} on {spec}") as progress:
        supernet, doc = train_supernet(resolved, spec, out=out_dir, trainer=trainer, init=init,
                                       progress=lambda e, n, row: progress("epoch", e, n))
    built = supernet.space
    if built is not resolved:
        err.print(f"space {resolved.name} built for the data: {built.in_channels} channel(s) "
                  f"(was {resolved.in_channels}), {built.num_classes} classes (was "
                  f"{resolved.num_classes})", highlight=False, soft_wrap=True)
    doc = {"version": 1, "space": built.name, "folder": str(out_dir), **doc}
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.splitnets_tables import splitnets_train_table

    out.print(splitnets_train_table(doc))
    err.print(f"supernet written to {out_dir}; search it with `edgesplit nas splitnets search "
              f"{out_dir} --topology hmd-star`")


@splitnets_app.command("search")
@user_errors
def search(
    supernet: Path = typer.Argument(..., help="Folder of a supernet trained with `train`."),
    topology: str = typer.Option("hmd-star", "--topology", "-t",
                                 help="A star of sensors sending to one aggregator (preset "
                                      "or file)."),
    sensor_memory: str | None = typer.Option(None, "--sensor-memory",
                                             help="Mem_sen, e.g. 256KiB (default: the sensor "
                                                  "device's memory)."),
    sensor_speedup: float = typer.Option(1.0, "--sensor-speedup",
                                         help="Sensors this many times faster (appendix H)."),
    target_ms: float | None = typer.Option(None, "--latency-target-ms",
                                           help="Soft latency target (default: trade off "
                                                "against the largest network)."),
    population: int = typer.Option(32, "--population", min=2),
    generations: int = typer.Option(20, "--generations", min=0),
    save_front: int = typer.Option(3, "--save-front", min=0,
                                   help="Networks along the front to save besides the best."),
    seed: int = typer.Option(0, "--seed"),
    out_dir: Path | None = typer.Option(None, "--out", "-o",
                                        help="Folder for search.json and a model + plan folder "
                                             "per saved network."),
    plot: Path | None = typer.Option(None, "--plot",
                                     help="Write the accuracy/latency plot (PNG)."),
    paper_convention: bool = typer.Option(
        False, "--paper-convention",
        help="Price as SplitNets' Tables 4/6: 8-bit weights and activations, T = OP / Comp, "
             "T_comm = bytes / bandwidth (default: float32 and the devices' estimators)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Stage 2: evolutionary search of a trained supernet for TOPOLOGY under the sensor memory
    limit; --out writes the networks with plans `edgesplit serve/run` execute."""
    from edgesplit.nas.splitnets.cost import FLOAT32, PAPER
    from edgesplit.nas.splitnets.run import search_supernet
    from edgesplit.units import parse_bytes

    limit = parse_bytes(sensor_memory, "--sensor-memory")
    with progress_bar(f"SplitNets search on {topology}") as progress:
        run = search_supernet(supernet, topology, out=out_dir, memory_limit_bytes=limit,
                              sensor_speedup=sensor_speedup, latency_target_ms=target_ms,
                              population=population, generations=generations, seed=seed,
                              save_front=save_front,
                              pricing=PAPER if paper_convention else FLOAT32,
                              progress=lambda g, n, best: progress("generation", g, n))
    doc = {"version": 1, **run.summary}
    if plot is not None:
        from edgesplit.report.plots import plot_search_front

        history = run.search.search_.history_
        plot_search_front([dict(c.metrics) for c in history],
                          [dict(c.metrics) for c in run.search.front_], plot,
                          title=f"SplitNets search on {doc['topology']}",
                          memory_limit_bytes=run.search.hardware.memory_limit_bytes,
                          rejected=run.search.search_.rejected_)
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.splitnets_tables import splitnets_front_table

    out.print(splitnets_front_table(doc))
    if plot is not None:
        err.print(f"plot written to {plot}")
