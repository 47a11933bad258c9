"""The quantized ONNX Runtime stage against references that share none of its kernels: the
GGUF package's own dequantisation, and transformers' Llama loaded from the same GGUF
(transformers un-permutes and dequantises it itself)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("onnxruntime")

from edgesplit.errors import ConfigError
from edgesplit.llm.model.gguf import GGUFModel, QuantTensor
from edgesplit.llm.stage.onnx_stage import OnnxStage
from edgesplit.llm.stage.quantized import dequantize_rows, nbits_weight
from tiny_gguf import TINY, write_tiny_gguf

EXACT = "exact"  # MatMulNBits in float32 everywhere: the graph's arithmetic, checked tightly
TOKENS = np.array([[3, 17, 99, 5, 42, 7, 150, 1]], np.int64)


@pytest.fixture(scope="module", params=["Q4_0", "Q4_1", "Q8_0"])
def gguf_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf"
    return write_tiny_gguf(path, request.param)


@pytest.fixture(scope="module")
def reference(gguf_file):
    """transformers' Llama from the same GGUF, float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                dtype=torch.float32).eval()


def _logits_ref(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits[0].numpy()


def _whole(path, activations=EXACT, **kw) -> OnnxStage:
    shape = GGUFModel(path).shape
    return OnnxStage(GGUFModel(path), 0, shape.num_layers, embed=True, head=True,
                     max_context=64, activations=activations, **kw)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_repacked_blocks_hold_the_gguf_values(tmp_path, kind):
    """Every weight repacked for MatMulNBits dequantises to what gguf's own code makes of the
    stored bytes (the same values: a repacking, not a requantisation)."""
    model = GGUFModel(write_tiny_gguf(tmp_path / "m.gguf", kind))
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"):
        t = model.tensor(name)
        w = nbits_weight(t)
        ours = dequantize_rows(w, np.arange(t.rows))
        np.testing.assert_allclose(ours, t.dequantize(), rtol=1e-6, atol=1e-7)


def test_a_step_matches_transformers_from_the_same_gguf(gguf_file, reference):
    stage = _whole(gguf_file)
    logits = stage.step(TOKENS, 0, stage.new_cache())
    np.testing.assert_allclose(logits[0], _logits_ref(reference, TOKENS)[-1], rtol=1e-3,
                               atol=1e-3)


def test_decode_over_the_cache_equals_the_whole_sequence(gguf_file, reference):
    """Prefill 3 tokens, then one token a step: each step's logits are the full sequence's at
    that position (the preallocated cache, positions and rotary line up)."""
    stage = _whole(gguf_file)
    cache = stage.new_cache()
    full = _logits_ref(reference, TOKENS)
    stage.step(TOKENS[:, :3], 0, cache)
    for t in range(3, TOKENS.shape[1]):
        logits = stage.step(TOKENS[:, t:t + 1], t, cache)
        np.testing.assert_allclose(logits[0], full[t], rtol=1e-3, atol=1e-3)
    assert cache.length == TOKENS.shape[1]


def test_a_rewound_cache_continues_from_its_prefix(gguf_file, reference):
    """A second turn sharing 4 tokens: crop, then prefill the rest at position 4."""
    stage = _whole(gguf_file)
    cache = stage.new_cache()
    stage.step(TOKENS, 0, cache)
    other = TOKENS.copy()
    other[0, 4:] = [9, 8, 7, 6]
    cache.crop(4)
    logits = stage.step(other[:, 4:], 4, cache)
    np.testing.assert_allclose(logits[0], _logits_ref(reference, other)[-1], rtol=1e-3,
                               atol=1e-3)


@pytest.mark.parametrize("activations", ["float", "int8", "mixed"])
@pytest.mark.parametrize("cut", [0, 1, 2, 3])
def test_two_stages_equal_one(gguf_file, cut, activations):
    """Layers split at ``cut`` over two stages give the one stage's logits, bit for bit,
    with the kernels as served (int8 activations round every last-bit difference)."""
    model = GGUFModel(gguf_file)
    layers = model.shape.num_layers
    kw = {"max_context": 64, "activations": activations}
    one = OnnxStage(model, 0, layers, embed=True, head=True, **kw)
    first = OnnxStage(model, 0, cut, embed=True, head=False, **kw)
    second = OnnxStage(model, cut, layers, embed=False, head=True, **kw)
    c1, c2, c0 = first.new_cache(), second.new_cache(), one.new_cache()
    for pos, ids in ((0, TOKENS[:, :5]), (5, TOKENS[:, 5:6]), (6, TOKENS[:, 6:7])):
        expected = one.step(ids, pos, c0)
        got = second.step(first.step(ids, pos, c1), pos, c2)
        np.testing.assert_array_equal(got, expected)


def test_int8_kernels_agree_with_the_float_reference(gguf_file, reference):
    """The served path (int8 activations, as llama.cpp's) keeps the float model's top-1 on
    nearly every position of a teacher-forced sequence."""
    stage = _whole(gguf_file, activations="int8")
    ids = np.random.default_rng(1).integers(0, TINY["vocab"], (1, 48))
    cache = stage.new_cache()
    full = _logits_ref(reference, ids)
    agree = 0
    for t in range(ids.shape[1]):
        agree += int(stage.step(ids[:, t:t + 1], t, cache).argmax()) == int(full[t].argmax())
    assert agree >= 0.9 * ids.shape[1]


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "F32"])
def test_the_embedding_is_looked_up_in_the_mapped_file(tmp_path, kind):
    """A stage keeps the embedding as the file's own bytes, mapped on their own (it outlives
    the model), and a lookup gives the rows gguf's dequantisation and the repacked (a tied
    head's) copy give, bit for bit."""
    model = GGUFModel(write_tiny_gguf(tmp_path / "m.gguf", "Q4_0", embed_kind=kind))
    stored = model.tensor("token_embd.weight")
    stage = OnnxStage(model, 0, 1, embed=True, head=False, max_context=8)
    del model
    rows = np.array([0, 7, 7, TINY["vocab"] - 1])
    assert isinstance(stage.embed, QuantTensor) and isinstance(stage.embed.data, np.memmap)
    assert stage.embed.nbytes == stored.nbytes  # its own bytes, not the whole file's
    looked_up = stage.embed.dequantize_rows(rows)
    np.testing.assert_array_equal(looked_up, stored.dequantize()[rows])
    if kind != "F32":
        np.testing.assert_array_equal(looked_up, dequantize_rows(nbits_weight(stored), rows))


