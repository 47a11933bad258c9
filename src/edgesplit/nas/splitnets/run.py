"""The two stages of SplitNets as the CLI and the benchmark run them.

``train_supernet(space, data_spec, out=...)``: stage 1 on a labelled data set (a validation
part is carved out of the training part, seeded, so stage 2 scores candidates on data the
supernet never trained on and the held-out part stays for the final networks); the folder
keeps the supernet and how it was trained.

``search_supernet(folder, topology, ...)``: stage 2 for one hardware configuration, which may
differ from any earlier one (faster sensors, less memory: appendix H) without retraining;
writes ``search.json`` and a result folder (model + plan) for the best network and for up to
``save_front`` networks spread along the accuracy/latency front.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgesplit.data import EvalData
from edgesplit.data.training import LabelledData, load_labelled, stratified_split
from edgesplit.errors import ConfigError, option
from edgesplit.hardware import AnalyticalCompute, Topology, resolve_topology
from edgesplit.nas.core.files import write_json
from edgesplit.nas.splitnets.checkpoint import load_supernet, save_supernet
from edgesplit.nas.splitnets.cost import FLOAT32, SplitHardware, SplitPricing
from edgesplit.nas.splitnets.result import SplitNetResult, save_splitnet
from edgesplit.nas.splitnets.search import SearchProgress, SplitNetsSearch
from edgesplit.nas.splitnets.space import SplitSpace
from edgesplit.nas.splitnets.supernet import SplitSupernet
from edgesplit.nas.splitnets.train import (
    SupernetTrainer,
    TrainProgress,
    calibration_batches,
    subnet_accuracy,
)

__all__ = ["SearchRun", "load_split_data", "reference_subnets", "scale_sensors",
           "search_supernet", "train_supernet"]

VALIDATION_FRACTION = 0.15


@dataclass(frozen=True)
class SplitData:
    fit: EvalData  # what stage 1 trains on
    validation: EvalData  # what stage 2 scores candidates on
    test: EvalData  # held out for the final networks
    classes: tuple[str, ...]
    space: SplitSpace  # the space asked for, built for this data's channels and classes


def _subset(data: EvalData, idx: torch.Tensor, name: str) -> EvalData:
    assert data.labels is not None
    return EvalData(name, (data.inputs[0][idx],), data.labels[idx], data.description)


def load_split_data(spec: str, space: SplitSpace, seed: int = 0) -> SplitData:
    """``spec`` through :func:`load_labelled` as it is (an image folder at its own channels),
    with ``space`` built for its channels and classes (:meth:`SplitSpace.for_data`; views must
    match), and a seeded stratified validation part of the training part."""
    data: LabelledData = load_labelled(spec, grayscale=None)
    shape = data.sample_shape
    views = shape[0] if len(shape) == 4 else 1
    channels = shape[1] if len(shape) == 4 else shape[0]
    if views != space.views:
        raise ConfigError(f"data {spec!r} has {views} view(s) of {channels} channel(s); space "
                          f"{space.name!r} expects {space.views} of {space.in_channels}")
    space = space.for_data(channels, data.num_classes)
    assert data.train.labels is not None
    fit_idx, val_idx = stratified_split(data.train.labels, VALIDATION_FRACTION, seed)
    return SplitData(_subset(data.train, fit_idx, f"{spec}:fit"),
                     _subset(data.train, val_idx, f"{spec}:validation"), data.test,
                     data.classes, space)


def reference_subnets(space: SplitSpace) -> list[tuple[str, Any]]:
    """The bounds of Fig. 11: the largest and smallest networks without / with every
    splitting module (single view), or with the first / last one (multi-view)."""
    if space.multi_view:
        last = len(space.phases) - 1
        return [("max-first", space.largest([0])), ("max-last", space.largest([last])),
                ("min-first", space.smallest([0])), ("min-last", space.smallest([last]))]
    every = space.all_phases()
    return [("max-zero-hot", space.largest()), ("max-all-hot", space.largest(every)),
            ("min-zero-hot", space.smallest()), ("min-all-hot", space.smallest(every))]


def train_supernet(space: SplitSpace, data_spec: str, *, out: str | Path | None = None,
                   trainer: SupernetTrainer | None = None, init: str = "split-aware",
                   progress: TrainProgress | None = None
                   ) -> tuple[SplitSupernet, dict[str, Any]]:
    """Stage 1; returns the supernet and the summary saved next to it (with ``out``)."""
    trainer = trainer or SupernetTrainer()
    if progress is not None:
        trainer.progress = progress
    data = load_split_data(data_spec, space, trainer.seed)
    space = data.space
    torch.manual_seed(trainer.seed)
    supernet = SplitSupernet(space, init=init)
    start = time.perf_counter()
    trainer.fit(supernet, data.fit, data.test if trainer.track else None)
    seconds = time.perf_counter() - start
    calibration = calibration_batches(data.fit)
    bounds = {name: subnet_accuracy(supernet, arch, data.test, calibration)
              for name, arch in reference_subnets(space)}
    summary = {"data": data_spec, "seed": trainer.seed, "epochs": trainer.epochs,
               "batch_size": trainer.batch_size, "lr": trainer.lr, "sampler": trainer.sampler,
               "random_subnets": trainer.randoms,
               "distill": trainer.distill, "init": init, "train_seconds": seconds,
               "fit_samples": len(data.fit), "validation_samples": len(data.validation),
               "test_samples": len(data.test), "test_accuracy": bounds,
               "history": trainer.history_}
    if out is not None:
        save_supernet(out, supernet, summary)
    return supernet, summary


def scale_sensors(topology: Topology, speedup: float) -> Topology:
    """``topology`` with every device that sends (a sensor) ``speedup`` times faster: peak
    compute and memory bandwidth (appendix H's 4x faster sensor processor)."""
    if speedup == 1:
        return topology
    if not speedup > 0:
        raise ConfigError(f"{option('sensor_speedup', speedup)} must be > 0")
    senders = {tl.src for tl in topology.links}
    devices = []
    for d in topology.devices:
        if d.name in senders:
            if not isinstance(d.compute, AnalyticalCompute):
                raise ConfigError(f"sensor {d.name!r} has a measured compute model; "
                                  f"{option('sensor_speedup')} needs an analytical one")
            compute = d.compute.model_copy(update={
                "peak_gops": {b: g * speedup for b, g in d.compute.peak_gops.items()},
                "memory_bandwidth_gb_per_s": d.compute.memory_bandwidth_gb_per_s * speedup,
                "memory_tiers": tuple(t.model_copy(update={
                    "bandwidth_gb_per_s": t.bandwidth_gb_per_s * speedup})
                    for t in d.compute.memory_tiers)})
            d = d.model_copy(update={"compute": compute})
        devices.append(d)
    return topology.model_copy(update={"devices": tuple(devices),
                                       "name": f"{topology.name} (sensors x{speedup:g})"})


@dataclass(frozen=True)
class SearchRun:
    search: SplitNetsSearch
    summary: dict[str, Any]
    results: list[SplitNetResult]


def search_supernet(folder: str | Path, topology: str | Path | Topology, *,
                    out: str | Path | None = None, memory_limit_bytes: int | None = None,
                    sensor_speedup: float = 1.0, latency_target_ms: float | None = None,
                    population: int = 32, generations: int = 20, seed: int = 0,
                    save_front: int = 3, progress: SearchProgress | None = None,
                    supernet: SplitSupernet | None = None, doc: dict[str, Any] | None = None,
                    pricing: SplitPricing = FLOAT32) -> SearchRun:
    """Stage 2 on the supernet saved in ``folder`` (or the ``supernet`` and its training
    ``doc`` given) for ``topology``, costs under ``pricing`` (the default float32
    convention, or :data:`~edgesplit.nas.splitnets.cost.PAPER`); result folders under
    ``out``."""
    if supernet is None or doc is None:
        supernet, saved = load_supernet(folder)
        doc = saved.get("training", {})
    assert doc is not None
    topo = scale_sensors(resolve_topology(topology), sensor_speedup)
    hardware = SplitHardware.from_topology(topo, supernet.space.views,
                                           memory_limit_bytes=memory_limit_bytes,
                                           pricing=pricing)
    data = load_split_data(str(doc.get("data", "digits")), supernet.space,
                           int(doc.get("seed", 0)))
    search = SplitNetsSearch(hardware, population=population, generations=generations,
                             latency_target_ms=latency_target_ms, seed=seed,
                             progress=progress)
    start = time.perf_counter()
    search.fit(supernet, data.validation, data.fit)
    summary = {"supernet": str(folder), "topology": topo.name, "sensor_speedup": sensor_speedup,
               "pricing": pricing.name,
               "search_seconds": time.perf_counter() - start, **search.summary()}
    results: list[SplitNetResult] = []
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        chosen = [("best", search.best_)] + [
            (f"front-{i}", c) for i, c in enumerate(_spread(search.front_, save_front))]
        for name, cand in chosen:
            results.append(save_splitnet(
                out / name, supernet, cand.arch, hardware, topo, calibration=data.fit,
                test=data.test, summary={"validation_accuracy": cand.metrics["accuracy"],
                                         "score": cand.score, "generation": cand.generation}))
        summary["results"] = {name: {"folder": str(r.folder),
                                     "test_accuracy": r.summary.get("test_accuracy"),
                                     "predicted_ms": r.plan.predicted.total_ms}
                              for (name, _), r in zip(chosen, results, strict=True)}
        write_json(out / "search.json", summary)
    return SearchRun(search, summary, results)


def _spread(front: list[Any], count: int) -> list[Any]:
    """Up to ``count`` candidates evenly spaced along ``front`` (its ends included)."""
    if count <= 0 or not front:
        return []
    if count >= len(front):
        return list(front)
    if count == 1:
        return [front[-1]]
    step = (len(front) - 1) / (count - 1)
    return [front[round(i * step)] for i in range(count)]


