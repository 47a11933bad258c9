"""Latency estimators behind one interface: the latency of a layer on a device, and the transfer
time of N bytes over a link.

- :class:`RooflineEstimator`: analytical, from a device's peak ops/s per bit-width, memory
  bandwidth, per-op-class efficiency and per-layer overhead.
- :class:`ProfileEstimator`: lookup of measured per-layer latencies (``edgesplit profile``).
- :class:`RegressionEstimator`: JMSNAS's U(.), a per-op-class linear model from (MACs, bytes
  moved) to latency, fitted on profiles with non-negative least squares (scikit-learn estimator
  contract: parameters in ``__init__``, ``fit``, learned state ending in ``_``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.hardware.device import AnalyticalCompute, Device, MeasuredCompute
from edgesplit.hardware.link import Link
from edgesplit.hardware.work import LayerWork
from edgesplit.registry import Registry

if TYPE_CHECKING:
    from edgesplit.graph import LayerGraph

__all__ = ["ESTIMATORS", "LatencyEstimator", "ProfileEstimator", "RegressionEstimator",
           "RooflineEstimator", "estimator_for", "register_estimator"]


class LatencyEstimator(ABC):
    """Latency of a layer on a device (at the bit-widths baked into its LayerWork), and of
    moving bytes over a link."""

    @abstractmethod
    def layer_ms(self, work: LayerWork, device: Device) -> float:
        """Milliseconds to run one call of the layer described by ``work`` on ``device``."""

    def transfer_ms(self, nbytes: float, link: Link, *, direction: Literal["up", "down"] = "up"
                    ) -> float:
        return link.transfer_ms(nbytes, direction=direction)

    def graph_ms(self, graph: LayerGraph, device: Device, *, w_bits: int | None = None,
                 a_bits: int | None = None) -> dict[str, float]:
        """Per-layer latency of every layer of ``graph`` on ``device``."""
        return {layer.name: self.layer_ms(LayerWork.of(graph, layer, w_bits=w_bits,
                                                       a_bits=a_bits), device)
                for layer in graph.layers}


class RooflineEstimator(LatencyEstimator):
    """latency = max(FLOPs / (peak(bits) x efficiency), bytes / bandwidth) + overhead.

    The compute precision is the narrowest native width holding the layer's bit-width (the
    wider of weights and activations), so 4-bit layers on INT8 hardware compute at INT8 speed
    while moving half the bytes (AUTO-SPLIT section 5.1). The bandwidth is the device's
    off-chip one, or with ``memory_tiers`` that of the smallest tier holding the layer's
    working set (see :meth:`memory_ms`)."""

    def layer_ms(self, work: LayerWork, device: Device) -> float:
        compute = device.compute
        if not isinstance(compute, AnalyticalCompute):
            raise ConfigError(f"device {device.name!r} has a measured compute model; the roofline "
                              "estimator needs peak_gops and memory_bandwidth_gb_per_s")
        if work.op_class == "view":  # reshapes move no data on a real engine
            return compute.layer_overhead_ms
        native = compute.compute_bits(work.bits)
        efficiency = compute.efficiency.get(work.op_class, compute.default_efficiency)
        ops = max(work.flops, 2 * work.macs)
        compute_ms = ops / (compute.peak_gops[native] * 1e9 * efficiency) * 1e3
        return max(compute_ms, self.memory_ms(work, compute)) + compute.layer_overhead_ms

    @staticmethod
    def memory_ms(work: LayerWork, compute: AnalyticalCompute) -> float:
        """The memory side of the roofline. Without tiers: ``bytes_moved`` at the off-chip
        bandwidth (as every preset has always been priced). With tiers: the bytes the layer
        really streams (``bytes_touched``) at the bandwidth of the level its working set fits."""
        if not compute.memory_tiers:
            return work.bytes_moved / (compute.memory_bandwidth_gb_per_s * 1e9) * 1e3
        nbytes = work.bytes_touched
        return nbytes / (compute.bandwidth_for(nbytes) * 1e9) * 1e3


class ProfileEstimator(LatencyEstimator):
    """Measured latencies by layer name, from a profile written by ``edgesplit profile``."""

    def __init__(self, latencies_ms: Mapping[str, float], *, model: str = "",
                 fallback: LatencyEstimator | None = None) -> None:
        self.latencies_ms = dict(latencies_ms)
        self.model = model
        self.fallback = fallback

    @classmethod
    def from_profile(cls, profile: Mapping, *, backend: str = "eager",
                     fallback: LatencyEstimator | None = None) -> ProfileEstimator:
        key = f"{backend}_ms"
        table = {row["name"]: row[key]["median"] for row in profile["layers"] if row.get(key)}
        return cls(table, model=profile.get("model", ""), fallback=fallback)

    def layer_ms(self, work: LayerWork, device: Device) -> float:
        if work.name in self.latencies_ms:
            return self.latencies_ms[work.name]
        if self.fallback is not None:
            return self.fallback.layer_ms(work, device)
        raise ConfigError(f"layer {work.name!r} is not in the profile of "
                          f"{self.model or 'the model'} measured on {device.name!r}: profile "
                          "this model on that device (`edgesplit profile MODEL`)")


class RegressionEstimator(LatencyEstimator):
    """Per-op-class ``latency_ms = a * MACs + b * bytes_moved + c`` with a, b, c >= 0.

    Classes with fewer than ``min_samples`` layers in the training data use a model fitted on
    all layers. ``coef_`` maps op class (and ``"*"``) to (ms per MAC, ms per byte, ms)."""

    def __init__(self, min_samples: int = 4) -> None:
        self.min_samples = min_samples

    @staticmethod
    def _design(works: Sequence[LayerWork]) -> np.ndarray:
        return np.array([[w.macs, w.bytes_moved, 1.0] for w in works], dtype=np.float64)

    @staticmethod
    def _fit_nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)  # conditioning: columns to ~[0, 1]
        from scipy.optimize import nnls  # 0.3 s to import: only where a model is fitted

        coef, _ = nnls(x / scale, y)
        return coef / scale

    def fit(self, works: Iterable[LayerWork], latencies_ms: Iterable[float]
            ) -> RegressionEstimator:
        works = list(works)
        y = np.asarray(list(latencies_ms), dtype=np.float64)
        if len(works) != len(y) or not works:
            raise ConfigError("fit needs one latency per layer and at least one layer")
        self.coef_ = {"*": self._fit_nnls(self._design(works), y)}
        by_class: dict[str, list[int]] = {}
        for i, w in enumerate(works):
            by_class.setdefault(w.op_class, []).append(i)
        for op_class, idx in by_class.items():
            if len(idx) >= self.min_samples:
                self.coef_[op_class] = self._fit_nnls(self._design([works[i] for i in idx]), y[idx])
        self.n_samples_ = len(works)
        return self

    def predict(self, works: Sequence[LayerWork]) -> np.ndarray:
        if not hasattr(self, "coef_"):
            raise ConfigError("RegressionEstimator is not fitted: call fit(works, latencies_ms)")
        coefs = np.array([self.coef_.get(w.op_class, self.coef_["*"]) for w in works])
        return (self._design(works) * coefs).sum(axis=1)

    def layer_ms(self, work: LayerWork, device: Device) -> float:
        return float(self.predict([work])[0])


ESTIMATORS: Registry[Callable[[Device], LatencyEstimator]] = Registry(
    "compute model", label="Compute models with a default estimator")


def register_estimator(compute_model: str, factory: Callable[[Device], LatencyEstimator], *,
                       replace: bool = False) -> None:
    """Make ``factory(device)`` the default estimator of devices whose ``compute.model`` is
    ``compute_model`` (a new compute model, or ``replace=True`` to override a built-in one)."""
    ESTIMATORS.register(compute_model, factory, replace=replace)


def estimator_for(device: Device) -> LatencyEstimator:
    """The default estimator of a device, chosen by its compute model: roofline for analytical
    devices; for measured ones, their profile with a regression fitted on it for layers the
    profile lacks."""
    return ESTIMATORS.get(device.compute.model)(device)


def _roofline(device: Device) -> LatencyEstimator:
    return RooflineEstimator()


def _measured(device: Device) -> LatencyEstimator:
    from edgesplit.hardware.profile import load_profile

    assert isinstance(device.compute, MeasuredCompute)  # the registry key says so
    profile = load_profile(device.compute.profile)
    works = [LayerWork(**{k: row[k] for k in LayerWork.__dataclass_fields__ if k in row})
             for row in profile["layers"]]
    fallback = RegressionEstimator().fit(works, [row["eager_ms"]["median"]
                                                 for row in profile["layers"]])
    return ProfileEstimator.from_profile(profile, fallback=fallback)


register_estimator("analytical", _roofline)
register_estimator("measured", _measured)
