"""AdaptiveNet (paper 003) on this machine: elastification, search efficiency (Fig. 12), reuse
(Fig. 11), shrunk blocks' speed-up, switching under load (Fig. 13), and the joint subnet +
split search (beyond the paper).

1. Elastification of four models with no per-model code: the trained digits CNN, ResNet-18
   and MobileNetV2 (random weights, 1x3x64x64) and the pretrained MiniLM sentence encoder:
   blocks, branches, subnets, and the pretrained path against the captured model.
2. Search efficiency (Fig. 12): the digits supernet (distilled and tuned), budget 60 % of the
   pretrained model's measured latency; the target is the best search accuracy of any subnet
   within the budget, found by evaluating the whole space (65 subnets). Subnets evaluated until
   the target, over 10 seeds, for AdaptiveSearch (NearbyInit / NearbyMutate), plain evolution
   and simulated annealing. Then ResNet-18 trained here on the digits (3x32x32, 8 epochs,
   exported to .pt2 and elastified from the file; 12,375 subnets), target 99.5 % of the best
   any run found, 5 seeds.
3. Reuse (Fig. 11): evaluation time with the prefix-tree cache against without, for
   populations of 100 random subnets and of 100 NearbyInit candidates (and the digits
   supernet's whole space); outputs compared bit for bit.
4. Shrunk blocks: measured time of each shrunk branch against its original block (batch 1,
   from the profiled block latency table) next to the MACs ratio, on ResNet-18 at 3x32x32.
5. Switching (Fig. 13): ResNet-18's pool served one request at a time (1 torch thread); four
   background processes start at 30 % of the requests and stop at 70 %; reaction time (load
   on -> first switch), time until a request meets the budget again, and the switch back.
6. Joint search: the MiniLM supernet on a Raspberry Pi 4 + V100 over 5G, each subnet at its
   best split, against the pretrained model's best plan.

Writes benchmarks/results/nas_adaptivenet.{md,json} and nas_adaptivenet_{search,switching}.png.
Run it on a quiet machine: the load average is recorded before and after.

    python benchmarks/bench_nas_adaptivenet.py [--out DIR] [--render-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgesplit.graph import capture
from edgesplit.nas.adaptivenet import (
    AdaptiveSearch,
    AnnealingSearch,
    BlockLatencyTable,
    EvolutionBaseline,
    JointLatency,
    NearbyBreeder,
    PrefixTreeEvaluator,
    elastify,
    load_supernet,
    measure_reuse,
)
from edgesplit.nas.adaptivenet.data import batches
from edgesplit.nas.adaptivenet.run import (
    elastify_model,
    search_device,
    serve_pool,
    supernet_data,
    trained_data,
)
from edgesplit.nas.adaptivenet.train import ElasticTrainer
from edgesplit.report.plots import plot_search_efficiency, plot_switching

RESULTS = Path(__file__).parent / "results"
NAME = "nas_adaptivenet"
QUICK = os.environ.get("EDGESPLIT_BENCH_QUICK") == "1"  # a smoke run of the script itself
SEEDS = 2 if QUICK else 10
RESNET_SEEDS = 1 if QUICK else 5
EPOCHS = (1, 1) if QUICK else (15, 15)
RESNET_EPOCHS = (1, 0) if QUICK else (15, 15)
PRETRAIN_EPOCHS = 1 if QUICK else 8  # ResNet-18 trained on the digits: the "pretrained" model
MODELS = {"digits_cnn": None, "resnet18": (1, 3, 64, 64), "mobilenet_v2": (1, 3, 64, 64),
          "all_minilm_l6_v2": None}


def pretrained_resnet(path: Path) -> dict[str, Any]:
    """ResNet-18 (10 classes) trained on the digits' training part at 3x32x32, exported to
    ``path``: a pretrained model with real accuracy to elastify from a ``.pt2`` file (no
    weights may be downloaded)."""
    import torch.nn.functional as F

    from edgesplit.data.training import load_labelled
    from edgesplit.models import create_model
    from edgesplit.nas.adaptivenet.data import fit_images

    data = load_labelled("digits")
    x = fit_images(data.train.inputs[0].float(), (1, 3, 32, 32))
    y = data.train.labels
    assert y is not None
    model = create_model("resnet18", (1, 3, 32, 32), num_classes=10).module.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(PRETRAIN_EPOCHS):
        for idx in torch.randperm(len(y), generator=gen).split(64):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    torch.export.save(torch.export.export(model, (x[:1],)), str(path))
    return {"epochs": PRETRAIN_EPOCHS, "seconds": time.perf_counter() - start}


def elastification_rows() -> list[dict[str, Any]]:
    rows = []
    for name, shape in MODELS.items():
        start = time.perf_counter()
        graph = capture(name, input_shape=shape)
        supernet = elastify(graph)
        seconds = time.perf_counter() - start
        with torch.no_grad():
            ref = graph.program(*graph.example_inputs)
            ref = ref[0] if isinstance(ref, (tuple, list)) else ref
            diff = float((supernet(*graph.example_inputs) - ref).abs().max())
        kinds = {k: sum(b.kind == k for b in supernet.space.branches)
                 for k in ("original", "merged", "shrunk")}
        rows.append({"model": name, "input_shape": list(graph.example_inputs[0].shape),
                     "params": supernet.meta["total_params"], "blocks": kinds["original"],
                     "merged": kinds["merged"], "shrunk": kinds["shrunk"],
                     "subnets": supernet.space.count(),
                     "side_layers": supernet.side.gm is not None,
                     "pretrained_path_max_abs_diff": diff, "seconds": seconds})
    return rows


def _evaluations(search_cls: type, budget: float, evaluator: PrefixTreeEvaluator,
                 table: BlockLatencyTable, seed: int, **options: Any) -> dict[str, Any]:
    search = search_cls(budget, seed=seed, **options).fit(evaluator, table)
    return {"evaluated": len(search.history_), "best": search.best_accuracy_,
            "history": [c.score if c.metrics["latency"] <= budget else None
                        for c in search.history_],
            "curve": [vars(s) for s in search.curve_]}


def _to_target(run: dict[str, Any], target: float) -> tuple[int | None, float | None]:
    """Subnets evaluated, and wall seconds (at the end of the iteration), until a subnet
    within the budget reached ``target``."""
    count = next((i for i, score in enumerate(run["history"], start=1)
                  if score is not None and score >= target), None)
    wall = next((s["wall_s"] for s in run["curve"]
                 if s["best_accuracy"] is not None and s["best_accuracy"] >= target), None)
    return count, wall


def _efficiency(folder: Path, budget_fraction: float, seeds: int, exhaustive: bool
                ) -> dict[str, Any]:
    """Fig. 12: subnets evaluated and wall seconds to reach the target accuracy. Each run of
    each method has an evaluator of its own (its own cache: nothing one run evaluated makes
    another's cheaper), on the same search data."""
    supernet, _ = load_supernet(folder)
    data = trained_data(supernet)
    example = data.search.example(1)
    table = BlockLatencyTable.profile(supernet, example, repeats=5 if QUICK else 20)
    budget = budget_fraction * table.predict(supernet.space.original)
    parts = batches(data.search, 100)
    runs: dict[str, list[dict[str, Any]]] = {"AdaptiveNet": [], "evolution": [],
                                             "annealing": []}
    if exhaustive:
        archs = _all_paths(supernet.space)
        scores = PrefixTreeEvaluator(supernet, parts, data.metric, max_depth=4).evaluate(archs)
        target = max(scores[a] for a in archs if table.predict(a) <= budget)
    for seed in range(seeds):
        for method, cls, opts in (
                ("AdaptiveNet", AdaptiveSearch, {"population": 10, "iterations": 10}),
                ("evolution", EvolutionBaseline, {"population": 10, "iterations": 10}),
                ("annealing", AnnealingSearch, {"steps": 110})):
            own = PrefixTreeEvaluator(supernet, parts, data.metric, max_depth=4)
            runs[method].append(_evaluations(cls, budget, own, table, seed, **opts))
    if not exhaustive:  # the target: 99.5 % of the best any run found
        target = 0.995 * max(r["best"] for rs in runs.values() for r in rs)
    for rs in runs.values():
        for r in rs:
            r["evaluated_to_target"], r["seconds_to_target"] = _to_target(r, target)
    return {"model": supernet.meta["model"], "budget_ms": budget * 1000, "target": target,
            "subnets": supernet.space.count(), "exhaustive": exhaustive,
            "methods": {m: _summarise(rs) for m, rs in runs.items()},
            "curves": {m: rs[0]["curve"] for m, rs in runs.items()}}


def _summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    reached = [r for r in runs if r["evaluated_to_target"] is not None]
    counts = [r["evaluated_to_target"] for r in reached]
    walls = [r["seconds_to_target"] for r in reached if r["seconds_to_target"] is not None]
    return {"runs": len(runs), "reached": len(reached),
            "mean_evaluated_to_target": statistics.mean(counts) if counts else None,
            "max_evaluated_to_target": max(counts) if counts else None,
            "median_seconds_to_target": statistics.median(walls) if walls else None,
            "seconds_to_target": [r["seconds_to_target"] for r in runs],
            "mean_best": statistics.mean(r["best"] for r in runs)}


def _all_paths(space: Any) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []

    def walk(position: int, path: tuple[str, ...]) -> None:
        if position == space.num_blocks:
            paths.append(path)
            return
        for branch in space.starting_at[position]:
            walk(branch.end, (*path, branch.name))
    walk(0, ())
    return paths


def reuse_rows(folders: dict[str, Path]) -> list[dict[str, Any]]:
    rows = []
    for label, folder in folders.items():
        supernet, _ = load_supernet(folder)
        data = trained_data(supernet)
        parts = batches(data.search, 100)
        example = data.search.example(1)
        table = BlockLatencyTable.profile(supernet, example, repeats=3 if QUICK else 10)
        rng = np.random.default_rng(0)
        budget = 0.6 * table.predict(supernet.space.original)
        nearby = NearbyBreeder(supernet.space, table, budget, 0.1 * budget)
        count = 20 if QUICK else 100
        populations = {
            f"random {count}": {supernet.space.random_arch(rng) for _ in range(count)},
            f"NearbyInit {count}": {nearby.random_arch(rng) for _ in range(count)},
        }
        if supernet.space.count() <= 100:
            populations["whole space"] = set(_all_paths(supernet.space))
        for name, archs in populations.items():
            result = measure_reuse(supernet, parts, data.metric, sorted(archs), max_depth=4,
                                   table=table)
            rows.append({"model": label, "population": name, "subnets": len(archs),
                         "saving_pct": result["saving_pct"],
                         "call_saving_pct": result["call_saving_pct"],
                         "predicted_saving_pct": result["predicted_saving_pct"],
                         "identical": result["identical"]})
    return rows


def shrunk_rows(folder: Path) -> list[dict[str, Any]]:
    supernet, _ = load_supernet(folder)
    data = trained_data(supernet)
    table = BlockLatencyTable.profile(supernet, data.search.example(1),
                                      repeats=5 if QUICK else 30)
    macs = supernet.meta["branch_macs"]
    rows = []
    for branch in supernet.space.branches:
        if branch.kind != "shrunk":
            continue
        base = f"b{branch.start}"
        rows.append({"model": supernet.meta["model"], "branch": branch.name, "keep": branch.keep,
                     "macs_ratio": macs[branch.name] / macs[base],
                     "time_ratio": table.branch_seconds[branch.name] / table.branch_seconds[base],
                     "speedup": table.branch_seconds[base] / table.branch_seconds[branch.name]})
    return rows


SWITCHING_RUNS = 5  # the flapping goal (0) is judged on their median


def switching(folder: Path, work: Path) -> dict[str, Any]:
    search_device(folder, budget=0.8, population=10, iterations=4 if QUICK else 8,
                  repeats=5 if QUICK else 20, out=work / "resnet-search")
    runs = [serve_pool(work / "resnet-search", requests=200 if QUICK else 600, load="cpu",
                       processes=4) for _ in range(1 if QUICK else SWITCHING_RUNS)]
    return {"runs": [{k: v for k, v in r.items() if k not in ("records", "events", "pool")}
                     | {"events": r["events"]} for r in runs], "plotted": runs[0]}


def joint(folder: Path) -> dict[str, Any]:
    from edgesplit.hardware.catalog import resolve_device, resolve_link
    from edgesplit.plan.cost import EdgeCloudSetting

    setting = EdgeCloudSetting(edge=resolve_device("raspberry-pi-4"),
                               cloud=resolve_device("v100-server"), link=resolve_link("5g"),
                               input_bits=8)  # camera frames, as its results were priced
    run = search_device(folder, budget=0.85, setting=setting, population=10,
                        iterations=3 if QUICK else 8)
    supernet, _ = load_supernet(folder)
    data = supernet_data(supernet, "sentences")
    example = data.search.example(1)
    latency = JointLatency(supernet, setting, example)
    original = latency.split(supernet.space.original)
    s = run.summary
    return {"setting": "raspberry-pi-4 + v100-server over 5g", "budget_ms": s["budget_ms"],
            "best": s["best"], "split": s["split"], "original": s["original"],
            "original_split": {"edge_blocks": original.edge_blocks,
                               "total_ms": original.total_ms},
            "plan_predicted_ms": s.get("plan", {}).get("predicted_ms")}


def _stage(name: str, started: list[float]) -> None:
    """One line per stage on stderr, so a long run shows where it is."""
    now = time.perf_counter()
    print(f"[{now - started[0]:7.1f} s] {name}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--render-only", "--replot", action="store_true",
                        help=f"rewrite {NAME}.md and the figures from {NAME}.json without "
                             "measuring")
    parser.add_argument("--monitor", default="the monitor of this checkout",
                        help="what the switching runs' monitor is (a commit, a rule): kept "
                             "with them, and named when a later run lists them as earlier")
    args = parser.parse_args()
    if args.render_only:
        write_report(json.loads((args.out / f"{NAME}.json").read_text()), args.out)
        return
    measure(args.out, args.monitor)


def _earlier_switching(out: Path) -> list[dict]:
    """The switching runs of the results already in ``out`` and the ones listed before them:
    every run made is reported, the latest first replaced."""
    path = out / f"{NAME}.json"
    if QUICK or not path.exists():
        return []
    previous = json.loads(path.read_text())
    if "switching" not in previous:
        return list(previous.get("switching_earlier", []))
    last = {"runs": previous["switching"]["runs"],
            "monitor": previous.get("monitor", "the monitor of that run"),
            "load_before": previous.get("load_before")}
    return [*previous.get("switching_earlier", []), last]


def measure(out: Path, monitor: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    load_before = [round(x, 2) for x in os.getloadavg()]
    start = time.perf_counter()
    clock = [start]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _stage("elastification of four models", clock)
        elast = elastification_rows()
        _stage("training three supernets", clock)
        elastify_model("digits_cnn", out=work / "digits", trainer=ElasticTrainer(
            distill_epochs=EPOCHS[0], tune_epochs=EPOCHS[1]))
        pretrain = pretrained_resnet(work / "resnet18-digits.pt2")
        elastify_model(str(work / "resnet18-digits.pt2"), data="digits", out=work / "resnet",
                       trainer=ElasticTrainer(distill_epochs=RESNET_EPOCHS[0],
                                              tune_epochs=RESNET_EPOCHS[1]))
        elastify_model("all_minilm_l6_v2", out=work / "minilm", trainer=ElasticTrainer(
            distill_epochs=1 if QUICK else 10, tune_epochs=1 if QUICK else 10))
        _stage("search efficiency: digits", clock)
        digits = _efficiency(work / "digits", 0.6, SEEDS, exhaustive=True)
        _stage("search efficiency: resnet18", clock)
        resnet = _efficiency(work / "resnet", 0.8, RESNET_SEEDS, exhaustive=False)
        _stage("reuse", clock)
        reuse = reuse_rows({"digits_cnn": work / "digits", "resnet18": work / "resnet"})
        _stage("shrunk blocks", clock)
        shrunk = shrunk_rows(work / "resnet")
        _stage("switching", clock)
        switch = switching(work / "resnet", work)
        _stage("joint search", clock)
        joint_doc = joint(work / "minilm")
    doc = {"elastification": elast, "pretrain": pretrain, "efficiency": [digits, resnet],
           "reuse": reuse, "shrunk": shrunk, "switching": switch, "joint": joint_doc,
           "seconds": time.perf_counter() - start, "load_before": load_before,
           "load_after": [round(x, 2) for x in os.getloadavg()], "quick": QUICK,
           "threads": torch.get_num_threads(), "monitor": monitor,
           "switching_earlier": _earlier_switching(out)}
    results = Path(tempfile.mkdtemp()) if QUICK else out
    (results / f"{NAME}.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_report(doc, results)


def write_report(doc: dict[str, Any], results: Path) -> None:
    """The markdown and the figures from a run's document (``--render-only`` redraws them from
    the saved JSON). The figures name what the tables name: the methods, the model, the
    budget and target, the switching run."""
    (results / f"{NAME}.md").write_text(_markdown(doc))
    digits = doc["efficiency"][0]
    seeds = digits["methods"][next(iter(digits["methods"]))]["runs"]
    plot_search_efficiency(digits["curves"], results / f"{NAME}_search.png",
                           target=digits["target"],
                           title=f"{digits['model']} ({digits['subnets']:,} subnets), budget "
                                 f"{digits['budget_ms']:.3g} ms: seed 0 of {seeds}")
    switch = doc["switching"]
    plot_switching(switch["plotted"], results / f"{NAME}_switching.png",
                   title=f"{doc['efficiency'][1]['model']} pool, switching run 1 of "
                         f"{len(switch['runs'])} (1 torch thread)")
    print((results / f"{NAME}.md").read_text())


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _markdown(doc: dict[str, Any]) -> str:
    lines = ["# AdaptiveNet on this machine (paper 003)", "",
             f"One run, {doc['seconds'] / 60:.1f} min, {doc['threads']} torch threads. Load "
             f"average before {doc['load_before']}, after {doc['load_after']} (2 cores).", "",
             "## Elastification (no per-model code)", "",
             "| model | input | params | blocks | merged | shrunk | subnets | pretrained path "
             "max abs diff | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["elastification"]:
        lines.append(f"| {r['model']} | {r['input_shape']} | {r['params']:,} | {r['blocks']} | "
                     f"{r['merged']} | {r['shrunk']} | {r['subnets']:,} | "
                     f"{r['pretrained_path_max_abs_diff']:.2g} | {r['seconds']:.1f} |")
    pre = doc["pretrain"]
    lines += ["", "## Search efficiency (Fig. 12)", "",
              f"The ResNet-18 below was trained here on the digits ({pre['epochs']} epochs, "
              f"{pre['seconds']:.0f} s), exported to .pt2 and elastified from that file.", ""]
    for eff in doc["efficiency"]:
        how = ("the best within the budget over the whole space" if eff["exhaustive"]
               else "99.5 % of the best any run found")
        lines += [f"{eff['model']} ({eff['subnets']:,} subnets), budget "
                  f"{eff['budget_ms']:.3g} ms, target {eff['target']:.4f} ({how}):", "",
                  "| method | runs reaching the target | mean subnets evaluated to reach it | "
                  "worst | median wall s to reach it | mean best accuracy |",
                  "|---|---|---|---|---|---|"]
        for method, m in eff["methods"].items():
            lines.append(f"| {method} | {m['reached']}/{m['runs']} | "
                         f"{_fmt(m['mean_evaluated_to_target'], '.1f')} | "
                         f"{_fmt(m['max_evaluated_to_target'], 'd')} | "
                         f"{_fmt(m.get('median_seconds_to_target'))} | {m['mean_best']:.4f} |")
        lines.append("")
    lines += ["## Reuse of shared prefixes (Fig. 11; goal >= 50 % saved)", "",
              "Wall time saved: from the medians of 5 runs of each, caches fresh every run, "
              "the order alternated (runs before this rule had one run each).", "",
              "| model | population | subnets | wall time saved % | branch calls saved % | "
              "saved by the table % | identical |", "|---|---|---|---|---|---|---|"]
    for r in doc["reuse"]:
        lines.append(f"| {r['model']} | {r['population']} | {r['subnets']} | "
                     f"{r['saving_pct']:.1f} | {r['call_saving_pct']:.1f} | "
                     f"{r['predicted_saving_pct']:.1f} | {r['identical']} |")
    lines += ["", "## Shrunk blocks: measured speed-up (batch 1)", "",
              "| model | branch | channels kept | MACs ratio | time ratio | speed-up |",
              "|---|---|---|---|---|---|"]
    for r in doc["shrunk"]:
        lines.append(f"| {r['model']} | {r['branch']} | {r['keep']} | {r['macs_ratio']:.2f} | "
                     f"{r['time_ratio']:.2f} | {r['speedup']:.2f}x |")
    lines += ["", "## Switching under load (Fig. 13; goal < 1 s)", "",
              "| run | budget ms | switches | flaps | reaction s | back within budget s | "
              "switch back after the load s | requests over budget |",
              "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(doc["switching"]["runs"]):
        flaps = r.get("flaps", "-")  # runs before the flapping count have none
        lines.append(f"| {i + 1} | {r['budget_ms']:.3g} | {len(r['events'])} | {flaps} | "
                     f"{_fmt(r['reaction_s'])} | {_fmt(r['recovery_s'])} | "
                     f"{_fmt(r['switch_back_s'])} | {r['over_budget']}/{r['requests']} |")
    flapped = [r["flaps"] for r in doc["switching"]["runs"] if "flaps" in r]
    if flapped and len(flapped) >= SWITCHING_RUNS:
        median = statistics.median(flapped)
        lines += ["", f"Flaps (switches no load change asked for; goal 0): {flapped}, median "
                  f"{median:g}: " + ("met." if median == 0 else "**not met**.")]
    elif flapped:  # a run of 3, before the goal was judged on a median of 5
        lines += ["", f"Flaps (switches no load change asked for; goal 0): {flapped}, "
                  + ("met." if not any(flapped) else
                     "**not met**: under this load the fastest subnet runs near its estimate "
                     "while larger ones run several times slower, so a switch up is undone "
                     "once the cooldown and backoff allow it (the monitor assumes one r).")]
    for earlier in doc.get("switching_earlier", []):  # every run made is reported
        flaps = [r["flaps"] for r in earlier["runs"]]
        lines += ["", f"An earlier run with another monitor ({earlier['monitor']}; load "
                  f"{earlier['load_before']} before): flaps {flaps}, median "
                  f"{statistics.median(flaps):g}."]
    j = doc["joint"]
    link = j["split"]["transfer_ms"] + j["split"]["rtt_ms"]
    lines += ["", "## Joint subnet + split (beyond the paper)", "",
              f"MiniLM on {j['setting']}, budget {j['budget_ms']:.3g} ms: the pretrained model's "
              f"best plan takes {j['original_split']['total_ms']:.3g} ms (cut after block "
              f"{j['original_split']['edge_blocks']}); the searched subnet "
              f"{'-'.join(j['best']['arch'])} takes {j['best']['latency_ms']:.3g} ms cut after "
              f"block {j['split']['edge_blocks']} of {j['split']['blocks']} (edge "
              f"{j['split']['edge_ms']:.3g}, link {link:.3g}"
              f", cloud {j['split']['cloud_ms']:.3g} ms), cosine {j['best']['test_accuracy']:.3f} "
              "to the pretrained embeddings on held-out sentences.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
