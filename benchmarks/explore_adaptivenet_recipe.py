"""Exploration, not a benchmark: how AdaptiveNet's training recipe (learning rates, epochs)
changes the accuracy of fixed subnets of the fine-tuned MobileNetV2, seed 0.

It elastifies the cached fine-tuned network (``bench_vision_real.py --sections finetune``
first), trains it with the given recipe and scores on the first 2,000 test images: the
pretrained path, every subnet that swaps exactly one block for its first merged or shrunk
branch, twelve random subnets and the all-shrunk-by-half one. Accuracies do not depend on
the machine's load; the seconds do (they are recorded, not compared).

    python benchmarks/explore_adaptivenet_recipe.py NAME DISTILL TUNE [LIMIT LR TUNE_LR]

writes ``benchmarks/results/vision_real_adaptivenet_lr/NAME.json``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).parent / "results" / "vision_real_adaptivenet_lr"


def fixed_subnets(space, seed: int = 123) -> dict[str, tuple[str, ...]]:
    """The subnets every recipe is scored on (names -> archs)."""
    orig = space.original
    archs = {"original": orig}
    for b in space.branches:
        if b.level in (-1, 1):
            archs[f"one:{b.name}"] = (*orig[:b.start], b.name, *orig[b.end:])
    rng = np.random.default_rng(seed)
    for k in range(12):
        archs[f"rand{k}"] = space.random_arch(rng)
    half = [next((b.name for b in space.branches if b.start == i and b.level == -1), o)
            for i, o in enumerate(orig)]
    archs["all_shrink1"] = tuple(half)
    return archs


def main(argv: list[str]) -> None:
    from edgesplit.nas.adaptivenet.evaluate import PrefixTreeEvaluator
    from edgesplit.nas.adaptivenet.run import elastify_model, trained_data
    from edgesplit.nas.adaptivenet.train import ElasticTrainer
    from edgesplit.train.finetune import default_recipe, export_finetuned, finetune

    name, distill, tune = argv[0], int(argv[1]), int(argv[2])
    limit = int(argv[3]) if len(argv) > 3 else 8000
    lr = float(argv[4]) if len(argv) > 4 else 3e-3
    tune_lr = float(argv[5]) if len(argv) > 5 else 1e-3
    recipe = default_recipe("mobilenet_v2", seed=0)
    result = finetune(recipe)  # cached by the finetune section
    with tempfile.TemporaryDirectory() as tmp:
        model_file = export_finetuned(result, Path(tmp) / "mobilenet_v2.pt2")
        started = time.perf_counter()
        trainer = ElasticTrainer(distill_epochs=distill, tune_epochs=tune, batch_size=64,
                                 seed=0, lr=lr, tune_lr=tune_lr)
        supernet, doc = elastify_model(str(model_file), data=recipe.data_spec, trainer=trainer,
                                       out=Path(tmp) / "supernet", seed=0, train_limit=limit,
                                       search_size=500)
        train_s = time.perf_counter() - started
    archs = fixed_subnets(supernet.space)
    data = trained_data(supernet)
    test = list(data.test.batches(250))[:8]
    scores = PrefixTreeEvaluator(supernet, test, data.metric, max_depth=4).evaluate(
        list(set(archs.values())))
    acc = {k: 100 * scores[v] for k, v in archs.items()}
    one = [v for k, v in acc.items() if k.startswith("one:")]
    rand = [v for k, v in acc.items() if k.startswith("rand")]
    doc = {"name": name, "distill_epochs": distill, "tune_epochs": tune, "train_limit": limit,
           "lr": lr, "tune_lr": tune_lr, "train_s": train_s, "test_images": 2000,
           "history": doc["training"]["history"], "accuracy": acc,
           "one_branch_median": float(np.median(one)), "random_median": float(np.median(rand))}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(name, {k: round(doc[k], 2) for k in ("one_branch_median", "random_median")})


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(sys.argv[1:])
