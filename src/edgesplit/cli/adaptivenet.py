"""`edgesplit nas adaptivenet ...`: AdaptiveNet's three steps: elastify a pretrained model into
a supernet (on the cloud), search it on the device under a latency budget, and serve the pool
of searched subnets, switching when the measured latency drifts."""

from __future__ import annotations

from pathlib import Path

import typer

from edgesplit.cli._app import emit_json, err, out, user_errors
from edgesplit.cli.nas import nas_app, progress_bar

__all__ = ["adaptivenet_app"]

adaptivenet_app = typer.Typer(no_args_is_help=True,
                              help="AdaptiveNet: elastify a pretrained model, search it on the "
                                   "device, switch subnets at run time.")
nas_app.add_typer(adaptivenet_app, name="adaptivenet")


def _fractions(text: str) -> tuple[float, ...]:
    from edgesplit.errors import ConfigError

    if not text.strip():
        return ()
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"--shrink takes fractions like 0.5,0.25; got {text!r}") from None


@adaptivenet_app.command("elastify")
@user_errors
def elastify(
    model: str = typer.Argument(..., help="Built-in model name or a .pt2 file."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Folder for the supernet."),
    input_shape: str | None = typer.Option(None, "--input-shape",
                                           help="Input shape of a built-in model, e.g. "
                                                "1,3,32,32."),
    data: str | None = typer.Option(None, "--data",
                                    help="digits (or any labelled set `load_labelled` reads) "
                                         "or sentences (default: the model's)."),
    task: str | None = typer.Option(None, "--task",
                                    help="labels, agreement or cosine (default: labels when "
                                         "they fit the outputs, else cosine)."),
    gamma: float = typer.Option(0.25, "--gamma", help="Block size limit, a fraction of P0."),
    merge: int = typer.Option(2, "--merge", min=0,
                              help="Most blocks one merged branch removes (0: none)."),
    shrink: str = typer.Option("0.5,0.25", "--shrink",
                               help="Channel fractions shrunk branches keep ('' for none)."),
    distill_epochs: int = typer.Option(10, "--distill-epochs", min=0),
    tune_epochs: int = typer.Option(10, "--tune-epochs", min=0),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    lr: float = typer.Option(3e-3, "--lr", help="Distillation learning rate (Adam)."),
    tune_lr: float = typer.Option(1e-3, "--tune-lr", help="Tuning learning rate (Adam)."),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Elastify MODEL into a supernet (merged and shrunk branches), train the new branches
    (distillation, then tuning) and save it to --out."""
    from edgesplit.graph.capture import parse_shape
    from edgesplit.nas.adaptivenet.elastify import ElasticConfig
    from edgesplit.nas.adaptivenet.run import elastify_model
    from edgesplit.nas.adaptivenet.train import ElasticTrainer

    config = ElasticConfig(gamma=gamma, merge=merge, shrink=_fractions(shrink))
    trainer = ElasticTrainer(distill_epochs=distill_epochs, tune_epochs=tune_epochs,
                             batch_size=batch_size, lr=lr, tune_lr=tune_lr, seed=seed)
    shape = parse_shape(input_shape) if input_shape else None
    with progress_bar(f"AdaptiveNet {model}") as progress:
        _, doc = elastify_model(model, input_shape=shape, config=config, data=data, task=task,
                                trainer=trainer, out=out_dir, progress=progress, seed=seed)
    doc = {"version": 1, "folder": str(out_dir), **doc}
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.adaptivenet_tables import elastify_table, indicator_table

    out.print(elastify_table(doc))
    training = doc["training"]
    out.print(indicator_table(training["indicator_before"], training["indicator_after"],
                              training["task"]))
    err.print(f"supernet written to {out_dir}; search it on this device with `edgesplit nas "
              f"adaptivenet search {out_dir} --budget 0.6`")