def test_the_reader_skips_array_metadata_and_reads_the_rest_as_gguf_does(tmp_path):
    """Array fields (a tokenizer's tokens and merges) are skipped, read as []; every other
    field and every tensor is what gguf's own reader makes of the file."""
    from gguf import GGUFReader, GGUFValueType

    path = write_tiny_gguf(tmp_path / "m.gguf", "Q4_1", vocab_arrays=True)
    full, lean = GGUFReader(str(path)), GGUFModel(path)
    arrays = [k for k, f in full.fields.items() if f.types[0] == GGUFValueType.ARRAY]
    assert "tokenizer.ggml.tokens" in arrays and "tokenizer.ggml.merges" in arrays
    for key, field in full.fields.items():
        assert lean.field(key) == ([] if key in arrays else field.contents()), key
    assert lean.field("tokenizer.ggml.model") == "tiny"  # a string after the arrays
    for t in full.tensors:
        np.testing.assert_array_equal(lean.tensor(t.name).data.reshape(-1),
                                      np.asarray(t.data).reshape(-1))


def test_a_truncated_gguf_is_refused_in_one_line(tmp_path):
    """A file cut inside its array metadata or its tensor infos: one line, as before."""
    from gguf import GGUFReader

    path = write_tiny_gguf(tmp_path / "m.gguf", "Q4_0", vocab_arrays=True)
    full = GGUFReader(str(path))
    data, start = path.read_bytes(), full.data_offset
    for cut in (full.fields["tokenizer.ggml.tokens"].offset + 100, start // 2, start - 9):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ConfigError, match="is not a readable GGUF file") as info:
            GGUFModel(tmp_path / "cut.gguf")
        assert "\n" not in str(info.value)


def test_bad_input_is_refused_in_one_line(tmp_path, gguf_file):
    stage = _whole(gguf_file)
    cache = stage.new_cache()
    with pytest.raises(ConfigError, match="token ids must be in"):
        stage.step(np.array([[TINY["vocab"]]]), 0, cache)
    with pytest.raises(ConfigError, match="max context"):
        stage.step(TOKENS, 60, cache)
    with pytest.raises(ConfigError, match="activations 'int4': choose one of float, int8"):
        _whole(gguf_file, activations="int4")
    assert cache.length == 0
    bad = QuantTensor("w", "Q4_0", 2, 40, np.zeros((2, 40), np.uint8))
    with pytest.raises(ConfigError, match="not a multiple of the Q4_0 block"):
        nbits_weight(bad)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ConfigError, match="not a readable GGUF") as info:
        GGUFModel(tmp_path / "junk.gguf")
    assert "\n" not in str(info.value)
