"""GGUF blocks in ONNX Runtime's layout for ``com.microsoft.MatMulNBits``, exactly.

A llama.cpp block holds 32 consecutive weights of a row and its scale (and, for Q4_1, its
minimum); MatMulNBits (ONNX Runtime's MLAS kernels: int8 dot products on AVX2/AVX-512 VNNI)
takes blocks of the same 32 weights with one scale and a zero point each. The values are the
same; only the packing differs:

- ``Q4_0``: w = d * (q - 8), q in 0..15. MatMulNBits' default 4-bit zero point is 8: no
  zero-point input.
- ``Q8_0``: w = d * q, q in -128..127. Stored as q + 128 against the default 8-bit zero
  point 128.
- ``Q4_1``: w = d * q + m. MatMulNBits computes x . (d * (q - z)) with a zero point z per
  block, but only an integer z in 0..15 keeps it on the fast int8 path (a float zero point
  falls back to dequantising the whole matrix every call: 230 ms a token for SmolLM2 against
  4.5 ms, measured), and -m / d is no integer. So the product is split where it is exact:
  w = d * (q - 8) + (m + 8 d), x . w = MatMulNBits(x, q, d, z = 8) + (x's block sums) .
  (m + 8 d), the second a float32 matmul of ``K / 32`` columns (``[N, K / 32]``). Why 8 and
  not z = 0 (x . d q + (x's block sums) . m, as exact in float): with int8 activations
  MatMulNBits multiplies the weights by x rounded per block, the block sums by x itself, so
  the rounding error of x is weighted by the first term's weights. d (q - 8) is centred
  where d q is all positive (its mean 7.5 d: the rounding errors add up instead of
  cancelling); on SmolLM2 Q4_1 the centred split halves int8's top-1 disagreements with
  float32 (94.0 % -> 96.6 % over 500 tokens, mean KL 0.020 -> 0.0044 nats) and saves the
  zero-point input (a decode step ~8 % faster, measured).

llama.cpp packs a 4-bit block's element j in the low nibble of byte j and element j + 16 in
its high nibble; MatMulNBits packs elements 2i and 2i + 1 into byte i. Repacking copies the
quantized bytes once (the stage keeps that copy, never a float one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.llm.model.gguf import FLOAT_TYPES, KERNEL_TYPES, QuantTensor

__all__ = ["BLOCK", "NBitsWeight", "dequantize_rows", "nbits_weight"]

BLOCK = 32  # weights per block, every type here
_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # bytes per block


@dataclass(frozen=True)
class NBitsWeight:
    """MatMulNBits' inputs for one weight: ``packed`` ``uint8 [N, blocks, bytes/block]``,
    ``scales`` ``float32 [N * blocks]``, ``zero`` the zero point every block has (8 or 128:
    MatMulNBits' defaults, so no zero-point input), and for Q4_1 the blocks' offsets
    ``mins`` ``float32 [N, blocks]`` (m + 8 d, added through the block sums of x)."""

    n: int
    k: int
    bits: int
    packed: np.ndarray
    scales: np.ndarray
    zero: int
    mins: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        mins = 0 if self.mins is None else self.mins.nbytes
        return int(self.packed.nbytes + self.scales.nbytes + mins)


def _blocks(t: QuantTensor) -> np.ndarray:
    if t.cols % BLOCK:
        raise ConfigError(f"{t.name}: {t.cols} columns is not a multiple of the {t.kind} "
                          f"block of {BLOCK}")
    return np.ascontiguousarray(t.data).reshape(t.rows, t.cols // BLOCK, _BYTES[t.kind])


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 stored at byte ``at`` of every block, as float32 ``[rows, blocks]``."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0] \
        .astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """llama.cpp's 16 bytes per block -> the 32 values in order (uint8 0..15)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _pack4(values: np.ndarray) -> np.ndarray:
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def nbits_weight(t: QuantTensor) -> NBitsWeight:
    """``t`` (Q4_0, Q4_1 or Q8_0) as MatMulNBits takes it, the same values exactly."""
    if t.kind not in KERNEL_TYPES:
        raise ConfigError(f"{t.name}: type {t.kind} has no quantized kernel here "
                          f"({', '.join(KERNEL_TYPES)} do)")
    b = _blocks(t)
    d = _f16(b, 0)
    if t.kind == "Q8_0":
        packed = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return NBitsWeight(t.rows, t.cols, 8, packed, d.reshape(-1), 128)
    if t.kind == "Q4_0":
        return NBitsWeight(t.rows, t.cols, 4, _pack4(_nibbles(b[..., 2:])), d.reshape(-1), 8)
    # centred: d (q - 8) + (m + 8 d) (the module docstring says why)
    return NBitsWeight(t.rows, t.cols, 4, _pack4(_nibbles(b[..., 4:])), d.reshape(-1), 8,
                       _f16(b, 2) + 8 * d)


def dequantize_rows(w: NBitsWeight | np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float32 ``[len(rows), K]``: the given rows of a weight from its MatMulNBits form or a
    float matrix (the repacking's values, for tests; a stage's embedding lookup reads the
    GGUF's own rows: :meth:`QuantTensor.dequantize_rows
    <edgesplit.llm.model.gguf.QuantTensor.dequantize_rows>`)."""
    if isinstance(w, np.ndarray):
        return np.asarray(w[rows], dtype=np.float32)
    blocks = w.k // BLOCK
    packed = w.packed[rows]
    scales = w.scales.reshape(w.n, blocks)[rows][..., None]
    if w.bits == 8:
        q = packed.astype(np.float32)
    else:
        q = np.empty((*packed.shape[:-1], BLOCK), np.float32)
        q[..., 0::2], q[..., 1::2] = packed & 0x0F, packed >> 4
    out = (q - w.zero) * scales
    if w.mins is not None:
        out += w.mins[rows][..., None]
    return out.reshape(len(rows), w.k)


def float_weight(t: QuantTensor) -> np.ndarray:
    """A weight without a kernel here, as float32 (said once by the caller)."""
    if t.kind in FLOAT_TYPES:
        return np.asarray(t.data, np.float32).reshape(t.rows, t.cols)
    return t.dequantize()
