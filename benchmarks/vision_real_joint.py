"""Section ``joint`` of ``bench_vision_real.py`` (issue 38, item 6): AdaptiveNet's subnet chosen
together with its edge-cloud split, on the fine-tuned MobileNetV2, in a setting where cutting
pays, with the chosen subnet's task accuracy.

For each seed: the fine-tuned network (the recipe's seed-0 run) is elastified, its branches
distilled and tuned as in section ``adaptivenet``, and searched jointly
(:class:`edgesplit.nas.adaptivenet.placement.JointLatency`: each candidate at its best block
boundary in the setting, priced by the same cost model as every plan) under a budget that is
a fraction of the pretrained path's best plan. Reported for the pretrained path and the chosen
subnet: the best cut, and the same network's edge-only and cloud-only latency, so that
"cutting pays" is read from the numbers (the cut's total below both); and test accuracy on all
10,000 test images.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _latencies(joint: Any, arch: tuple[str, ...]) -> dict[str, Any]:
    """The best cut of ``arch`` and its edge-only and cloud-only alternatives, in ms."""
    best = joint.split(arch)
    return {"blocks": len(arch), "edge_blocks": best.edge_blocks,
            "split_ms": best.total_ms, "edge_only_ms": joint.at(arch, len(arch)).total_ms,
            "cloud_only_ms": joint.at(arch, 0).total_ms,
            "edge_ms": best.edge_ms, "transfer_ms": best.transfer_ms, "cloud_ms": best.cloud_ms}


def section(seeds: list[int], *, setting_names: tuple[str, str, str], budget: float,
            train_limit: int, search_size: int, distill_epochs: int, tune_epochs: int,
            lr: float, tune_lr: float, population: int, iterations: int, load: Any,
            workdir: Path | None = None) -> dict[str, Any]:
    """``workdir``: where section ``adaptivenet`` kept its trained supernets; one trained
    with this recipe and seed is searched as it is (training it again would give the same
    weights at the cost of minutes), any other seed is trained here."""
    from vision_real_adaptivenet import seeded_trainers

    from edgesplit.hardware.catalog import resolve_device, resolve_link
    from edgesplit.plan.cost import EdgeCloudSetting
    from edgesplit.train.finetune import default_recipe, finetune

    edge, link, cloud = setting_names
    setting = EdgeCloudSetting(edge=resolve_device(edge), cloud=resolve_device(cloud),
                               link=resolve_link(link))
    recipe = default_recipe("mobilenet_v2", seed=0)
    result = finetune(recipe)
    sec: dict[str, Any] = {"load_before": load(), "model": "mobilenet_v2",
                           "finetuned_test_accuracy": result.test_accuracy,
                           "setting": {"edge": edge, "link": link, "cloud": cloud},
                           "budget": budget, "train_limit": train_limit,
                           "search_size": search_size, "population": population,
                           "iterations": iterations, "distill_epochs": distill_epochs,
                           "tune_epochs": tune_epochs, "lr": lr, "tune_lr": tune_lr,
                           "seeds": {}}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = workdir or Path(scratch)
        for seed, model_file, trainer in seeded_trainers(tmp, result, seeds, distill_epochs,
                                                         tune_epochs, lr, tune_lr):
            sec["seeds"][str(seed)] = _one_seed(tmp, model_file, recipe.data_spec, seed,
                                                trainer, setting, budget, train_limit,
                                                search_size, population, iterations)
    runs = list(sec["seeds"].values())
    for key in ("best_test_accuracy", "original_test_accuracy"):
        values = [r[key] for r in runs]
        sec[key] = {"mean": statistics.mean(values),
                    "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}
    sec["load_after"] = load()
    return sec


def _one_seed(tmp: Path, model_file: Path, spec: str, seed: int, trainer: Any, setting: Any,
              budget: float, train_limit: int, search_size: int, population: int,
              iterations: int) -> dict[str, Any]:
    from edgesplit.nas.adaptivenet.evaluate import PrefixTreeEvaluator
    from edgesplit.nas.adaptivenet.placement import JointLatency
    from edgesplit.nas.adaptivenet.run import elastify_model, search_device, trained_data

    started = time.perf_counter()
    folder = tmp / f"supernet-{seed}"
    kept = _kept(folder, trainer, train_limit, search_size)
    if kept is not None:
        print(f"  joint seed {seed}: the supernet section adaptivenet trained", file=sys.stderr,
              flush=True)
        supernet, training = kept
    else:
        print(f"  joint seed {seed}: elastify and train", file=sys.stderr, flush=True)
        folder = tmp / f"joint-supernet-{seed}"
        supernet, doc = elastify_model(str(model_file), data=spec, trainer=trainer,
                                       out=folder, seed=seed, train_limit=train_limit,
                                       search_size=search_size)
        training = doc["training"]
    trained_s = training["seconds"] if kept is not None else time.perf_counter() - started
    print(f"  joint seed {seed}: joint search at {budget} of the pretrained plan",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    run = search_device(folder, budget=budget, setting=setting, population=population,
                        iterations=iterations, seed=seed)
    search_s = time.perf_counter() - start
    data = trained_data(supernet)
    joint = JointLatency(supernet, setting, data.search.example(1))
    original, best = supernet.space.original, tuple(run.summary["best"]["arch"])
    scores = PrefixTreeEvaluator(supernet, list(data.test.batches(250)), data.metric,
                                 max_depth=4).evaluate([original, best])
    return {"train_s": trained_s, "search_s": search_s,
            "budget_ms": run.summary["budget_ms"], "evaluated": run.summary["evaluated"],
            "original": _latencies(joint, original), "best": _latencies(joint, best),
            "best_arch": list(best), "search_accuracy": run.summary["best"]["search_accuracy"],
            "original_test_accuracy": 100 * scores[original],
            "best_test_accuracy": 100 * scores[best],
            "history": training["history"], "reused_training": kept is not None}


def _kept(folder: Path, trainer: Any, train_limit: int, search_size: int
          ) -> tuple[Any, dict[str, Any]] | None:
    """The supernet saved in ``folder`` and its training record, if it was trained with
    ``trainer``'s recipe and seed on the same images; else None."""
    from edgesplit.nas.adaptivenet.checkpoint import load_supernet

    if not folder.is_dir():
        return None
    supernet, _ = load_supernet(folder)
    training = supernet.meta["training"]
    wanted = {"seed": trainer.seed, "distill_epochs": trainer.distill_epochs,
              "tune_epochs": trainer.tune_epochs, "batch_size": trainer.batch_size,
              "lr": trainer.lr, "tune_lr": trainer.tune_lr, "train_limit": train_limit,
              "search_size": search_size}
    if any(training.get(k) != v for k, v in wanted.items()):
        return None
    return supernet, training


