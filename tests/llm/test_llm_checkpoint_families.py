"""Real checkpoints of every Llama-layout family edgesplit runs besides Llama: a tiny model of
each (Mistral, Qwen3, Gemma, Phi-3, and a Phi-3 with partial rotary and LongRoPE), perturbed
random weights saved by transformers' ``save_pretrained(safe_serialization=True)`` and nothing
else, planned from the folder and split in two and three stages that each load their own
blocks from it (no ``model=``), against ``generate`` on the same folder loaded by
``AutoModelForCausalLM.from_pretrained``. Other families are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm, plan_llm_at
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.stage.compute import LLMStageModel
from edgesplit.llm.stage.server import head_stage
from edgesplit.models.causal_lm import causal_lm_config, create_causal_lm
from edgesplit.plan.model import Plan
from edgesplit.runtime.shell import ServingShell
from helpers import perturbed, server_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = 8
NEW = 10
SUPPORTED = "llama, mistral, qwen2, qwen3, gemma, phi3, gpt2"
# Phi-3 with half of each head rotated and LongRoPE (Phi-3-mini-128k's and Phi-4-mini's
# rotary), its short factors up to PROMPT + NEW positions: a split runs that far only
# (llm.model.description._phi3_positions)
PHI3_LONGROPE = {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                     "partial_rotary_factor": 0.5,
                                     "short_factor": [1.0, 1.5, 2.0, 2.5],
                                     "long_factor": [3.0, 5.0, 7.0, 9.0]},
                 "original_max_position_embeddings": PROMPT + NEW}
CHECKPOINTS = {"mistral": ("mistral_tiny", {}), "qwen3": ("qwen3_tiny", {}),
               "gemma": ("gemma_tiny", {}), "phi3": ("phi3_tiny", {}),
               "phi3-longrope": ("phi3_tiny", PHI3_LONGROPE)}


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def folder(request, tmp_path_factory) -> Path:
    """A safetensors folder of the tiny model, weights perturbed (seeded) so that greedy
    decoding does not repeat one token."""
    from transformers import AutoModelForCausalLM

    name, overrides = CHECKPOINTS[request.param]
    torch.manual_seed(0)
    model = perturbed(AutoModelForCausalLM.from_config(_config(name, overrides)).eval()
                      if overrides else create_causal_lm(name))
    out = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).eval()


def _plan(folder: Path, boundaries: tuple[int, ...], max_context: int = PROMPT + NEW) -> Plan:
    full = get_topology("home-wifi")
    m = len(boundaries) - 1
    topology = chain("test", full.devices[:m], [tl.link for tl in full.links[:m - 1]])
    return plan_llm_at(str(folder), topology, boundaries,
                       LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW, max_context=max_context),
                       method="test")


@pytest.mark.parametrize("boundaries", [(0, 3, 6), (0, 2, 4, 6)], ids=["2-stage", "3-stage"])
def test_stages_from_the_folder_give_the_tokens_of_generate(folder, reference, boundaries):
    prompt = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    out = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                             min_new_tokens=NEW, do_sample=False, eos_token_id=None)
    expected = out[0, PROMPT:].tolist()
    assert len(set(expected)) > 2  # the perturbed weights do not repeat one token

    plan = _plan(folder, boundaries)
    assert plan.llm is not None and plan.llm.fingerprint is not None
    assert plan.model.source == str(folder)
    servers: list[ServingShell] = []
    nxt = None
    try:
        for i in range(head_stage(plan.llm), 0, -1):  # no model=: each loads from the folder
            servers.insert(0, server_for(plan, plan.devices[i].name, next_address=nxt,
                                         data_port=None, shape=False))
            nxt = servers[0].loopback_channel()
        with LLMClient(plan, nxt, shape=False) as client:
            assert [t.token for t in client.generate(prompt[0].tolist(), NEW)] == expected
    finally:
        for server in servers:
            server.stop(0)


def test_a_stage_holds_only_its_blocks(folder):
    """Every tensor of a stage lies under its blocks' modules or a shared one, and its
    parameters are the plan's weight_bytes (a tied embedding in full on each end)."""
    plan = _plan(folder, (0, 2, 4, 6))
    llm = plan.llm
    assert llm is not None
    for i, planned in enumerate(llm.stages):
        blocks = llm.blocks[planned.start:planned.end]
        own = [p for b in blocks for p in b.modules] + list(llm.shared_modules)
        held = LLMStageModel(plan, i).tensors()
        assert held and all(any(key.startswith(f"{p}.") for p in own) for key in held), \
            sorted(held)
        params = sum(t.numel() * t.element_size() for t in held.values()
                     if isinstance(t, torch.nn.Parameter))
        assert params == planned.weight_bytes == sum(b.param_bytes for b in blocks)


def _config(name: str, overrides: dict):
    from transformers import AutoConfig

    fields = {**causal_lm_config(name).to_dict(), **overrides}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def test_longrope_plans_stop_where_its_long_factors_start():
    """Past original_max_position_embeddings, transformers' generate recomputes a Phi-3
    LongRoPE cache with the long factors; stages cannot, so a plan may not go there."""
    config = _config("phi3_tiny", PHI3_LONGROPE)
    assert config.max_position_embeddings == 512
    topology = get_topology("home-wifi")
    plan_llm(config, topology, LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW,
                                           max_context=PROMPT + NEW))
    with pytest.raises(ConfigError, match=f"exceeds the {PROMPT + NEW} positions") as info:
        plan_llm(config, topology, LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW,
                                               max_context=PROMPT + NEW + 1))
    assert "\n" not in str(info.value)


def test_other_families_are_refused_in_one_line(tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from edgesplit.llm.model.checkpoint import open_checkpoint

    for model_type in ("gpt_neox", "bert"):
        where = tmp_path / model_type
        where.mkdir()
        AutoConfig.for_model(model_type).save_pretrained(where)
        save_file({"x": torch.zeros(2)}, str(where / "model.safetensors"))
        with pytest.raises(ConfigError, match=f"'{model_type}' of .* is not supported; "
                                              f"supported: {SUPPORTED}") as info:
            open_checkpoint(where)
        assert "\n" not in str(info.value)
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["model_type"] == "bert"


def test_gguf_families_are_those_transformers_reads(tmp_path, monkeypatch):
    """A GGUF of Gemma (transformers reads gemma2/3/4 only) is refused before any conversion,
    naming the GGUF architectures edgesplit converts."""
    pytest.importorskip("gguf")
    from gguf import GGUFWriter

    from edgesplit.llm.model.checkpoint import open_checkpoint

    monkeypatch.setenv("EDGESPLIT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "gemma.gguf"
    writer = GGUFWriter(str(path), "gemma")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"GGUF architecture 'gemma' .* supported: llama, "
                                          r"mistral, qwen2, qwen3, phi3, gpt2") as info:
        open_checkpoint(path)
    assert "\n" not in str(info.value)
