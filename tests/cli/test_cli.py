"""The command line: JSON contract of `inspect`, listings, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from edgesplit.cli import app

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_inspect_json_contract():
    result = _run("inspect", "resnet18", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["version"] == 1 and doc["model"] == "resnet18"
    layer = doc["layers"][0]
    for key in ("name", "op", "macs", "param_bytes", "out_shape", "out_elements", "inputs"):
        assert key in layer
    assert layer["inputs"] == ["pixel_values"] and layer["out_shape"] == [1, 64, 112, 112]
    assert [l["index"] for l in doc["layers"]] == list(range(len(doc["layers"])))
    assert doc["totals"]["macs"] == sum(l["macs"] for l in doc["layers"])
    first, last = doc["cuts"][0], doc["cuts"][-1]
    assert (first["index"], first["tensors"], first["elements"]) == (-1, ["pixel_values"], 150_528)
    assert (last["index"], last["elements"]) == (len(doc["layers"]) - 1, 1000)
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert by_name["pixel_values"]["producer"] == "input"
    assert by_name[doc["layers"][-1]["outputs"][0]]["consumers"] == ["output"]


def test_inspect_input_shape_and_split_after():
    result = _run("inspect", "resnet18", "--input-shape", "1,3,112,112", "--json",
                  "--split-after", "resnet.embedder.pooler")
    doc = json.loads(result.stdout)
    assert doc["cuts"][0]["elements"] == 3 * 112 * 112
    assert doc["split"]["edge_layers"] == 2
    assert doc["split"]["crossing_elements"] == 64 * 28 * 28
    assert doc["split"]["memory"]["weight_bytes"] > 0


def test_inspect_table_and_models_listing():
    result = _run("inspect", "resnet18", "--limit", "3")
    assert result.exit_code == 0
    assert "single-tensor cut points" in result.stdout and "first 3 of" in result.stdout
    listing = json.loads(_run("models", "--json").stdout)
    names = {m["name"] for m in listing["models"]}
    assert {"alexnet", "vgg16", "resnet18", "resnet34", "resnet50", "mobilenet_v2", "googlenet",
            "mnasnet", "resnext50", "yolov3_tiny", "bert_mini", "gpt2_small"} <= names


@pytest.mark.parametrize("args, message", [
    (["inspect", "resnet999"], "unknown model 'resnet999'"),
    (["inspect", "/nonexistent/model.pt2"], "does not exist"),
    (["inspect", "resnet18", "--input-shape", "1,3,224"], "4-d input shape"),
    (["inspect", "resnet18", "--input-shape", "1,1,64,64"], "could not capture resnet18"),
    (["inspect", "resnet18", "--split-after", "nope"], "no layer named 'nope'"),
])
def test_user_errors_are_one_line_with_exit_2(args, message):
    proc = subprocess.run([sys.executable, "-m", "edgesplit.cli", *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


def test_unreadable_file(tmp_path):
    bad = tmp_path / "garbage.pt2"
    bad.write_text("hello")
    proc = subprocess.run([sys.executable, "-m", "edgesplit.cli", "inspect", str(bad)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cannot read" in proc.stderr and "Traceback" not in proc.stderr


def test_hardware_listings_json():
    devices = json.loads(_run("devices", "--json").stdout)["devices"]
    by_name = {d["name"]: d for d in devices}
    assert by_name["eyeriss"]["compute"]["peak_gops"] == {"8": 68.0}  # 34 G MAC/s
    assert by_name["this-machine"]["compute"]["peak_gops"]["32"] > 0
    links = {l["name"]: l for l in json.loads(_run("links", "--json").stdout)["links"]}
    assert links["dads-cat1"]["bandwidth_mbps"] == 0.13
    topos = {t["name"]: t for t in json.loads(_run("topologies", "--json").stdout)["topologies"]}
    assert [d["name"] for d in topos["jmsnas-chain"]["devices"]] == ["ue", "sbs", "mbs", "cloud"]


def test_profile_writes_a_file_and_validates(tmp_path):
    path = tmp_path / "p.json"
    result = _run("profile", "resnet18", "--input-shape", "1,3,64,64", "--repeats", "3",
                  "--warmup", "1", "--out", str(path), "--validate")
    assert result.exit_code == 0, result.output
    doc = json.loads(path.read_text())
    assert doc["kind"] == "edgesplit-profile" and doc["version"] == 1
    assert len(doc["layers"]) == 31 and doc["input_shapes"] == [[1, 3, 64, 64]]
    row = doc["layers"][0]
    assert row["eager_ms"]["repeats"] == 3 and row["eager_ms"]["p10"] <= row["eager_ms"]["p90"]
    assert row["onnx_ms"]["median"] > 0  # conv layers export to ONNX
    assert doc["whole_model"]["eager_ms"]["median"] > 0
    estimators = doc["validation"]["estimators"]
    assert {"profile-sum", "regression (this model's layers)", "roofline (this-machine)"} <= set(
        estimators)
    assert doc["validation"]["targets"][0]["target"] == "whole model"
    assert "estimator error" in result.stdout


def test_profile_batch_size_replaces_the_first_dimension():
    result = _run("profile", "alexnet", "--batch-size", "2", "--repeats", "1", "--warmup", "0",
                  "--no-onnx", "--idle-ms", "2", "--threads", "1", "--json")
    doc = json.loads(result.stdout)
    assert doc["input_shapes"] == [[2, 3, 224, 224]]
    assert doc["idle_ms"] == 2.0 and doc["machine"]["threads"] == 1
    assert all(r["onnx_ms"] is None for r in doc["layers"])


def test_plan_json_contract(tmp_path):
    out = tmp_path / "plan.json"
    result = _run("plan", "resnet18", "--edge", "jetson-nano", "--cloud", "v100-server",
                  "--link", "4g", "--json", "--out", str(out),
                  "--split-after", "resnet.encoder.stages.1.layers.1.add")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["version"] == 1
    assert {"name", "edge_ms", "cloud_ms", "param_bytes"} <= set(doc["layers"][0])
    assert {"producer", "consumers", "bytes"} <= set(doc["tensors"][0])
    assert doc["link"]["bandwidth_mbps"] == 10.0 and doc["link"]["rtt_ms"] == 50.0
    assert set(doc["methods"]) == {"neurosurgeon", "dads", "qdmp", "cloud_only", "edge_only",
                                   "qdmp_e", "qdmp_e_u4", "u8", "cloud16", "autosplit", "manual"}
    for entry in doc["methods"].values():
        assert {"feasible", "edge_layers", "sent_bytes", "edge_ms", "transfer_ms", "cloud_ms",
                "total_ms", "edge_memory_bytes", "plan"} <= set(entry)
        assert entry["total_ms"] == pytest.approx(entry["edge_ms"] + entry["transfer_ms"]
                                                  + entry["cloud_ms"] + entry["rtt_ms"]
                                                  + entry["serialize_ms"])
        assert entry["serialize_ms"] == pytest.approx(
            sum(t.get("serialize_ms", 0.0) for t in entry["plan"]["transfers"]))
    manual = doc["methods"]["manual"]
    assert manual["edge_layers"][-1] == "resnet.encoder.stages.1.layers.1.add"
    assert manual["sent_bytes"] == 128 * 28 * 28 * 4
    # re-check the manual plan by hand from the document's own numbers
    edge = set(manual["edge_layers"])
    by_layer = {l["name"]: l for l in doc["layers"]}
    assert manual["edge_ms"] == pytest.approx(sum(by_layer[n]["edge_ms"] for n in edge))
    assert manual["cloud_ms"] == pytest.approx(
        sum(l["cloud_ms"] for l in doc["layers"] if l["name"] not in edge))
    saved = json.loads(out.read_text())
    assert saved["method"] == doc["chosen"] == "manual"  # the split the user named is the plan
    assert doc["methods"][doc["best"]]["lossless"]  # no --eval-data: nothing unmeasured wins


def test_plan_chooses_a_lossless_plan_unless_accuracy_is_measured_or_accepted(tmp_path):
    """Without evaluation data a quantized plan (here AUTO-SPLIT's, faster than any float
    plan) must not silently become the plan: it is chosen only with --accept-unmeasured."""
    args = ["plan", "digits_cnn", "--link", "4g", "--method", "qdmp,cloud_only,u8,autosplit"]
    out = tmp_path / "plan.json"
    result = _run(*args, "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    fastest = min((m for m, e in doc["methods"].items() if e["feasible"]),
                  key=lambda m: doc["methods"][m]["total_ms"])
    assert not doc["methods"][fastest]["lossless"]  # the trap: a faster, unmeasured plan
    assert doc["chosen"] == doc["best"] == "qdmp"
    assert json.loads(out.read_text())["method"] == "qdmp"
    assert "note: chose qdmp" in result.stderr and fastest in result.stderr
    accepted = _run(*args, "--accept-unmeasured", "--json")
    assert json.loads(accepted.stdout)["chosen"] == fastest
    only_lossy = _run("plan", "digits_cnn", "--link", "4g", "--method", "u8,autosplit")
    assert only_lossy.exit_code == 2 and "--accept-unmeasured" in only_lossy.output


def test_plan_errors_name_the_problem(tmp_path):
    bad = tmp_path / "link.yaml"
    bad.write_text("name: x\nbandwidth_mbps: -1\n")
    for args, message in [
        (["plan", "resnet18", "--edge", "toaster"], "unknown device 'toaster'"),
        (["plan", "resnet18", "--link", str(bad)], "field 'bandwidth_mbps'"),
        (["plan", "resnet18", "--edge-memory", "1000"], "edge memory"),
        (["plan", "resnet18", "--privacy-layer", "nope"], "privacy constraint"),
        (["plan", "resnet18", "--method", "magic"], "unknown planning method 'magic'"),
        (["plan", "resnet18", "--edge-memory", "lots"], "is not a size"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "edgesplit.cli", *args],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr


def test_plan_over_a_topology_json_contract(tmp_path):
    drawing = tmp_path / "assign.png"
    result = _run("plan", "mobilenet_v2", "--topology", "jmsnas-chain", "--json", "--draw",
                  str(drawing))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["topology"]["devices"] == ["ue", "sbs", "mbs", "cloud"]
    assert [l["bandwidth_mbps"] for l in doc["topology"]["links"]] == [25, 50, 200]
    assert set(doc["layers"][0]["latency_ms"]) == {"ue", "sbs", "mbs", "cloud"}
    best = doc["methods"][doc["best"]]
    # re-check by hand: compute from the per-layer table, transfers from the tensors' bytes
    layer_ms = {l["name"]: l["latency_ms"] for l in doc["layers"]}
    compute = sum(layer_ms[n][d] for d, names in best["assignment"].items() for n in names)
    placed = {n: d for d, names in best["assignment"].items() for n in names}
    order = doc["topology"]["devices"]
    link_bytes = [0] * len(doc["topology"]["links"])
    for t in doc["tensors"]:
        src = 0 if t["producer"] == "input" else order.index(placed[t["producer"]])
        dst = max(len(order) - 1 if c == "output" else order.index(placed[c])
                  for c in t["consumers"])
        for hop in range(src, dst):  # a tensor travels every link between its devices
            link_bytes[hop] += t["bytes"]
    transfer = sum(b * 8 / (l["bandwidth_mbps"] * 1e3) + (l["rtt_ms"] / 2 if b else 0)
                   for b, l in zip(link_bytes, doc["topology"]["links"], strict=True))
    serialize = sum(t.get("serialize_ms", 0.0) for t in best["plan"]["transfers"])
    assert best["serialize_ms"] == pytest.approx(serialize)  # encode + decode of what crosses
    assert best["total_ms"] == pytest.approx(compute + transfer + serialize)
    assert best["total_ms"] <= doc["methods"]["sink_only"]["total_ms"]
    assert drawing.read_bytes()[:4] == b"\x89PNG"
    throughput = json.loads(_run("plan", "mobilenet_v2", "--topology", "jmsnas-chain", "--json",
                                 "--objective", "throughput").stdout)
    assert throughput["methods"]["multisplit"]["period_ms"] <= best["period_ms"] + 1e-9


def test_unsupported_topology_shapes_are_named():
    for args, message in [(["--topology", "hmd-star"], "not a supported mesh"),
                          (["--topology", "jmsnas-chain", "--sweep-link"],
                           "--sweep-link apply to the edge-cloud planner"),
                          (["--objective", "throughput"], "apply to --topology planning"),
                          (["--topology", "jmsnas-mesh", "--objective", "speed"],
                           "objective must be 'latency' or 'throughput'")]:
        proc = subprocess.run([sys.executable, "-m", "edgesplit.cli", "plan", "resnet18", *args],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_plan_measures_accuracy_on_an_eval_file_and_plots_the_front(tmp_path):
    import numpy as np

    from edgesplit.data import load_dataset

    digits = load_dataset("digits")
    data = tmp_path / "digits.npz"
    np.savez(data, inputs=digits.inputs[0][:150].numpy(), labels=digits.labels[:150].numpy())
    plot = tmp_path / "front.png"
    result = _run("plan", "digits_cnn", "--edge", "eyeriss", "--cloud", "tpu", "--link",
                  "autosplit-3mbps", "--method", "autosplit,u8,cloud16,qdmp",
                  "--eval-data", str(data), "--calibration-samples", "30",
                  "--max-acc-drop", "0.5", "--pareto-plot", str(plot), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    auto = doc["methods"]["autosplit"]
    assert auto["quality"]["samples"] == 120 and auto["quality"]["metric"] == "top1"
    assert auto["quality"]["drop"] <= 0.5
    assert doc["methods"]["u8"]["quality"]["samples"] == 120
    assert doc["methods"]["qdmp"]["quality"] is None  # float: nothing to measure
    alts = auto["plan"]["alternatives"]
    chosen = next(a for a in alts if a["chosen"])
    # measured fastest first up to the choice: none slower than it, the choice among them
    assert chosen["drop"] is not None and any(a["pareto"] for a in alts)
    assert all(a["drop"] is None for a in alts if a["total_ms"] > chosen["total_ms"])
    assert plot.stat().st_size > 10_000  # drawn on the distortion axis
    every = json.loads(_run("plan", "digits_cnn", "--edge", "eyeriss", "--cloud", "tpu",
                            "--link", "autosplit-3mbps", "--method", "autosplit",
                            "--eval-data", str(data), "--calibration-samples", "30",
                            "--max-acc-drop", "0.5", "--measure-all", "--pareto-plot",
                            str(plot), "--json").stdout)["methods"]["autosplit"]["plan"]
    assert all(a["drop"] is not None for a in every["alternatives"])
    assert next(a for a in every["alternatives"] if a["chosen"]) == chosen
    assert plot.stat().st_size > 10_000  # drawn on the drop axis


def test_plan_accuracy_options_explain_mistakes(tmp_path):
    for args, message in [
        (["--method", "autosplit", "--max-acc-drop", "1"], "--eval-data"),
        (["--method", "autosplit", "--eval-data", "digit"], "unknown data set 'digit'"),
        (["--method", "autosplit", "--eval-data", str(tmp_path / "x.npz")], "does not exist"),
        (["--method", "u8", "--pareto-plot", str(tmp_path / "p.png")], "include autosplit"),
        (["--method", "autosplit", "--measure-all"], "--measure-all measures accuracy"),
        (["--method", "u8", "--measure-all"], "applies to autosplit"),
        (["--input-bits", "12"], "input_bits"),
    ]:
        result = _run("plan", "resnet18", "--edge", "eyeriss", "--cloud", "tpu", *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output
