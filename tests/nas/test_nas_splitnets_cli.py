"""`edgesplit nas splitnets spaces|train|search` end to end on a tiny space and a slice of the
digits: JSON documents, the supernet and result folders, the plot, one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.data.training import load_labelled
from edgesplit.nas.splitnets import PhaseSpec, SplitSpace
from edgesplit.plan import load_plan
from helpers import rgb_folder

TINY = SplitSpace("tiny-split-cli", 1, 10, (8, 16), (4,),
                  (PhaseSpec((6, 8), (1, 3), (1,), (0, 1), (2, 3)),
                   PhaseSpec((10,), (3,), (1, 2), (1,), (2, 4))), (16,))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("splitnets-cli")
    space = folder / "tiny.json"
    space.write_text(json.dumps(TINY.to_dict()))
    digits = load_labelled("digits")
    data = folder / "digits.npz"
    np.savez(data, inputs=digits.train.inputs[0][:200].numpy(),
             labels=digits.train.labels[:200].numpy())
    supernet = folder / "supernet"
    result = CliRunner().invoke(app, [
        "nas", "splitnets", "train", "--space", str(space), "--data", str(data), "--epochs", "1",
        "--batch-size", "50", "--out", str(supernet), "--json"])
    assert result.exit_code == 0, result.output
    return folder, supernet, json.loads(result.stdout)


def test_train_writes_the_supernet_and_reports_the_bounds(trained):
    _, supernet, doc = trained
    assert doc["version"] == 1 and doc["space"] == "tiny-split-cli"
    assert doc["sampler"] == "five" and doc["init"] == "split-aware"
    assert set(doc["test_accuracy"]) == {"max-zero-hot", "max-all-hot", "min-zero-hot",
                                         "min-all-hot"}
    assert len(doc["history"]) == 1 and "loss/random-one-hot" in doc["history"][0]
    assert (supernet / "supernet.json").is_file() and (supernet / "supernet.safetensors").is_file()


def test_search_writes_networks_with_runnable_plans_and_a_plot(trained):
    folder, supernet, _ = trained
    out, plot = folder / "search", folder / "front.png"
    result = CliRunner().invoke(app, [
        "nas", "splitnets", "search", str(supernet), "--topology", "hmd-star",
        "--sensor-memory", "64KiB", "--population", "4", "--generations", "1",
        "--save-front", "1", "--out", str(out), "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["memory_limit_bytes"] == 64 * 1024 and doc["evaluated"] >= 4
    assert all(row["sensor_memory_bytes"] <= 64 * 1024 for row in doc["front"])
    assert set(doc["results"]) == {"best", "front-0"}
    assert plot.read_bytes().startswith(b"\x89PNG")
    summary = json.loads((out / "best" / "splitnet.json").read_text())
    assert summary["sensor_memory"]["fits"]
    plan = load_plan(out / "best" / "plan.json")
    assert plan.runnable and plan.method == "splitnets"
    # appendix H: the same supernet searched again for 4x faster sensors, no retraining
    faster = CliRunner().invoke(app, [
        "nas", "splitnets", "search", str(supernet), "--sensor-speedup", "4",
        "--population", "4", "--generations", "0", "--json"])
    assert faster.exit_code == 0, faster.output
    assert "x4" in json.loads(faster.stdout)["topology"]


def test_tables_print(trained):
    _folder, supernet, _ = trained
    result = CliRunner().invoke(app, ["nas", "splitnets", "search", str(supernet),
                                      "--population", "3", "--generations", "0"])
    assert result.exit_code == 0, result.output
    assert "T_comm ms" in result.stdout
    listed = CliRunner().invoke(app, ["nas", "splitnets", "spaces"])
    assert "digits-split" in listed.stdout and "shapes-split" in listed.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--out", "{tmp}/x", "--sampler", "bignas"], "must be one of five, sandwich"),
    (["train", "--out", "{tmp}/x", "--space", "nope"], "Known SplitNets spaces"),
    (["search", "{tmp}/missing"], "no trained supernet"),
    (["search", "{supernet}", "--topology", "jmsnas-chain"], "not a star"),
    (["search", "{supernet}", "--sensor-memory", "1KiB", "--population", "3"],
     "closest"),
])
def test_refusals_are_one_line(trained, args, message):
    folder, supernet, _ = trained
    args = [a.format(tmp=folder, supernet=supernet) for a in args]
    result = CliRunner().invoke(app, ["nas", "splitnets", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_users_rgb_folder_of_3_classes_trains_a_3_class_rgb_supernet(trained, tmp_path):
    """The data as it is: SplitNets refused an RGB 3-class folder and worked only after a
    hand-edited space; the space's network is now built for the data (issue 37)."""
    folder = trained[0]
    images = rgb_folder(tmp_path / "rgb", size=20)
    out = tmp_path / "supernet"
    result = CliRunner().invoke(app, [
        "nas", "splitnets", "train", "--space", str(folder / "tiny.json"), "--data",
        str(images), "--epochs", "1", "--batch-size", "8", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert "3 channel(s) (was 1), 3 classes (was 10)" in " ".join(result.stderr.split())
    saved = json.loads((out / "supernet.json").read_text())["space"]
    assert (saved["in_channels"], saved["num_classes"]) == (3, 3)


def test_search_with_the_paper_convention_prices_8_bit(trained):
    """--paper-convention: the search priced at 8 bits, so each network's sensor memory is a
    quarter of what the default float32 convention prices it at."""
    from edgesplit.hardware import get_topology
    from edgesplit.nas.splitnets import SplitArch, SplitHardware

    _, supernet, _ = trained
    result = CliRunner().invoke(app, [
        "nas", "splitnets", "search", str(supernet), "--population", "4",
        "--generations", "0", "--paper-convention", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["pricing"] == "paper" and "paper pricing" in doc["hardware"]
    float32 = SplitHardware.from_topology(get_topology("hmd-star"), 1)
    assert doc["front"]
    for row in doc["front"]:
        cost = float32.cost(TINY, SplitArch.from_dict(row["arch"]))
        assert 4 * row["sensor_memory_bytes"] == cost.sensor_memory_bytes
