"""The causal-LM block description (llm/model/description.py) held to real transformers models:
parameter bytes per block against the modules, KV-cache bytes against a DynamicCache after a
forward pass, MACs per block and phase against torch's FLOP counter."""

from __future__ import annotations

import json

import pytest
import torch

from edgesplit.errors import ConfigError, UnknownNameError
from edgesplit.llm import Phase, describe_causal_lm
from edgesplit.llm.model.description import TOKEN_BYTES
from edgesplit.llm.model.measure import (
    measured_block_flops,
    measured_kv_bytes,
    measured_param_bytes,
)
from edgesplit.models import create_model, list_models
from edgesplit.models.causal_lm import causal_lm_config, create_causal_lm, list_causal_lms

TINY = ["llama_tiny", "qwen2_tiny", "gpt2_tiny", "mistral_tiny", "qwen3_tiny", "gemma_tiny",
        "phi3_tiny"]
SUPPORTED = "llama, mistral, qwen2, qwen3, gemma, phi3, gpt2"


@pytest.fixture(scope="module", params=TINY)
def tiny(request):
    """(description, eager-attention model, prompt ids, cache after the prompt)."""
    name = request.param
    lm = describe_causal_lm(name)
    model = create_causal_lm(name, _attn_implementation="eager")
    ids = torch.randint(0, 200, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, use_cache=True)
    return lm, model, ids, out.past_key_values


def test_blocks_are_embed_decoders_head():
    lm = describe_causal_lm("llama_tiny")
    assert [b.name for b in lm.blocks] == ["embed", "block.0", "block.1", "block.2", "block.3",
                                           "head"]
    assert lm.blocks[1].modules == ("model.layers.0",)
    assert lm.shared_modules == ("model.rotary_emb",)
    gpt2 = describe_causal_lm("gpt2_tiny")
    assert gpt2.blocks[0].modules[:2] == ("transformer.wte", "transformer.wpe")
    assert gpt2.blocks[-1].modules == ("transformer.ln_f", "lm_head")


def test_param_bytes_match_the_module(tiny):
    lm, model, _, _ = tiny
    measured = measured_param_bytes(model, lm)
    assert measured == {b.name: b.param_bytes for b in lm.blocks}
    # the whole model on one stage holds each tensor once, tied or not
    unique = sum(p.numel() * p.element_size() for p in model.parameters())
    assert lm.stage_param_bytes(0, lm.n) == unique


def test_tied_embedding_counts_once_per_stage():
    lm = describe_causal_lm("gpt2_tiny")  # GPT-2 ties lm_head to wte
    assert lm.tied_bytes == 256 * 64 * 4
    apart = lm.stage_param_bytes(0, 1) + lm.stage_param_bytes(1, lm.n)
    assert apart == lm.stage_param_bytes(0, lm.n) + lm.tied_bytes


def test_kv_cache_bytes_match_dynamic_cache(tiny):
    lm, _, ids, cache = tiny
    tokens = ids.shape[1]
    decoders = [b for b in lm.blocks if b.kind == "decoder"]
    assert measured_kv_bytes(cache) == [b.kv_bytes_per_token * tokens for b in decoders]
    s = lm.shape
    assert decoders[0].kv_bytes_per_token == 2 * s.num_kv_heads * s.head_dim * 4


def test_gqa_is_in_the_kv_accounting():
    llama = describe_causal_lm("llama_tiny")
    assert (llama.shape.num_heads, llama.shape.num_kv_heads) == (4, 2)
    assert llama.kv_bytes_per_token() == 4 * 2 * 2 * 16 * 4  # blocks x K,V x heads x dim x fp32
    half = describe_causal_lm("llama_tiny", dtype="float16")
    assert half.kv_bytes_per_token() * 2 == llama.kv_bytes_per_token()


def test_prefill_macs_match_flop_counter(tiny):
    lm, model, ids, _ = tiny
    counted = measured_block_flops(model, lm,
                                   lambda: model(ids, use_cache=False, logits_to_keep=1))
    phase = Phase.prefill(ids.shape[1])
    assert counted == {b.name: 2 * lm.macs(b.index, phase) for b in lm.blocks}


def test_decode_macs_match_flop_counter_and_grow_with_context(tiny):
    lm, model, ids, cache = tiny
    import copy

    step = copy.deepcopy(cache)  # the fixture's cache stays at the prompt
    counted = measured_block_flops(
        model, lm, lambda: model(ids[:, -1:], cache=step, use_cache=True))
    phase = Phase.decode(ids.shape[1])
    assert counted == {b.name: 2 * lm.macs(b.index, phase) for b in lm.blocks}
    assert lm.macs(1, Phase.decode(100)) > lm.macs(1, Phase.decode(10))


def test_boundary_bytes_are_hidden_states_only():
    lm = describe_causal_lm("llama_tiny")
    p, d = Phase.prefill(9), Phase.decode(30)
    assert lm.boundary_bytes(0, p) == 9 * TOKEN_BYTES
    assert lm.boundary_bytes(3, p) == 9 * 64 * 4
    assert lm.boundary_bytes(3, d) == 64 * 4  # the cache length never travels
    assert lm.boundary_bytes(lm.n, d) == 0
    assert lm.boundary_tensor(2) == "block.0.out"


