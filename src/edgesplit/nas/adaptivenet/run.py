"""AdaptiveNet's stages as the CLI and the benchmark run them.

``elastify_model(model, ...)``: on the cloud, elastify a pretrained model, train the added
branches (distillation, then tuning) and save the supernet with how it was trained (the data
spec and task, so the device searches on the same kind of data).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgesplit.nas.adaptivenet.checkpoint import build_supernet, save_supernet
from edgesplit.nas.adaptivenet.data import ElasticData, load_elastic_data
from edgesplit.nas.adaptivenet.elastify import ElasticConfig
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet
from edgesplit.nas.adaptivenet.train import ElasticTrainer, latency_range_accuracy

__all__ = ["DEFAULT_DATA", "data_for", "elastify_model", "supernet_data"]

Progress = Callable[[str, int, int], None]

# What each built-in model is measured on when --data is not given.
DEFAULT_DATA = {"all_minilm_l6_v2": "sentences", "minilm": "sentences"}


def data_for(model: str, data: str | None) -> str:
    """The data spec for ``model``: the user's, else the model's default, else digits."""
    return data or DEFAULT_DATA.get(model, "digits")


def supernet_data(supernet: ElasticSupernet, spec: str, task: str | None = None,
                  seed: int = 0) -> ElasticData:
    """``spec`` loaded for ``supernet``'s inputs, targets from its pretrained path."""
    shape = [int(s) for s in supernet.meta["blocks"][0]["in_shape"]]
    return load_elastic_data(spec, input_shape=shape, teacher=supernet, task=task, seed=seed)


def _summary(supernet: ElasticSupernet) -> dict[str, Any]:
    space = supernet.space
    kinds = {k: sum(1 for b in space.branches if b.kind == k)
             for k in ("original", "merged", "shrunk")}
    return {"model": supernet.meta["model"], "blocks": space.num_blocks,
            "branches": kinds, "subnets": space.count(),
            "params": supernet.meta["total_params"],
            "added_params": sum(p.numel() for p in supernet.added_parameters())}


def elastify_model(model: str, *, input_shape: Sequence[int] | None = None,
                   config: ElasticConfig | None = None, data: str | None = None,
                   task: str | None = None, trainer: ElasticTrainer | None = None,
                   out: str | Path | None = None, progress: Progress | None = None,
                   seed: int = 0) -> tuple[ElasticSupernet, dict[str, Any]]:
    """Elastify ``model``, train it on ``data`` and save it to ``out``; returns the supernet
    and a summary (blocks, branches, training, latency-range accuracy before and after)."""
    trainer = trainer or ElasticTrainer(seed=seed)
    started = time.perf_counter()
    supernet = build_supernet(model, input_shape=input_shape, config=config)
    spec = data_for(model, data)
    loaded = supernet_data(supernet, spec, task, seed)
    before = latency_range_accuracy(supernet, loaded, seed=seed)
    if progress is not None:
        trainer.progress = lambda phase, step, steps, loss: progress(phase, step, steps)
    trainer.fit(supernet, loaded)
    after = latency_range_accuracy(supernet, loaded, seed=seed)
    training = {
        "data": spec, "task": loaded.task, "seed": seed, "sizes": loaded.sizes(),
        "distill_epochs": trainer.distill_epochs, "tune_epochs": trainer.tune_epochs,
        "batch_size": trainer.batch_size, "lr": trainer.lr, "tune_lr": trainer.tune_lr,
        "history": [vars(r) for r in trainer.history_],
        "indicator_before": before, "indicator_after": after,
        "seconds": time.perf_counter() - started,
    }
    if out is not None:
        save_supernet(out, supernet, training)
    supernet.meta["training"] = training
    return supernet, {**_summary(supernet), "config": supernet.meta["config"],
                      "training": training}