def _row(name: str, seed: str, lat: dict[str, Any], acc: float) -> str:
    pays = lat["split_ms"] < min(lat["edge_only_ms"], lat["cloud_only_ms"]) - 1e-9
    return (f"| {seed} | {name} | {lat['edge_blocks']}/{lat['blocks']} | "
            f"{lat['split_ms']:.2f} | {lat['edge_only_ms']:.2f} | {lat['cloud_only_ms']:.2f} | "
            f"{'yes' if pays else 'no'} | {acc:.2f} |")


def _reused(sec: dict[str, Any]) -> str:
    seeds = [seed for seed, r in sec["seeds"].items() if r.get("reused_training")]
    return f"; seeds {', '.join(seeds)}: section 5's supernets, not trained again" if seeds else ""


def render_earlier(earlier: list[dict[str, Any]]) -> list[str]:
    """Every earlier run of this section, one line each."""
    if not earlier:
        return []
    lines = ["### Earlier runs of this section", ""]
    for sec in earlier:
        b, o = sec["best_test_accuracy"], sec["original_test_accuracy"]
        lines.append(f"- Adam lr {sec.get('lr', 3e-3):g}, tuning lr {sec.get('tune_lr', 1e-3):g}"
                     f", {sec['distill_epochs']} + {sec['tune_epochs']} epochs, "
                     f"{sec['train_limit']:,} images, seeds {', '.join(sec['seeds'])}: chosen "
                     f"subnets {b['mean']:.2f} % (sd {b['stdev']:.2f}) against "
                     f"{o['mean']:.2f} %.")
    return [*lines, ""]


def render(sec: dict[str, Any]) -> list[str]:
    s = sec["setting"]
    lines = ["## AdaptiveNet's subnet and split chosen together (item 6)", "",
             f"The fine-tuned MobileNetV2 ({sec['finetuned_test_accuracy']:.2f} %) elastified, "
             f"distilled ({sec['distill_epochs']} epochs) and tuned ({sec['tune_epochs']}) on "
             f"the first {sec['train_limit']:,} training images (Adam lr "
             f"{sec.get('lr', 3e-3):g}, tuning lr {sec.get('tune_lr', 1e-3):g}"
             f"{_reused(sec)}), then searched jointly with "
             f"its split for `{s['edge']}` -> `{s['link']}` -> `{s['cloud']}` (population "
             f"{sec['population']}, {sec['iterations']} iterations, on {sec['search_size']:,} "
             f"held-out training images) under a budget of {sec['budget']} of the pretrained "
             "path's best plan. Latencies are the cost model's (the same as every plan's); "
             "cut: blocks on the edge / blocks. Accuracy: all 10,000 test images. "
             f"Load {sec['load_before']} before, {sec['load_after']} after.", "",
             "| seed | network | cut | best plan ms | edge-only ms | cloud-only ms | cutting "
             "pays | test % |", "|---|---|---|---|---|---|---|---|"]
    for seed, r in sec["seeds"].items():
        lines.append(_row("pretrained path", seed, r["original"], r["original_test_accuracy"]))
        lines.append(_row(f"chosen subnet ({r['budget_ms']:.2f} ms budget)", seed, r["best"],
                          r["best_test_accuracy"]))
    b, o = sec["best_test_accuracy"], sec["original_test_accuracy"]
    lines += ["", f"Chosen subnets: {b['mean']:.2f} % (sd {b['stdev']:.2f}) against the "
              f"pretrained path's {o['mean']:.2f} % on the same supernets.", ""]
    if sec.get("note"):
        lines += [sec["note"], ""]
    return lines
