"""`edgesplit nas adaptivenet ...`: AdaptiveNet's three steps: elastify a pretrained model into
a supernet (on the cloud), search it on the device under a latency budget, and serve the pool
of searched subnets, switching when the measured latency drifts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from edgesplit.cli._app import (
    TORCH_DEVICE_HELP,
    check_torch_device,
    emit_json,
    err,
    out,
    require_positive,
    set_threads,
    user_errors,
)
from edgesplit.cli.nas import nas_app, progress_bar

if TYPE_CHECKING:
    from edgesplit.plan.cost import EdgeCloudSetting

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
    model: str = typer.Argument(..., help="Built-in model name, your own model as "
                                          "my_net.py:MyNet (with --input-shape), or a .pt2 "
                                          "file."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Folder for the supernet."),
    input_shape: str | None = typer.Option(None, "--input-shape",
                                           help="Input shape of a built-in model or "
                                                "your own, e.g. 1,3,32,32."),
    data: str | None = typer.Option(None, "--data",
                                    help="digits (or any labelled set `load_labelled` reads), "
                                         "sentences, or fashion-mnist:size=96,channels=3,"
                                         "norm=imagenet (streamed; default: the model's)."),
    train_limit: int | None = typer.Option(None, "--train-limit", min=1,
                                           help="Train on the first N training samples."),
    search_size: int | None = typer.Option(None, "--search-size", min=1,
                                           help="Samples the device searches on (default: "
                                                "1000 of an image set's held-out 5000; half "
                                                "the held-out part of a labelled set)."),
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
    threads: int | None = typer.Option(None, "--threads", min=1,
                                       help="torch threads (default: torch's)."),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Elastify MODEL into a supernet (merged and shrunk branches), train the new branches
    (distillation, then tuning) and save it to --out."""
    check_torch_device(torch_device)  # a missing accelerator: one line, before the capture
    from edgesplit.graph.capture import parse_shape
    from edgesplit.nas.adaptivenet.elastify import ElasticConfig
    from edgesplit.nas.adaptivenet.run import elastify_model
    from edgesplit.nas.adaptivenet.train import ElasticTrainer

    config = ElasticConfig(gamma=gamma, merge=merge, shrink=_fractions(shrink))
    trainer = ElasticTrainer(distill_epochs=distill_epochs, tune_epochs=tune_epochs,
                             batch_size=batch_size, lr=lr, tune_lr=tune_lr, seed=seed,
                             torch_device=torch_device)
    shape = parse_shape(input_shape) if input_shape else None
    set_threads(threads)
    with progress_bar(f"AdaptiveNet {model}") as progress:
        _, doc = elastify_model(model, input_shape=shape, config=config, data=data, task=task,
                                trainer=trainer, out=out_dir, progress=progress, seed=seed,
                                train_limit=train_limit, search_size=search_size)
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


def _setting(edge: str | None, cloud: str | None, link: str | None
             ) -> EdgeCloudSetting | None:
    """The edge-cloud setting of a joint search, or None for a search on this device."""
    from edgesplit.errors import ConfigError
    from edgesplit.hardware.catalog import resolve_device, resolve_link
    from edgesplit.plan.cost import EdgeCloudSetting

    given = [v is not None for v in (edge, cloud, link)]
    if not any(given):
        return None
    if not all(given):
        raise ConfigError("a joint subnet + split search needs --edge, --cloud and --link "
                          "together (or none of them to search for this device alone)")
    assert edge is not None and cloud is not None and link is not None
    return EdgeCloudSetting(edge=resolve_device(edge), cloud=resolve_device(cloud),
                            link=resolve_link(link))


