"""A causal LM as a chain of blocks with costs for its two phases, from its config alone.

Blocks, in order: ``embed`` (token and, for GPT-2, position embeddings), ``block.0`` ...
``block.{L-1}`` (the decoder blocks) and ``head`` (final norm, LM head and greedy pick). A stage
is a contiguous range of blocks; only a hidden state crosses between stages (token ids before
``embed``, the picked token id after ``head``). The KV cache stays with its block.

Two phases (:class:`Phase`): *prefill* runs the P prompt tokens with an empty cache; *decode*
runs one token against a cache of L tokens. Each block's work in a phase is a list of
:class:`OpWork` (one per kernel: projections, attention, norms, activations), counted
analytically from the config, with the conventions of :mod:`edgesplit.graph.ops`: a matmul is
``tokens x in x out`` MACs and 2 FLOPs per MAC (+1 per output for a bias), attention
``heads x tokens x context x 2 x head_dim`` MACs (QK^T and AV over the whole context, what
the math and most CPU kernels compute). ``tests/llm/test_llm_model.py`` checks the MACs against
``torch.utils.flop_counter`` on real models, the parameters against the modules and the KV
cache against a ``DynamicCache`` after a forward pass.

Supported: transformers ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``phi3`` and
``gpt2`` configs, from a registered name, a config, or a real checkpoint
(:mod:`edgesplit.llm.model.checkpoint`: its fingerprint is recorded). All but GPT-2 share
Llama's layout; what each does differently is data (:class:`_Family`): Qwen3's per-head q/k
norms, Gemma's scaled embedding and GeGLU, Phi-3's fused projections, Qwen2's q/k/v bias,
which layers of Mistral, Phi-3 and Qwen2/3 attend over a sliding window. A window is recorded
(:attr:`CausalLMShape.window`) and planned only for contexts it leaves full attention
(:attr:`CausalLMShape.window_context`), so the costs are those of full attention and the
runtime switches the window off (:func:`edgesplit.models.causal_lm.full_attention_config`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edgesplit.errors import ConfigError, UnknownNameError
from edgesplit.llm.model.precision import (
    FLOAT_BYTES,
    Precision,
    check_precision_name,
    resolve_precision,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "ARCHITECTURES",
    "DTYPE_BYTES",
    "TOKEN_BYTES",
    "Block",
    "CausalLM",
    "CausalLMShape",
    "OpWork",
    "Phase",
    "describe_causal_lm",
]

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "gpt2")
DTYPE_BYTES = FLOAT_BYTES  # the float precisions' widths (llm.model.precision has them all)
TOKEN_BYTES = 8  # token ids travel as int64, as transformers keeps them
BlockKind = Literal["embed", "decoder", "head"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Phase:
    """One forward call: ``tokens`` new tokens against ``cached`` tokens already in the KV
    cache (prefill: the prompt, nothing cached; decode: one token)."""

    kind: Literal["prefill", "decode"]
    tokens: int
    cached: int = 0

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.cached < 0:
            raise ConfigError(f"a {self.kind} phase needs tokens >= 1 and cached >= 0, got "
                              f"{self.tokens} and {self.cached}")

    @classmethod
    def prefill(cls, prompt_tokens: int) -> Phase:
        return cls("prefill", prompt_tokens, 0)

    @classmethod
    def decode(cls, cached: int) -> Phase:
        return cls("decode", 1, cached)

    @property
    def context(self) -> int:
        """Tokens attended to: the cache plus the new ones."""
        return self.cached + self.tokens


@dataclass(frozen=True)
class OpWork:
    """One kernel of a block in one phase; the fields of :class:`edgesplit.hardware.LayerWork`
    (which the planner builds from it) without the bit-width."""

    name: str
    op_class: str
    macs: int
    flops: int
    params: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int


def _max_positions(config: PretrainedConfig) -> int:
    return int(config.max_position_embeddings)


def _phi3_positions(config: PretrainedConfig) -> int:
    """Phi-3 with LongRoPE runs split as in one process up to
    ``original_max_position_embeddings`` only: when a sequence passes it, transformers'
    ``generate`` recomputes the whole KV cache with the long factors
    (``Phi3ForCausalLM.prepare_inputs_for_generation``), while each stage's cache keeps the
    keys it rotated with the short ones."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") != "longrope":
        return _max_positions(config)
    switch = int(config.original_max_position_embeddings)
    if switch < config.max_position_embeddings:
        log.warning("%s: LongRoPE switches to its long factors past %d positions, which a "
                    "split cannot follow (every stage would recompute its cache); planning "
                    "at most %d of its %d positions", config.model_type, switch, switch,
                    config.max_position_embeddings)
    return min(switch, _max_positions(config))


