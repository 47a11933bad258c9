"""`edgesplit llm plan`: the JSON document, its plans through the Plan loader, --out, the
tables, and one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.plan import load_plan, recompute_total
from edgesplit.plan.model import Plan

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_plan_json_round_trips_through_the_plan_loader(tmp_path):
    out = tmp_path / "plan.json"
    result = _run("llm", "plan", "llama_tiny", "--topology", "jmsnas-chain", "--prompt-tokens",
                  "16", "--new-tokens", "8", "--max-context", "64", "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["version"] == 1 and doc["model"] == "llama_tiny" and doc["best"] == "dp"
    assert doc["workload"] == {"prompt_tokens": 16, "new_tokens": 8, "max_context": 64,
                               "sessions": 1, "decode_cached_tokens": 19}
    assert list(doc["methods"]) == ["dp", "single_device", "memory_proportional", "equal_split"]
    assert [b["name"] for b in doc["blocks"]][:2] == ["embed", "block.0"]
    for entry in doc["methods"].values():
        plan = Plan.model_validate(entry["plan"])
        assert plan.llm is not None
        assert recompute_total(plan) == pytest.approx(entry["request_ms"], rel=1e-9)
        assert entry["request_ms"] == pytest.approx(
            entry["ttft_ms"] + 7 * entry["tpot_ms"], rel=1e-9)
        assert sum(len(blocks) for blocks in entry["assignment"].values()) == 6
    saved = load_plan(out)
    assert saved == Plan.model_validate(doc["methods"]["dp"]["plan"])
    assert saved.llm is not None and saved.llm.max_context == 64


def test_plan_tables():
    result = _run("llm", "plan", "gpt2_tiny", "--topology", "home-wifi", "--objective",
                  "throughput", "-p", "8", "-n", "4")
    assert result.exit_code == 0, result.output
    for text in ("gpt2_tiny", "* dp", "memory_proportional", "equal_split", "single_device",
                 "phone", "laptop", "jetson", "TTFT", "tokens/s", "objective throughput"):
        assert text in result.stdout


def test_calibrate_measures_this_machine_first(monkeypatch):
    from edgesplit.llm.stage import calibration

    asked = []
    monkeypatch.setattr(calibration, "calibrate_this_machine",
                        lambda model, dtype, **kw: asked.append((model, dtype, kw)))
    result = _run("llm", "plan", "llama_tiny", "--topology", "home-wifi", "-p", "8", "-n", "4",
                  "--calibrate")
    assert result.exit_code == 0, result.output
    assert asked == [("llama_tiny", "float32", {"activations": "auto", "remeasure": True})]


@pytest.mark.parametrize(("args", "message"), [
    (("llama3_8b", "--topology", "home-wifi"), "no split into contiguous stages fits"),
    (("llama_tyni", "--topology", "home-wifi"), "Did you mean llama_tiny"),
    (("llama_tiny", "--topology", "jmsnas-mesh"), "not a chain"),
    (("llama_tiny", "--topology", "home-wifi", "--objective", "speed"), "--objective speed"),
    (("llama_tiny", "--topology", "home-wifi", "--dtype", "int4"), "--precision int4"),
])
def test_one_line_errors(args, message):
    result = _run("llm", "plan", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error:") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
