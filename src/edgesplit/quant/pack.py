"""Dense packing of b-bit unsigned integers (1 <= b <= 8) into bytes, vectorised with numpy.

Eight b-bit values fill exactly b bytes, so values are packed in groups of eight: each group is
assembled into one little-endian 64-bit word (value k at bit k*b) and its low b bytes are kept
(the last group only as many bytes as its values need: ceil(count * b / 8) bytes in all).
Unpacking reverses it. The common widths take faster routes with the same layout: 1, 2 and 4
bits whole values per byte, 6 bits four values in three bytes, all in uint8 arithmetic; the
others go through 64-bit words. No Python loop runs over elements (benchmarks/bench_wire.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["pack_bits", "packed_size", "unpack_bits"]


def packed_size(count: int, bits: int) -> int:
    """Bytes needed for ``count`` values of ``bits`` bits: ceil(count * bits / 8)."""
    return (count * bits + 7) // 8


def _check(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be between 1 and 8, got {bits}")


def _lanes(flat: np.ndarray, per_group: int) -> np.ndarray:
    groups = -(-flat.size // per_group)
    if flat.size == groups * per_group:
        return flat.reshape(groups, per_group)
    padded = np.zeros(groups * per_group, dtype=np.uint8)
    padded[: flat.size] = flat
    return padded.reshape(groups, per_group)


def _pack_small(flat: np.ndarray, bits: int) -> np.ndarray:
    """1, 2 and 4 bits: whole values per byte, in uint8 arithmetic (one pass per lane)."""
    per_byte = 8 // bits
    lanes = _lanes(flat, per_byte)
    out = lanes[:, 0].copy()
    for k in range(1, per_byte):
        out |= lanes[:, k] << np.uint8(k * bits)
    return out


def _unpack_small(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    per_byte = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    out = np.empty((raw.size, per_byte), dtype=np.uint8)
    for k in range(per_byte):
        out[:, k] = (raw >> np.uint8(k * bits)) & mask
    return out.reshape(-1)[:count]


def _pack6(flat: np.ndarray) -> np.ndarray:
    """6 bits: four values in three bytes (the same layout as the general path)."""
    v = _lanes(flat, 4)
    out = np.empty((v.shape[0], 3), dtype=np.uint8)
    out[:, 0] = v[:, 0] | (v[:, 1] << np.uint8(6))
    out[:, 1] = (v[:, 1] >> np.uint8(2)) | (v[:, 2] << np.uint8(4))
    out[:, 2] = (v[:, 2] >> np.uint8(4)) | (v[:, 3] << np.uint8(2))
    return out.reshape(-1)


def _unpack6(raw: np.ndarray, count: int) -> np.ndarray:
    b = _lanes(raw, 3)
    out = np.empty((b.shape[0], 4), dtype=np.uint8)
    out[:, 0] = b[:, 0] & np.uint8(63)
    out[:, 1] = (b[:, 0] >> np.uint8(6)) | ((b[:, 1] & np.uint8(15)) << np.uint8(2))
    out[:, 2] = (b[:, 1] >> np.uint8(4)) | ((b[:, 2] & np.uint8(3)) << np.uint8(4))
    out[:, 3] = b[:, 2] >> np.uint8(2)
    return out.reshape(-1)[:count]


def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Pack unsigned integers < 2**bits (any shape; flattened) densely."""
    _check(bits)
    flat = np.ascontiguousarray(values, dtype=np.uint8).reshape(-1)
    if bits == 8:
        return flat.tobytes()
    if 8 % bits == 0:
        return _pack_small(flat, bits)[: packed_size(flat.size, bits)].tobytes()
    if bits == 6:
        return _pack6(flat)[: packed_size(flat.size, bits)].tobytes()
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
    if 8 % bits == 0:
        return _unpack_small(raw, bits, count)
    if bits == 6:
        return _unpack6(raw, count)
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
