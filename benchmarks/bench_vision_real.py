"""Real vision (issue 38): pretrained ImageNet networks on a real 70,000-image data set.

Section ``finetune`` (item 3): MobileNetV2 and EfficientNet-Lite0, pretrained on ImageNet, each
fine-tuned on Fashion-MNIST at 96x96 with three channels (``edgesplit.train.finetune``: a
frozen prefix whose features are computed once, the tail trained) for three seeds; test
accuracy of the whole network on all 10,000 test images with a bootstrap 95 % interval per run,
the mean and spread over seeds, and the wall time of one run (features + training +
evaluation; later seeds of a model reuse the first seed's prefix features, so their time is
training + evaluation). Goal: one run within 15 minutes on 2 cores. Every run is written to the
fine-tuning cache, which the other sections (AUTO-SPLIT, AdaptiveNet, L2S on the fine-tuned
networks) start from.

Section ``autosplit`` (item 4): each fine-tuned network (seed 0) planned by AUTO-SPLIT and its
baselines (U8, QDMP_E, QDMP_E+U4, CLOUD16) for the paper's Eyeriss -> 3 Mbps -> TPU setting and
for a phone -> 5G -> V100 one. Plans are *chosen* on the validation slice (the last 5,000
training images, never trained on: the recipe's holdout) and *reported* on all 10,000 test
images: each method's plan, and AUTO-SPLIT's Pareto front (up to ``--front-limit`` members,
evenly spaced, the choice always), measured with the same calibration. Goal (the paper's):
AUTO-SPLIT within 1 point of the float model while faster than CLOUD16.

Section ``adaptivenet`` (item 5): AdaptiveNet on the fine-tuned MobileNetV2 (elastify, train,
search under three budgets, every pool on the test set; switching and reuse), see
``vision_real_adaptivenet.py``.

Section ``l2s`` (item 7): L2S split training of the ImageNet-pretrained MobileNetV2 on
Fashion-MNIST between two processes, LinUCB-E learning the cut under the KL privacy limit,
against unsplit training on the same batches, three seeds; see ``vision_real_l2s.py``.

Section ``joint`` (item 6): AdaptiveNet's subnet chosen together with its edge-cloud split in a
setting where cutting pays, with the chosen subnet's test accuracy, three seeds; see
``vision_real_joint.py``.

Section ``switching``: section ``adaptivenet``'s switching runs alone, again, after a change to
the monitor (``--an-monitor`` says which); the earlier runs are kept beside them. ``--prepare
--an-workdir DIR`` fine-tunes and trains its seed-0 supernet first (no quiet machine needed),
so the quiet part is only the search and the serving runs.

Quiet machine: refuses above a 1-minute load of 1.0 unless ``--allow-load`` (accuracy does not
depend on load; times do); the load is recorded before and after each section.

    python benchmarks/bench_vision_real.py [--sections finetune autosplit adaptivenet l2s joint
        switching] [--an-workdir DIR] [--prepare]
        [--seeds 0 1 2] [--an-seeds 0 1 2] [--an-train-limit N] [--an-runs N]
        [--models mobilenet_v2 ...] [--settings eyeriss-3mbps-tpu ...] [--front-limit N]
        [--train-limit N] [--out DIR] [--allow-load X] [--render-only | --from-cache]
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

from edgesplit.hardware.profile import machine_info

RESULTS = Path(__file__).parent / "results"
QUIET_LOAD = 1.0
MODELS = ("mobilenet_v2", "efficientnet_lite0")
GOAL_S = 15 * 60
# name -> (edge, cloud, link): the paper's setting (Fig. 5), and a phone on 5G to a V100
SETTINGS = {"eyeriss-3mbps-tpu": ("eyeriss", "tpu", "autosplit-3mbps"),
            "phone-5g-v100": ("phone-2022", "v100-server", "5g")}
# the joint subnet + split search's setting (edge, link, cloud): one where the pretrained
# MobileNetV2's best plan cuts inside the network (checked in the section's table)
# (`edgesplit plan` of the fine-tuned network's .pt2, exported at batch 2: split 8.6 ms,
# edge-only 15.1, cloud-only 18.5; the section prices batch 1, about half; over the preset
# `wifi` the device alone is as fast as any cut)
JOINT_SETTING = ["raspberry-pi-4", "l2s-wifi-100", "v100-server"]
BASELINES = ("u8", "qdmp_e", "qdmp_e_u4", "cloud16")
GOAL_DROP = 1.0  # points of top-1 below the float model


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _model_summary(runs: list[dict[str, Any]], data_spec: str) -> dict[str, Any]:
    """Every run of one model, the mean and spread of their accuracy, the first run's time."""
    accs = [r["test_accuracy"] for r in runs]
    return {"runs": runs, "mean": statistics.mean(accs),
            "stdev": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "min": min(accs), "max": max(accs), "data_spec": data_spec,
            "first_run_s": runs[0]["wall_s"], "met_time_goal": runs[0]["wall_s"] <= GOAL_S}


