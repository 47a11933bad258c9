"""Dense packing of b-bit unsigned integers (1 <= b <= 8) into bytes, vectorised with numpy.

Eight b-bit values fill exactly b bytes, so values are packed in groups of eight: each group is
assembled into one little-endian 64-bit word (value k at bit k*b) and its low b bytes are kept
(the last group only as many bytes as its values need: ceil(count * b / 8) bytes in all).
Unpacking reverses it. Throughput is that of a few numpy passes over N/8 words (see
benchmarks/bench_wire.py), with no Python loop over elements.
"""

from __future__ import annotations

import numpy as np

__all__ = ["packed_size", "pack_bits", "unpack_bits"]


def packed_size(count: int, bits: int) -> int:
    """Bytes needed for ``count`` values of ``bits`` bits: ceil(count * bits / 8)."""
    return (count * bits + 7) // 8


def _check(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be between 1 and 8, got {bits}")


def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Pack unsigned integers < 2**bits (any shape; flattened) densely."""
    _check(bits)
    flat = np.ascontiguousarray(values, dtype=np.uint8).reshape(-1)
    if bits == 8:
        return flat.tobytes()
    groups = (flat.size + 7) // 8
    padded = np.zeros(groups * 8, dtype=np.uint64)
    padded[: flat.size] = flat
    lanes = padded.reshape(groups, 8)
    words = np.zeros(groups, dtype=np.uint64)
    for k in range(8):  # eight vectorised passes, one per lane
        words |= lanes[:, k] << np.uint64(k * bits)
    packed = words.astype("<u8").view(np.uint8).reshape(groups, 8)[:, :bits].reshape(-1)
    return packed[: packed_size(flat.size, bits)].tobytes()  # the last group only as needed


def unpack_bits(data: bytes | memoryview, bits: int, count: int) -> np.ndarray:
    """The first ``count`` values packed by :func:`pack_bits` (uint8 array)."""
    _check(bits)
    if len(data) != packed_size(count, bits):
        raise ValueError(f"{len(data)} bytes cannot hold exactly {count} values of {bits} bits")
    raw = np.frombuffer(data, dtype=np.uint8)
    if bits == 8:
        return raw[:count].copy()
    groups = (count + 7) // 8
    full = np.zeros(groups * bits, dtype=np.uint8)
    full[: raw.size] = raw
    wide = np.zeros((groups, 8), dtype=np.uint8)
    wide[:, :bits] = full.reshape(groups, bits)
    words = wide.view("<u8").reshape(groups)
    mask = np.uint64((1 << bits) - 1)
    out = np.empty((groups, 8), dtype=np.uint8)
    for k in range(8):
        out[:, k] = (words >> np.uint64(k * bits)) & mask
    return out.reshape(-1)[:count]
