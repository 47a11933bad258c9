"""Tiny random Llama GGUFs written with the ``gguf`` package, for the quantized stage's tests
(the real SmolLM2 file is too slow for ``make test``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TINY = {"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 96, "layers": 3, "vocab": 160,
        "context": 256, "eps": 1e-5, "theta": 10000.0}


def write_tiny_gguf(path: Path, kind: str = "Q4_0", *, seed: int = 0, tied: bool = True,
                    embed_kind: str = "Q8_0", vocab_arrays: bool = False,
                    **changes: float) -> Path:
    """A random Llama of TINY's shape (``changes`` override it) whose linears are stored as
    ``kind`` and its embedding as ``embed_kind``; norms float32. ``vocab_arrays``: metadata
    arrays as a tokenizer's (tokens, their types, merges), not a tokenizer anything loads."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    c = {**TINY, **changes}
    h, heads, kv, ffn, vocab = (int(c[k]) for k in ("hidden", "heads", "kv_heads", "ffn",
                                                     "vocab"))
    head_dim = h // heads
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(int(c["layers"]))
    writer.add_context_length(int(c["context"]))
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(c["theta"]))
    writer.add_layer_norm_rms_eps(float(c["eps"]))
    writer.add_vocab_size(vocab)
    writer.add_file_type(2)
    if vocab_arrays:
        writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(int(c["vocab"]))])
        writer.add_array("tokenizer.ggml.token_type", [1] * int(c["vocab"]))
        writer.add_array("tokenizer.ggml.merges", [f"t o{i}" for i in range(50)])
        writer.add_string("tokenizer.ggml.model", "tiny")

    def add(name: str, rows: int, cols: int, what: str, scale: float = 0.08) -> None:
        w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if what == "F32":
            writer.add_tensor(name, w)
            return
        qtype = GGMLQuantizationType[what]
        writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)  # shape: its bytes

    def norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32))

    add("token_embd.weight", vocab, h, embed_kind, 0.5)
    for i in range(int(c["layers"])):
        norm(f"blk.{i}.attn_norm.weight")
        add(f"blk.{i}.attn_q.weight", h, h, kind)
        add(f"blk.{i}.attn_k.weight", kv * head_dim, h, kind)
        add(f"blk.{i}.attn_v.weight", kv * head_dim, h, kind)
        add(f"blk.{i}.attn_output.weight", h, h, kind)
        norm(f"blk.{i}.ffn_norm.weight")
        add(f"blk.{i}.ffn_gate.weight", ffn, h, kind)
        add(f"blk.{i}.ffn_up.weight", ffn, h, kind)
        add(f"blk.{i}.ffn_down.weight", h, ffn, kind)
    norm("output_norm.weight")
    if not tied:
        add("output.weight", vocab, h, embed_kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
