"""Section ``l2s`` of ``bench_vision_real.py`` (issue 38, item 7): L2S split training of the
ImageNet-pretrained MobileNetV2, fine-tuned on Fashion-MNIST between two processes.

For each seed, :func:`edgesplit.train.session.train_split` as ``edgesplit train-split`` runs it:
this process is the device, an ``edgesplit serve-training`` process on this machine the server
(one core each). The model is ``mobilenet_v2:pretrained`` (ImageNet backbone, a fresh 10-class
classifier seeded by the run's seed), trained whole with SGD on the first ``train_limit``
training images at ``size`` x ``size`` x 3. Each round LinUCB-E picks the cut among those the
KL privacy analysis allows (P^c from the pretrained classifier's divergence on 200 training
images); the device computes ``slowdown`` times slower than the server (measured compute,
stretched); the emulated link runs at ``bandwidth`` Mbps and drops to ``drop_to`` Mbps half-way,
so the cut that pays changes during the run. The unsplit reference trains the same model on the
same batches, epochs and seed in this process. Both are measured on all 10,000 test images.

Why 32x32: both processes train the whole network on one core each; at 96x96 (the fine-tuning
section's resolution, which freezes the prefix) one epoch of 8,000 images would take about an
hour per seed.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import Counter
from typing import Any

MODEL = "mobilenet_v2:pretrained"


def _phase(partitions: list[int], start: int, stop: int | None) -> dict[str, Any]:
    """The cuts chosen in rounds [start, stop): the most used one and each one's share."""
    part = partitions[start:stop]
    counts = Counter(part)
    return {"rounds": len(part), "most_used": counts.most_common(1)[0][0] if part else None,
            "share": {str(c): round(n / len(part), 3) for c, n in sorted(counts.items())}}


def _one_seed(config: Any, progress: bool) -> dict[str, Any]:
    import torch

    from edgesplit.train.remote import DEFAULT_MAX_BATCH
    from edgesplit.train.session import (
        load_split_data,
        local_training_server,
        model_for_data,
        one_core_per_side,
        train_split,
    )

    threads = torch.get_num_threads()
    data = load_split_data(config.data, config.batch_size, config.seed, config.train_limit)
    spec = str(model_for_data(config.model, data))
    start = time.perf_counter()
    try:
        one_core_per_side()
        with local_training_server(spec, lr=config.lr, momentum=config.momentum,
                                   seed=config.seed,
                                   max_batch=max(config.batch_size, DEFAULT_MAX_BATCH)) as address:
            doc = train_split(config, address, progress=progress)
    finally:
        torch.set_num_threads(threads)
    rounds = doc["rounds"]
    partitions = list(rounds["partitions"])
    drop = config.drop_at or len(partitions)
    changes = sum(a != b for a, b in itertools.pairwise(partitions))
    return {
        "seed": config.seed, "wall_s": round(time.perf_counter() - start, 1),
        "accuracy": doc["accuracy"], "baseline_accuracy": doc["baseline_accuracy"],
        "test_samples": doc["test_samples"], "rounds": len(partitions),
        "cuts": doc["cuts"], "chain_point": (doc["privacy"] or {}).get("chain_point"),
        "kl_per_cut": (doc["privacy"] or {}).get("kl_per_cut"),
        "before_drop": _phase(partitions, 0, drop), "after_drop": _phase(partitions, drop, None),
        "cut_changes": changes, "settled": doc["settled"], "adaptations": doc["adaptations"],
        "partitions": partitions, "delays_ms": [round(d, 1) for d in rounds["delays_ms"]],
        "bandwidth_mbps": rounds["bandwidth_mbps"], "final_loss": rounds["loss"][-1],
    }


