"""Latency tables of a search space: derived tables equal capture + estimator by hand, the file
round-trips and refuses another space, device, version or a corrupt file, a measured table is
complete, validation reports its documented structure, and the CLI. No timing or error
threshold is asserted: those depend on the machine."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.graph import capture
from edgesplit.hardware import LayerWork, estimator_for, get_device
from edgesplit.nas import OpSpec
from edgesplit.nas.jmsnas import (
    Arch,
    HeadSpec,
    LatencyTable,
    SearchSpace,
    StemSpec,
    build_latency_table,
    get_space,
    validate_latency_table,
)

# Three layers, the first two sharing a shape (built and priced once), the last downsampling.
TINY = SearchSpace.from_stages(
    "tiny-latency", (1, 8, 8), 3, stem=StemSpec(4, stride=1), stages=[(4, 2, 1), (8, 1, 2)],
    head=HeadSpec(8),
    candidates=(OpSpec("identity"), OpSpec.parse("mb3_e3"), OpSpec.parse("mb3_e3_sc")))
PRESET = "jetson-nano"


@pytest.fixture(scope="module")
def derived() -> LatencyTable:
    return build_latency_table(TINY, PRESET)


@pytest.fixture(scope="module")
def measured() -> LatencyTable:
    return build_latency_table(TINY, "this-machine", warmup=1, repeats=5, calibration=2,
                               threads=1)


def _estimated_ms(module: nn.Module, example: torch.Tensor) -> float:
    device = get_device(PRESET)
    graph = capture(module.eval(), example)
    return sum(estimator_for(device).layer_ms(LayerWork.of(graph, layer), device)
               for layer in graph.layers)


class _Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu6(self.bn(self.conv(x)))


def test_derived_table_equals_capture_plus_estimator(derived):
    assert derived.method == "estimated: RooflineEstimator"
    assert derived.measurement is None and derived.overhead_ms == 0.0
    assert (derived.space, derived.device, derived.batch) == ("tiny-latency", PRESET, 1)
    for i, name in ((0, "mb3_e3_sc"), (2, "mb3_e3")):
        layer, op = TINY.layers[i], OpSpec.parse(name)
        module = op.build(TINY.in_channels(i), layer.out_channels, layer.stride)
        example = torch.randn(1, TINY.in_channels(i), *TINY.in_size(i))
        assert derived.op_ms(i, name) == pytest.approx(_estimated_ms(module, example), rel=1e-9)
    assert derived.stem_ms == pytest.approx(_estimated_ms(_Stem(), torch.randn(1, 1, 8, 8)),
                                            rel=1e-9)
    # layers 0 and 1 see the same shape, so they are priced alike
    assert derived.layers[0] == derived.layers[1]


def test_identity_costs_nothing_and_vectors_follow_the_space(derived):
    assert derived.op_ms(0, "identity") == 0.0 and derived.op_ms(1, OpSpec("identity")) == 0.0
    for i, layer in enumerate(TINY.layers):
        assert derived.layer_vector(i) == [derived.op_ms(i, op) for op in layer.ops]
    assert all(ms > 0 for i in range(3) for op, ms in derived.layers[i].items()
               if op != "identity")


def test_arch_ms_is_stem_plus_chosen_ops_plus_head(derived, measured):
    arch = Arch.from_names(["identity", "mb3_e3_sc", "mb3_e3"])
    assert derived.arch_ms(arch) == pytest.approx(
        derived.stem_ms + derived.op_ms(1, "mb3_e3_sc") + derived.op_ms(2, "mb3_e3")
        + derived.head_ms)
    assert measured.arch_ms(arch) == pytest.approx(
        measured.overhead_ms + measured.stem_ms + measured.op_ms(1, "mb3_e3_sc")
        + measured.op_ms(2, "mb3_e3") + measured.head_ms)
    assert measured.fixed_ms == pytest.approx(
        measured.overhead_ms + measured.stem_ms + measured.head_ms)


def test_bad_queries_are_config_errors(derived):
    with pytest.raises(ConfigError, match=r"no op 'mb7_e6'.*identity, mb3_e3, mb3_e3_sc"):
        derived.op_ms(0, "mb7_e6")
    with pytest.raises(ConfigError, match="layer 3 is out of range"):
        derived.layer_vector(3)
    with pytest.raises(ConfigError, match=r"has 2 ops but .* 3 layers"):
        derived.arch_ms(Arch.from_names(["identity", "mb3_e3"]))


def test_measured_table_is_complete(measured):
    assert measured.method == "measured" and measured.is_measured
    assert measured.device == "this-machine"
    assert math.isfinite(measured.overhead_ms)
    assert measured.stem_ms > 0 and measured.head_ms > 0
    for i, layer in enumerate(TINY.layers):
        assert list(measured.layers[i]) == list(layer.op_names)
        for op in layer.ops:
            ms = measured.op_ms(i, op)
            assert ms == 0.0 if op.is_identity else (ms > 0 and math.isfinite(ms))
    info = measured.measurement
    assert info is not None
    assert (info["threads"], info["repeats"], info["warmup"]) == (1, 5, 1)
    assert info["torch"] == torch.__version__ and info["date"]
    assert set(info["load_average"]) == {"before", "after"}
    assert len(info["calibration"]["archs"]) == 2
    assert info["min_samples_per_op"] >= 5


def test_validation_reports_the_documented_structure(measured):
    result = validate_latency_table(measured, TINY, samples=3, warmup=1, repeats=3)
    for key in ("space", "device", "method", "batch", "threads", "cpus", "samples", "seed",
                "load_average", "mape_pct", "worst_error_pct", "fraction_within_10pct",
                "drift_pct", "archs"):
        assert key in result
    assert result["samples"] == len(result["archs"]) == 3 and result["threads"] == 1
    assert set(result["load_average"]) == {"before", "after"}
    calibration = {tuple(a) for a in measured.measurement["calibration"]["archs"]}
    for row in result["archs"]:
        assert tuple(row["arch"]) not in calibration  # held out
        assert row["predicted_ms"] == pytest.approx(measured.arch_ms(Arch.from_names(row["arch"])))
        assert row["measured_ms"] > 0
        assert row["error_pct"] == pytest.approx(
            100 * (row["predicted_ms"] - row["measured_ms"]) / row["measured_ms"])
    errors = [abs(row["error_pct"]) for row in result["archs"]]
    assert result["mape_pct"] == pytest.approx(sum(errors) / 3)
    assert abs(result["worst_error_pct"]) == pytest.approx(max(errors))
    assert 0.0 <= result["fraction_within_10pct"] <= 1.0
    assert math.isfinite(result["drift_pct"])  # the table has calibration networks


def test_validation_refuses_an_estimated_table(derived):
    with pytest.raises(ConfigError, match="not measured"):
        validate_latency_table(derived, TINY, samples=2)


def test_save_and_load_round_trip(derived, measured, tmp_path):
    path = derived.save(tmp_path / "derived.json")
    assert json.loads(path.read_text())["version"] == 2
    assert LatencyTable.load(path, space=TINY, device=PRESET) == derived
    assert LatencyTable.load(path) == derived
    path = measured.save(tmp_path / "measured.json")
    assert LatencyTable.load(path, space=TINY, device="this-machine") == measured


def test_a_table_for_another_space_or_device_is_refused(derived, measured, tmp_path):
    path = derived.save(tmp_path / "t.json")
    with pytest.raises(ConfigError, match=r"for search space 'tiny-latency', not "
                                          r"'digits-mbconv'.*edgesplit nas latency-table "
                                          r"digits-mbconv --device jetson-nano"):
        LatencyTable.load(path, space=get_space("digits-mbconv"))
    changed = SearchSpace(TINY.name, TINY.input_shape, TINY.num_classes, TINY.stem,
                          TINY.layers, HeadSpec(16))
    with pytest.raises(ConfigError, match="space 'tiny-latency' has changed"):
        LatencyTable.load(path, space=changed)
    with pytest.raises(ConfigError, match=r"for device 'jetson-nano', not 'jetson-tx2'.*"
                                          r"--device jetson-tx2"):
        LatencyTable.load(path, device="jetson-tx2")
    with pytest.raises(ConfigError, match="for device 'this-machine', not 'jetson-nano'"):
        measured.check(device=PRESET)
    data = measured.to_dict()
    data["device"]["fingerprint"] = "0" * 64
    data["measurement"]["machine"]["processor"] = "Some Other CPU"
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"measured on another machine.*Some Other CPU"):
        LatencyTable.load(tmp_path / "other.json", device="this-machine")


def test_a_renamed_preset_is_named_by_a_device_file_the_hint_says_how_to_write(derived,
                                                                               tmp_path):
    """A topology's ``{preset: jetson-tx2, name: cam}`` is not a preset, so the hint must not
    say ``--device cam``; the device file it describes loads (preset and overrides, as in a
    topology) and the table built for it fits."""
    from edgesplit.hardware.files import load_device

    path = derived.save(tmp_path / "t.json")
    renamed = get_device("jetson-tx2").model_copy(update={"name": "cam"})
    with pytest.raises(ConfigError, match=r"--device cam\.yaml -o FILE` with cam\.yaml a device "
                                          r"file holding topology entry 'cam'"):
        LatencyTable.load(path, device=renamed)
    (tmp_path / "cam.yaml").write_text("preset: jetson-tx2\nname: cam\n")
    assert load_device(tmp_path / "cam.yaml") == renamed
    with pytest.raises(ConfigError, match=r"--device jetson-tx2 -o FILE"):
        LatencyTable.load(path, device=get_device("jetson-tx2"))


@pytest.mark.parametrize("text, message", [
    ("{not json", "cannot read latency table"),
    ('{"kind": "edgesplit-profile", "version": 1}', "is not an edgesplit latency table"),
    ('{"kind": "edgesplit-latency-table", "version": 99}', "has version 99; this edgesplit "
                                                           "reads version 2"),
    ('{"kind": "edgesplit-latency-table", "version": 1}', "is malformed"),
])
def test_corrupt_or_foreign_files_are_refused(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        LatencyTable.load(path)


def test_a_version_1_table_in_milliseconds_is_read_as_seconds(derived, measured, tmp_path):
    """Version 1 wrote milliseconds and no unit; such a file loads as the same table."""
    for table in (derived, measured):
        doc = table.to_dict()
        old = {k: v for k, v in doc.items() if not k.endswith("_seconds") and k != "unit"}
        old.update(version=1, stem_ms=table.stem_ms, head_ms=table.head_ms,
                   overhead_ms=table.overhead_ms, layers=[dict(row) for row in table.layers])
        if table.measurement is not None:
            calibration = dict(table.measurement["calibration"])
            calibration["measured_ms"] = [None if s is None else s * 1e3
                                          for s in calibration.pop("measured_seconds")]
            calibration["sum_of_parts_ms"] = [s * 1e3
                                              for s in calibration.pop("sum_of_parts_seconds")]
            old["measurement"] = {**table.measurement, "calibration": calibration}
        path = tmp_path / "v1.json"
        path.write_text(json.dumps(old))
        loaded = LatencyTable.load(path, space=TINY)
        assert loaded.to_dict()["version"] == 2 and loaded.to_dict()["unit"] == "seconds"
        assert loaded.stem_seconds == pytest.approx(table.stem_seconds, rel=1e-12)
        assert loaded.overhead_ms == pytest.approx(table.overhead_ms, rel=1e-12, abs=1e-15)
        for i in range(len(TINY.layers)):
            assert loaded.layer_vector(i) == pytest.approx(table.layer_vector(i), rel=1e-12)
        if table.measurement is not None:
            ours = table.measurement["calibration"]["sum_of_parts_seconds"]
            assert loaded.measurement["calibration"]["sum_of_parts_seconds"] == pytest.approx(
                ours, rel=1e-12)


def test_bad_entries_are_refused(derived):
    data = derived.to_dict()
    data["layers"][0]["mb3_e3"] = -1.0
    with pytest.raises(ConfigError, match=r"layers\[0\]\['mb3_e3'\]=-1.0 must be >= 0"):
        LatencyTable.from_dict(data)
    with pytest.raises(ConfigError, match=r"missing\.json"):
        LatencyTable.load("missing.json")


@pytest.fixture
def tiny_file(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY.to_dict()))
    return path


def test_cli_latency_table_json(tiny_file, tmp_path):
    out = tmp_path / "table.json"
    result = CliRunner().invoke(app, [
        "nas", "latency-table", str(tiny_file), "--device", "this-machine", "--json",
        "--warmup", "1", "--repeats", "3", "--calibration", "1", "--threads", "1",
        "--validate", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["table"]["method"] == "measured" and doc["table"]["space"]["name"] == "tiny-latency"
    assert doc["validation"]["samples"] == 2 and doc["written_to"] == str(out)
    assert LatencyTable.load(out, space=TINY, device="this-machine").to_dict() == doc["table"]
    spaces = json.loads(CliRunner().invoke(app, ["nas", "spaces", "--json"]).stdout)
    assert {"digits-mbconv", "cifar-mbconv"} <= {s["name"] for s in spaces["spaces"]}


@pytest.mark.parametrize("args, message", [
    (["nas-space-that-does-not-exist", "--device", "jetson-nano"], "unknown search space"),
    (["TINY", "--device", "no-such-device"], "unknown device 'no-such-device'"),
    (["TINY", "--device", "jetson-nano", "--validate", "3"], "needs --device this-machine"),
])
def test_cli_user_errors_are_one_line_with_exit_2(tiny_file, args, message):
    args = [str(tiny_file) if a == "TINY" else a for a in args]
    proc = subprocess.run([sys.executable, "-m", "edgesplit.cli", "nas", "latency-table", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


def test_the_captured_work_kept_per_process_is_bounded(derived):
    """Tables for more spaces (here batch sizes) than the cache keeps: the oldest are dropped,
    and a table built again after that equals the first one built."""
    from edgesplit.nas.jmsnas import latency

    for batch in range(2, 3 + latency._WORKS_SPACES):
        build_latency_table(TINY, PRESET, batch=batch)
    assert len(latency._WORKS) == latency._WORKS_SPACES
    again = build_latency_table(TINY, PRESET)  # batch 1 was dropped: captured anew
    assert again.layers == derived.layers and again.stem_ms == derived.stem_ms
