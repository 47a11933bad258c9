"""`edgesplit llm serve` and `edgesplit llm generate`: a two-stage plan served by a real server
process and driven by a real client process (--json, then streamed tokens and the table), and
the commands' one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.models.causal_lm import create_causal_lm

runner = CliRunner()
START_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """llama_tiny split after block.1 over home-wifi's phone and laptop."""
    full = get_topology("home-wifi")
    topology = chain("two", full.devices[:2], [full.links[0].link])
    plan = plan_llm_at("llama_tiny", topology, (0, 3, 6),
                       LLMWorkload(prompt_tokens=6, new_tokens=8, max_context=24))
    path = tmp_path_factory.mktemp("llm") / "plan.json"
    plan.save(path)
    return path


def _edgesplit(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgesplit.cli", *args]


def test_serve_and_generate_end_to_end(plan_file):
    server = subprocess.Popen(_edgesplit("llm", "serve", str(plan_file), "--device", "laptop",
                                         "--port", "0", "--threads", "1"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # the server's `listening on` line
        assert line.startswith("listening on "), server.stderr.read()[-2000:]
        fields = line.split()
        assert fields[3] == "device=laptop" and fields[6] == "sessions=1"
        address = fields[2]
        prompt = [5, 0, 17, 42, 99, 3]
        done = subprocess.run(_edgesplit("llm", "generate", str(plan_file), "--server", address,
                                         "--prompt-ids", ",".join(map(str, prompt)), "-n", "8",
                                         "--json", "--threads", "1"),
                              capture_output=True, text=True, timeout=START_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        model = create_causal_lm("llama_tiny")
        ids = torch.tensor([prompt])
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                  min_new_tokens=8, do_sample=False, pad_token_id=0)
        assert doc["tokens"] == expected[0, 6:].tolist()
        assert doc["prompt"] == prompt and doc["new_tokens"] == 8
        assert doc["data_plane"].startswith("tcp ")
        assert [s["device"] for s in doc["stages"]] == ["phone", "laptop"]
        assert doc["ttft_ms"] > 0 and doc["tokens_per_s"] > 0
        for stage in doc["stages"]:
            assert stage["prefill_ms"] > 0 and stage["decode_ms"] > 0
            assert stage["predicted_prefill_ms"] > 0 and stage["predicted_decode_ms"] > 0
        # streamed tokens, then the table: the same tokens for the same prompt
        done = subprocess.run(_edgesplit("llm", "generate", str(plan_file), "--server", address,
                                         "--prompt-ids", ",".join(map(str, prompt)), "-n", "8"),
                              capture_output=True, text=True, timeout=START_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        assert first.split() == [str(t) for t in doc["tokens"]]
        for text in ("TTFT", "tokens/s", "plan prefill ms", "laptop"):
            assert text in done.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize(("args", "message"), [
    (("serve", "{plan}", "--device", "phone"), "first of the chain"),
    (("serve", "{plan}", "--device", "toaster"), "not in the plan"),
    (("generate", "{plan}", "--server", "127.0.0.1:1", "-p", "20", "-n", "8"),
     "more than the plan's max context of 24: ask for fewer tokens or plan with a larger "
     "--max-context"),
    (("generate", "{plan}", "-n", "2"), "--server HOST:PORT"),
    (("generate", "{plan}", "--server", "127.0.0.1:1", "--prompt-ids", "1,x"),
     "--prompt-ids takes comma-separated token ids"),
    (("generate", "{plan}", "--server", "127.0.0.1:1", "--prompt-ids", "1,300"),
     "prompt token ids must lie in [0, 256)"),
])
def test_one_line_errors(plan_file, args, message):
    result = runner.invoke(app, ["llm", *(a.format(plan=plan_file) for a in args)])
    assert result.exit_code != 0
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_layer_plan_is_refused(tmp_path):
    from edgesplit.hardware import get_device, get_link
    from edgesplit.plan import EdgeCloudSetting, PlanningProblem
    from edgesplit.plan.planners import Manual

    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")))
    plan = Manual(["down1.0"]).plan(problem)
    path = tmp_path / "layers.json"
    plan.save(path)
    result = runner.invoke(app, ["llm", "generate", str(path), "-n", "2"])
    assert result.exit_code != 0
    assert "no causal LM stages" in result.output and "edgesplit serve" in result.output
