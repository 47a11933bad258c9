"""The causal LMs edgesplit knows by name: tiny configs for tests, small ones to run, and the
shapes of published models to plan (``builtin=False``: never built by the zoo).

Configs are built in code, never fetched; weights are random.
"""

from __future__ import annotations

from typing import Any

from edgesplit.models.causal_lm import register_causal_lm

__all__: list[str] = []


def _llama(**fields: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**fields)


def _qwen2(**fields: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**fields)


def _gpt2(**fields: Any) -> Any:
    from transformers import GPT2Config

    return GPT2Config(**fields)


def _config(model_type: str, **fields: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **fields)


# Tiny: 4 decoder blocks, so tests can split them 2 and 3 ways; GQA (2 KV heads for 4 query
# heads) in all but GPT-2, as in their published models.
_TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
register_causal_lm(
    "llama_tiny",
    lambda: _llama(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
    description="tiny Llama (4 blocks, hidden 64, GQA 4/2 heads), transformers "
                "LlamaForCausalLM")
register_causal_lm(
    "qwen2_tiny",
    lambda: _qwen2(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
    description="tiny Qwen2 (4 blocks, hidden 64, GQA 4/2 heads, q/k/v bias), transformers "
                "Qwen2ForCausalLM")
register_causal_lm(
    "mistral_tiny",
    # no sliding window, as Mistral-7B-v0.2 and later (tests/llm/test_llm_sliding_window.py
    # sets one)
    lambda: _config("mistral", **_TINY, sliding_window=None),
    description="tiny Mistral (4 blocks, hidden 64, GQA 4/2 heads, no sliding window), "
                "transformers MistralForCausalLM")
register_causal_lm(
    "qwen3_tiny",
    # head_dim set apart from hidden / heads, as in Qwen3's published models (1024 / 16 != 128)
    lambda: _config("qwen3", **_TINY, head_dim=32),
    description="tiny Qwen3 (4 blocks, hidden 64, GQA 4/2 heads of 32, q/k norms), "
                "transformers Qwen3ForCausalLM")
register_causal_lm(
    "gemma_tiny",
    lambda: _config("gemma", **_TINY, head_dim=32),
    description="tiny Gemma (4 blocks, hidden 64, GQA 4/2 heads of 32, scaled tied "
                "embedding, GeGLU), transformers GemmaForCausalLM")
register_causal_lm(
    "phi3_tiny",
    # token ids within the tiny vocabulary (Phi-3's 32000 is not)
    lambda: _config("phi3", **_TINY, bos_token_id=1, eos_token_id=255, pad_token_id=255),
    description="tiny Phi-3 (4 blocks, hidden 64, GQA 4/2 heads, fused qkv and gate/up "
                "projections), transformers Phi3ForCausalLM")
register_causal_lm(
    "gpt2_tiny",
    # token ids within the tiny vocabulary (the default 50256 is not)
    lambda: _gpt2(vocab_size=256, n_embd=64, n_layer=4, n_head=4, n_positions=512,
                  bos_token_id=255, eos_token_id=255),
    description="tiny GPT-2 (4 blocks, hidden 64, 4 heads), transformers GPT2LMHeadModel")

# Small: published shapes a CPU builds in seconds.
register_causal_lm(
    "llama_small",
    lambda: _llama(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                   num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                   max_position_embeddings=2048, tie_word_embeddings=True),
    description="SmolLM-135M shape (Llama, 30 blocks, GQA 9/3), transformers "
                "LlamaForCausalLM")
register_causal_lm(
    "qwen2_small",
    lambda: _qwen2(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                   num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                   max_position_embeddings=32768, tie_word_embeddings=True),
    description="Qwen2-0.5B shape (24 blocks, GQA 14/2), transformers Qwen2ForCausalLM")
# gpt2_small is already a built-in model (models/_hf.py); here only its config.
register_causal_lm("gpt2_small", lambda: _gpt2(), builtin=False,
                   description="GPT-2 small 124M (Radford et al. 2019)")

# Published shapes to plan: building them takes the model's full memory in float32.
register_causal_lm(
    "llama_1b",
    lambda: _llama(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                   num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                   max_position_embeddings=2048),
    builtin=False, description="TinyLlama-1.1B shape (22 blocks, GQA 32/4), for planning")
register_causal_lm(
    "llama3_8b",
    lambda: _llama(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                   max_position_embeddings=8192, rope_theta=500000.0),
    builtin=False, description="Llama-3-8B shape (32 blocks, GQA 32/8), for planning")
