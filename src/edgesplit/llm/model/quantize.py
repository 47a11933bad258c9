"""A transformers checkpoint's weights quantized as a stage loads them, read as a GGUF is read.

The quantized stage (:class:`edgesplit.llm.stage.onnx_stage.OnnxStage`) reads a model through
:class:`~edgesplit.llm.model.gguf.GGUFModel`'s interface: ``shape``, ``tensor`` by llama.cpp's
name, ``linear`` by layer and part, ``head``. :class:`QuantizedCheckpoint` answers it from a
safetensors folder (a transformers Llama, or a GGUF dequantised into the cache), quantizing
each weight matrix when it is asked for with ``gguf``'s own reference code
(:func:`gguf.quants.quantize`: llama.cpp's Q8_0, Q4_0 and Q4_1, groups of 32 along a row), so
a stage reads and quantizes only its own tensors and keeps no float copy of them. Norms stay
float32. The rows are already in transformers' order (no un-permuting, unlike a GGUF's Q and
K).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.llm.model.gguf import LLAMA_TENSORS, GGUFShape, QuantTensor

if TYPE_CHECKING:
    from edgesplit.llm.model.checkpoint import Checkpoint

__all__ = ["QUANTIZABLE", "QuantizedCheckpoint", "llama_shape"]

QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1")
# llama.cpp's names -> transformers' (``{i}``: the layer)
_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
          "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER_PARTS = {"attn_norm": "input_layernorm", "q": "self_attn.q_proj",
                "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "ffn_norm": "post_attention_layernorm", "gate": "mlp.gate_proj",
                "up": "mlp.up_proj", "down": "mlp.down_proj"}
_NAMES.update({LLAMA_TENSORS[part]: f"model.layers.{{i}}.{name}.weight"
               for part, name in _LAYER_PARTS.items()})


def llama_shape(config: Any, source: str) -> GGUFShape:
    """What the quantized stage needs of a transformers Llama ``config``; ConfigError for
    what it does not implement (another family, biases, a scaled rotary embedding)."""
    arch = getattr(config, "model_type", None)
    if arch != "llama":
        raise ConfigError(f"{source!r} is a {arch}: quantized stages run Llama-layout models "
                          "(llama); run it as float32, float16 or bfloat16")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ConfigError(f"{source!r} has attention or MLP biases, which the quantized "
                          "stage does not implement: run it as float32, float16 or bfloat16")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default" or rope.get("partial_rotary_factor",
                                                                 1.0) != 1.0:
        raise ConfigError(f"{source!r} scales its rotary embedding ({rope.get('rope_type')}), "
                          "which the quantized stage does not implement: run it as float32, "
                          "float16 or bfloat16")
    theta = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    return GGUFShape(
        "llama", int(config.num_hidden_layers), hidden, int(config.intermediate_size), heads,
        int(getattr(config, "num_key_value_heads", None) or heads),
        int(getattr(config, "head_dim", None) or hidden // heads), int(config.vocab_size),
        int(config.max_position_embeddings), float(config.rms_norm_eps), float(theta),
        bool(getattr(config, "tie_word_embeddings", False)))


class QuantizedCheckpoint:
    """``checkpoint``'s Llama weights with every matrix quantized to ``kind`` (one of
    :data:`QUANTIZABLE`) when read, by llama.cpp's tensor names."""

    def __init__(self, checkpoint: Checkpoint, kind: str) -> None:
        if kind not in QUANTIZABLE:
            raise ConfigError(f"cannot quantize to {kind}: choose one of "
                              f"{', '.join(QUANTIZABLE)}")
        self.kind, self.source = kind, checkpoint.source
        self.shape = llama_shape(checkpoint.config(), checkpoint.source)
        self._files = checkpoint.tensor_files()

    def tensor(self, name: str) -> QuantTensor:
        """Tensor ``name`` (llama.cpp's): a matrix quantized to ``kind``, a norm float32."""
        stored = self._stored(name)
        w = _read(self._files[stored], stored)
        if w.ndim == 1:
            return QuantTensor(name, "F32", 1, w.shape[0], w.reshape(1, -1))
        rows, cols = (int(d) for d in w.shape)
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        try:
            data = quantize(w, GGMLQuantizationType[self.kind])
        except Exception as exc:  # gguf's QuantError: a row not a whole number of groups
            raise ConfigError(f"{self.source}: cannot quantize {stored} ({rows} x {cols}) to "
                              f"{self.kind}: {exc}") from None
        return QuantTensor(name, self.kind, rows, cols, data.reshape(rows, -1))

    def mapped(self, name: str) -> QuantTensor:
        """As :meth:`tensor` (quantized in memory: there is no file of its blocks to map)."""
        return self.tensor(name)

    def linear(self, part: str, layer: int) -> QuantTensor:
        """Decoder layer ``layer``'s ``part`` (a key of LLAMA_TENSORS)."""
        return self.tensor(LLAMA_TENSORS[part].format(i=layer))

    def head(self) -> QuantTensor:
        """The LM head's weight: the token embedding where they are tied."""
        return self.tensor("token_embd.weight" if self.shape.tied_embeddings
                           else "output.weight")

    def _stored(self, name: str) -> str:
        template = name
        layer = None
        if name.startswith("blk."):
            _, index, rest = name.split(".", 2)
            layer, template = int(index), f"blk.{{i}}.{rest}"
        if template not in _NAMES:
            raise ConfigError(f"no transformers tensor corresponds to {name!r}")
        stored = _NAMES[template].format(i=layer)
        if stored == "lm_head.weight" and stored not in self._files:  # tied, stored once
            stored = _NAMES["token_embd.weight"]
        if stored not in self._files:
            raise ConfigError(f"the checkpoint {self.source!r} has no tensor {stored!r}: not "
                              "a complete Llama checkpoint")
        return stored


def _read(file: Any, name: str) -> np.ndarray:
    """Tensor ``name`` of the safetensors ``file`` as float32 (through torch: numpy has no
    bfloat16)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return f.get_tensor(name).to(torch.float32).numpy()