@adaptivenet_app.command("search")
@user_errors
def search(
    supernet: Path = typer.Argument(..., help="Folder written by `elastify`."),
    budget: float | None = typer.Option(None, "--budget",
                                        help="Latency budget as a fraction of the pretrained "
                                             "model's (default 0.6)."),
    budget_ms: float | None = typer.Option(None, "--budget-ms", help="Absolute budget (ms)."),
    delta: float = typer.Option(0.1, "--delta",
                                help="Half-width of the band NearbyInit/Mutate keep "
                                     "candidates in, as a fraction of the budget."),
    edge: str | None = typer.Option(None, "--edge", help="Joint search: the edge device."),
    cloud: str | None = typer.Option(None, "--cloud", help="Joint search: the cloud device."),
    link: str | None = typer.Option(None, "--link", help="Joint search: the link."),
    population: int = typer.Option(20, "--population", min=2),
    iterations: int = typer.Option(10, "--iterations", min=0),
    max_depth: int = typer.Option(4, "--max-depth", min=1,
                                  help="Most prefix features cached at once."),
    reuse: bool = typer.Option(True, "--reuse/--no-reuse",
                               help="Reuse shared prefixes' features (Algorithm 1)."),
    batch: int = typer.Option(1, "--batch", min=1, help="Batch size latency is measured at."),
    repeats: int = typer.Option(20, "--repeats", min=1, help="Profiling rounds."),
    seed: int = typer.Option(0, "--seed"),
    threads: int | None = typer.Option(None, "--threads", min=1,
                                       help="torch threads (default: torch's)."),
    out_dir: Path | None = typer.Option(None, "--out", "-o",
                                        help="Folder for search.json, pool.json, the latency "
                                             "table, model.pt2 and plan.json."),
    plot: Path | None = typer.Option(None, "--plot",
                                     help="Write the accuracy/latency plot of the search."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Search SUPERNET on this device under a latency budget (block latency table profiled
    here), or jointly with its edge-cloud split (--edge/--cloud/--link); --out writes the best
    subnet as a model + plan `edgesplit serve` runs, and the pool `serve` switches within."""
    from edgesplit.nas.adaptivenet.run import search_device

    require_positive(budget=budget, budget_ms=budget_ms, delta=delta)  # before profiling
    setting = _setting(edge, cloud, link)
    set_threads(threads)
    with progress_bar(f"AdaptiveNet search of {supernet}") as progress:
        run = search_device(supernet, budget=budget, budget_ms=budget_ms, delta=delta,
                            setting=setting, population=population, iterations=iterations,
                            max_depth=max_depth, reuse=reuse, batch=batch, repeats=repeats,
                            seed=seed, out=out_dir, progress=progress)
    doc = {"version": 1, **run.summary}
    for warning in doc.get("warnings", []):
        err.print(f"warning: {warning}", highlight=False, soft_wrap=True, markup=False)
    if plot is not None:
        from edgesplit.report.plots import plot_search_front

        points = [{"latency_ms": h["latency_ms"], "accuracy": h["accuracy"]}
                  for h in doc["history"]]
        front = [{"latency_ms": e["latency_s"] * 1000, "accuracy": e["accuracy"]}
                 for e in doc["pool"]]
        marks = [{"method": "held out", "label": name, "latency_ms": doc[name]["latency_ms"],
                  "accuracy": doc[name]["test_accuracy"]} for name in ("best", "original")]
        plot_search_front(points, front, plot, baselines=marks,
                          title=f"AdaptiveNet search of {doc['model']}, budget "
                                f"{doc['budget_ms']:.3g} ms", searched_on="search data",
                          xlabel="predicted latency (ms, log)",
                          ylabel=doc.get("score", f"accuracy ({doc['metric']})"))
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.adaptivenet_tables import search_table

    out.print(search_table(doc))
    if out_dir is not None:
        err.print(f"best subnet and plan written to {out_dir}; watch it switch with `edgesplit "
                  f"nas adaptivenet serve {out_dir}`")


@adaptivenet_app.command("serve")
@user_errors
def serve(
    folder: Path = typer.Argument(..., help="Folder written by `search --out`."),
    requests: int = typer.Option(600, "--requests", min=10),
    load: str = typer.Option("cpu", "--load",
                             help="cpu (background processes) or slowdown (each request "
                                  "sleeps to --factor times its compute: deterministic)."),
    processes: int = typer.Option(2, "--processes", min=1, help="Background processes."),
    factor: float = typer.Option(3.0, "--factor", help="Slowdown factor."),
    load_from: float = typer.Option(0.3, "--load-from",
                                    help="Load starts at this fraction of the requests."),
    load_until: float = typer.Option(0.7, "--load-until",
                                     help="Load stops at this fraction of the requests."),
    threads: int = typer.Option(1, "--threads", min=1, help="torch threads while serving."),
    cooldown_requests: int | None = typer.Option(
        None, "--cooldown-requests", min=0,
        help="Requests after a switch before switching up (default 20)."),
    cooldown_s: float | None = typer.Option(
        None, "--cooldown-s", min=0.0,
        help="Seconds after a switch before switching up (default 0.5; switching down is "
             "never held back)."),
    confirm: int | None = typer.Option(
        None, "--confirm", min=1,
        help="Requests in a row a switch's verdict must hold before it is made (default 10: "
             "a shorter slowdown or dip switches nothing)."),
    tolerance: float | None = typer.Option(
        None, "--tolerance", min=0.0,
        help="How far over the budget the window's latency may run before switching down "
             "(default 0.2: set it above the machine's own noise)."),
    plot: Path | None = typer.Option(None, "--plot",
                                     help="Write the latency timeline with the switches."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Serve requests with the searched pool, inject a load, and switch subnets when the
    measured latency drifts (the paper's dynamic model update)."""
    from edgesplit.nas.adaptivenet.run import budget_note, serve_pool

    # the monitor's own defaults (monitor.COOLDOWN_*, CONFIRM, TOLERANCE) unless given
    settings: dict[str, Any] = {k: v for k, v in (("cooldown_requests", cooldown_requests),
                                                  ("cooldown_s", cooldown_s),
                                                  ("confirm", confirm),
                                                  ("tolerance", tolerance)) if v is not None}
    with progress_bar(f"AdaptiveNet serving {folder}") as progress:
        doc = serve_pool(folder, requests=requests, load_from=load_from, load_until=load_until,
                         load=load, processes=processes, factor=factor, threads=threads,
                         progress=progress, **settings)
    doc = {"version": 1, **doc}
    note = budget_note(doc)
    if note is not None:  # the table's budget is not the one search printed: say why
        err.print(note, highlight=False, soft_wrap=True, markup=False)
    if plot is not None:
        from edgesplit.report.plots import plot_switching

        plot_switching(doc, plot, title=f"AdaptiveNet switching under a {load} load")
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.adaptivenet_tables import switching_table

    out.print(switching_table(doc))
