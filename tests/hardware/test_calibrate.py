"""The calibrated roofline (efficiencies and per-layer overhead fitted to profiles under the
measured memory bandwidths, tiers included), the measured wire codec and `edgesplit
calibrate`. Fits are checked on synthetic latencies from a known roofline (exact answers, no
timing); the CLI only for its document."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.hardware import AnalyticalCompute, Device, LayerWork, RooflineEstimator
from edgesplit.hardware.calibrate import calibrate_roofline, fit_roofline
from edgesplit.hardware.device import MemoryTier
from edgesplit.plan.codec import measure_wire_codec
from edgesplit.report.hardware_tables import calibration_table
from helpers import captured

TRUE = AnalyticalCompute(peak_gops={32: 50.0}, memory_bandwidth_gb_per_s=4.0,
                         efficiency={"conv": 0.4, "matmul": 0.6, "dwconv": 0.05,
                                     "elementwise": 0.1, "pool": 0.1, "norm": 0.1},
                         default_efficiency=0.3, layer_overhead_ms=0.05)
# the same with caches: working sets up to 1 MiB stream at 40 GB/s, up to 16 MiB at 20, larger
# ones (AlexNet's fully-connected weights) from DRAM at 4
TIERS = (MemoryTier(max_bytes=2**20, bandwidth_gb_per_s=40.0),
         MemoryTier(max_bytes=16 * 2**20, bandwidth_gb_per_s=20.0))
TRUE_TIERED = AnalyticalCompute.model_validate({**TRUE.model_dump(), "memory_tiers": TIERS})


def _device(compute: AnalyticalCompute) -> Device:
    return Device(name="x", kind="cpu", compute=compute)


def _samples(model: str, truth: AnalyticalCompute = TRUE) -> tuple[list[LayerWork], list[float]]:
    graph = captured(model)
    works = [LayerWork.of(graph, layer) for layer in graph.layers]
    est = RooflineEstimator()
    return works, [est.layer_ms(w, _device(truth)) for w in works]


def test_fit_recovers_a_known_roofline_and_predicts_an_unseen_model():
    works, ms = _samples("resnet18")
    more, more_ms = _samples("mobilenet_v2")
    fitted = fit_roofline(works + more, ms + more_ms, peak_gops=50.0,
                          memory_bandwidth_gb_per_s=4.0)
    assert fitted.memory_bandwidth_gb_per_s == 4.0  # measured, not fitted
    assert fitted.layer_overhead_ms == pytest.approx(0.05, rel=0.5)  # traded against eff.
    est = RooflineEstimator()
    unseen, truth = _samples("mnasnet")  # fitted on two other models
    predicted = sum(est.layer_ms(w, _device(fitted)) for w in unseen)
    assert predicted == pytest.approx(sum(truth), rel=0.05)


def test_a_two_tier_fit_prices_a_dram_bound_model_it_never_saw():
    # fitted on two models whose layers mostly fit the caches; AlexNet, left out, has 16-151 MB
    # fully-connected layers read from DRAM: the measured off-chip tier prices them, exactly
    works, ms = _samples("resnet18", TRUE_TIERED)
    more, more_ms = _samples("mobilenet_v2", TRUE_TIERED)
    fitted = fit_roofline(works + more, ms + more_ms, peak_gops=50.0,
                          memory_bandwidth_gb_per_s=4.0, memory_tiers=TIERS)
    assert fitted.memory_tiers == TIERS and fitted.memory_bandwidth_gb_per_s == 4.0
    assert fitted.efficiency["conv"] == pytest.approx(0.4, rel=0.05)
    assert fitted.layer_overhead_ms == pytest.approx(0.05, rel=0.5)
    est, device = RooflineEstimator(), _device(fitted)
    unseen, truth = _samples("alexnet", TRUE_TIERED)
    big = [(w, t) for w, t in zip(unseen, truth, strict=True) if w.bytes_moved > 16 * 2**20]
    assert len(big) == 2  # classifier.1 and .4 (151 and 67 MB); .6 (16.4 MB) fits 16 MiB
    for work, true_ms in big:
        dram_ms = work.bytes_moved / 4e9 * 1e3 + fitted.layer_overhead_ms
        assert est.layer_ms(work, device) == pytest.approx(dram_ms)
        assert dram_ms == pytest.approx(true_ms, rel=0.01)
    predicted = sum(est.layer_ms(w, device) for w in unseen)
    assert predicted == pytest.approx(sum(truth), rel=0.05)


def test_calibration_table_shows_the_memory_tiers():
    console = Console(width=100, record=True)
    console.print(calibration_table(_device(TRUE_TIERED)))
    text = console.export_text()
    assert "working set <= 1 MiB" in text and "working set <= 16 MiB" in text
    assert "larger (off-chip)" in text


def test_calibrate_keeps_the_base_device_and_says_where_it_came_from():
    base = _device(TRUE.model_copy(update={"efficiency": {}, "layer_overhead_ms": 0.0}))
    graph = captured("digits_cnn")
    works, ms = _samples("digits_cnn")
    profile = {"model": "digits_cnn", "layers": [
        {**w.to_dict(), "eager_ms": {"median": m}} for w, m in zip(works, ms, strict=True)]}
    device = calibrate_roofline(base, [profile], name="mine")
    assert device.name == "mine" and "digits_cnn" in device.source
    assert device.memory_bytes == base.memory_bytes
    est = RooflineEstimator()
    fitted = sum(est.layer_ms(LayerWork.of(graph, layer), device) for layer in graph.layers)
    assert fitted == pytest.approx(sum(ms), rel=0.05)


def test_wire_codec_is_measured_positive():
    codec = measure_wire_codec(repeats=3)
    assert min(codec.encode_gb_per_s, codec.decode_gb_per_s, codec.quantized_encode_gb_per_s,
               codec.quantized_decode_gb_per_s) > 0
    assert codec.encode_ms(1 << 20) > codec.encode_ms(1 << 10) >= 0


def test_calibrate_cli_writes_a_device_file_the_planner_reads(tmp_path):
    out = tmp_path / "me.json"
    result = CliRunner().invoke(app, ["calibrate", "digits_cnn", "--repeats", "2", "--warmup",
                                      "0", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["compute"]["model"] == "analytical" and doc["wire"]["encode_gb_per_s"] > 0
    from edgesplit.hardware import get_device, resolve_device

    device = resolve_device(str(out))
    assert np.isfinite(device.compute.layer_overhead_ms)
    # the fit keeps this machine's measured memory side: off-chip bandwidth and tiers
    measured = get_device("this-machine").compute
    assert device.compute.memory_bandwidth_gb_per_s == measured.memory_bandwidth_gb_per_s
    assert device.compute.memory_tiers == measured.memory_tiers
