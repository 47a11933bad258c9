"""``sentences``: real English sentences for the pretrained all-MiniLM-L6-v2 encoder.

``sentences.txt`` (shipped in this package) holds one sentence per line; its first line, a
``#`` comment, states where they come from (permissively licensed text: scikit-learn's data set
descriptions, the model card, Python standard-library docstrings). They are tokenized with the
model's own tokenizer at sequence length 32, the model's default input shape. There are no
labels: quality is the cosine similarity of the quantized model's embeddings to the float
model's.
"""

from __future__ import annotations

import functools
from importlib.resources import files

from edgesplit.data import EvalData, register_dataset
from edgesplit.data.tokenizer import MODEL_NAME, tokenize
from edgesplit.errors import ConfigError

__all__ = ["SEQ_LEN", "load_sentences", "read_sentences"]

SEQ_LEN = 32
_DESCRIPTION = ("real English sentences (scikit-learn data set descriptions, model card, Python "
                "docstrings) tokenized at length 32; metric: cosine to the float embeddings")


@functools.lru_cache(maxsize=1)
def read_sentences() -> tuple[str, ...]:
    """The sentences of ``sentences.txt`` in file order, without comment or blank lines."""
    resource = files("edgesplit.data") / "sentences.txt"
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("edgesplit/data/sentences.txt is missing from the installed package; "
                          "reinstall edgesplit") from None
    lines = (line.strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


@register_dataset("sentences", model=MODEL_NAME, description=_DESCRIPTION)
def load_sentences() -> EvalData:
    input_ids, attention_mask = tokenize(read_sentences(), SEQ_LEN)
    return EvalData(name="sentences", inputs=(input_ids, attention_mask), labels=None,
                    description=_DESCRIPTION)
