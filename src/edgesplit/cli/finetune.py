"""`edgesplit finetune`: a pretrained built-in network fine-tuned on a real data set, exported
as a ``.pt2`` that every other command takes (``plan``, ``serve``, ``train-split``...)."""

from __future__ import annotations

from pathlib import Path

import typer

from edgesplit.cli._app import app, emit_json, err, out, user_errors
from edgesplit.cli.nas import progress_bar


@app.command("finetune")
@user_errors
def finetune(
    model: str = typer.Argument(..., help="A pretrained built-in: mobilenet_v2 or "
                                          "efficientnet_lite0."),
    data: str = typer.Option("fashion-mnist", "--data", help="Image data set to fine-tune on."),
    image_size: int = typer.Option(96, "--image-size", help="Input resolution (a multiple of "
                                                           "32); gray images get 3 channels."),
    epochs: int | None = typer.Option(None, "--epochs", help="Epochs of the tail (recipe "
                                                              "default if not given)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the new head and the batch order."),
    train_limit: int | None = typer.Option(None, "--train-limit",
                                           help="Train on the first N images only (a quick "
                                                "look; the test set is always whole)."),
    holdout: int | None = typer.Option(None, "--holdout", min=0,
                                       help="Keep the last N training images out of training, "
                                            "to choose plans on (recipe default: 5000)."),
    out_file: Path | None = typer.Option(None, "--out", help="Write the fine-tuned network "
                                                             "here as a .pt2."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Train again even if this recipe's "
                                                            "result is cached."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Fine-tune a pretrained network on a real data set (a frozen prefix, its features
    computed once, the tail trained): test accuracy on every test image with a bootstrap
    interval; cached by recipe, so the second run is instant."""
    from edgesplit.train.finetune import default_recipe, export_finetuned
    from edgesplit.train.finetune import finetune as run

    if out_file is not None and out_file.suffix != ".pt2":
        raise typer.BadParameter("--out must name a .pt2 file")
    changes = {"data": data, "image_size": image_size, "seed": seed, "train_limit": train_limit}
    if epochs is not None:
        changes["epochs"] = epochs
    if holdout is not None:
        changes["holdout"] = holdout
    recipe = default_recipe(model, **changes)
    with progress_bar(f"fine-tuning {model}") as progress:
        result = run(recipe, progress=progress, use_cache=not no_cache)
    if out_file is not None:
        export_finetuned(result, out_file)
    summary = result.summary() | {"out": str(out_file) if out_file else None}
    if as_json:
        emit_json(summary)
        return
    lo, hi = result.interval
    out.print(f"{model} on {data} at {image_size}x{image_size}: test accuracy "
              f"{result.test_accuracy:.2f} % (95 % interval {lo:.2f}-{hi:.2f}, "
              f"{result.test_images} images){' [cached]' if result.cached else ''}",
              highlight=False)
    if out_file is not None:
        choose_on = recipe.validation_spec or recipe.data_spec
        err.print(f"wrote {out_file}; its inputs are --eval-data {recipe.data_spec}"
                  + (f" (choose plans on the held-out training images, {choose_on})"
                     if recipe.validation_spec else "") + ", e.g.\n"
                  f"  edgesplit plan {out_file} --edge eyeriss --cloud tpu --link autosplit-3mbps"
                  f" --method autosplit,cloud16 --eval-data {choose_on}",
                  highlight=False, soft_wrap=True)
