"""A GGUF file's tensors in their quantized form, read by name: no float32 copy.

The file is memory-mapped (:class:`gguf.GGUFReader`); a tensor is a view of its bytes until a
stage repacks it for its kernel (:mod:`edgesplit.llm.stage.quantized`), so a stage's resident
weights are the quantized bytes of its own blocks and nothing else. The reader skips the
contents of array metadata (a tokenizer's tokens and merges): gguf makes a numpy view of every
element, 160 MB and 2.8 s for SmolLM2's 49k tokens, and a stage reads scalars only.

Names are llama.cpp's (``blk.3.attn_q.weight``); :data:`LLAMA_TENSORS` maps a decoder
layer's parts to them. llama.cpp stores a Llama's Q and K projections with the rows of each
head interleaved for its rotary kernel (``convert_hf_to_gguf.py``'s ``permute``);
:meth:`GGUFModel.linear` undoes that on whole rows, which moves quantized blocks without
touching their values, so the stage runs the checkpoint's exact weights in transformers'
layout (half-split rotary), as transformers' own GGUF loader does after dequantising.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np

from edgesplit.errors import ConfigError

__all__ = ["KERNEL_TYPES", "LLAMA_TENSORS", "GGUFModel", "GGUFShape", "QuantTensor"]

# the tensor types a stage computes with in their quantized form (others are dequantised)
KERNEL_TYPES = ("Q4_0", "Q4_1", "Q8_0")
FLOAT_TYPES = ("F32", "F16", "BF16")
# a decoder layer's parts -> llama.cpp's tensor names (``{i}``: the layer)
LLAMA_TENSORS = {
    "attn_norm": "blk.{i}.attn_norm.weight", "q": "blk.{i}.attn_q.weight",
    "k": "blk.{i}.attn_k.weight", "v": "blk.{i}.attn_v.weight",
    "o": "blk.{i}.attn_output.weight", "ffn_norm": "blk.{i}.ffn_norm.weight",
    "gate": "blk.{i}.ffn_gate.weight", "up": "blk.{i}.ffn_up.weight",
    "down": "blk.{i}.ffn_down.weight",
}
_ARCHITECTURES = ("llama",)  # llama.cpp's name; SmolLM2, Llama 2/3, TinyLlama, Mistral 7B


@dataclass(frozen=True)
class QuantTensor:
    """A weight as llama.cpp stores it: ``rows`` x ``cols`` (torch's [out, in]) of type
    ``kind``, ``data`` its bytes one row per line (``uint8 [rows, bytes per row]``; float
    types as their own dtype ``[rows, cols]``)."""

    name: str
    kind: str
    rows: int
    cols: int
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def take_rows(self, order: np.ndarray) -> QuantTensor:
        """The same tensor with its rows in ``order`` (whole rows: quantized blocks move as
        they are)."""
        return QuantTensor(self.name, self.kind, self.rows, self.cols, self.data[order])

    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 ``[len(rows), cols]``: the given rows only (an embedding lookup reads the
        pages of its rows and nothing else)."""
        picked = QuantTensor(self.name, self.kind, len(rows), self.cols, self.data[rows])
        return picked.dequantize()

    def dequantize(self) -> np.ndarray:
        """float32 ``[rows, cols]`` (tests and the types without a kernel)."""
        if self.kind in FLOAT_TYPES:
            return np.asarray(self.data, dtype=np.float32).reshape(self.rows, self.cols)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        kind = GGMLQuantizationType[self.kind]
        return dequantize(np.ascontiguousarray(self.data), kind).reshape(self.rows, self.cols)


@dataclass(frozen=True)
class GGUFShape:
    """What a stage needs to know of the model, from the file's metadata."""

    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    rms_eps: float
    rope_theta: float
    tied_embeddings: bool


class GGUFModel:
    """One GGUF file, memory-mapped; its tensors by name, quantized."""

    def __init__(self, path: str | Path) -> None:
        try:
            from gguf import GGUFReader
        except ImportError:
            raise ConfigError("reading a .gguf file needs the package gguf: "
                              "`pip install gguf`") from None
        self.path = Path(path)
        try:
            self._reader = _header_reader(GGUFReader)(str(self.path))
        except Exception:  # gguf's own reader says why, or reads it (its internals moved)
            try:
                self._reader = GGUFReader(str(self.path))
            except Exception as exc:  # a foreign or damaged file: one line
                raise ConfigError(f"{str(path)!r} is not a readable GGUF file: {exc}") from None
        self._tensors = {t.name: t for t in self._reader.tensors}

    def field(self, key: str, default: Any = None) -> Any:
        """Metadata ``key``'s value: a number or a string (arrays are skipped, read as [])."""
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    @cached_property
    def shape(self) -> GGUFShape:
        arch = str(self.field("general.architecture", ""))
        if arch not in _ARCHITECTURES:
            raise ConfigError(f"GGUF architecture {arch!r} of {str(self.path)!r} has no "
                              f"quantized stage; supported: {', '.join(_ARCHITECTURES)} "
                              "(others run dequantised: --precision float32)")

        def need(key: str) -> Any:
            value = self.field(f"{arch}.{key}")
            if value is None:
                raise ConfigError(f"{self.path.name} has no {arch}.{key}: not a complete "
                                  "GGUF of this architecture")
            return value

        if self.field(f"{arch}.rope.scaling.type") not in (None, "none"):
            raise ConfigError(f"{self.path.name} uses rope scaling, which the quantized stage "
                              "does not implement: run it dequantised (--precision float32)")
        hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = int(self.field(f"{arch}.rope.dimension_count", hidden // heads))
        vocab = self.field(f"{arch}.vocab_size")
        embed = self._tensors.get("token_embd.weight")
        if embed is None:
            raise ConfigError(f"{self.path.name} has no token_embd.weight")
        return GGUFShape(
            arch, int(need("block_count")), hidden, int(need("feed_forward_length")), heads,
            int(self.field(f"{arch}.attention.head_count_kv", heads)), head_dim,
            int(vocab if vocab is not None else int(embed.shape[1])),
            int(need("context_length")), float(need("attention.layer_norm_rms_epsilon")),
            float(self.field(f"{arch}.rope.freq_base", 10000.0)),
            "output.weight" not in self._tensors)

    def tensor(self, name: str) -> QuantTensor:
        """Tensor ``name`` as stored (a view of the mapped file)."""
        t = self._tensors.get(name)
        if t is None:
            raise ConfigError(f"{self.path.name} has no tensor {name!r}: not a complete GGUF "
                              "of this architecture")
        kind = t.tensor_type.name
        dims = [int(d) for d in t.shape]  # ggml order: ne0 (the row length) first
        cols, rows = dims[0], int(np.prod(dims[1:])) if len(dims) > 1 else 1
        # float types: one value per weight; quantized: the row's blocks as bytes
        data = np.asarray(t.data).reshape(rows, cols if kind in FLOAT_TYPES else -1)
        return QuantTensor(name, kind, rows, cols, data)

    def mapped(self, name: str) -> QuantTensor:
        """Tensor ``name`` on a mapping of its own bytes: what a stage keeps after it drops
        the model (an embedding), so only the pages it reads become resident, where a view of
        the whole file would keep every page the stage touched while building."""
        t = self.tensor(name)
        found = self._tensors[name]
        data = np.memmap(self.path, dtype=t.data.dtype, mode="r", offset=int(found.data_offset),
                         shape=t.data.shape)
        return QuantTensor(name, t.kind, t.rows, t.cols, data)

    def linear(self, part: str, layer: int) -> QuantTensor:
        """Decoder layer ``layer``'s ``part`` (a key of LLAMA_TENSORS), rows in transformers'
        order (Q and K un-interleaved per head)."""
        t = self.tensor(LLAMA_TENSORS[part].format(i=layer))
        if part in ("q", "k"):
            s = self.shape
            heads = s.num_heads if part == "q" else s.num_kv_heads
            t = t.take_rows(_unpermute_rows(heads, t.rows))
        return t

    def head(self) -> QuantTensor:
        """The LM head's weight ([vocab, hidden]): the token embedding where they are tied."""
        return self.tensor("token_embd.weight" if self.shape.tied_embeddings
                           else "output.weight")

    @property
    def nbytes(self) -> int:
        return sum(int(t.n_bytes) for t in self._tensors.values())


@cache
def _header_reader(base: type) -> type:
    """``base`` (gguf's GGUFReader) reading array metadata as its size only: the library makes
    a numpy view of each element of every array (SmolLM2's tokenizer: 160 MB and 2.8 s; skipped:
    3 MB and 0.04 s, measured). Scalars, strings, tensor infos and every check stay the
    library's. An array reads as empty (``contents()`` is [])."""
    from gguf import GGUFValueType

    class HeaderReader(base):
        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            if raw_type != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            count = self._get(orig_offs + 4, np.uint64)
            itype, offs = GGUFValueType(raw_itype[0]), orig_offs + 12
            scalar = self.gguf_scalar_to_np.get(itype)
            if itype == GGUFValueType.STRING:  # each a uint64 length, then its bytes
                big = (self.byte_order == "S") == (sys.byteorder == "little")
                length = struct.Struct(">Q" if big else "<Q").unpack_from
                for _ in range(int(count[0])):
                    offs += 8 + length(self.data, offs)[0]
            elif scalar is not None:
                offs += int(count[0]) * np.dtype(scalar).itemsize
            else:  # arrays of arrays: as the library reads them
                return super()._get_field_parts(orig_offs, raw_type)
            return offs - orig_offs, [raw_itype, count], [], [GGUFValueType.ARRAY, itype]

    return HeaderReader


def _unpermute_rows(heads: int, rows: int) -> np.ndarray:
    """The row order that undoes llama.cpp's ``permute`` of a Q or K projection: there, each
    head's rows ``[first half | second half]`` were interleaved pairwise."""
    half = rows // heads // 2
    stored = np.arange(rows).reshape(heads, half, 2)  # stored row of (head, i, which half)
    return stored.transpose(0, 2, 1).reshape(rows)
