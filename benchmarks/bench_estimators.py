"""How well do the latency estimators predict whole-model latency on this machine?

For each target model (ResNet-18, MobileNetV2, BERT-base), measured whole-model latency is
compared with the sum of per-layer predictions from:
- `regression (other models)`: JMSNAS's U(.) fitted on the per-layer profiles of *other* models
  only (leave-one-model-out: nothing of the target was seen);
- `regression (own layers)`: fitted on the target's own per-layer profile (the whole-model time
  is still never fitted on);
- `profile-sum`: the target's measured per-layer medians added up;
- `roofline (this-machine)`: the analytical model with peaks measured live.
Partitions (edge prefixes and cloud suffixes at single-tensor cuts), measured as one piece, are
reported too. Writes benchmarks/results/estimators.md and estimators.json.

    python benchmarks/bench_estimators.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.progress import Progress

from edgesplit.graph import capture
from edgesplit.hardware import get_device
from edgesplit.hardware.profile import machine_info, profile_graph
from edgesplit.hardware.validate import default_estimators, validate_estimators

RESULTS = Path(__file__).parent / "results"
TARGETS = ["resnet18", "mobilenet_v2", "bert_base"]
TRAIN_ONLY = ["resnet34", "mnasnet", "googlenet", "vit_tiny", "minilm", "efficientnet_b0",
              "alexnet"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    device = get_device("this-machine")
    graphs, profiles = {}, {}
    with Progress() as progress:
        task = progress.add_task("profiling", total=len(TARGETS) + len(TRAIN_ONLY))
        for name in TARGETS + TRAIN_ONLY:
            progress.update(task, description=f"profiling {name}")
            graphs[name] = capture(name)
            profiles[name] = profile_graph(graphs[name], repeats=args.repeats, onnx=False)
            progress.advance(task)
        reports = {}
        task = progress.add_task("validating", total=len(TARGETS))
        for name in TARGETS:
            progress.update(task, description=f"validating {name}")
            # Re-profile right before measuring the targets: this machine drifts by tens of
            # percent over minutes, which would otherwise be charged to the estimators.
            profiles[name] = profile_graph(graphs[name], repeats=args.repeats, onnx=False)
            others = [profiles[m] for m in profiles if m != name]
            estimators = default_estimators(profiles[name], device, train_profiles=others)
            reports[name] = validate_estimators(graphs[name], estimators,
                                                partitions=args.partitions, repeats=args.repeats)
            progress.advance(task)
    write(reports, device)


def write(reports: dict, device) -> None:
    RESULTS.mkdir(exist_ok=True)
    names = list(next(iter(reports.values()))["estimators"])
    summary = {est: sum(r["estimators"][est]["whole_model_error_pct"] for r in reports.values())
               / len(reports) for est in names}
    doc = {"version": 1, "machine": machine_info(), "this_machine": device.model_dump(mode="json"),
           "whole_model_mape_pct": summary, "reports": reports}
    (RESULTS / "estimators.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Latency estimator error on this machine", "",
             "Whole-model latency measured in PyTorch eager vs the sum of per-layer predictions. "
             "`regression (other models)` never saw the target model. Errors in percent; one "
             "run on a shared 2-core machine.", "",
             "| estimator | " + " | ".join(reports) + " | whole-model MAPE | partitions MAPE "
             "(median over models) |",
             "|---|" + "---:|" * (len(reports) + 2)]
    for est in names:
        cells = [f"{r['estimators'][est]['whole_model_error_pct']:.1f}" for r in reports.values()]
        parts = sorted(r["estimators"][est]["mape_pct"] for r in reports.values())
        lines.append(f"| {est} | " + " | ".join(cells) + f" | **{summary[est]:.1f}** | "
                     f"{parts[len(parts) // 2]:.1f} |")
    lines += ["", "Measured whole-model latency (ms): " + ", ".join(
        f"{m} {r['targets'][0]['measured_ms']:.2f}" for m, r in reports.items()), ""]
    (RESULTS / "estimators.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
