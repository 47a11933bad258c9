"""Devices, links and files: validation errors, roofline arithmetic by hand (memory tiers
included), regression fit on synthetic profiles with known coefficients, and
profiling/partition consistency."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesplit.errors import ConfigError, UnknownNameError
from edgesplit.hardware.catalog import (
    get_device,
    list_devices,
    resolve_device,
    resolve_link,
    resolve_topology,
)
from edgesplit.hardware.device import AnalyticalCompute, Device, MemoryTier
from edgesplit.hardware.estimators import (
    ProfileEstimator,
    RegressionEstimator,
    RooflineEstimator,
    estimator_for,
)
from edgesplit.hardware.files import load_device, load_link, load_topology
from edgesplit.hardware.link import Link
from edgesplit.hardware.this_machine import monotone_tiers
from edgesplit.hardware.work import LayerWork

MiB = 2**20


def _device(**compute) -> Device:
    spec = {"peak_gops": {8: 100.0, 32: 25.0}, "memory_bandwidth_gb_per_s": 10.0,
            "default_efficiency": 1.0, **compute}
    return Device(name="d", kind="accelerator", compute=AnalyticalCompute(**spec))


def _work(macs=0, flops=None, w=0, i=0, o=0, op_class="conv", bits=32) -> LayerWork:
    return LayerWork("l", op_class, macs, 2 * macs if flops is None else flops, 0, w, i, o, bits)


def test_roofline_compute_bound_by_hand():
    # 1 GMAC = 2 GOP at 25 GOP/s (FP32) = 80 ms; 1 MB at 10 GB/s = 0.1 ms
    assert RooflineEstimator().layer_ms(_work(macs=10**9, w=10**6),
                                        _device()) == pytest.approx(80.0)


def test_roofline_memory_bound_by_hand():
    # 1 MMAC = 2 MOP at 25 GOP/s = 0.08 ms; 100 MB at 10 GB/s = 10 ms
    work = _work(macs=10**6, w=50 * 10**6, i=25 * 10**6, o=25 * 10**6)
    assert RooflineEstimator().layer_ms(work, _device()) == pytest.approx(10.0)


def test_sub_8_bit_computes_at_int8_but_moves_fewer_bytes():
    device = _device(layer_overhead_ms=0.5, efficiency={"conv": 0.5})
    est = RooflineEstimator()
    # 1 GMAC at INT8: 2 GOP / (100 GOP/s x 0.5) = 40 ms (+0.5 overhead), whatever bits <= 8
    assert est.layer_ms(_work(macs=10**9, bits=8), device) == pytest.approx(40.5)
    assert est.layer_ms(_work(macs=10**9, bits=4), device) == pytest.approx(40.5)
    # memory-bound layer: halving the bytes halves the time
    at8 = est.layer_ms(_work(macs=1, i=10**8, bits=8), device) - 0.5
    at4 = est.layer_ms(_work(macs=1, i=5 * 10**7, bits=4), device) - 0.5
    assert at8 == pytest.approx(10.0) and at4 == pytest.approx(5.0)


def _tiered(**compute) -> Device:
    # 1 MiB at 100 GB/s, 16 MiB at 50, larger at the off-chip 10 GB/s
    return _device(memory_tiers=[MemoryTier(max_bytes=MiB, bandwidth_gb_per_s=100.0),
                                 MemoryTier(max_bytes=16 * MiB, bandwidth_gb_per_s=50.0)],
                   **compute)


def test_memory_tiers_price_a_layer_by_its_working_set():
    est, device = RooflineEstimator(), _tiered()
    # 1 MB (fits 1 MiB) at 100 GB/s = 0.01 ms; 10 MB at 50 = 0.2 ms; 100 MB at 10 = 10 ms
    assert est.layer_ms(_work(macs=1, w=10**6), device) == pytest.approx(0.01)
    assert est.layer_ms(_work(macs=1, w=10**7), device) == pytest.approx(0.2)
    assert est.layer_ms(_work(macs=1, w=10**8), device) == pytest.approx(10.0)
    # the working set is weights + input + output: 0.5 MB of weights with a 1 MB input is 1.5 MB
    assert est.layer_ms(_work(macs=1, w=5 * 10**5, i=10**6), device) == pytest.approx(0.03)
    # without tiers every layer streams at the off-chip bandwidth, as before
    assert est.layer_ms(_work(macs=1, w=10**6), _device()) == pytest.approx(0.1)


def test_an_embedding_streams_the_rows_it_gathers_not_its_table():
    # a 32 MB table read for 2 KB of output: 1 KB of ids + 2 KB out + 2 KB of rows
    work = _work(macs=0, flops=0, w=32 * 10**6, i=1000, o=2000, op_class="embedding")
    assert work.bytes_touched == 5000 and work.bytes_moved == 32_003_000
    assert RooflineEstimator().layer_ms(work, _tiered()) == pytest.approx(5000 / 100e9 * 1e3)
    # untiered devices keep pricing the whole table (their published numbers stand)
    assert RooflineEstimator().layer_ms(work, _device()) == pytest.approx(3.2003)


def test_device_files_without_memory_tiers_load_and_dump_as_before(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"name": "old", "kind": "npu", "compute": {
        "model": "analytical", "peak_gops": {"8": 68.0}, "memory_bandwidth_gb_per_s": 1.0,
        "efficiency": {"conv": 0.7}, "default_efficiency": 0.5, "layer_overhead_ms": 0.0}}))
    device = load_device(old)
    assert device.compute.memory_tiers == () and device.compute.bandwidth_for(1) == 1.0
    # dumps of untiered devices have no memory_tiers key: files and fingerprints unchanged
    assert device.model_dump(mode="json")["compute"] == json.loads(old.read_text())["compute"]
    presets = [get_device(name) for name in list_devices() if name != "this-machine"]
    assert all("memory_tiers" not in d.model_dump()["compute"] for d in presets)
    tiered = _tiered().model_dump(mode="json")
    assert [t["max_bytes"] for t in tiered["compute"]["memory_tiers"]] == [MiB, 16 * MiB]
    assert Device.model_validate(tiered) == _tiered()


@pytest.mark.parametrize(("tiers", "message"), [
    ([{"max_bytes": 16 * MiB, "bandwidth_gb_per_s": 50}, {"max_bytes": MiB,
                                                          "bandwidth_gb_per_s": 100}],
     "must grow in max_bytes"),
    ([{"max_bytes": MiB, "bandwidth_gb_per_s": 50}, {"max_bytes": 16 * MiB,
                                                     "bandwidth_gb_per_s": 100}],
     "must not grow"),
    ([{"max_bytes": MiB, "bandwidth_gb_per_s": 5}], "nor fall below"),
    ([{"max_bytes": 0, "bandwidth_gb_per_s": 50}], "max_bytes"),
])
def test_memory_tiers_are_validated(tmp_path, tiers, message):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"name": "d", "kind": "cpu", "compute": {
        "peak_gops": {"32": 100}, "memory_bandwidth_gb_per_s": 10, "memory_tiers": tiers}}))
    with pytest.raises(ConfigError, match=message):
        load_device(path)


def test_measured_rates_become_monotone_tiers():
    # a small buffer's call overhead makes it look slower than 1 MiB: it takes 1 MiB's rate;
    # 16 and 64 MiB stream alike: one tier; 256 MiB is off-chip
    measured = {256 << 10: 60.0, MiB: 110.0, 4 * MiB: 95.0, 16 * MiB: 57.0, 64 * MiB: 57.0,
                256 * MiB: 30.0}
    tiers, off_chip = monotone_tiers(measured)
    assert off_chip == 30.0
    assert [(t.max_bytes, t.bandwidth_gb_per_s) for t in tiers] == [
        (MiB, 110.0), (4 * MiB, 95.0), (64 * MiB, 57.0)]
    assert monotone_tiers({MiB: 20.0, 4 * MiB: 30.0}) == ((), 30.0)  # noise: no faster tier
    with pytest.raises(ConfigError):
        monotone_tiers({})


def test_layer_work_at_bit_widths(block_graph):
    work = LayerWork.of(block_graph, "dw")
    assert (work.weight_bytes, work.input_bytes, work.output_bytes) == (80 * 4, 2048, 2048)
    q = LayerWork.of(block_graph, "dw", w_bits=4, a_bits=8)
    assert (q.weight_bytes, q.input_bytes, q.output_bytes, q.bits) == (40, 512, 512, 8)
    assert LayerWork.of(block_graph, "dw", w_bits=4, a_bits=4).bits == 4


def test_regression_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    truth = {"conv": (2e-9, 1e-8, 0.01), "matmul": (1e-9, 3e-8, 0.02)}
    works, latencies = [], []
    for op_class, (a, b, c) in truth.items():
        for _ in range(40):
            macs, nbytes = int(rng.integers(1e5, 1e9)), int(rng.integers(1e4, 1e7))
            works.append(_work(macs=macs, w=nbytes, op_class=op_class))
            latencies.append(a * macs + b * nbytes + c)
    est = RegressionEstimator().fit(works, latencies)
    for op_class, coef in truth.items():
        np.testing.assert_allclose(est.coef_[op_class], coef, rtol=1e-6)
    np.testing.assert_allclose(est.predict(works), latencies, rtol=1e-6)
    # a class never seen falls back to the all-layers model
    assert est.layer_ms(_work(macs=10**6, op_class="pool"), _device()) > 0


def test_regression_needs_data():
    with pytest.raises(ConfigError, match="not fitted"):
        RegressionEstimator().predict([_work()])
    with pytest.raises(ConfigError, match="one latency per layer"):
        RegressionEstimator().fit([_work()], [1.0, 2.0])


def test_profile_estimator_lookup_and_missing_layer():
    est = ProfileEstimator({"l": 1.5}, model="m")
    assert est.layer_ms(_work(), _device()) == 1.5
    with pytest.raises(ConfigError, match="not in the profile of m"):
        est.layer_ms(LayerWork("other", "conv", 0, 0, 0, 0, 0, 0), _device())


def test_link_transfer_time_by_hand():
    link = Link(name="l", bandwidth_mbps=8.0, down_bandwidth_mbps=80.0, rtt_ms=20)
    assert link.transfer_ms(1_000_000) == pytest.approx(1000.0)  # 8 Mbit at 8 Mbps
    assert link.transfer_ms(1_000_000, direction="down") == pytest.approx(100.0)
    lossy = Link(name="l", bandwidth_mbps=8.0, loss=0.5)
    assert lossy.transfer_ms(1_000_000) == pytest.approx(2000.0)
    bus = Link(name="bus", bandwidth_mbps=1200, medium="bus", shared=True)
    assert bus.transfer_ms(150_000, senders=4) == pytest.approx(4.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"bandwidth_mbps": -3}, "field 'bandwidth_mbps': Input should be greater than 0 (got -3)"),
    ({"bandwidth_mbps": 1, "loss": 1.5}, "field 'loss'"),
    ({"bandwidth_mbps": 1, "speed": 3}, "field 'speed': Extra inputs are not permitted"),
    ({}, "field 'bandwidth_mbps': Field required"),
])
def test_link_file_errors_name_the_field(tmp_path, kwargs, message):
    path = tmp_path / "link.yaml"
    path.write_text(json.dumps({"name": "x", **kwargs}))
    with pytest.raises(ConfigError) as info:
        load_link(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_device_file_yaml_and_toml(tmp_path):
    yaml_path = tmp_path / "cam.yaml"
    yaml_path.write_text("name: cam\nkind: npu\nmemory_bytes: 4194304\ncompute:\n"
                         "  peak_gops: {8: 500}\n  memory_bandwidth_gb_per_s: 4\n")
    toml_path = tmp_path / "cam.toml"
    toml_path.write_text('name = "cam"\nkind = "npu"\nmemory_bytes = 4194304\n[compute]\n'
                         'memory_bandwidth_gb_per_s = 4\n[compute.peak_gops]\n8 = 500\n')
    assert load_device(yaml_path) == load_device(toml_path)
    assert resolve_device(str(yaml_path)).compute.peak_gops == {8: 500.0}


def test_device_file_errors(tmp_path):
    bad_kind = tmp_path / "d.yaml"
    bad_kind.write_text("name: d\nkind: toaster\ncompute: {peak_gops: {8: 1}, "
                        "memory_bandwidth_gb_per_s: 1}\n")
    with pytest.raises(ConfigError, match="field 'kind'"):
        load_device(bad_kind)
    missing = tmp_path / "m.yaml"
    missing.write_text("name: d\nkind: cpu\n")
    with pytest.raises(ConfigError, match="field 'compute': Field required"):
        load_device(missing)
    broken = tmp_path / "b.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_device(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_device(tmp_path / "nope.yaml")
    with pytest.raises(UnknownNameError, match=r"unknown device 'jetson-nan'.*Did you mean"):
        resolve_device("jetson-nan")
    with pytest.raises(UnknownNameError, match="unknown link"):
        resolve_link("6g")


def test_topology_file_with_presets_and_renames(tmp_path):
    path = tmp_path / "topo.yaml"
    path.write_text(
        "name: two-cams\n"
        "devices:\n"
        "  - {preset: jetson-nano, name: cam1}\n"
        "  - {preset: jetson-nano, name: cam2}\n"
        "  - v100-server\n"
        "links:\n"
        "  - {src: cam1, dst: v100-server, link: wifi}\n"
        "  - {src: cam2, dst: v100-server, link: {name: lte, bandwidth_mbps: 5.85}}\n")
    topo = load_topology(path)
    assert [d.name for d in topo.devices] == ["cam1", "cam2", "v100-server"]
    assert topo.link("cam2", "v100-server").bandwidth_mbps == 5.85
    assert not topo.is_chain
    cyclic = tmp_path / "cyc.yaml"
    cyclic.write_text("name: c\ndevices: [jetson-nano, v100-server]\nlinks:\n"
                      "  - {src: jetson-nano, dst: v100-server, link: wifi}\n"
                      "  - {src: v100-server, dst: jetson-nano, link: wifi}\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_topology(cyclic)
    unknown = tmp_path / "u.yaml"
    unknown.write_text("name: u\ndevices: [jetson-nano]\nlinks:\n"
                       "  - {src: jetson-nano, dst: cloud, link: wifi}\n")
    with pytest.raises(ConfigError, match="unknown device 'cloud'"):
        resolve_topology(str(unknown))


def test_this_machine_is_measured_live():
    device = get_device("this-machine")
    assert device.kind == "cpu" and device.compute.peak_gops[32] > 0
    assert device.compute.memory_bandwidth_gb_per_s > 0
    assert all(t.bandwidth_gb_per_s >= device.compute.memory_bandwidth_gb_per_s
               for t in device.compute.memory_tiers)  # validated: caches are not slower
    assert isinstance(estimator_for(device), RooflineEstimator)


def test_measured_device_uses_its_profile_with_regression_fallback(tmp_path, block_graph):
    from edgesplit.hardware.profile import load_profile, profile_graph, save_profile

    prof = profile_graph(block_graph, warmup=1, repeats=3, onnx=False)
    assert [row["name"] for row in prof["layers"]] == ["stem", "expand", "dw", "project", "add"]
    # in-context layer times add up to about one forward pass (same run, interleaved)
    assert prof["sum_of_layers_ms"]["eager"] > 0 and prof["whole_model"]["eager_ms"]["median"] > 0
    save_profile(prof, tmp_path / "prof.json")
    (tmp_path / "dev.yaml").write_text("name: board\nkind: cpu\ncompute:\n  profile: prof.json\n")
    device = resolve_device(str(tmp_path / "dev.yaml"))
    est = estimator_for(device)
    assert isinstance(est, ProfileEstimator)
    work = LayerWork.of(block_graph, "dw")
    assert est.layer_ms(work, device) == prof["layers"][2]["eager_ms"]["median"]
    unseen = LayerWork("other-model-layer", "conv", 10**6, 2 * 10**6, 0, 4000, 4000, 4000)
    # a layer the profile lacks is answered by the regression fitted on that profile
    from edgesplit.hardware.profile import works_and_latencies

    fitted = RegressionEstimator().fit(*works_and_latencies(prof))
    assert est.layer_ms(unseen, device) == pytest.approx(fitted.layer_ms(unseen, device))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**load_profile(tmp_path / "prof.json"), "version": 99}))
    with pytest.raises(ConfigError, match="version 99"):
        load_profile(bad)


def test_profile_idles_before_each_pass_and_says_so(block_graph):
    from edgesplit.hardware.profile import profile_graph

    prof = profile_graph(block_graph, warmup=0, repeats=2, onnx=False, idle_ms=1.0)
    assert prof["idle_ms"] == 1.0
    assert all(row["eager_ms"]["median"] >= 0 for row in prof["layers"])
    with pytest.raises(ConfigError, match="idle_ms"):
        profile_graph(block_graph, warmup=0, repeats=1, onnx=False, idle_ms=-1.0)


def test_thread_pool_release_is_torchs_own_runtime_and_keeps_results():
    """The release pauses torch's OpenMP, not the copy another wheel loaded (scikit-learn's
    libgomp), and torch computes the same afterwards, on this thread and on another."""
    import os
    import threading

    import sklearn.datasets  # noqa: F401  (loads scikit-learn's own libgomp beside torch's)
    import torch

    from edgesplit.hardware.threads import openmp_library, release_thread_pool

    lib = openmp_library.__wrapped__()  # found afresh, with both copies loaded
    if lib is None:
        pytest.skip("torch's OpenMP runtime has no omp_pause_resource_all here")
    assert lib._name.startswith(os.path.dirname(torch.__file__))
    x = torch.arange(1 << 20, dtype=torch.float32)
    want = (x * 2).sum()
    assert release_thread_pool()
    assert torch.equal((x * 2).sum(), want)
    got = []
    worker = threading.Thread(target=lambda: got.append((release_thread_pool(),
                                                         torch.equal((x * 2).sum(), want))))
    worker.start()
    worker.join()
    assert got == [(True, True)]


def test_preset_overrides_in_a_topology_file_are_validated(tmp_path):
    """An override of a preset's field goes through the same validation as a device file:
    a size in units is read as bytes, a wrong value is one ConfigError line (it was stored
    unchecked and failed in numpy deep inside planning)."""
    path = tmp_path / "t.yaml"
    path.write_text("name: t\ndevices:\n  - {preset: phone-2022, memory_bytes: 2MiB}\n"
                    "  - v100-server\nlinks:\n  - {src: phone-2022, dst: v100-server, "
                    "link: wifi}\n")
    assert load_topology(path).devices[0].memory_bytes == 2 * 2**20
    path.write_text(path.read_text().replace("2MiB", "lots"))
    with pytest.raises(ConfigError, match="memory") as info:
        load_topology(path)
    assert "\n" not in str(info.value)
    path.write_text(path.read_text().replace("memory_bytes: lots", "memory_byte: 1"))
    with pytest.raises(ConfigError, match="memory_byte"):
        load_topology(path)
