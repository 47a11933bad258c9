"""`edgesplit nas jmsnas` end to end on a tiny space and a slice of the digits: JSON document,
result folder, Fig. 5, and one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.data.training import load_labelled
from edgesplit.nas.jmsnas import HeadSpec, SearchSpace, StemSpec
from edgesplit.plan import load_plan
from edgesplit.runtime.program import PlanProgram
from helpers import rgb_folder

TINY = SearchSpace.from_stages("tiny-jmsnas", (1, 32, 32), 10, stem=StemSpec(8, stride=2),
                               stages=[(8, 1, 2), (16, 1, 2)], head=HeadSpec(0))
# with a layer that keeps its shape, which a mesh can copy onto its branch devices
TINY_MESH = SearchSpace.from_stages("tiny-mesh", (1, 32, 32), 10, stem=StemSpec(8, stride=2),
                                    stages=[(8, 1, 2), (8, 1, 1), (16, 1, 2)], head=HeadSpec(0))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jmsnas-cli")
    space = folder / "tiny.json"
    space.write_text(json.dumps(TINY.to_dict()))
    (folder / "tiny-mesh.json").write_text(json.dumps(TINY_MESH.to_dict()))
    digits = load_labelled("digits")
    data = folder / "digits.npz"
    np.savez(data, inputs=digits.train.inputs[0][:240].numpy(),
             labels=digits.train.labels[:240].numpy())
    return folder, space, data


def test_jmsnas_json_folder_and_plot(inputs):
    folder, space, data = inputs
    out, plot = folder / "result", folder / "fig5.png"
    result = CliRunner().invoke(app, [
        "nas", "jmsnas", "--topology", "jmsnas-chain", "--latency-budget-ms", "50",
        "--space", str(space), "--data", str(data), "--warmup-epochs", "1", "--epochs", "1",
        "--retrain-epochs", "1", "--batch-size", "32", "--out", str(out), "--plot", str(plot),
        "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["version"] == 1 and doc["space"] == "tiny-jmsnas"
    assert [h["phase"] for h in doc["history"]] == ["warm-up", "search"]
    assert doc["arch_ms"] <= 50 and 0 <= doc["accuracy"] <= 100
    assert set(doc["tables"]) == {"ue", "sbs", "mbs", "cloud"}
    assert plot.read_bytes().startswith(b"\x89PNG")
    plan = load_plan(out / "plan.json")
    assert plan.runnable and doc["plan"]["method"] == plan.method
    PlanProgram.load(plan)  # the runtime takes it as it takes any plan


def test_jmsnas_on_a_mesh_copies_a_section_onto_the_branch_devices(inputs):
    folder, _, data = inputs
    out = folder / "mesh-result"
    result = CliRunner().invoke(app, [
        "nas", "jmsnas", "--topology", "jmsnas-mesh", "--latency-budget-ms", "50",
        "--space", str(folder / "tiny-mesh.json"), "--data", str(data), "--warmup-epochs", "1",
        "--epochs", "1", "--retrain-epochs", "1", "--batch-size", "32", "--out", str(out),
        "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["layout"] == {"fork": 1, "join": 2, "branches": 3}
    assert len(doc["arch"]["ops"]) == 5  # layer 0, three copies of layer 1, layer 2
    assert set(doc["placement"]) >= {"mbs1", "mbs2", "mbs3", "cloud"}
    runs = doc.get("runnable_plan", doc["plan"])
    PlanProgram.load(load_plan(out / runs["file"]))


@pytest.mark.parametrize("args, message", [
    (["--topology", "hmd-star", "--latency-budget-ms", "5"], "not a supported mesh"),
    (["--topology", "jmsnas-mesh", "--latency-budget-ms", "5", "--placement", "1,1"],
     "does not apply to the mesh"),
    (["--topology", "jmsnas-mesh", "--latency-budget-ms", "5"], "no layers that keep"),
    (["--topology", "jmsnas-chain", "--latency-budget-ms", "5", "--table", "ue"],
     "write DEVICE=FILE"),
    (["--topology", "jmsnas-chain", "--latency-budget-ms", "5", "--table", "phone=x.json"],
     "does not have"),
    (["--topology", "jmsnas-chain", "--latency-budget-ms", "0.001"], "raise the budget"),
])
def test_jmsnas_user_errors_are_one_line(inputs, args, message):
    _, space, data = inputs
    proc = subprocess.run([sys.executable, "-m", "edgesplit.cli", "nas", "jmsnas", *args,
                           "--space", str(space), "--data", str(data)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    # one error line; on a slow machine progress lines for the log may precede it
    lines = [line for line in proc.stderr.splitlines()
             if line.strip() and not line.startswith("JMSNAS ")]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr


def test_a_users_rgb_folder_of_3_classes_gets_a_3_class_rgb_network(inputs, tmp_path):
    """The data as it is: an RGB folder is not turned gray nor its 3 classes padded to the
    space's 10; the space's network is built for it, and stderr says so (issue 37)."""
    _, space, _ = inputs
    images = rgb_folder(tmp_path / "rgb", size=12)
    out = tmp_path / "result"
    result = CliRunner().invoke(app, [
        "nas", "jmsnas", "--topology", "jmsnas-chain", "--latency-budget-ms", "50",
        "--space", str(space), "--data", str(images), "--warmup-epochs", "0", "--epochs", "1",
        "--retrain-epochs", "1", "--batch-size", "8", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert "3x32x32 input (was 1x32x32), 3 classes (was 10)" in " ".join(result.stderr.split())
    arch = json.loads((out / "arch.json").read_text()) if (out / "arch.json").exists() else \
        json.loads(next(out.rglob("arch.json")).read_text())
    assert arch["space"]["input_shape"] == [3, 32, 32] and arch["space"]["num_classes"] == 3