def finetune_section(seeds: list[int], train_limit: int | None,
                     models: list[str]) -> dict[str, Any]:
    from edgesplit.train.finetune import default_recipe, finetune

    section: dict[str, Any] = {"load_before": _load(), "models": {}}
    for model in models:
        runs = []
        load_before = _load()
        for seed in seeds:
            recipe = default_recipe(model, seed=seed, train_limit=train_limit)
            start = time.perf_counter()
            result = finetune(recipe, refresh=True)
            wall = time.perf_counter() - start
            runs.append({"seed": seed, "test_accuracy": result.test_accuracy,
                         "interval": list(result.interval), "wall_s": wall,
                         "seconds": result.seconds, "history": result.history,
                         "recipe": result.summary()["recipe"]})
            print(f"{model} seed {seed}: {result.test_accuracy:.2f} % "
                  f"[{result.interval[0]:.2f}, {result.interval[1]:.2f}] in {wall:.0f} s",
                  file=sys.stderr, flush=True)
        section["models"][model] = _model_summary(runs, recipe.data_spec) | {
            "load_before": load_before, "load_after": _load()}
    section["load_after"] = _load()
    return section


def merged(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A section run for some models, with the other models' results of the previous run
    kept (each model records the load around its own runs)."""
    if not old:
        return new
    kept = {m: {"load_before": old.get("load_before"), "load_after": old.get("load_after")}
            | v for m, v in old.get("models", {}).items() if m not in new["models"]}
    return new | {"models": kept | new["models"]}


def finetune_from_cache(seeds: list[int], train_limit: int | None) -> dict[str, Any]:
    """The section from runs already in the fine-tuning cache (each stored with what it
    measured and its times): for a run that was interrupted after some seeds."""
    from edgesplit.train.finetune import cached_result, default_recipe

    section: dict[str, Any] = {"load_before": None, "load_after": None, "models": {},
                               "from_cache": True}
    for model in MODELS:
        runs = []
        for seed in seeds:
            recipe = default_recipe(model, seed=seed, train_limit=train_limit)
            result = cached_result(recipe)
            if result is None:
                continue
            wall = sum(result.seconds.values())
            runs.append({"seed": seed, "test_accuracy": result.test_accuracy,
                         "interval": list(result.interval), "wall_s": wall,
                         "seconds": result.seconds, "history": result.history,
                         "recipe": result.summary()["recipe"]})
        if runs:
            section["models"][model] = _model_summary(runs, recipe.data_spec)
    return section


def _plan_bits(plan: Any, graph_layers: list[str]) -> dict[str, tuple[int, int]]:
    """The (weight, activation) bits a plan runs each quantised layer at: its edge layers as
    the plan records them; CLOUD16 runs every layer at 16 bits on the cloud, which a plan's
    layers do not record."""
    if plan.method == "cloud16":
        return dict.fromkeys(graph_layers, (16, 16))
    return {layer.name: (layer.w_bits or 32, layer.a_bits or 32) for layer in plan.layers
            if layer.w_bits is not None or layer.a_bits is not None}


def _spread(front: list[Any], chosen: Any, limit: int) -> list[Any]:
    """Up to ``limit`` members of the front (sorted by latency), evenly spaced, with the
    choice always among them."""
    if len(front) <= limit:
        return front
    step = (len(front) - 1) / max(1, limit - 1)
    picked = {round(i * step) for i in range(limit)}
    out = [front[i] for i in sorted(picked)]
    return out if any(c is chosen for c in out) else sorted([*out[:-1], chosen],
                                                           key=lambda c: c.total_ms)


def _progress(stage: str, done: int, total: int) -> None:
    if done == total or done % 5 == 0:
        print(f"  {stage}: {done}/{total}", file=sys.stderr, flush=True)


def served_agreement(plan_path: Path, module: Any, test: Any, limit: int | None
                     ) -> dict[str, Any]:
    """The plan served for real: its cloud part in a process of its own (``edgesplit serve``),
    its edge part here, two test images per request (the plan's batch) over loopback
    (unshaped); top-1 agreement
    with the unsplit float network, and the top-1 accuracy of each, on the same images."""
    import subprocess

    import torch

    from edgesplit.plan import Plan
    from edgesplit.runtime import PlanProgram
    from edgesplit.runtime.client import ChainClient

    images = test if limit is None else test.subset(slice(0, limit))
    server = subprocess.Popen([sys.executable, "-m", "edgesplit.cli", "serve", str(plan_path),
                               "--device", "cloud", "--port", "0"], stdout=subprocess.PIPE,
                              text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("listening on"):
            raise SystemExit(f"the cloud part did not start: {line!r}")
        program = PlanProgram.load(Plan.model_validate_json(plan_path.read_text()))
        split_top1, float_top1 = [], []
        start = time.perf_counter()
        with ChainClient(program, line.split()[2]) as client, torch.no_grad():
            # the plan's graph is the .pt2 at its example batch, 2 (export_finetuned)
            for batch, real in images.batches(2):
                x = batch[0]
                split_top1 += client.request((x,)).outputs[0][:real].argmax(1).tolist()
                float_top1 += module(x)[:real].argmax(1).tolist()
                if len(split_top1) % 1000 == 0:
                    print(f"  served {len(split_top1)}/{len(images)}", file=sys.stderr,
                          flush=True)
        seconds = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=30)
    split, unsplit = torch.tensor(split_top1), torch.tensor(float_top1)
    labels = images.labels[:len(split)]
    return {"images": len(split), "agreement": 100 * float((split == unsplit).float().mean()),
            "split_accuracy": 100 * float((split == labels).float().mean()),
            "float_accuracy": 100 * float((unsplit == labels).float().mean()),
            "seconds": seconds}


def autosplit_setting(model_file: Path, module: Any, recipe: Any, setting_name: str,
                      front_limit: int, serve_images: int | None) -> dict[str, Any]:
    """One network in one setting: every method's plan chosen on the validation slice and
    measured on the test set, AUTO-SPLIT's front measured on the test set, and its plan
    served over real processes."""
    from edgesplit.data.images import load_images
    from edgesplit.hardware import get_device, get_link
    from edgesplit.plan import EdgeCloudSetting, PlanningProblem, get_planner
    from edgesplit.plan.autosplit import AutoSplit, pareto_front
    from edgesplit.plan.quantized import device_bits, quant_setup
    from edgesplit.quant.accuracy import QualityMeter

    edge, cloud, link = SETTINGS[setting_name]
    setting = EdgeCloudSetting(edge=get_device(edge), cloud=get_device(cloud),
                               link=get_link(link))
    validation = load_images(recipe.validation_spec)
    test = load_images(recipe.data_spec, "test")
    problem = PlanningProblem(str(model_file), setting, eval_data=validation,
                              eval_batch_size=250, progress=_progress)
    start = time.perf_counter()
    selection = AutoSplit().select(problem)
    plans = {"autosplit": AutoSplit().plan(problem)}
    for method in BASELINES:
        plans[method] = get_planner(method).plan(problem)
    choose_s = time.perf_counter() - start
    setup = quant_setup(problem, device_bits(None, setting.edge.supported_bits))
    meter = setup.meter
    assert meter is not None
    on_test = QualityMeter(meter.graph, test, meter.calibration, meter.batch_size)
    layers = [layer.name for layer in meter.graph.layers]
    rows = {}
    for method, plan in plans.items():
        q = on_test.measure(_plan_bits(plan, layers))
        rows[method] = {"total_ms": plan.predicted.total_ms, "feasible": plan.feasible,
                        "validation_drop": plan.quality.drop if plan.quality else None,
                        "test_accuracy": q.value, "test_drop": q.drop}
        print(f"  {method}: {plan.predicted.total_ms:.2f} ms, test {q.value:.2f} % "
              f"(drop {q.drop:.2f})", file=sys.stderr, flush=True)
    front = pareto_front(selection.candidates)
    members = []
    for c in _spread(front, selection.best, front_limit):
        q = on_test.measure(c.bits())
        members.append({"total_ms": c.total_ms, "split": c.split, "distortion": c.distortion,
                        "validation_drop": c.drop, "test_accuracy": q.value,
                        "test_drop": q.drop, "chosen": c is selection.best,
                        "bits": sorted({f"w{c.w_bits[n]}a{c.a_bits[n]}" for n in c.edge})})
    measured = sum(c.drop is not None for c in selection.candidates)
    plan_path = model_file.parent / f"{model_file.stem}-{setting_name}.json"
    plans["autosplit"].save(plan_path)
    served = served_agreement(plan_path, module, test, serve_images)
    print(f"  served: agreement {served['agreement']:.2f} % over {served['images']} images",
          file=sys.stderr, flush=True)
    return {"edge": edge, "cloud": cloud, "link": link, "float_test_accuracy":
            on_test.reference, "float_validation_accuracy": meter.reference,
            "validation_images": len(meter.data), "test_images": len(test),
            "candidates": len(selection.candidates), "candidates_measured": measured,
            "front_size": len(front), "methods": rows, "front": members, "served": served,
            "choose_s": choose_s, "total_s": time.perf_counter() - start,
            "met_goal": rows["autosplit"]["test_drop"] <= GOAL_DROP
            and rows["autosplit"]["total_ms"] < rows["cloud16"]["total_ms"]}


def autosplit_section(models: list[str], settings: list[str], front_limit: int,
                      serve_images: int | None) -> dict[str, Any]:
    from edgesplit.train.finetune import default_recipe, export_finetuned, finetune

    section: dict[str, Any] = {"load_before": _load(), "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            recipe = default_recipe(model, seed=0)
            result = finetune(recipe)  # the cached seed-0 run of the finetune section
            model_file = export_finetuned(result, Path(tmp) / f"{model}.pt2")
            section["models"][model] = {}
            for name in settings:
                print(f"{model} in {name}:", file=sys.stderr, flush=True)
                section["models"][model][name] = autosplit_setting(
                    Path(model_file), result.module.eval(), recipe, name, front_limit,
                    serve_images)
    section["load_after"] = _load()
    return section


def render(doc: dict[str, Any], out: Path) -> None:
    lines = ["# Real vision: pretrained networks on Fashion-MNIST (issue 38)", "",
             f"Machine: {_machine(doc['machine'])}. Generated by "
             "`benchmarks/bench_vision_real.py`.", ""]
    ft = doc.get("finetune")
    if ft:
        lines += ["## Fine-tuning (item 3)", "",
                  "ImageNet-pretrained, fine-tuned on the first 55,000 training images (the "
                  "last 5,000 held out to choose plans on) at 96x96x3 "
                  "(gray repeated, ImageNet normalisation): the prefix up to the 6x6 features "
                  "frozen and computed once, the tail trained (AdamW, cosine, label smoothing "
                  "0.1). Accuracy: the whole fine-tuned network on all 10,000 test images; "
                  "interval: bootstrap 95 % over the test images. Time: one run, features + "
                  "training + evaluation (later seeds reuse the prefix features). "
                  + (f"Load {ft['load_before']} before, {ft['load_after']} after."
                     if not ft.get("from_cache") else
                     "Assembled from the fine-tuning cache (an interrupted run): wall time is "
                     "the run's features + training + evaluation.")
                  + (f" {ft['note']}" if ft.get("note") else ""), "",
                  "| model | seed | test accuracy % | 95 % interval | wall s | features s | "
                  "training s | evaluation s |", "|---|---|---|---|---|---|---|---|"]
        for model, m in ft["models"].items():
            for r in m["runs"]:
                s = r["seconds"]
                lines.append(f"| {model} | {r['seed']} | {r['test_accuracy']:.2f} | "
                             f"{r['interval'][0]:.2f}-{r['interval'][1]:.2f} | "
                             f"{r['wall_s']:.0f} | {s['features']:.0f} | {s['training']:.0f} "
                             f"| {s['evaluation']:.0f} |")
        lines += ["", "| model | mean % | stdev | min-max | first run | within 15 min | "
                  "load before, after |", "|---|---|---|---|---|---|---|"]
        for model, m in ft["models"].items():
            lines.append(f"| {model} | {m['mean']:.2f} | {m['stdev']:.2f} | "
                         f"{m['min']:.2f}-{m['max']:.2f} | {m['first_run_s'] / 60:.1f} min | "
                         f"{'yes' if m['met_time_goal'] else 'no'} | "
                         f"{m.get('load_before', ft['load_before'])}, "
                         f"{m.get('load_after', ft['load_after'])} |")
        lines += ["", "![fine-tuning](vision_real_finetune.png)", ""]
        _plot_finetune(ft, out / "vision_real_finetune.png")
    if doc.get("autosplit"):
        lines += _render_autosplit(doc["autosplit"], out)
    if doc.get("adaptivenet"):
        import vision_real_adaptivenet

        lines += vision_real_adaptivenet.render(doc["adaptivenet"])
        lines += vision_real_adaptivenet.render_earlier(doc.get("adaptivenet_earlier", []))
    if doc.get("joint"):
        import vision_real_joint

        lines += vision_real_joint.render(doc["joint"])
        lines += vision_real_joint.render_earlier(doc.get("joint_earlier", []))
    if doc.get("l2s"):
        import vision_real_l2s

        lines += vision_real_l2s.render(doc["l2s"], out / "vision_real_l2s.png")
        lines += vision_real_l2s.render_earlier(doc.get("l2s_earlier", []))
    (out / "vision_real.md").write_text("\n".join(lines) + "\n")


def _render_autosplit(sec: dict[str, Any], out: Path) -> list[str]:
    lines = ["## AUTO-SPLIT on the fine-tuned networks (item 4)", "",
             "Chosen on the validation slice (the last 5,000 training images, held out of "
             "fine-tuning), measured on all 10,000 test images with the same calibration. "
             "Latency: the plan's prediction for the setting (the input crosses at 32 bits, "
             "exact: it is the 96x96x3 tensor the network takes). "
             f"Load {sec['load_before']} before, {sec['load_after']} after.", ""]
    for model, settings in sec["models"].items():
        for name, r in settings.items():
            if not isinstance(r, dict):  # the load around a model's runs (see merged)
                continue
            lines += [f"### {model}, {r['edge']} -> {r['link']} -> {r['cloud']}", "",
                      f"Float model: {r['float_test_accuracy']:.2f} % on the test set, "
                      f"{r['float_validation_accuracy']:.2f} % on {r['validation_images']} "
                      f"validation images. {r['candidates']} candidates, "
                      f"{r['candidates_measured']} measured (latency order, up to the "
                      f"choice); front of {r['front_size']}. Goal (within {GOAL_DROP:g} point "
                      f"of float, faster than CLOUD16): "
                      f"{'met' if r['met_goal'] else 'NOT met'}.", "",
                      "| method | predicted ms | test top-1 % | test drop | validation drop "
                      "| feasible |", "|---|---:|---:|---:|---:|---|"]
            for method, m in r["methods"].items():
                vd = m["validation_drop"]
                lines.append(f"| {method} | {m['total_ms']:.2f} | {m['test_accuracy']:.2f} | "
                             f"{m['test_drop']:.2f} | {'-' if vd is None else f'{vd:.2f}'} | "
                             f"{'yes' if m['feasible'] else 'no'} |")
            lines += ["", "| front member | predicted ms | split | bits | test top-1 % | "
                      "test drop |", "|---|---:|---:|---|---:|---:|"]
            for i, f in enumerate(r["front"]):
                bits = " ".join(f["bits"]) or "float"
                lines.append(f"| {i}{' (chosen)' if f['chosen'] else ''} | "
                             f"{f['total_ms']:.2f} | {f['split']} | {bits} | "
                             f"{f['test_accuracy']:.2f} | {f['test_drop']:.2f} |")
            sv = r.get("served")
            if sv:
                lines += ["", f"Served (cloud part in its own process, loopback, two images per "
                          f"request, {sv['images']} test images, {sv['seconds']:.0f} s): top-1 "
                          f"agreement with the unsplit float network {sv['agreement']:.2f} %; "
                          f"accuracy {sv['split_accuracy']:.2f} % split, "
                          f"{sv['float_accuracy']:.2f} % unsplit."]
            png = f"vision_real_autosplit_{model}_{name}.png"
            _plot_front(r, f"{model}: {r['edge']} -> {r['link']} -> {r['cloud']}", out / png)
            lines += ["", f"![front]({png})", ""]
    return lines


def _plot_front(r: dict[str, Any], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    front = r["front"]
    ax.plot([f["total_ms"] for f in front], [f["test_accuracy"] for f in front], "o-",
            color="C0", label="AUTO-SPLIT front (distortion), test accuracy")
    for i, (method, m) in enumerate(r["methods"].items()):
        ax.scatter(m["total_ms"], m["test_accuracy"], marker="*" if method == "autosplit"
                   else "s", s=140 if method == "autosplit" else 50, color=f"C{i + 1}",
                   label=method, zorder=3)
    ax.axhline(r["float_test_accuracy"] - GOAL_DROP, color="gray", linestyle=":",
               label=f"float - {GOAL_DROP:g} point")
    ax.set_xscale("log")
    ax.set_xlabel("predicted latency, ms (log)")
    ax.set_ylabel("top-1 % on 10,000 test images")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _machine(info: dict[str, Any]) -> str:
    return f"{info['processor']}, torch {info['torch']} on {info['threads']} threads"


def _plot_finetune(ft: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (model, m) in enumerate(ft["models"].items()):
        for j, r in enumerate(m["runs"]):
            x = i + (j - (len(m["runs"]) - 1) / 2) * 0.15
            lo, hi = r["interval"]
            ax.errorbar(x, r["test_accuracy"], yerr=[[r["test_accuracy"] - lo],
                                                     [hi - r["test_accuracy"]]],
                        fmt="o", color=f"C{i}", capsize=3,
                        label=model if j == 0 else None)
        ax.hlines(m["mean"], i - 0.3, i + 0.3, colors=f"C{i}", linestyles="dashed")
    ax.set_xticks(range(len(ft["models"])), list(ft["models"]))
    ax.set_ylabel("test accuracy % (10,000 images)")
    ax.set_title("Fine-tuned on Fashion-MNIST: each seed with its 95 % interval, mean dashed")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["finetune", "autosplit"],
                        choices=["finetune", "autosplit", "adaptivenet", "l2s", "joint",
                                 "switching"])
    parser.add_argument("--an-seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--an-train-limit", type=int, default=8000)
    parser.add_argument("--an-search-size", type=int, default=500)
    parser.add_argument("--an-epochs", nargs=2, type=int, default=[3, 1],
                        metavar=("DISTILL", "TUNE"))
    parser.add_argument("--an-lr", nargs=2, type=float, default=None, metavar=("LR", "TUNE_LR"),
                        help="AdaptiveNet's Adam rates (default: ElasticTrainer's).")
    parser.add_argument("--an-search", nargs=2, type=int, default=[10, 4],
                        metavar=("POPULATION", "ITERATIONS"))
    parser.add_argument("--an-runs", type=int, default=5, help="Serving runs per load.")
    parser.add_argument("--an-workdir", type=Path, default=None,
                        help="Keep the trained supernets here (a temporary folder by default); "
                             "a kept one trained with the same recipe is reused.")
    parser.add_argument("--an-monitor", default="",
                        help="With section switching: the monitor it measures, in words (the "
                             "earlier runs are kept, each with its own).")
    parser.add_argument("--prepare", action="store_true",
                        help="Section switching: only fine-tune and train into --an-workdir "
                             "(no measurement, so no quiet machine needed).")
    parser.add_argument("--an-requests", type=int, default=600)
    parser.add_argument("--joint-setting", nargs=3, default=JOINT_SETTING,
                        metavar=("EDGE", "LINK", "CLOUD"))
    parser.add_argument("--joint-budget", type=float, default=0.6)
    parser.add_argument("--l2s-seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--l2s-train-limit", type=int, default=8000)
    parser.add_argument("--l2s-epochs", type=int, default=2)
    parser.add_argument("--l2s-size", type=int, default=32)
    parser.add_argument("--l2s-lr", type=float, default=0.001,
                        help="0.001: chosen on the unsplit model's training loss over 500 "
                             "rounds (0.003 plateaued at 1.05; 0.01 diverged)")
    parser.add_argument("--l2s-privacy-kl", type=float, default=0.4)
    parser.add_argument("--l2s-slowdown", type=float, default=3.0)
    parser.add_argument("--l2s-bandwidth", nargs=2, type=float, default=[400.0, 10.0],
                        metavar=("MBPS", "DROP_TO"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--front-limit", type=int, default=8)
    parser.add_argument("--serve-images", type=int, default=None,
                        help="Serve the chosen plan on the first N test images (default all).")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD)
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--from-cache", action="store_true",
                        help="Assemble the finetune section from cached runs (interrupted run).")
    parser.add_argument("--note", default="", help="With --from-cache: how the runs went.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "vision_real.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    if args.from_cache:
        doc["machine"] = machine_info()
        doc["finetune"] = finetune_from_cache(args.seeds, args.train_limit)
        if args.note:
            doc["finetune"]["note"] = args.note
        path.write_text(json.dumps(doc, indent=2))
    elif args.prepare:
        import vision_real_adaptivenet

        if args.an_workdir is None:
            raise SystemExit("--prepare trains into --an-workdir; name one")
        vision_real_adaptivenet.switching_section(
            args.an_seeds[0], workdir=args.an_workdir, runs=args.an_runs,
            requests=args.an_requests, prepare=True, **_an_recipe(args))
        return
    elif not args.render_only:
        if _load() > args.allow_load:
            raise SystemExit(f"load {_load()} > {args.allow_load}: not a quiet machine "
                             "(--allow-load to measure anyway)")
        doc["machine"] = machine_info()
        if "finetune" in args.sections:
            doc["finetune"] = merged(doc.get("finetune"),
                                     finetune_section(args.seeds, args.train_limit,
                                                      args.models))
            path.write_text(json.dumps(doc, indent=2))
        if "autosplit" in args.sections:
            doc["autosplit"] = merged(doc.get("autosplit"),
                                      autosplit_section(args.models, args.settings,
                                                        args.front_limit, args.serve_images))
            path.write_text(json.dumps(doc, indent=2))
        _adaptivenet_sections(args, doc, path)
        if "l2s" in args.sections:
            import vision_real_l2s

            if doc.get("l2s") and doc["l2s"]["lr"] != args.l2s_lr:  # every run is reported
                doc.setdefault("l2s_earlier", []).append(doc["l2s"])
            doc["l2s"] = vision_real_l2s.section(
                args.l2s_seeds, train_limit=args.l2s_train_limit, epochs=args.l2s_epochs,
                size=args.l2s_size, privacy_kl=args.l2s_privacy_kl,
                slowdown=args.l2s_slowdown, bandwidth=args.l2s_bandwidth[0],
                drop_to=args.l2s_bandwidth[1], lr=args.l2s_lr, load=_load)
        path.write_text(json.dumps(doc, indent=2))
    render(doc, args.out)


def _adaptivenet_sections(args: argparse.Namespace, doc: dict[str, Any], path: Path) -> None:
    """Sections ``adaptivenet`` and ``joint``: run together, the joint search reuses the
    supernets section ``adaptivenet`` trained (same seeds, same recipe). A run replacing one
    made with another recipe keeps it under ``*_earlier``: every run made is reported."""
    recipe = _an_recipe(args)
    with tempfile.TemporaryDirectory() as scratch:
        kept = args.an_workdir or scratch
        if "adaptivenet" in args.sections:
            import vision_real_adaptivenet

            _keep_earlier(doc, "adaptivenet")
            doc["adaptivenet"] = vision_real_adaptivenet.section(
                args.an_seeds, runs=args.an_runs, requests=args.an_requests,
                workdir=Path(kept), **recipe)
            path.write_text(json.dumps(doc, indent=2))
        if "joint" in args.sections:
            import vision_real_joint

            _keep_earlier(doc, "joint")
            doc["joint"] = vision_real_joint.section(
                args.an_seeds, setting_names=tuple(args.joint_setting),
                budget=args.joint_budget, workdir=Path(kept), **recipe)
            path.write_text(json.dumps(doc, indent=2))
        if "switching" in args.sections:
            _switching_again(args, doc, Path(kept), recipe)
            path.write_text(json.dumps(doc, indent=2))


def _an_recipe(args: argparse.Namespace) -> dict[str, Any]:
    from edgesplit.nas.adaptivenet.train import ElasticTrainer

    defaults = ElasticTrainer()
    lr, tune_lr = args.an_lr or (defaults.lr, defaults.tune_lr)
    return dict(train_limit=args.an_train_limit, search_size=args.an_search_size,
                distill_epochs=args.an_epochs[0], tune_epochs=args.an_epochs[1], lr=lr,
                tune_lr=tune_lr, population=args.an_search[0], iterations=args.an_search[1],
                load=_load)


def _switching_again(args: argparse.Namespace, doc: dict[str, Any], workdir: Path,
                     recipe: dict[str, Any]) -> None:
    """Section ``switching``: the adaptivenet section's switching runs again, replacing its
    ``switching`` (the earlier runs kept under ``switching_earlier``)."""
    import vision_real_adaptivenet

    section = doc.get("adaptivenet")
    if not section:
        raise SystemExit("section switching reruns section adaptivenet's switching; run "
                         "section adaptivenet first")
    load_before = _load()
    switching = vision_real_adaptivenet.switching_section(
        args.an_seeds[0], workdir=workdir, runs=args.an_runs, requests=args.an_requests,
        **recipe)
    assert switching is not None
    section.setdefault("switching_earlier", []).append(section["switching"])
    section["switching"] = switching | {"monitor": args.an_monitor, "load_before": load_before,
                                        "load_after": _load()}


def _keep_earlier(doc: dict[str, Any], name: str) -> None:
    if doc.get(name):
        doc.setdefault(f"{name}_earlier", []).append(doc.pop(name))


if __name__ == "__main__":
    main()
