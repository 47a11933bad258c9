"""A causal LM's precision: how its weights are stored, apart from its activations.

Precisions (:data:`PRECISIONS`):

- ``float32``, ``float16``, ``bfloat16``: torch stages; weights, activations, the KV cache and
  the wire all at that width (what ``dtype`` always meant).
- ``q8_0``, ``q4_0``, ``q4_1``: ONNX Runtime stages (:mod:`edgesplit.llm.stage.onnx_stage`)
  whose weight matrices stay in llama.cpp's blocks of :data:`GROUP_SIZE` weights
  (:data:`BLOCK_BYTES` each: a float16 scale, for Q4_1 a float16 minimum, and the 8- or 4-bit
  values); norms are float32, and activations, the KV cache and the wire float32.
- ``gguf``: a GGUF file's own types, resolved when planning to the type most of its linear
  weights have (SmolLM2's built-in is Q4_1 linears with a Q8_0 embedding: ``q4_1``).

Where a GGUF's linears are of the planned type, a stage runs the file's tensors as stored, and
each weight is priced at what the stage holds of it: its bytes in the file for the types with
a kernel (and float32), a dequantised float32 copy for the others. Any other checkpoint (a
transformers folder, or a GGUF of another type, from its dequantised folder) is quantized when
a stage loads (:mod:`edgesplit.llm.model.quantize`), priced by :data:`BLOCK_BYTES`.

Quantized stages run Llama's layout without biases (``llama``), from a real checkpoint (a
config-only model's weights are random), with every matrix's input a multiple of the group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesplit.errors import ConfigError, option

if TYPE_CHECKING:
    from edgesplit.llm.model.description import CausalLMShape
    from edgesplit.llm.model.gguf import GGUFModel

__all__ = [
    "BLOCK_BYTES",
    "FLOAT_BYTES",
    "GROUP_SIZE",
    "OWN_TYPES",
    "PRECISIONS",
    "QUANTIZED",
    "Precision",
    "check_precision_name",
    "default_precision",
    "gguf_linear_kind",
    "resolve_precision",
]

FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
QUANTIZED = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1"}  # precision -> GGUF type
OWN_TYPES = "gguf"
PRECISIONS = (*FLOAT_BYTES, *QUANTIZED, OWN_TYPES)
GROUP_SIZE = 32  # weights per block, every quantized type here
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}  # bytes per block of GROUP_SIZE weights
VALUE_BYTES = 4  # a quantized stage's activations, KV cache and wire: float32
_LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
# a Llama block's matmuls (llm.model.description) -> the GGUF tensor each one holds (norms
# are float32 in a stage whatever the file stores)
_GGUF_OPS = {"self_attn.q_proj": "blk.{i}.attn_q.weight",
             "self_attn.k_proj": "blk.{i}.attn_k.weight",
             "self_attn.v_proj": "blk.{i}.attn_v.weight",
             "self_attn.o_proj": "blk.{i}.attn_output.weight",
             "mlp.gate_proj": "blk.{i}.ffn_gate.weight",
             "mlp.up_proj": "blk.{i}.ffn_up.weight",
             "mlp.down_proj": "blk.{i}.ffn_down.weight"}


@dataclass(frozen=True)
class Precision:
    """A resolved precision (never ``gguf``): ``name`` and, for a GGUF run as stored, the
    bytes a stage holds of each weight by op name (``block.3.self_attn.q_proj``)."""

    name: str
    held: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def quantized(self) -> bool:
        return self.name in QUANTIZED

    @property
    def kind(self) -> str | None:
        """The GGUF type of its weight matrices (None: a float precision)."""
        return QUANTIZED.get(self.name)

    @property
    def group_size(self) -> int | None:
        return GROUP_SIZE if self.quantized else None

    @cached_property
    def value_bytes(self) -> int:
        """Bytes of one activation, KV cache or wire value."""
        return VALUE_BYTES if self.quantized else FLOAT_BYTES[self.name]

    @property
    def value_dtype(self) -> str:
        """The dtype of the hidden states and the KV cache."""
        return "float32" if self.quantized else self.name

    def matrix_bytes(self, name: str, rows: int, cols: int) -> int:
        """Bytes a stage holds of the weight matrix of op ``name``, ``rows`` x ``cols``
        (``cols``: the input side, along which the groups run)."""
        held = self.held.get(name)
        if held is not None:
            return held
        kind = self.kind
        if kind is None:
            return rows * cols * self.value_bytes
        return rows * (cols // GROUP_SIZE) * BLOCK_BYTES[kind]


def _named(name: str) -> str:
    """The precision ``name`` as the caller set it (``--precision q4_1`` under the CLI)."""
    return option("dtype", name, flag="--precision")


def check_precision_name(name: str) -> None:
    """ConfigError unless ``name`` is one of :data:`PRECISIONS`."""
    if name not in PRECISIONS:
        raise ConfigError(f"{_named(name)} is not a precision edgesplit runs; choose "
                          f"one of {', '.join(PRECISIONS)}")


def default_precision(source: Any) -> str:
    """The precision a model runs at unless told: a GGUF's own types where a quantized stage
    runs them (a Llama whose linears are Q8_0, Q4_0 or Q4_1: the file as stored, at the speed
    and size its users chose it for), else float32."""
    from edgesplit.llm.model.checkpoint import gguf_file

    if not isinstance(source, (str, Path)):
        return "float32"
    try:
        path = gguf_file(source)
    except ConfigError:
        return "float32"  # not there: planning says so, at any precision
    if path is None:
        return "float32"
    from edgesplit.llm.model.gguf import GGUFModel

    try:
        model = GGUFModel(path)
        if model.shape.architecture == "llama" and gguf_linear_kind(model) in QUANTIZED.values():
            return OWN_TYPES
    except ConfigError:
        pass  # another architecture, rope scaling: its float path says what it can do
    return "float32"


def resolve_precision(name: str, shape: CausalLMShape, source: str | None,
                      config: Any = None) -> Precision:
    """``name`` for a model of ``shape`` (and transformers ``config``) whose real checkpoint
    is ``source`` (None: a config-only model, random weights); ConfigError, in one line,
    where it cannot run."""
    check_precision_name(name)
    if name in FLOAT_BYTES:
        return Precision(name)
    _check_quantizable(name, shape)
    from edgesplit.llm.model.checkpoint import gguf_file

    path = gguf_file(source) if source is not None else None
    if path is None:
        if name == OWN_TYPES:
            what = repr(source) if source is not None else "a config-only model"
            raise ConfigError(f"{_named(name)} runs a GGUF file's own types and "
                              f"{what} is not a GGUF: choose "
                              f"{', '.join(QUANTIZED)} (a real checkpoint, quantized when a "
                              "stage loads) or a float precision")
        if source is None:
            raise ConfigError(f"{_named(name)} quantizes a real checkpoint's weights; "
                              "a config-only model has random ones: give a .gguf file, "
                              "smollm2-135m-instruct or a transformers folder, or plan it as "
                              f"{', '.join(FLOAT_BYTES)}")
        if config is not None:
            from edgesplit.llm.model.quantize import llama_shape

            llama_shape(config, source)  # what the stage will refuse, refused now
        return Precision(name)
    from edgesplit.llm.model.gguf import GGUFModel

    model = GGUFModel(path)
    kind = gguf_linear_kind(model)
    if name == OWN_TYPES:
        if kind not in QUANTIZED.values():
            raise ConfigError(f"{path.name}'s linear weights are {kind}, which has no "
                              f"quantized kernel here ({', '.join(QUANTIZED.values())} do): "
                              f"plan it as {', '.join(QUANTIZED)} (quantized again from its "
                              "dequantised weights) or as float32")
        name = kind.lower()
    # the file as stored where its linears are of this type; else quantized at load
    return Precision(name, gguf_held_bytes(model)) if QUANTIZED[name] == kind \
        else Precision(name)


def _check_quantizable(name: str, shape: CausalLMShape) -> None:
    """A quantized stage runs Llama's layout without biases, every matrix's input a multiple
    of the group (the embedding's rows, the hidden size, the attention's output, the MLP's)."""
    if shape.architecture != "llama" or shape.qkv_bias or shape.out_bias or shape.mlp_bias:
        raise ConfigError(f"{_named(name)}: quantized stages run Llama-layout models "
                          f"without biases (llama); this {shape.architecture} runs as "
                          f"{', '.join(FLOAT_BYTES)}")
    for what, size in (("hidden size", shape.hidden_size),
                       ("attention width (heads x head_dim)", shape.num_heads * shape.head_dim),
                       ("intermediate size", shape.intermediate_size)):
        if size % GROUP_SIZE:
            raise ConfigError(f"{_named(name)}: the model's {what} of {size} is not a "
                              f"multiple of the quantization group of {GROUP_SIZE}; run it as "
                              f"{', '.join(FLOAT_BYTES)}")


def gguf_linear_kind(model: GGUFModel) -> str:
    """The GGUF type most of the decoder layers' linear weights are stored as."""
    from edgesplit.llm.model.gguf import LLAMA_TENSORS

    weights: Counter[str] = Counter()
    for i in range(model.shape.num_layers):
        for part in _LINEARS:
            t = model.tensor(LLAMA_TENSORS[part].format(i=i))
            weights[t.kind] += t.rows * t.cols
    return weights.most_common(1)[0][0]


def gguf_held_bytes(model: GGUFModel) -> dict[str, int]:
    """Per matrix op of the description, the bytes a stage holds of its GGUF weight: as
    stored for the types with a kernel and float32, a float32 copy for the others (the stage
    dequantises them)."""
    from edgesplit.llm.model.gguf import KERNEL_TYPES

    def held(tensor: str) -> int:
        t = model.tensor(tensor)
        as_stored = t.kind in KERNEL_TYPES or t.kind == "F32"
        return t.nbytes if as_stored else t.rows * t.cols * FLOAT_BYTES["float32"]

    out = {"embed.tokens": held("token_embd.weight"),
           "head.lm_head": held("token_embd.weight" if model.shape.tied_embeddings
                                else "output.weight")}
    for i in range(model.shape.num_layers):
        out.update({f"block.{i}.{op}": held(tensor.format(i=i))
                    for op, tensor in _GGUF_OPS.items()})
    return out