def _no_window(config: PretrainedConfig) -> int | None:
    """Llama and Gemma: every layer attends over the whole context (their attention and mask
    never read ``sliding_window``)."""
    return None


def _window_everywhere(config: PretrainedConfig) -> int | None:
    """Mistral and Phi-3: every layer attends over ``sliding_window`` when it is set (their
    mask and attention read it; ``layer_types`` is not read)."""
    window = getattr(config, "sliding_window", None)
    return None if window is None else int(window)


_LAYER_TYPES = ("full_attention", "sliding_attention")


def _window_by_layer_type(config: PretrainedConfig) -> int | None:
    """Qwen2 and Qwen3: the layers ``layer_types`` marks ``sliding_attention`` attend over
    ``sliding_window``. Only ``layer_types`` decides: the config fills it from
    ``use_sliding_window`` (off: ``sliding_window`` is dropped) and ``max_window_layers``
    (layers from that index on slide), and the model reads nothing else."""
    types = set(getattr(config, "layer_types", None) or ())
    if unknown := types - set(_LAYER_TYPES):
        raise ConfigError(f"layer_types {sorted(unknown)} of this {config.model_type} config "
                          f"are not modelled: use {' or '.join(_LAYER_TYPES)}")
    if "sliding_attention" not in types:
        return None
    window = getattr(config, "sliding_window", None)
    if window is None:
        raise ConfigError(f"this {config.model_type} config has sliding_attention layers but "
                          "no sliding_window: set sliding_window (and use_sliding_window "
                          "true), or make every layer_types entry full_attention")
    return int(window)


@dataclass(frozen=True)
class _Family:
    """How a family with Llama's layout (pre-norm decoder layers, rotary attention, gated MLP,
    ``model.layers.i``) differs from Llama. Work counts per element are the kernels' FLOPs."""

    # (q/k/v bias, o bias) whatever the config says; None: both are ``attention_bias``
    bias: tuple[bool, bool] | None = None
    qk_norm: bool = False  # an RMSNorm over head_dim on every query and key head (Qwen3)
    fused: bool = False  # one qkv_proj and one gate_up_proj matmul (Phi-3)
    embed_scale: bool = False  # the embedding times sqrt(hidden), in its module (Gemma)
    norm_flops: int = 4  # RMSNorm per element; (1 + weight) takes one more (Gemma)
    act_flops: int = 5  # the gate's activation and the product: SiLU; GELU-tanh takes 9
    # the positions a split runs as one process does (Phi-3's LongRoPE: fewer)
    max_positions: Callable[[PretrainedConfig], int] = _max_positions
    # the attention window of the layers that slide, as the family's model reads its config
    window: Callable[[PretrainedConfig], int | None] = _no_window


_FAMILIES = {
    "llama": _Family(),
    "mistral": _Family(window=_window_everywhere),
    "qwen2": _Family(bias=(True, False), window=_window_by_layer_type),
    "qwen3": _Family(qk_norm=True, window=_window_by_layer_type),
    "gemma": _Family(embed_scale=True, norm_flops=5, act_flops=9),
    "phi3": _Family(fused=True, max_positions=_phi3_positions, window=_window_everywhere),
}



