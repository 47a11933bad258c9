"""A roofline calibrated to this machine: per-op-class compute efficiency, an effective memory
bandwidth and a fixed per-layer overhead, fitted to measured per-layer profiles.

The hand-set efficiencies of a preset are meant for accelerators known only from data sheets;
on a CPU they miss by tens of per cent, mostly on small layers, where the dispatch cost of a
layer (Python, the framework, the kernel launch) outweighs its arithmetic. The fit keeps the
roofline's form, so a calibrated device still prices layers it never saw (other models, other
bit-widths): ``latency = max(ops / (peak x eff[class]), bytes / bandwidth) + overhead``.

How: for each candidate overhead (a grid up to the 20th percentile of layer times) and
effective bandwidth (a grid below the measured one), every op class takes the efficiency
that minimises its layers' absolute error (a grid search: the ``max`` makes it non-linear,
but each class is a one-dimensional problem once overhead and bandwidth are fixed); the best
total absolute error wins. Absolute errors, because a partition's time is a sum of layers:
the large layers must be right, the small ones by their count (which the overhead carries).
Before fitting, each profile's layer times are scaled so that they add up to its whole
forward pass: the per-layer clock ticks cost a little, and a request pays for the whole pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.hardware.device import OP_CLASSES, AnalyticalCompute, Device
from edgesplit.hardware.work import LayerWork

__all__ = ["calibrate_roofline", "fit_roofline", "profile_samples"]

# efficiencies below 2 % would price memory-bound classes (element-wise, pooling) by their few
# operations; a fit on few such layers then explains their dispatch cost that way and blows up
# on a model with many large ones (MobileNetV2 fitted on ResNet-18 + digits: 10x too high)
_EFFICIENCIES = np.geomspace(0.02, 1.0, 120)
_BANDWIDTH_SHARES = np.geomspace(0.05, 1.0, 24)
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
    """Per class, the efficiency on the grid with the least absolute error, and the total."""
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
        k = int(np.argmin(err))
        eff[str(c)] = float(_EFFICIENCIES[k])
        total += float(err[k])
    return eff, total


def fit_roofline(works: Sequence[LayerWork], latencies_ms: Sequence[float], *,
                 peak_gops: float, memory_bandwidth_gb_per_s: float) -> AnalyticalCompute:
    """The roofline (FP32 peak ``peak_gops``) whose efficiencies, effective bandwidth (at most
    the measured ``memory_bandwidth_gb_per_s``) and per-layer overhead best fit these layers."""
    y = np.asarray(latencies_ms, dtype=np.float64)
    if len(works) != len(y) or len(y) < 4:
        raise ConfigError("calibrating a roofline needs at least 4 profiled layers")
    ops = np.array([max(w.flops, 2 * w.macs) for w in works], dtype=np.float64)
    moved = np.array([w.bytes_moved for w in works], dtype=np.float64)
    classes = np.array([w.op_class for w in works])

    def search(overheads: np.ndarray, bandwidths: np.ndarray, best=None):
        for overhead in overheads:
            for bandwidth in bandwidths:
                mem_ms = moved / (bandwidth * 1e9) * 1e3
                eff, err = _best_efficiencies(ops, mem_ms, y, classes, peak_gops, overhead)
                if best is None or err < best[0]:
                    best = (err, eff, float(bandwidth), float(overhead))
        return best

    # a dispatch cost cannot exceed what the quickest layers take
    top = float(np.percentile(y, 20))
    overheads = np.linspace(0.0, top, _OVERHEAD_STEPS)
    best = search(overheads, memory_bandwidth_gb_per_s * _BANDWIDTH_SHARES)
    # then finer, around the best of the coarse grids
    step = top / (_OVERHEAD_STEPS - 1)
    ratio = _BANDWIDTH_SHARES[1] / _BANDWIDTH_SHARES[0]
    best = search(np.clip(np.linspace(best[3] - step, best[3] + step, 9), 0.0, None),
                  np.clip(best[2] * np.geomspace(1 / ratio, ratio, 9), None,
                          memory_bandwidth_gb_per_s), best)
    assert best is not None
    _, eff, bandwidth, overhead = best
    known = {c: e for c, e in eff.items() if c in OP_CLASSES and c != "view"}
    weights = {c: float(ops[classes == c].sum()) for c in known}
    # classes never profiled take the ops-weighted mean efficiency of the ones that were
    default = (sum(known[c] * weights[c] for c in known) / sum(weights.values())
               if known and sum(weights.values()) > 0 else 0.5)
    return AnalyticalCompute(peak_gops={32: round(peak_gops, 3)},
                             memory_bandwidth_gb_per_s=round(bandwidth, 4),
                             efficiency={c: round(e, 5) for c, e in sorted(known.items())},
                             default_efficiency=round(default, 5),
                             layer_overhead_ms=round(overhead, 5))


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
    compute = fit_roofline(works, ms, peak_gops=base.compute.peak_gops[
        base.compute.compute_bits(32)],
        memory_bandwidth_gb_per_s=base.compute.memory_bandwidth_gb_per_s)
    models = sorted({str(p.get("model", "?")) for p in profiles})
    return base.model_copy(update={
        "name": name or f"{base.name}-calibrated",
        "compute": compute,
        "description": f"{base.description}; roofline fitted to {len(ms)} profiled layers",
        "source": f"calibrated on profiles of {', '.join(models)} (edgesplit profile "
                  "--calibrate)"})
