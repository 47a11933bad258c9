"""Honesty about latency models: how well each estimator predicts latencies it was not fitted
on (whole models and partitions measured as one piece), as MAPE and worst case."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgesplit.graph import LayerGraph
from edgesplit.hardware.device import Device
from edgesplit.hardware.estimators import (
    LatencyEstimator,
    ProfileEstimator,
    RegressionEstimator,
    RooflineEstimator,
)
from edgesplit.hardware.profile import measure_partitions, prefix_partitions, works_and_latencies
from edgesplit.hardware.work import LayerWork

__all__ = ["default_estimators", "error_stats", "validate_estimators"]


def error_stats(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """MAPE and worst absolute percentage error, in percent."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    errors = np.abs(p - m) / m * 100
    return {"mape_pct": float(errors.mean()), "worst_pct": float(errors.max()),
            "count": len(errors)}


def default_estimators(profile: Mapping[str, Any], device: Device,
                       train_profiles: Sequence[Mapping[str, Any]] = ()
                       ) -> dict[str, tuple[LatencyEstimator, Device]]:
    """The estimators ``profile --validate`` compares, each with the device it models."""
    works, latencies = works_and_latencies(profile)
    estimators: dict[str, tuple[LatencyEstimator, Device]] = {
        "profile-sum": (ProfileEstimator.from_profile(profile), device),
        "regression (this model's layers)": (RegressionEstimator().fit(works, latencies), device),
        "roofline (this-machine)": (RooflineEstimator(), device),
    }
    if train_profiles:
        other_w, other_l = [], []
        for p in train_profiles:
            w, lat = works_and_latencies(p)
            other_w += w
            other_l += lat
        estimators["regression (other models)"] = (RegressionEstimator().fit(other_w, other_l),
                                                   device)
    return estimators


def validate_estimators(graph: LayerGraph, estimators: Mapping[str, tuple[LatencyEstimator,
                                                                          Device]],
                        *, partitions: int = 6, warmup: int = 3, repeats: int = 20
                        ) -> dict[str, Any]:
    """Measure the whole model and ``partitions`` edge/cloud parts each as one piece, and
    compare every estimator's sum of per-layer predictions against them."""
    names = [layer.name for layer in graph.layers]
    parts: list[tuple[str, list[str]]] = [("whole model", names)]
    for prefix in prefix_partitions(graph, partitions):
        rest = [n for n in names if n not in set(prefix)]
        parts += [(f"edge up to {prefix[-1]}", prefix), (f"cloud after {prefix[-1]}", rest)]
    measured = measure_partitions(graph, [p for _, p in parts], warmup=warmup, repeats=repeats)
    works = {layer.name: LayerWork.of(graph, layer) for layer in graph.layers}
    report: dict[str, Any] = {"model": graph.model, "targets": [], "estimators": {}}
    predictions: dict[str, list[float]] = {}
    for label, (estimator, device) in estimators.items():
        per_layer = {n: estimator.layer_ms(w, device) for n, w in works.items()}
        predictions[label] = [sum(per_layer[n] for n in layers) for _, layers in parts]
        whole = error_stats(predictions[label][:1], measured[:1])
        report["estimators"][label] = {
            "whole_model_error_pct": whole["mape_pct"],
            **error_stats(predictions[label], measured),
        }
    for i, (name, layers) in enumerate(parts):
        report["targets"].append({"target": name, "layers": len(layers),
                                  "measured_ms": measured[i],
                                  "predicted_ms": {k: v[i] for k, v in predictions.items()}})
    return report
