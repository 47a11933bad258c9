"""A roofline calibrated to this machine: per-op-class compute efficiency and a fixed per-layer
overhead fitted to measured per-layer profiles, under the memory bandwidths the base device
measured (the off-chip one and, if it has them, the faster tiers for working sets that fit a
cache).

The hand-set efficiencies of a preset are meant for accelerators known only from data sheets;
on a CPU they miss by tens of per cent, mostly on small layers, where the dispatch cost of a
layer (Python, the framework, the kernel launch) outweighs its arithmetic. The fit keeps the
roofline's form, so a calibrated device still prices layers it never saw (other models, other
bit-widths): ``latency = max(ops / (peak x eff[class]), bytes / bandwidth(working set)) +
overhead``.

The bandwidths are measured (``this-machine`` streams buffers of 256 KiB to 256 MiB), not
fitted: most profiled layers are compute- or dispatch-bound and say little about memory, and
a bandwidth fitted to them swung from run to run (29 to 104 GB/s) and priced the one model
whose layers are really memory-bound (AlexNet's 100+ MB fully-connected weights, read from
DRAM) 2x too slow when it was left out of the fit.

How: for each candidate overhead (a grid up to the 20th percentile of layer times, then a
finer one around the best), every op class takes the efficiency that minimises its layers'
absolute error (a grid search: the ``max`` makes it non-linear, but each class is a
one-dimensional problem once the overhead is fixed); the best total absolute error wins.
Absolute errors, because a partition's time is a sum of layers: the large layers must be
right, the small ones by their count (which the overhead carries). Before fitting, each
profile's layer times are scaled so that they add up to its whole forward pass: the per-layer
clock ticks cost a little, and a request pays for the whole pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.hardware.device import OP_CLASSES, AnalyticalCompute, Device, MemoryTier
from edgesplit.hardware.estimators import RooflineEstimator
from edgesplit.hardware.work import LayerWork

__all__ = ["calibrate_roofline", "fit_roofline", "profile_samples"]

# Efficiencies down to 0.1 % of peak: CPU pooling kernels reach 0.2-0.4 % of the matmul peak
# (max-pooling 3x3 at 0.6-0.9 GFLOP/s against ~260). With a fitted bandwidth such low values
# let a fit on few layers explain dispatch cost by operations; with measured bandwidths the
# overhead is the only other term, and every class is fitted on its own layers' time.
_EFFICIENCIES = np.geomspace(0.001, 1.0, 200)
_OVERHEAD_STEPS = 24


def profile_samples(profile: Mapping[str, Any], *, scale_to_whole: bool = True
                    ) -> tuple[list[LayerWork], np.ndarray]:
    """(works, latencies in ms) of a profile's layers (eager medians); ``scale_to_whole``
    scales them to add up to the profile's whole-model median (within x0.5-x2: beyond that
    the machine changed between the two and the layers are kept as measured)."""
    fields = LayerWork.__dataclass_fields__
    rows = [r for r in profile["layers"] if r.get("eager_ms")]
    works = [LayerWork(**{k: r[k] for k in fields if k in r}) for r in rows]
    ms = np.array([r["eager_ms"]["median"] for r in rows], dtype=np.float64)
    whole = (profile.get("whole_model") or {}).get("eager_ms") or {}
    if scale_to_whole and whole.get("median") and ms.sum() > 0:
        ratio = whole["median"] / ms.sum()
        if 0.5 <= ratio <= 2.0:
            ms = ms * ratio
    return works, ms


def _best_efficiencies(ops: np.ndarray, mem_ms: np.ndarray, y: np.ndarray, classes: np.ndarray,
                       peak: float, overhead: float) -> tuple[dict[str, float], float]:
    """Per class, the efficiency on the grid with the least absolute error, and the total. Of
    equally good efficiencies the highest: where a class's layers are all memory- or
    overhead-bound, their time says nothing about its compute, and the lowest efficiency that
    keeps them so would price a larger, compute-bound layer of that class far too slow."""
    eff: dict[str, float] = {}
    total = 0.0
    for c in np.unique(classes):
        sel = classes == c
        if c == "view":  # priced as the overhead alone
            total += float(np.abs(overhead - y[sel]).sum())
            continue
        compute = ops[sel][None, :] / (peak * 1e9 * _EFFICIENCIES[:, None]) * 1e3
        pred = np.maximum(compute, mem_ms[sel][None, :]) + overhead
        err = np.abs(pred - y[sel][None, :]).sum(axis=1)
        k = len(err) - 1 - int(np.argmin(err[::-1]))  # the last of the minima: the highest
        eff[str(c)] = float(_EFFICIENCIES[k])
        total += float(err[k])
    return eff, total


def _best_overhead(ops: np.ndarray, mem_ms: np.ndarray, y: np.ndarray, classes: np.ndarray,
                   peak: float) -> tuple[dict[str, float], float]:
    """(efficiencies, overhead) of the least total absolute error: a coarse grid of overheads
    up to what the quickest layers take (a dispatch cost cannot exceed it), then a finer one
    around the best."""
    def best_of(overheads: np.ndarray) -> tuple[dict[str, float], float, float]:
        """(efficiencies, total error, overhead) of the best of ``overheads``."""
        fits = [(*_best_efficiencies(ops, mem_ms, y, classes, peak, float(o)), float(o))
                for o in overheads]
        return min(fits, key=lambda fit: fit[1])

    top = float(np.percentile(y, 20))
    step = top / (_OVERHEAD_STEPS - 1)
    coarse = best_of(np.linspace(0.0, top, _OVERHEAD_STEPS))
    fine = best_of(np.clip(np.linspace(coarse[2] - step, coarse[2] + step, 9), 0.0, None))
    eff, _, overhead = min(coarse, fine, key=lambda fit: fit[1])
    return eff, overhead


def fit_roofline(works: Sequence[LayerWork], latencies_ms: Sequence[float], *,
                 peak_gops: float, memory_bandwidth_gb_per_s: float,
                 memory_tiers: Sequence[MemoryTier] = ()) -> AnalyticalCompute:
    """The roofline (FP32 peak ``peak_gops``; the measured off-chip
    ``memory_bandwidth_gb_per_s`` and ``memory_tiers``, kept as they are) whose per-class
    efficiencies and per-layer overhead best fit these layers."""
    y = np.asarray(latencies_ms, dtype=np.float64)
    if len(works) != len(y) or len(y) < 4:
        raise ConfigError("calibrating a roofline needs at least 4 profiled layers")
    memory = AnalyticalCompute(peak_gops={32: peak_gops},
                               memory_bandwidth_gb_per_s=memory_bandwidth_gb_per_s,
                               memory_tiers=tuple(memory_tiers))
    ops = np.array([max(w.flops, 2 * w.macs) for w in works], dtype=np.float64)
    mem_ms = np.array([RooflineEstimator.memory_ms(w, memory) for w in works])
    classes = np.array([w.op_class for w in works])
    eff, overhead = _best_overhead(ops, mem_ms, y, classes, peak_gops)
    known = {c: e for c, e in eff.items() if c in OP_CLASSES and c != "view"}
    weights = {c: float(ops[classes == c].sum()) for c in known}
    # classes never profiled take the ops-weighted mean efficiency of the ones that were
    default = (sum(known[c] * weights[c] for c in known) / sum(weights.values())
               if known and sum(weights.values()) > 0 else 0.5)
    return memory.model_copy(update={
        "peak_gops": {32: round(peak_gops, 3)},
        "efficiency": {c: round(e, 5) for c, e in sorted(known.items())},
        "default_efficiency": round(default, 5), "layer_overhead_ms": round(overhead, 5)})


def calibrate_roofline(base: Device, profiles: Sequence[Mapping[str, Any]], *,
                       name: str | None = None) -> Device:
    """``base`` (an analytical device measured on this machine, e.g. ``this-machine``) with its
    roofline fitted to ``profiles`` (``edgesplit profile`` documents of this machine)."""
    if not isinstance(base.compute, AnalyticalCompute):
        raise ConfigError(f"device {base.name!r} has no roofline to calibrate (it is measured); "
                          "start from an analytical device such as this-machine")
    works: list[LayerWork] = []
    ms: list[float] = []
    for profile in profiles:
        w, y = profile_samples(profile)
        works += w
        ms += list(y)
    measured = base.compute
    compute = fit_roofline(works, ms, peak_gops=measured.peak_gops[measured.compute_bits(32)],
                           memory_bandwidth_gb_per_s=measured.memory_bandwidth_gb_per_s,
                           memory_tiers=measured.memory_tiers)
    models = sorted({str(p.get("model", "?")) for p in profiles})
    return base.model_copy(update={
        "name": name or f"{base.name}-calibrated",
        "compute": compute,
        "description": f"{base.description}; roofline fitted to {len(ms)} profiled layers",
        "source": f"calibrated on profiles of {', '.join(models)} (edgesplit profile "
                  "--calibrate)"})
