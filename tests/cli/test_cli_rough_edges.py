"""Issue 55, item 4: rough edges a new user hit. A YAML file with a syntax error is named with
its line and column, a stage that cannot be reached (or refuses the token) is one line of
stderr, and `llm generate --json` carries the text with the token ids. (Plans that run from
another folder: tests/plan/test_plan_paths.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.hardware import chain, get_topology
from edgesplit.hardware.files import load_device, load_link, load_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.models.causal_lm import causal_lm_config
from helpers import free_port, listening

runner = CliRunner()
CORPUS = ["the cat sat on the mat", "a dog ran in the park", "split the model over devices"]
PROCESS_TIMEOUT_S = 120


def _edgesplit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgesplit.cli", *args], capture_output=True,
                          text=True, timeout=PROCESS_TIMEOUT_S)


def _dead_address() -> str:
    """An address where nothing listens (a free port)."""
    return f"127.0.0.1:{free_port()}"


# ---- b. YAML syntax errors name the line and column --------------------------------------------
@pytest.mark.parametrize("load", [load_device, load_link, load_topology])
def test_a_yaml_syntax_error_names_line_and_column(tmp_path, load):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkind: cpu\n  compute: {peak_gops: 1\n")
    with pytest.raises(ConfigError) as info:
        load(bad)
    message = str(info.value)
    assert "line 3, column 10" in message and "bad.yaml" in message and "\n" not in message


def test_a_yaml_error_with_a_context_names_where_that_began(tmp_path):
    bad = tmp_path / "topo.yaml"
    bad.write_text('name: "unterminated\ndevices: []\n')
    with pytest.raises(ConfigError, match=r"line 3, column 1: found unexpected end of stream "
                                          r"\(while scanning a quoted scalar from line 1, "
                                          r"column 7\)"):
        load_topology(bad)


def test_the_cli_prints_the_yaml_error_in_one_line(tmp_path):
    bad = tmp_path / "topo.yaml"
    bad.write_text("name: t\ndevices: [a, b\nlinks: []\n")
    result = runner.invoke(app, ["plan", "digits_cnn", "--topology", str(bad)])
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot parse") and "line 3, column" in result.output
    assert result.output.strip().count("\n") == 0, result.output


# ---- a small real checkpoint with a tokenizer --------------------------------------------------
@pytest.fixture(scope="module")
def talking(tmp_path_factory) -> Path:
    """A two-stage plan (phone, laptop) of a tiny Llama with a byte-level BPE tokenizer of its
    own, saved as a checkpoint folder: text in and out in seconds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("talking")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fields = {**causal_lm_config("llama_tiny").to_dict(), "vocab_size": len(tokenizer),
              "bos_token_id": 0, "eos_token_id": 1}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "ckpt",
                                                             safe_serialization=True)
    tokenizer.save_pretrained(root / "ckpt")
    full = get_topology("home-wifi")
    plan_llm_at(str(root / "ckpt"), chain("two", full.devices[:2], [full.links[0].link]),
                (0, 3, 6), LLMWorkload(prompt_tokens=4, new_tokens=4, max_context=32)
                ).save(root / "plan.json")
    return root / "plan.json"


@pytest.fixture(scope="module")
def laptop(talking):
    """The plan's second stage served in this process, with a token."""
    from edgesplit.plan import load_plan

    with listening(load_plan(talking), "laptop", token="sesame", data_port=None) as (_, address):
        yield address


# ---- c. an unreachable stage, a wrong token: one line ------------------------------------------
def test_text_generation_against_an_unreachable_stage_prints_one_line(talking):
    """The failed step, then the session's end failing for the same reason: only the first."""
    done = _edgesplit("llm", "generate", str(talking), "--server", _dead_address(),
                      "--prompt", "the cat", "-n", "2", "--threads", "1")
    assert done.returncode == 2
    assert done.stderr.startswith("error: server ") and "unavailable" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_run_against_an_unreachable_server_prints_one_line(digits_chain, tmp_path):
    digits_chain.plan.save(tmp_path / "plan.json")
    done = _edgesplit("run", str(tmp_path / "plan.json"), "--server", _dead_address(), "-n",
                      "2", "-c", "2")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    # the concurrent clients' error names the CLI's option, not the Python keyword
    assert "--retries" in done.stderr


def test_a_wrong_token_prints_one_line(talking, laptop):
    done = _edgesplit("llm", "generate", str(talking), "--server", laptop, "--prompt-ids",
                      "5,6,7", "-n", "2", "--token", "wrong", "--threads", "1")
    assert done.returncode == 2
    assert "UNAUTHENTICATED" in done.stderr and done.stderr.count("\n") == 1, done.stderr


# ---- d. llm generate --json carries the text ---------------------------------------------------
def test_generate_json_has_the_text_and_the_prompt_text(talking, laptop):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(talking.parent / "ckpt")
    result = runner.invoke(app, ["llm", "generate", str(talking), "--server", laptop,
                                 "--token", "sesame", "--prompt", "the cat", "-n", "4",
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["prompt_text"] == "the cat" == tokenizer.decode(doc["prompt"])
    # the text as printed: an end-of-sequence token ends it and is not part of it
    assert doc["text"] == tokenizer.decode(doc["tokens"], skip_special_tokens=True)
    ids = runner.invoke(app, ["llm", "generate", str(talking), "--server", laptop, "--token",
                              "sesame", "--prompt-ids", ",".join(map(str, doc["prompt"])),
                              "-n", "4", "--json"])
    assert ids.exit_code == 0, ids.output
    again = json.loads(ids.stdout)
    assert again["tokens"][:len(doc["tokens"])] == doc["tokens"]
    assert again["prompt_text"] == "the cat"
    assert again["text"] == tokenizer.decode(again["tokens"])


def test_generate_json_of_random_weights_has_no_text(tmp_path):
    """A plan of a model by name has no tokenizer: its text fields are null."""
    full = get_topology("home-wifi")
    plan_llm_at("llama_tiny", chain("one", full.devices[:1], []), (0, 6),
                LLMWorkload(prompt_tokens=4, new_tokens=2, max_context=16)
                ).save(tmp_path / "plan.json")
    result = runner.invoke(app, ["llm", "generate", str(tmp_path / "plan.json"),
                                 "--prompt-ids", "5,6,7", "-n", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["text"] is None and doc["prompt_text"] is None and len(doc["tokens"]) == 2
