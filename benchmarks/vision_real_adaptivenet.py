"""Section ``adaptivenet`` of ``bench_vision_real.py`` (issue 38, item 5): AdaptiveNet on the
fine-tuned MobileNetV2.

For each seed: the fine-tuned network (the recipe's seed-0 run, exported to ``.pt2``) is
elastified, its added branches distilled and tuned on the first ``train_limit`` training
images at 96x96x3, and searched on this machine (block latency table profiled here, the
search part: ``search_size`` of the 5,000 held-out training images) under three budgets, each
a fraction of the pretrained path's measured latency. Every subnet of every pool, and the
pretrained path, is then scored on all 10,000 test images (one prefix-tree pass: shared
prefixes computed once, the scores exactly those of separate runs).

Then, on seed 0 at the middle budget:
- switching: ``serve_pool`` with real background processes (``cpu``) and with an injected
  slowdown (deterministic), ``runs`` runs each: reaction (load start to first switch), back
  within budget (load start to the first request on a switched-to subnet that met it), the
  switch back after the load, and flaps (switches no load change asked for; goal 0), with the
  monitor's default cooldown and, as the control, without it;
- reuse (Fig. 11): a NearbyInit population scored with and without prefix reuse, the median of
  5 runs of each with the order alternated, and the compute avoided (branch calls, compute
  priced by the latency table).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

BUDGETS = (0.8, 0.6, 0.4)  # fractions of the pretrained path's latency


def _progress(stage: str, done: int, total: int) -> None:
    if done == total or done % max(1, total // 10) == 0:
        print(f"    {stage}: {done}/{total}", file=sys.stderr, flush=True)


def section(seeds: list[int], *, train_limit: int, search_size: int, distill_epochs: int,
            tune_epochs: int, lr: float, tune_lr: float, population: int, iterations: int,
            runs: int, requests: int, load: Any, workdir: Path | None = None
            ) -> dict[str, Any]:
    """``workdir``: where the trained supernets are kept (``supernet-SEED``) for section
    ``joint`` to reuse; a temporary folder by default."""
    from edgesplit.train.finetune import default_recipe, finetune

    recipe = default_recipe("mobilenet_v2", seed=0)
    result = finetune(recipe)  # the cached seed-0 run of the finetune section
    sec: dict[str, Any] = {"load_before": load(), "model": "mobilenet_v2",
                           "finetuned_test_accuracy": result.test_accuracy,
                           "data": recipe.data_spec, "train_limit": train_limit,
                           "search_size": search_size, "budgets": list(BUDGETS),
                           "distill_epochs": distill_epochs, "tune_epochs": tune_epochs,
                           "lr": lr, "tune_lr": tune_lr,
                           "population": population, "iterations": iterations, "seeds": {}}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = workdir or Path(scratch)
        for seed, model_file, trainer in seeded_trainers(tmp, result, seeds, distill_epochs,
                                                         tune_epochs, lr, tune_lr):
            sec["seeds"][str(seed)] = _one_seed(tmp, model_file, recipe.data_spec, seed,
                                                trainer, train_limit, search_size, population,
                                                iterations)
        first = tmp / f"search-{seeds[0]}-{BUDGETS[1]}"
        sec["switching"] = _switching(first, runs, requests)
        sec["reuse"] = _reuse(tmp / f"supernet-{seeds[0]}")
    sec["load_after"] = load()
    return sec


def seeded_trainers(tmp: Path, result: Any, seeds: list[int], distill_epochs: int,
                    tune_epochs: int, lr: float, tune_lr: float
                    ) -> Iterator[tuple[int, Path, Any]]:
    """The fine-tuned network exported once into ``tmp``, then for each seed the elastic
    trainer every AdaptiveNet section trains with (batch 64, that seed)."""
    from edgesplit.nas.adaptivenet.train import ElasticTrainer
    from edgesplit.train.finetune import export_finetuned

    model_file = tmp / "mobilenet_v2.pt2"
    if not model_file.is_file():  # a kept workdir's supernets name this file as their source
        export_finetuned(result, model_file)
    for seed in seeds:
        yield seed, model_file, ElasticTrainer(distill_epochs=distill_epochs,
                                               tune_epochs=tune_epochs, batch_size=64, lr=lr,
                                               tune_lr=tune_lr, seed=seed)


def _one_seed(tmp: Path, model_file: Path, spec: str, seed: int, trainer: Any,
              train_limit: int, search_size: int, population: int, iterations: int
              ) -> dict[str, Any]:
    from edgesplit.nas.adaptivenet.evaluate import PrefixTreeEvaluator
    from edgesplit.nas.adaptivenet.run import elastify_model, search_device, trained_data

    print(f"  seed {seed}: elastify and train", file=sys.stderr, flush=True)
    started = time.perf_counter()
    folder = tmp / f"supernet-{seed}"
    supernet, doc = elastify_model(str(model_file), data=spec, trainer=trainer, out=folder,
                                   seed=seed, train_limit=train_limit,
                                   search_size=search_size, progress=_progress)
    trained_s = time.perf_counter() - started
    searches = {}
    for budget in BUDGETS:
        print(f"  seed {seed}: search at {budget} of the pretrained latency", file=sys.stderr,
              flush=True)
        start = time.perf_counter()
        run = search_device(folder, budget=budget, population=population,
                            iterations=iterations, seed=seed,
                            out=tmp / f"search-{seed}-{budget}")
        s = run.summary
        searches[str(budget)] = {
            "budget_ms": s["budget_ms"], "evaluated": s["evaluated"],
            "wall_s": time.perf_counter() - start, "search_seconds": s["search_seconds"],
            "best": s["best"], "original": s["original"],
            "pool": [e.to_dict() for e in run.pool]}
    # every pool's subnets and the pretrained path on all 10,000 test images, in one pass
    print(f"  seed {seed}: the pools on the test set", file=sys.stderr, flush=True)
    data = trained_data(supernet)
    original = supernet.space.original
    archs = list(dict.fromkeys([original, *(tuple(e["arch"]) for r in searches.values()
                                            for e in r["pool"])]))
    start = time.perf_counter()
    scores = PrefixTreeEvaluator(supernet, list(data.test.batches(250)), data.metric,
                                 max_depth=4).evaluate(archs)
    for r in searches.values():
        for e in r["pool"]:
            e["test_accuracy"] = 100 * scores[tuple(e["arch"])]
    return {"training": {k: doc["training"][k] for k in
                         ("sizes", "distill_epochs", "tune_epochs", "batch_size", "history",
                          "indicator_before", "indicator_after")},
            "blocks": doc["blocks"], "branches": doc["branches"], "subnets": doc["subnets"],
            "train_s": trained_s, "test_eval_s": time.perf_counter() - start,
            "original_test_accuracy": 100 * scores[original], "searches": searches}


def _switching(folder: Path, runs: int, requests: int) -> dict[str, Any]:
    from edgesplit.nas.adaptivenet.run import serve_pool

    out: dict[str, Any] = {"requests": requests, "runs": runs}
    for load in ("cpu", "slowdown"):
        for cooled in (True, False):
            name = f"{load}{'' if cooled else ' without cooldown'}"
            print(f"  switching: {name}", file=sys.stderr, flush=True)
            settings = {} if cooled else {"cooldown_requests": 0, "cooldown_s": 0.0}
            done = []
            for _ in range(runs):
                doc = serve_pool(folder, requests=requests, load=load, **settings)
                done.append({k: doc[k] for k in
                             ("budget_ms", "reaction_s", "recovery_s", "switch_back_s",
                              "flaps", "over_budget", "cooldown", "confirm", "tolerance",
                              "load_on_s", "load_off_s")}
                            | {"switches": len(doc["events"]), "events": doc["events"],
                               "ratios": _ratios(doc)})
            out[name] = {"runs": done, "median": _medians(done)}
    return out


def switching_section(seed: int, *, workdir: Path, train_limit: int, search_size: int,
                      distill_epochs: int, tune_epochs: int, lr: float, tune_lr: float,
                      population: int, iterations: int, runs: int, requests: int,
                      prepare: bool = False, **_: Any) -> dict[str, Any] | None:
    """Section ``switching``: the switching runs of section ``adaptivenet`` alone, again
    (after a change to the monitor), on the supernet of ``seed`` trained with the section's
    recipe into ``workdir`` (reused when kept there with that recipe, as section ``joint``
    does) and its search at the middle budget. ``prepare``: only train (no quiet machine
    needed) and return None."""
    from vision_real_joint import _kept

    from edgesplit.nas.adaptivenet.run import elastify_model, search_device
    from edgesplit.train.finetune import default_recipe, finetune

    recipe = default_recipe("mobilenet_v2", seed=0)
    result = finetune(recipe)  # the cached seed-0 run of the finetune section
    workdir.mkdir(parents=True, exist_ok=True)
    (_, model_file, trainer), = seeded_trainers(workdir, result, [seed], distill_epochs,
                                                tune_epochs, lr, tune_lr)
    folder = workdir / f"supernet-{seed}"
    if _kept(folder, trainer, train_limit, search_size) is None:
        print(f"  seed {seed}: elastify and train", file=sys.stderr, flush=True)
        elastify_model(str(model_file), data=recipe.data_spec, trainer=trainer, out=folder,
                       seed=seed, train_limit=train_limit, search_size=search_size,
                       progress=_progress)
    if prepare:
        return None
    search = workdir / f"search-{seed}-{BUDGETS[1]}"
    print(f"  seed {seed}: search at {BUDGETS[1]} of the pretrained latency", file=sys.stderr,
          flush=True)
    search_device(folder, budget=BUDGETS[1], population=population, iterations=iterations,
                  seed=seed, out=search)
    return _switching(search, runs, requests)


def _ratios(doc: dict[str, Any]) -> list[float]:
    """Every request's latency over its subnet's calibrated estimate, in order: what the
    monitor saw, kept so that a flap can be read against the noise around it."""
    estimate = {tuple(e["arch"]): e["latency_s"] * 1e3 for e in doc["pool"]}
    return [round(r["latency_ms"] / estimate[tuple(r["arch"])], 3) for r in doc["records"]]


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    return {k: median(k) for k in ("reaction_s", "recovery_s", "switch_back_s", "flaps",
                                   "switches", "over_budget")} | {
        "no_reaction": sum(r["reaction_s"] is None for r in runs),
        "no_switch_back": sum(r["switch_back_s"] is None for r in runs)}


def _reuse(folder: Path, count: int = 20, images: int = 200) -> dict[str, Any]:
    from edgesplit.nas.adaptivenet.breed import NearbyBreeder
    from edgesplit.nas.adaptivenet.checkpoint import load_supernet
    from edgesplit.nas.adaptivenet.evaluate import measure_reuse
    from edgesplit.nas.adaptivenet.latency import BlockLatencyTable
    from edgesplit.nas.adaptivenet.run import trained_data

    print("  reuse", file=sys.stderr, flush=True)
    supernet, _ = load_supernet(folder)
    data = trained_data(supernet)
    parts = [b for _, b in zip(range(-(-images // 100)), data.search.batches(100),
                               strict=False)]
    table = BlockLatencyTable.profile(supernet, data.search.example(1), repeats=10)
    budget = BUDGETS[1] * table.predict(supernet.space.original)
    nearby = NearbyBreeder(supernet.space, table, budget, 0.1 * budget)
    rng = np.random.default_rng(0)
    archs = sorted({nearby.random_arch(rng) for _ in range(count)})
    result = measure_reuse(supernet, parts, data.metric, archs, max_depth=4, table=table)
    return result | {"population": f"NearbyInit {count}", "images": images}


def render(sec: dict[str, Any]) -> list[str]:
    lines = ["## AdaptiveNet on the fine-tuned MobileNetV2 (item 5)", "",
             f"The fine-tuned MobileNetV2 (seed 0, {sec['finetuned_test_accuracy']:.2f} % on "
             f"the test set) elastified; its added branches distilled and tuned on the first "
             f"{sec['train_limit']:,} training images at 96x96x3 "
             f"({_recipe(sec)}); searched on this machine "
             f"(population {sec['population']}, {sec['iterations']} iterations, on "
             f"{sec['search_size']:,} of the held-out training images) under three budgets, "
             "fractions of the pretrained path's latency measured here. Accuracy: all 10,000 "
             f"test images. Load {sec['load_before']} before, {sec['load_after']} after.", "",
             "| seed | budget | budget ms | best subnet ms | best test % | pretrained % | "
             "pool: test % (ms) | train s | search s |", "|---|---|---|---|---|---|---|---|---|"]
    for seed, s in sec["seeds"].items():
        for budget, r in s["searches"].items():
            pool = ", ".join(f"{e['test_accuracy']:.2f} ({e['latency_s'] * 1e3:.3g})"
                             for e in sorted(r["pool"], key=lambda e: e["latency_s"]))
            lines.append(f"| {seed} | {budget} | {r['budget_ms']:.3g} | "
                         f"{r['best']['latency_ms']:.3g} | {100 * r['best']['test_accuracy']:.2f}"
                         f" | {s['original_test_accuracy']:.2f} | {pool} | {s['train_s']:.0f} | "
                         f"{r['wall_s']:.0f} |")
    lines += ["", *_best_over_seeds(sec), ""]
    if sec.get("note"):  # what the numbers say against the paper, written after the run
        lines += [sec["note"], ""]
    lines += _render_switching(sec["switching"])
    lines += _render_switching_earlier(sec.get("switching_earlier", []))
    return lines + _render_reuse(sec["reuse"])


def _recipe(sec: dict[str, Any]) -> str:
    """The training recipe in words (runs made before the rates were recorded used the
    defaults of then: 3e-3 / 1e-3)."""
    training = next(iter(sec["seeds"].values()))["training"]
    return (f"{training['distill_epochs']} distillation + {training['tune_epochs']} tuning "
            f"epochs, Adam lr {sec.get('lr', 3e-3):g}, tuning lr {sec.get('tune_lr', 1e-3):g}")


def render_earlier(earlier: list[dict[str, Any]]) -> list[str]:
    """Every earlier run of this section (another recipe), one line each: every run made is
    reported, not only the latest."""
    if not earlier:
        return []
    lines = ["### Earlier runs of this section", ""]
    for sec in earlier:
        best = {b: statistics.mean(100 * s["searches"][str(b)]["best"]["test_accuracy"]
                                   for s in sec["seeds"].values()) for b in sec["budgets"]}
        lines.append(f"- {_recipe(sec)}, {sec['train_limit']:,} images, seeds "
                     f"{', '.join(sec['seeds'])}: best subnet's test accuracy, mean over seeds, "
                     + ", ".join(f"{v:.2f} % at {b}" for b, v in best.items())
                     + f" (pretrained path {sec['finetuned_test_accuracy']:.2f} %).")
    return [*lines, ""]


def _best_over_seeds(sec: dict[str, Any]) -> list[str]:
    rows = ["| budget | best test % mean | stdev | seeds |", "|---|---|---|---|"]
    for budget in sec["budgets"]:
        accs = [100 * s["searches"][str(budget)]["best"]["test_accuracy"]
                for s in sec["seeds"].values()]
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        rows.append(f"| {budget} | {statistics.mean(accs):.2f} | {spread:.2f} | {len(accs)} |")
    return rows


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _render_switching(sw: dict[str, Any]) -> list[str]:
    lines = ["### Switching (seed 0, middle budget)", "",
             f"{sw['runs']} runs of {sw['requests']} single-image requests each, the load from "
             "request 30 % to 70 %: `cpu` is two background processes (real contention), "
             "`slowdown` an injected 3x sleep (deterministic). Medians over the runs; flaps: "
             "switches no load change asked for (goal 0)."
             + (f" Monitor: {sw['monitor']}; load {sw['load_before']} before, "
                f"{sw['load_after']} after." if sw.get("monitor") else ""), "",
             "| load | monitor | reaction s | back within budget s | switch back s | "
             "switches | flaps | requests over budget | runs without a reaction | "
             "runs without a switch back |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in sw.items():
        if not isinstance(r, dict):
            continue
        m, load = r["median"], name.split()[0]
        monitor = "no cooldown" if "without" in name else "default cooldown"
        lines.append(f"| {load} | {monitor} | {_fmt(m['reaction_s'])} | "
                     f"{_fmt(m['recovery_s'])} | {_fmt(m['switch_back_s'])} | "
                     f"{_fmt(m['switches'], '.0f')} | {_fmt(m['flaps'], '.0f')} | "
                     f"{_fmt(m['over_budget'], '.0f')} | {m['no_reaction']} | "
                     f"{m.get('no_switch_back', '-')} |")
    lines += ["", "Every run's flaps: " + "; ".join(
        f"{name}: {[x['flaps'] for x in r['runs']]}" for name, r in sw.items()
        if isinstance(r, dict)), ""]
    return lines


def _render_switching_earlier(earlier: list[dict[str, Any]]) -> list[str]:
    """Every earlier switching run (another monitor), one line each."""
    if not earlier:
        return []
    lines = ["Earlier switching runs (every run made is reported):", ""]
    for sw in earlier:
        flaps = "; ".join(f"{name}: median {_fmt(r['median']['flaps'], '.0f')} "
                          f"{[x['flaps'] for x in r['runs']]}"
                          for name, r in sw.items() if isinstance(r, dict) and "runs" in r)
        lines.append(f"- {sw.get('monitor', 'the monitor of the section run')}: flaps {flaps}.")
    return [*lines, ""]


def _render_reuse(r: dict[str, Any]) -> list[str]:
    med = r["median_seconds"]
    return ["### Reuse of shared prefixes (seed 0)", "",
            f"{r['population']} ({r['subnets']} distinct subnets) on {r['images']} search "
            f"images, {r['repeats']} runs of each, the order alternated: median "
            f"{med['baseline']:.2f} s from scratch, {med['reuse']:.2f} s with reuse, "
            f"{r['saving_pct']:.1f} % wall time saved; branch calls {r['call_saving_pct']:.1f} % "
            f"fewer; compute priced by the latency table {r['predicted_saving_pct']:.1f} % less; "
            f"identical accuracies: {r['identical']}. Every run (s): from scratch "
            f"{[round(x, 2) for x in r['seconds']['baseline']]}, reuse "
            f"{[round(x, 2) for x in r['seconds']['reuse']]}.", ""]
