"""Causal language models (decoder-only LMs) by name: their transformers config, and the model
built from it with random weights.

An LLM is planned from its *config* alone (shapes decide every cost), so this registry keeps a
config factory per name rather than a module factory: ``llm plan llama3_8b`` needs no 32 GB of
random weights. Entries marked ``builtin`` are also ordinary built-in models
(``create_model``, ``edgesplit inspect``), wrapped to return logits like ``gpt2_small``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from edgesplit.models import register_model, token_inputs
from edgesplit.registry import Registry

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = [
    "CausalLMEntry",
    "causal_lm_config",
    "create_causal_lm",
    "full_attention_config",
    "get_causal_lm",
    "list_causal_lms",
    "register_causal_lm",
]


@dataclass(frozen=True)
class CausalLMEntry:
    """A registered causal LM: how to make its config, and whether it is a built-in model."""

    name: str
    make_config: Callable[[], PretrainedConfig]
    description: str = ""
    builtin: bool = True  # also in the model zoo; False: a published shape, for planning only


_REGISTRY: Registry[CausalLMEntry] = Registry(
    "causal LM", label="Causal LMs", loader=lambda: _ensure_loaded(),
    hint="(or pass a transformers config.json, or the folder holding one)")


def _ensure_loaded() -> None:
    from edgesplit.models import _causal_lm  # noqa: F401  (registers on import)


class CausalLMLogits(nn.Module):
    """The LM as a built-in model: token ids in, logits out, no cache (what capture and
    ``edgesplit inspect`` see). ``model`` is the transformers model itself, which
    generation uses."""

    edgesplit_strip_prefix = "model."

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, use_cache=False).logits


def register_causal_lm(name: str, make_config: Callable[[], PretrainedConfig], *,
                       description: str = "", builtin: bool = True) -> None:
    """Register ``name``; with ``builtin`` also as a built-in model (input ``(1, 32)``
    token ids)."""
    _REGISTRY.register(name, CausalLMEntry(name, make_config, description, builtin))
    if builtin:
        # the config is made when the model's inputs are: making it imports transformers
        # (3 s), which a command that never touches a causal LM must not pay
        register_model(name, input_shape=(1, 32), family="text", source="transformers",
                       make_inputs=partial(_config_token_inputs, make_config),
                       description=description)(lambda: CausalLMLogits(_build(make_config())))


def _config_token_inputs(make_config: Callable[[], PretrainedConfig],
                         shape: Sequence[int]) -> tuple[torch.Tensor, ...]:
    return token_inputs(shape, vocab_size=make_config().vocab_size)


def get_causal_lm(name: str) -> CausalLMEntry:
    return _REGISTRY.get(name)


def list_causal_lms() -> list[str]:
    """Every registered causal LM, sorted."""
    return _REGISTRY.names()


def causal_lm_config(name: str) -> PretrainedConfig:
    """A fresh config of the causal LM ``name`` (an unknown name lists the known ones)."""
    return _REGISTRY.get(name).make_config()


def _build(config: PretrainedConfig, **overrides: Any) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    for key, value in overrides.items():
        setattr(config, key, value)
    return AutoModelForCausalLM.from_config(config).eval()


def create_causal_lm(name: str, **config_overrides: Any) -> PreTrainedModel:
    """The transformers model of ``name`` in eval mode, random weights from seed 0 (the same
    weights ``create_model(name)`` wraps). ``config_overrides`` set config attributes first,
    e.g. ``_attn_implementation="eager"`` to count attention FLOPs."""
    config = causal_lm_config(name)
    torch.manual_seed(0)
    return _build(config, **config_overrides)


# the config fields that switch every window off, where a family has them
_NO_WINDOW: dict[str, Any] = {"sliding_window": None, "use_sliding_window": False}


def full_attention_config(config: PretrainedConfig) -> PretrainedConfig:
    """``config`` with every sliding window switched off: a copy, or ``config`` itself when
    it has none. What the runtime builds and caches with: a plan admits a window only for
    contexts it leaves full attention (``CausalLMShape.window_context`` in
    :mod:`edgesplit.llm.model.description`, which reads each family's window), and without it
    the KV caches are plain ``DynamicCache`` layers, which crop and rewind (sessions) as any
    other.
    The file, and so a checkpoint's fingerprint, is untouched."""
    changes = {key: off for key, off in _NO_WINDOW.items()
               if getattr(config, key, off) != off}
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        changes["layer_types"] = ["full_attention"] * len(layer_types)
    if not changes:
        return config
    plain = copy.deepcopy(config)  # a checkpoint's config is cached: never changed in place
    for key, value in changes.items():
        setattr(plain, key, value)
    return plain
