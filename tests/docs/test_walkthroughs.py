"""The docs' walkthroughs reach their last step: `llm plan --method` writes a baseline's
plan (the DP keeps a tiny model on one device, so `llm serve --device jetson` had nothing to
serve), and `serve` says so in one line when the device it serves computes nothing."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.cli.serving import _warn_if_idle
from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, get_planner
from edgesplit.runtime import PlanProgram

runner = CliRunner()


def test_llm_plan_writes_the_method_asked_for(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["llm", "plan", "llama_tiny", "-t", "home-wifi", "-p", "8",
                                 "-n", "16", "--max-context", "64", "--method", "equal_split",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["method"] == "equal_split"
    assert all(s["end"] > s["start"] for s in plan["llm"]["stages"])  # every device serves
    bad = runner.invoke(app, ["llm", "plan", "llama_tiny", "-t", "home-wifi", "--method", "x"])
    assert bad.exit_code != 0 and "--method takes dp" in bad.output


def test_serving_a_device_with_nothing_to_compute_warns(capsys):
    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")))
    program = PlanProgram.load(get_planner("edge_only").plan(problem))
    _warn_if_idle(program, "cloud")
    assert "cloud computes nothing in this plan" in capsys.readouterr().err
    _warn_if_idle(program, "edge")
    assert capsys.readouterr().err == ""