def section(seeds: list[int], *, train_limit: int, epochs: int, size: int, privacy_kl: float,
            slowdown: float, bandwidth: float, drop_to: float, lr: float, load: Any,
            progress: bool = True) -> dict[str, Any]:
    from edgesplit.train.session import TrainSplitConfig

    data = f"fashion-mnist:size={size},channels=3,norm=imagenet"
    batch = 32
    rounds = epochs * -(-train_limit // batch)
    sec: dict[str, Any] = {
        "load_before": load(), "model": MODEL, "data": data, "size": size,
        "train_limit": train_limit,
        "epochs": epochs, "batch_size": batch, "lr": lr, "momentum": 0.9,
        "privacy_kl": privacy_kl, "device_slowdown": slowdown, "bandwidth_mbps": bandwidth,
        "drop_to_mbps": drop_to, "drop_at": rounds // 2, "runs": []}
    for seed in seeds:
        config = TrainSplitConfig(model=MODEL, data=data, train_limit=train_limit,
                                  epochs=epochs, batch_size=batch, lr=lr, momentum=0.9,
                                  seed=seed, bandwidth_mbps=bandwidth, drop_at=rounds // 2,
                                  drop_to=drop_to, device_slowdown=slowdown, policy="l2s",
                                  privacy_kl=privacy_kl)
        print(f"  l2s seed {seed}: {rounds} rounds", flush=True)
        sec["runs"].append(_one_seed(config, progress))
    for key in ("accuracy", "baseline_accuracy"):
        values = [r[key] for r in sec["runs"]]
        sec[key] = {"mean": statistics.mean(values),
                    "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "min": min(values), "max": max(values)}
    sec["gap"] = [round(r["accuracy"] - r["baseline_accuracy"], 2) for r in sec["runs"]]
    sec["load_after"] = load()
    return sec


def render_earlier(earlier: list[dict[str, Any]]) -> list[str]:
    """Runs of this section with other settings, kept so that every run made is reported."""
    lines = []
    for sec in earlier:
        runs = "; ".join(f"seed {r['seed']}: {r['accuracy']:.2f} % split, "
                         f"{r['baseline_accuracy']:.2f} % unsplit, final training loss "
                         f"{r['final_loss']:.2f}" for r in sec["runs"])
        lines += [f"Earlier run of this section at lr {sec['lr']} (otherwise the same): "
                  f"{runs}. {sec.get('note', '')}", ""]
    return lines


def render(sec: dict[str, Any], plot_path: Any) -> list[str]:
    a, b = sec["accuracy"], sec["baseline_accuracy"]
    lines = [
        "## L2S split training of a pretrained network (item 7)", "",
        f"`{sec['model']}` (ImageNet backbone, fresh 10-class classifier) fine-tuned whole on "
        f"the first {sec['train_limit']:,} Fashion-MNIST training images at "
        f"{sec['size']}x{sec['size']}x3 for {sec['epochs']} epochs (batch "
        f"{sec['batch_size']}, SGD lr {sec['lr']}, momentum {sec['momentum']}), split between "
        "this process (the device) and an `edgesplit serve-training` process (one core each), "
        "weights synchronised at every cut change (FWS). LinUCB-E picks each round's cut among "
        f"those the KL privacy analysis allows (threshold {sec['privacy_kl']}); the device "
        f"computes {sec['device_slowdown']:g}x slower than the server; the emulated link runs at "
        f"{sec['bandwidth_mbps']:g} Mbps and drops to {sec['drop_to_mbps']:g} Mbps at round "
        f"{sec['drop_at']}. The unsplit reference trains the same model on the same batches, "
        "epochs and seed. Accuracy on all 10,000 test images. "
        f"Load {sec['load_before']} before, {sec['load_after']} after.", "",
        "| seed | split % | unsplit % | split - unsplit | rounds | allowed cuts | most used cut "
        "before / after the drop | cut changes | wall s |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in sec["runs"]:
        lines.append(
            f"| {r['seed']} | {r['accuracy']:.2f} | {r['baseline_accuracy']:.2f} | "
            f"{r['accuracy'] - r['baseline_accuracy']:+.2f} | {r['rounds']} | "
            f"{r['cuts'][0]}-{r['cuts'][-1]} | {r['before_drop']['most_used']} "
            f"({r['before_drop']['share'].get(str(r['before_drop']['most_used']), 0):.0%}) / "
            f"{r['after_drop']['most_used']} "
            f"({r['after_drop']['share'].get(str(r['after_drop']['most_used']), 0):.0%}) | "
            f"{r['cut_changes']} | {r['wall_s']:.0f} |")
    lines += ["", f"Split: {a['mean']:.2f} % (sd {a['stdev']:.2f}); unsplit: {b['mean']:.2f} % "
              f"(sd {b['stdev']:.2f}). Cut c: chain elements 0..c on the device (the last, "
              f"{sec['runs'][0]['cuts'][-1]}, trains everything on the device).", "",
              *([sec["note_load"], ""] if sec.get("note_load") else []),
              "![L2S cuts](vision_real_l2s.png)", ""]
    _plot(sec, plot_path)
    return lines


def _plot(sec: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    for r in sec["runs"]:
        top.plot(range(1, r["rounds"] + 1), r["partitions"], lw=0.8,
                 label=f"seed {r['seed']}")
        bottom.plot(range(1, r["rounds"] + 1), r["delays_ms"], lw=0.6,
                    label=f"seed {r['seed']}")
    for ax in (top, bottom):
        ax.axvline(sec["drop_at"], color="grey", ls="--", lw=0.8)
    top.set_ylabel("cut (last device element)")
    top.set_title(f"L2S on pretrained MobileNetV2: {sec['bandwidth_mbps']:g} -> "
                  f"{sec['drop_to_mbps']:g} Mbps at round {sec['drop_at']} (dashed)")
    top.legend(fontsize=8)
    bottom.set_ylabel("round delay (ms)")
    bottom.set_xlabel("round")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