def test_registered_lms_are_builtin_models():
    assert {"llama_tiny", "qwen2_tiny", "gpt2_tiny", "llama_small", "qwen2_small"} <= set(
        list_models())
    assert {"llama_1b", "llama3_8b", "gpt2_small"} <= set(list_causal_lms())
    assert "llama3_8b" not in list_models()  # a shape to plan, never built by the zoo
    built = create_model("llama_tiny")
    direct = create_causal_lm("llama_tiny")
    assert torch.equal(built.module.model.lm_head.weight, direct.lm_head.weight)  # seed 0
    assert built.module(*built.example_inputs).shape == (1, 32, 256)


def test_large_shapes_describe_without_weights():
    lm = describe_causal_lm("llama3_8b", dtype="bfloat16")
    assert lm.stage_param_bytes(0, lm.n) == pytest.approx(8.03e9 * 2, rel=0.01)
    assert lm.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2  # 128 KiB per token


def test_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(causal_lm_config("qwen2_tiny").to_dict()))
    assert describe_causal_lm(tmp_path).blocks == describe_causal_lm("qwen2_tiny").blocks
    assert describe_causal_lm(str(path)).source == str(path)


def test_clear_errors(tmp_path):
    with pytest.raises(UnknownNameError, match="llama_tiny"):
        describe_causal_lm("llama_tyni")
    with pytest.raises(ConfigError, match="dtype"):
        describe_causal_lm("llama_tiny", dtype="int3")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ConfigError, match=f"'bert'.*not supported; supported: {SUPPORTED}"):
        describe_causal_lm(tmp_path)


@pytest.mark.parametrize("name", ["gpt_neox", "gemma2", "phi"])
def test_other_families_are_refused_in_one_line_naming_the_supported(name):
    from transformers import AutoConfig

    with pytest.raises(ConfigError, match=f"{name!r} is not supported; supported: "
                                          f"{SUPPORTED}") as info:
        describe_causal_lm(AutoConfig.for_model(name))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "fields", "window"), [
    ("mistral_tiny", {"sliding_window": 64}, 64),
    ("phi3_tiny", {"sliding_window": 64}, 64),
    # Qwen: the layers from max_window_layers on slide, only with use_sliding_window
    ("qwen3_tiny", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2,
                    "layer_types": None}, 64),
    ("qwen3_tiny", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 4,
                    "layer_types": None}, None),
    ("qwen2_tiny", {"use_sliding_window": False, "sliding_window": 64, "layer_types": None},
     None),
    ("llama_tiny", {"sliding_window": 64}, None),  # Llama never reads it
])
def test_sliding_windows_are_recorded_as_the_model_reads_them(name, fields, window):
    """A window is planned as full attention (only contexts it leaves full attention are:
    tests/llm/test_llm_sliding_window.py), so the blocks are those without it."""
    from transformers import AutoConfig

    fields = {**causal_lm_config(name).to_dict(), **fields}
    lm = describe_causal_lm(AutoConfig.for_model(fields.pop("model_type"), **fields))
    assert lm.shape.window == window
    assert lm.shape.window_context == (None if window is None else window - 1)
    assert lm.blocks == describe_causal_lm(name).blocks


def test_family_differences_are_in_the_blocks():
    """Qwen3's q/k norms (head_dim each), Phi-3's fused projections, Gemma's tied and scaled
    embedding: the same MACs as Llama's layout where the shapes are the same."""
    def names(lm):
        return [op.name for op in lm.ops(1, Phase.decode(4))]

    qwen3, phi3, gemma = (describe_causal_lm(n) for n in ("qwen3_tiny", "phi3_tiny",
                                                             "gemma_tiny"))
    llama, mistral = describe_causal_lm("llama_tiny"), describe_causal_lm("mistral_tiny")
    assert {"block.0.self_attn.q_norm", "block.0.self_attn.k_norm"} <= set(names(qwen3))
    assert qwen3.shape.head_dim == 32 and qwen3.shape.num_heads * 32 != qwen3.shape.hidden_size
    assert {"block.0.self_attn.qkv_proj", "block.0.mlp.gate_up_proj"} <= set(names(phi3))
    assert not {"block.0.self_attn.q_proj", "block.0.mlp.gate_proj"} & set(names(phi3))
    assert phi3.blocks == llama.blocks and mistral.blocks == llama.blocks
    for phase in (Phase.prefill(9), Phase.decode(30)):
        assert [phi3.macs(i, phase) for i in range(6)] == [llama.macs(i, phase)
                                                          for i in range(6)]
    assert gemma.shape.tied_embeddings and "embed.scale" in [
        op.name for op in gemma.ops(0, Phase.prefill(3))]


@pytest.mark.parametrize("name", ["llama_tiny", "gpt2_tiny"])
def test_prefill_macs_match_the_captured_layer_graph(name):
    # the repo's own counter (graph/ops.py on the torch.export capture, attention as SDPA)
    from edgesplit.graph import capture

    prompt = 9
    graph = capture(name, input_shape=(1, prompt))
    lm = describe_causal_lm(name)
    captured = dict.fromkeys((b.name for b in lm.blocks), 0)
    for layer in graph.layers:
        for block in lm.blocks:
            if any(layer.module_path == m or layer.module_path.startswith(m + ".")
                   for m in block.modules):
                captured[block.name] += layer.macs
                break
    phase = Phase.prefill(prompt)
    expected = {b.name: lm.macs(b.index, phase) for b in lm.blocks}
    # the captured model computes logits at every position; a stage plan, at the last only
    assert captured["head"] == prompt * expected.pop("head")
    assert {k: v for k, v in captured.items() if k != "head"} == expected