@dataclass(frozen=True)
class CausalLMShape:
    """What the costs depend on, read from a transformers config."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    tied_embeddings: bool
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    window: int | None = None  # the sliding window of the layers that have one (None: none)

    @property
    def window_context(self) -> int | None:
        """The most tokens a KV cache may hold (the plan's max context) for the window to
        change nothing, bit for bit; None without a window. transformers masks key k out of
        query q's window when ``q - k >= window`` (``masking_utils.sliding_window_overlay``),
        so up to ``window`` tokens attention is full in value; but a step whose keys (cached
        and new) reach ``window`` gets an explicit mask where full attention passes SDPA none
        (``_ignore_causal_mask_sdpa``), which rounds differently, and a
        ``DynamicSlidingWindowLayer`` keeps only ``window - 1`` tokens. Below ``window`` both
        run the same code on the same keys."""
        return None if self.window is None else self.window - 1

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> CausalLMShape:
        arch = getattr(config, "model_type", None)
        if arch not in ARCHITECTURES:
            raise ConfigError(f"causal LM architecture {arch!r} is not supported; supported: "
                              f"{', '.join(ARCHITECTURES)} (transformers model_type)")
        tied = bool(getattr(config, "tie_word_embeddings", False))
        if arch == "gpt2":
            h = config.n_embd
            return cls(arch, config.vocab_size, h, config.n_layer, config.n_head, config.n_head,
                       h // config.n_head, config.n_inner or 4 * h, config.n_positions, tied,
                       True, True, True)
        if getattr(config, "use_bidirectional_attention", False):
            raise ConfigError(f"this {arch} config attends bidirectionally "
                              "(use_bidirectional_attention): not a causal LM")
        h, heads = config.hidden_size, config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or h // heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        attn_bias = bool(getattr(config, "attention_bias", False))
        family = _FAMILIES[arch]
        qkv_bias, out_bias = family.bias or (attn_bias, attn_bias)
        return cls(arch, config.vocab_size, h, config.num_hidden_layers, heads, kv, head_dim,
                   config.intermediate_size, family.max_positions(config), tied,
                   qkv_bias, out_bias, bool(getattr(config, "mlp_bias", False)),
                   family.window(config))


@dataclass(frozen=True)
class Block:
    """A unit of placement: the modules it runs (paths in the transformers model), its
    parameters and, for a decoder block, the KV cache it keeps per token."""

    index: int
    name: str
    kind: BlockKind
    modules: tuple[str, ...]
    params: int
    param_bytes: int
    kv_bytes_per_token: int = 0


@dataclass(frozen=True)
class CausalLM:
    """A causal LM as blocks at one precision, ``dtype`` (llm.model.precision): a float one
    for weights, activations and KV cache alike, or quantized weights (``precision``) with
    float32 activations and KV cache."""

    name: str
    source: str  # a registered name or a config file: enough to build the model again
    shape: CausalLMShape
    dtype: str
    blocks: tuple[Block, ...] = field(repr=False)
    # modules every stage with decoder blocks builds for itself (rotary embeddings: buffers
    # computed from the config, no weights)
    shared_modules: tuple[str, ...] = ()
    # a real checkpoint's content fingerprint (llm.model.checkpoint); None: random weights
    fingerprint: str | None = None
    # the weights' precision, where it says more than ``dtype`` (a GGUF's own tensor sizes)
    precision: Precision | None = field(default=None, repr=False)

    @cached_property
    def weights(self) -> Precision:
        """How the weights are stored: :attr:`precision`, else ``dtype``'s."""
        return self.precision if self.precision is not None else Precision(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one activation, KV cache or wire value (float32 under quantized weights;
        the weights' bytes are :attr:`weights`')."""
        return self.weights.value_bytes

    @property
    def n(self) -> int:
        return len(self.blocks)

    @property
    def tied_bytes(self) -> int:
        """Bytes of the embedding matrix the LM head shares (0 if untied)."""
        s = self.shape
        return self.weights.matrix_bytes("embed.tokens", s.vocab_size, s.hidden_size) \
            if s.tied_embeddings else 0

    def stage_param_bytes(self, a: int, b: int) -> int:
        """Weights of a stage running blocks [a, b). A tied embedding counts in both ``embed``
        and ``head`` (stages apart each hold a copy), once when one stage has both."""
        total = sum(block.param_bytes for block in self.blocks[a:b])
        return total - (self.tied_bytes if a == 0 and b == self.n else 0)

    def kv_bytes_per_token(self, a: int = 0, b: int | None = None) -> int:
        """KV cache per cached token of blocks [a, b): 2 x kv_heads x head_dim x dtype each."""
        return sum(block.kv_bytes_per_token for block in self.blocks[a:b])

    def boundary_bytes(self, cut: int, phase: Phase) -> int:
        """Bytes crossing after ``cut`` blocks in ``phase``: token ids before ``embed``, a hidden
        state between blocks, nothing after ``head`` (its token goes back to the user:
        :data:`TOKEN_BYTES`)."""
        if cut == 0:
            return phase.tokens * TOKEN_BYTES
        if cut >= self.n:
            return 0
        return phase.tokens * self.shape.hidden_size * self.dtype_bytes

    def boundary_tensor(self, cut: int) -> str | None:
        """The name of the tensor crossing after ``cut`` blocks (None after the last)."""
        if cut == 0:
            return "input_ids"
        return f"{self.blocks[cut - 1].name}.out" if cut < self.n else None

    def ops(self, index: int, phase: Phase) -> tuple[OpWork, ...]:
        """The work of block ``index`` in ``phase``."""
        block = self.blocks[index]
        if block.kind == "embed":
            return tuple(_embed_ops(self, phase))
        if block.kind == "head":
            return tuple(_head_ops(self))
        return tuple(_decoder_ops(self, phase, prefix=f"{block.name}."))

    def macs(self, index: int, phase: Phase) -> int:
        return sum(op.macs for op in self.ops(index, phase))

    def activation_bytes(self, index: int, phase: Phase) -> int:
        """Working memory of block ``index`` in ``phase`` besides weights and KV cache: its
        input and output hidden states plus the largest intermediate (attention scores,
        which eager and math kernels materialise, or the MLP's hidden layer)."""
        s, dt, t = self.shape, self.dtype_bytes, phase.tokens
        block = self.blocks[index]
        if block.kind == "embed":
            return t * TOKEN_BYTES + t * s.hidden_size * dt
        if block.kind == "head":
            # transformers upcasts the logits to float32
            return s.hidden_size * dt + s.vocab_size * 4
        attention = (t * (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
                     + s.num_heads * t * phase.context + t * s.num_heads * s.head_dim)
        mlp = t * s.intermediate_size * (2 if s.architecture == "gpt2" else 3)
        return dt * (2 * t * s.hidden_size + max(attention, mlp))


# ---- work of each kind of block ----------------------------------------------------------------

def _matmul(lm: CausalLM, name: str, tokens: int, n_in: int, n_out: int, bias: bool
            ) -> OpWork:
    """A linear layer: its matrix at the weights' precision, its bias and activations at
    the activations' width."""
    dt = lm.dtype_bytes
    macs = tokens * n_in * n_out
    params = n_in * n_out + (n_out if bias else 0)
    weight = lm.weights.matrix_bytes(name, n_out, n_in) + (n_out * dt if bias else 0)
    return OpWork(name, "matmul", macs, 2 * macs + (tokens * n_out if bias else 0), params,
                  weight, tokens * n_in * dt, tokens * n_out * dt)


def _elementwise(name: str, op_class: str, elements: int, flops_each: int, dt: int, *,
                 params: int = 0, inputs: int = 1) -> OpWork:
    return OpWork(name, op_class, 0, flops_each * elements, params, params * dt,
                  inputs * elements * dt, elements * dt)


def _attention(name: str, lm: CausalLM, phase: Phase) -> OpWork:
    s, dt, t, ctx = lm.shape, lm.dtype_bytes, phase.tokens, phase.context
    macs = s.num_heads * t * ctx * 2 * s.head_dim
    # reads the queries and the whole cache (new keys/values included), writes the output
    # and appends the new keys and values to the cache
    kv_token = 2 * s.num_kv_heads * s.head_dim * dt
    return OpWork(name, "attention", macs, 2 * macs + 5 * s.num_heads * t * ctx, 0, 0,
                  t * s.num_heads * s.head_dim * dt + ctx * kv_token,
                  t * s.num_heads * s.head_dim * dt + t * kv_token)


def _decoder_ops(lm: CausalLM, phase: Phase, prefix: str) -> Iterator[OpWork]:
    s, dt, t = lm.shape, lm.dtype_bytes, phase.tokens
    h, q_out, kv_out = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    if s.architecture == "gpt2":
        yield _elementwise(f"{prefix}ln_1", "norm", t * h, 5, dt, params=2 * h)
        yield _matmul(lm, f"{prefix}attn.c_attn", t, h, 3 * h, True)
        yield _attention(f"{prefix}attn", lm, phase)
        yield _matmul(lm, f"{prefix}attn.c_proj", t, h, h, True)
        yield _elementwise(f"{prefix}add_1", "elementwise", t * h, 1, dt, inputs=2)
        yield _elementwise(f"{prefix}ln_2", "norm", t * h, 5, dt, params=2 * h)
        yield _matmul(lm, f"{prefix}mlp.c_fc", t, h, s.intermediate_size, True)
        yield _elementwise(f"{prefix}mlp.act", "elementwise", t * s.intermediate_size, 8, dt)
        yield _matmul(lm, f"{prefix}mlp.c_proj", t, s.intermediate_size, h, True)
        yield _elementwise(f"{prefix}add_2", "elementwise", t * h, 1, dt, inputs=2)
        return
    family, f = _FAMILIES[s.architecture], s.intermediate_size
    norm = family.norm_flops
    yield _elementwise(f"{prefix}input_layernorm", "norm", t * h, norm, dt, params=h)
    if family.fused:
        yield _matmul(lm, f"{prefix}self_attn.qkv_proj", t, h, q_out + 2 * kv_out, s.qkv_bias)
    else:
        yield _matmul(lm, f"{prefix}self_attn.q_proj", t, h, q_out, s.qkv_bias)
        yield _matmul(lm, f"{prefix}self_attn.k_proj", t, h, kv_out, s.qkv_bias)
        yield _matmul(lm, f"{prefix}self_attn.v_proj", t, h, kv_out, s.qkv_bias)
    if family.qk_norm:
        yield _elementwise(f"{prefix}self_attn.q_norm", "norm", t * q_out, norm, dt,
                           params=s.head_dim)
        yield _elementwise(f"{prefix}self_attn.k_norm", "norm", t * kv_out, norm, dt,
                           params=s.head_dim)
    yield _elementwise(f"{prefix}self_attn.rotary", "elementwise", t * (q_out + kv_out), 3, dt,
                       inputs=2)
    yield _attention(f"{prefix}self_attn", lm, phase)
    yield _matmul(lm, f"{prefix}self_attn.o_proj", t, q_out, h, s.out_bias)
    yield _elementwise(f"{prefix}add_1", "elementwise", t * h, 1, dt, inputs=2)
    yield _elementwise(f"{prefix}post_attention_layernorm", "norm", t * h, norm, dt, params=h)
    if family.fused:
        yield _matmul(lm, f"{prefix}mlp.gate_up_proj", t, h, 2 * f, s.mlp_bias)
    else:
        yield _matmul(lm, f"{prefix}mlp.gate_proj", t, h, f, s.mlp_bias)
        yield _matmul(lm, f"{prefix}mlp.up_proj", t, h, f, s.mlp_bias)
    yield _elementwise(f"{prefix}mlp.act_mul", "elementwise", t * f, family.act_flops, dt,
                       inputs=2)
    yield _matmul(lm, f"{prefix}mlp.down_proj", t, f, h, s.mlp_bias)
    yield _elementwise(f"{prefix}add_2", "elementwise", t * h, 1, dt, inputs=2)


def _embed_ops(lm: CausalLM, phase: Phase) -> Iterator[OpWork]:
    s, dt, t = lm.shape, lm.dtype_bytes, phase.tokens
    # A lookup reads the rows of its tokens, not the table: weight_bytes counts those rows
    # (a decode step on a 128k vocabulary would otherwise "read" the whole matrix).
    row = lm.weights.matrix_bytes("embed.tokens", s.vocab_size, s.hidden_size) // s.vocab_size
    yield OpWork("embed.tokens", "embedding", 0, 0, s.vocab_size * s.hidden_size,
                 t * row, t * TOKEN_BYTES, t * s.hidden_size * dt)
    if s.architecture == "gpt2":
        yield OpWork("embed.positions", "embedding", 0, 0, s.max_positions * s.hidden_size,
                     t * s.hidden_size * dt, t * TOKEN_BYTES, t * s.hidden_size * dt)
        yield _elementwise("embed.add", "elementwise", t * s.hidden_size, 1, dt, inputs=2)
    elif _FAMILIES[s.architecture].embed_scale:
        yield _elementwise("embed.scale", "elementwise", t * s.hidden_size, 1, dt)


def _head_ops(lm: CausalLM) -> Iterator[OpWork]:
    # Only the last position's logits pick the next token (generate's logits_to_keep=1), in
    # both phases, so the head's work does not grow with the prompt.
    s, dt = lm.shape, lm.dtype_bytes
    h = s.hidden_size
    if s.architecture == "gpt2":
        yield _elementwise("head.norm", "norm", h, 5, dt, params=2 * h)
    else:
        yield _elementwise("head.norm", "norm", h, _FAMILIES[s.architecture].norm_flops, dt,
                           params=h)
    yield _matmul(lm, "head.lm_head", 1, h, s.vocab_size, False)
    yield _elementwise("head.argmax", "pool", s.vocab_size, 1, dt)


# ---- blocks and the description ---------------------------------------------------------------

def _modules(shape: CausalLMShape) -> tuple[tuple[str, ...], str, tuple[str, ...], tuple[str, ...]]:
    """(embed modules, decoder block path prefix, head modules, shared modules) as transformers
    names them in ``*ForCausalLM`` / ``GPT2LMHeadModel``."""
    if shape.architecture == "gpt2":
        return (("transformer.wte", "transformer.wpe", "transformer.drop"), "transformer.h.",
                ("transformer.ln_f", "lm_head"), ())
    return (("model.embed_tokens",), "model.layers.", ("model.norm", "lm_head"),
            ("model.rotary_emb",))


def _blocks(shape: CausalLMShape, precision: Precision) -> tuple[Block, ...]:
    probe = CausalLM("probe", "probe", shape, precision.name, (), precision=precision)
    phase = Phase.decode(0)
    embed, layer_prefix, head, _ = _modules(shape)
    kv = 2 * shape.num_kv_heads * shape.head_dim * precision.value_bytes

    def block(index: int, name: str, kind: BlockKind, modules: tuple[str, ...],
              ops: Iterator[OpWork], kv_bytes: int = 0) -> Block:
        work = tuple(ops)
        return Block(index, name, kind, modules, sum(op.params for op in work),
                     sum(_held_bytes(probe, op) for op in work), kv_bytes)

    # the LM head's weight is its own parameter unless tied to the embedding
    blocks = [block(0, "embed", "embed", embed, _embed_ops(probe, phase))]
    blocks += [block(i + 1, f"block.{i}", "decoder", (f"{layer_prefix}{i}",),
                     _decoder_ops(probe, phase, f"block.{i}."), kv)
               for i in range(shape.num_layers)]
    blocks.append(block(shape.num_layers + 1, "head", "head", head, _head_ops(probe)))
    return tuple(blocks)


def _held_bytes(lm: CausalLM, op: OpWork) -> int:
    """The bytes of ``op``'s parameters a stage holds: what one decode step reads of them,
    except a lookup table, which is held whole (a step reads its rows)."""
    if op.op_class != "embedding":
        return op.weight_bytes
    h = lm.shape.hidden_size
    return lm.weights.matrix_bytes(op.name, op.params // h, h)


def describe_causal_lm(model: Any, *, dtype: str = "float32", name: str | None = None
                       ) -> CausalLM:
    """The block description of ``model``: a registered causal LM name
    (:func:`edgesplit.models.causal_lm.list_causal_lms`), a transformers ``config.json`` (or
    the folder holding one), a ``PretrainedConfig``, or a transformers causal LM module."""
    check_precision_name(dtype)  # before any checkpoint is read
    checkpoint = _checkpoint_of(model)
    if checkpoint is not None:
        config, label, source = checkpoint.config(), _label(checkpoint.source), \
            checkpoint.source
    else:
        config, label, source = _config_of(model)
    shape = CausalLMShape.from_config(config)
    _, _, _, shared = _modules(shape)
    precision = resolve_precision(dtype, shape, source if checkpoint is not None else None,
                                  config)
    return CausalLM(name or label, source, shape, precision.name, _blocks(shape, precision),
                    shared, checkpoint.fingerprint if checkpoint is not None else None,
                    precision)


def _checkpoint_of(model: Any) -> Any:
    """The real checkpoint ``model`` names (a built-in, a weights folder, a .gguf), if any."""
    if not isinstance(model, (str, Path)):
        return None
    from edgesplit.llm.model.checkpoint import open_checkpoint

    return open_checkpoint(model)


def _label(source: str) -> str:
    path = Path(source)
    return path.stem if path.suffix == ".gguf" else path.name


def _config_of(model: Any) -> tuple[PretrainedConfig, str, str]:
    """(config, display name, source to record) of anything describe_causal_lm accepts."""
    from transformers import PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return model, model.model_type, model.model_type
    inner = getattr(model, "model", None)  # a CausalLMLogits wrapper
    for candidate in (model, inner):
        config = getattr(candidate, "config", None)
        if isinstance(config, PretrainedConfig):
            return config, config.model_type, config.model_type
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.suffix == ".json" or path.is_dir():
            return _config_file(path / "config.json" if path.is_dir() else path), path.stem, \
                str(model)
        from edgesplit.models.causal_lm import causal_lm_config

        try:
            return causal_lm_config(str(model)), str(model), str(model)
        except UnknownNameError as exc:
            raise UnknownNameError(str(exc)) from None
    raise ConfigError(f"cannot describe {type(model).__name__} as a causal LM: pass a "
                      "registered name, a config.json, a transformers config or model")


def _config_file(path: Path) -> PretrainedConfig:
    from transformers import AutoConfig

    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{str(path)!r} is not a transformers config (no model_type)")
    model_type = data.pop("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"causal LM architecture {model_type!r} in {str(path)!r} is not "
                          f"supported; supported: {', '.join(ARCHITECTURES)}")
    return AutoConfig.for_model(model_type, **data)
