"""The wire format for tensors crossing a link (AUTO-SPLIT appendix, Tables 4-5).

A message is a fixed header, the shape, the quantization parameters, and the payload:

    magic "ESW1" | version u8 | dtype u8 | bits u8 | layout u8 | axis u8 | compression u8 |
    ndim u8 | reserved u8 | shape: ndim x u32 | n_params u32 | params: n_params x (scale f32,
    zero_point f32) | raw_len u64 | payload_len u64 | crc32 u32 | payload

all little-endian. Floating tensors at 1-8 bits are quantized asymmetrically, q = round(x /
scale + zero_point) clamped to [0, 2^bits - 1], per tensor or per channel, and packed densely
(eight b-bit values in b bytes); at 16 or 32 bits they travel as float16/float32. Other dtypes
(token ids, masks) travel as they are. The payload may be compressed with zstd or lz4 when that
makes it smaller. The CRC covers header and payload. Decoding checks every field and every
size against the bytes actually present before allocating anything, so malformed or hostile
input raises WireError and never crashes or over-allocates.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import Literal

import numpy as np
import torch

from edgesplit.errors import WireError
from edgesplit.quant.pack import pack_bits, packed_size, unpack_bits

__all__ = ["WIRE_VERSION", "MAX_ELEMENTS", "encode_tensor", "decode_tensor", "message_info"]

WIRE_VERSION = 1
MAGIC = b"ESW1"
MAX_ELEMENTS = 1 << 31  # refuse to describe more than 2^31 elements (8 GiB of float32)
_MAX_NDIM = 8
_FIXED = struct.Struct("<4sBBBBBBBB")
_TAIL = struct.Struct("<QQI")

_DTYPES = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16, 4: torch.float64,
           5: torch.int64, 6: torch.int32, 7: torch.uint8, 8: torch.bool, 9: torch.int8}
_CODES = {v: k for k, v in _DTYPES.items()}
_COMPRESSIONS = {0: None, 1: "zstd", 2: "lz4"}
_COMPRESSION_CODES = {v: k for k, v in _COMPRESSIONS.items()}
Compress = Literal["zstd", "lz4", "auto"] | None


def _quant_params(x: torch.Tensor, bits: int, axis: int | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    levels = (1 << bits) - 1
    if axis is None:
        lo, hi = x.min().reshape(1), x.max().reshape(1)
    else:
        moved = x.movedim(axis, 0).reshape(x.shape[axis], -1)
        lo, hi = moved.min(dim=1).values, moved.max(dim=1).values
    scale = (hi - lo) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant tensors
    zero = -lo / scale
    return scale.numpy().astype(np.float32), zero.numpy().astype(np.float32)


def _quantize(x: torch.Tensor, bits: int, axis: int | None) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    scale, zero = _quant_params(x, bits, axis)
    shape = [1] * x.dim()
    if axis is not None:
        shape[axis] = -1
    s = torch.from_numpy(scale).reshape(shape if axis is not None else [1])
    z = torch.from_numpy(zero).reshape(shape if axis is not None else [1])
    q = torch.clamp(torch.round(x / s + z), 0, (1 << bits) - 1).to(torch.uint8)
    return q.numpy(), scale, zero


def _compress(payload: bytes, method: Compress) -> tuple[int, bytes]:
    candidates = ["zstd", "lz4"] if method == "auto" else [method] if method else []
    best = (0, payload)
    for name in candidates:
        if name == "zstd":
            import zstandard

            packed = zstandard.ZstdCompressor(level=3).compress(payload)
        elif name == "lz4":
            import lz4.block

            packed = lz4.block.compress(payload, store_size=False)
        else:
            raise WireError(f"unknown compression {name!r}: use 'zstd', 'lz4', 'auto' or None")
        if len(packed) < len(best[1]):  # only when it pays
            best = (_COMPRESSION_CODES[name], packed)
    return best


def encode_tensor(t: torch.Tensor, bits: int, compress: Compress = None, *,
                  per_channel_axis: int | None = None) -> bytes:
    """Quantize (floating tensors at 1-8 bits) or convert (16/32 bits) and pack ``t``."""
    t = t.detach().cpu().contiguous()
    if t.dtype not in _CODES:
        raise WireError(f"dtype {t.dtype} cannot be sent; supported: "
                        f"{', '.join(str(d) for d in _CODES)}")
    if t.dim() > _MAX_NDIM or t.numel() > MAX_ELEMENTS:
        raise WireError(f"tensor of shape {tuple(t.shape)} is too large for one message")
    layout, axis, params = 0, 0, (np.ones(0, np.float32), np.zeros(0, np.float32))
    if not t.is_floating_point():
        width, payload = t.element_size() * 8, t.numpy().tobytes()
    elif bits in (16, 32):
        width = bits
        payload = t.to(torch.float16 if bits == 16 else torch.float32).numpy().tobytes()
    elif 1 <= bits <= 8:
        width = bits
        if per_channel_axis is not None:
            if not -t.dim() <= per_channel_axis < t.dim():
                raise WireError(f"per_channel_axis {per_channel_axis} is not an axis of a "
                                f"{t.dim()}-d tensor")
            layout, axis = 1, per_channel_axis % t.dim()
        q, scale, zero = _quantize(t.float(), bits, per_channel_axis if layout else None)
        params = (scale, zero)
        payload = pack_bits(q, bits)
    else:
        raise WireError(f"bits must be 1-8 (quantized), 16 or 32 (float), got {bits}")
    code, body = _compress(payload, compress)
    head = _FIXED.pack(MAGIC, WIRE_VERSION, _CODES[t.dtype], width, layout, axis, code, t.dim(), 0)
    head += struct.pack(f"<{t.dim()}I", *t.shape) + struct.pack("<I", len(params[0]))
    head += np.stack(params, axis=1).astype("<f4").tobytes() if len(params[0]) else b""
    prefix = head + struct.pack("<QQ", len(payload), len(body))
    crc = zlib.crc32(body, zlib.crc32(prefix))
    return prefix + struct.pack("<I", crc) + body


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise WireError(f"truncated message: {what} needs {n} bytes, "
                            f"{len(self.data) - self.pos} left")
        chunk = self.data[self.pos: self.pos + n]
        self.pos += n
        return chunk


def _parse(data: bytes):
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"a tensor message is bytes, not {type(data).__name__}")
    reader = _Reader(bytes(data))
    magic, version, dcode, bits, layout, axis, ccode, ndim, _ = _FIXED.unpack(
        reader.take(_FIXED.size, "the header"))
    if magic != MAGIC:
        raise WireError("not an edgesplit tensor message (bad magic)")
    if version != WIRE_VERSION:
        raise WireError(f"wire version {version} is not supported (this edgesplit reads "
                        f"{WIRE_VERSION})")
    if dcode not in _DTYPES or ccode not in _COMPRESSIONS or layout not in (0, 1) \
            or ndim > _MAX_NDIM:
        raise WireError("malformed header (dtype, compression, layout or rank out of range)")
    shape = struct.unpack(f"<{ndim}I", reader.take(4 * ndim, "the shape"))
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise WireError(f"message claims {count} elements, more than the {MAX_ELEMENTS} allowed")
    (n_params,) = struct.unpack("<I", reader.take(4, "the parameter count"))
    dtype = _DTYPES[dcode]
    quantized = dtype.is_floating_point and bits <= 8
    expected_params = 0 if not quantized else (shape[axis] if layout == 1 and ndim else 1)
    if n_params != expected_params or (layout == 1 and axis >= max(ndim, 1)):
        raise WireError("malformed header (quantization parameters do not match the layout)")
    params = np.frombuffer(reader.take(8 * n_params, "the parameters"), dtype="<f4").reshape(-1, 2)
    if not np.isfinite(params).all() or (params[:, 0] <= 0).any():
        raise WireError("malformed header (non-finite or non-positive scale)")
    if quantized:
        raw_expected = packed_size(count, bits)
    elif dtype.is_floating_point:
        if bits not in (16, 32):
            raise WireError(f"malformed header (float payload of {bits} bits)")
        raw_expected = count * bits // 8
    else:
        if bits != dtype.itemsize * 8:
            raise WireError("malformed header (integer width does not match its dtype)")
        raw_expected = count * dtype.itemsize
    prefix_end = reader.pos + 16
    raw_len, body_len = struct.unpack("<QQ", reader.take(16, "the lengths"))
    (crc,) = struct.unpack("<I", reader.take(4, "the checksum"))
    if raw_len != raw_expected:
        raise WireError(f"payload size {raw_len} does not match shape {shape} at {bits} bits")
    body = reader.take(body_len, "the payload")
    if reader.pos != len(reader.data):
        raise WireError(f"{len(reader.data) - reader.pos} unexpected bytes after the payload")
    if zlib.crc32(body, zlib.crc32(reader.data[:prefix_end])) != crc:
        raise WireError("checksum mismatch: the message was corrupted")
    return dtype, bits, layout, axis, _COMPRESSIONS[ccode], shape, params, raw_len, body


def _decompress(body: bytes, method: str | None, raw_len: int) -> bytes:
    if method is None:
        return body
    try:
        if method == "zstd":
            import zstandard

            out = zstandard.ZstdDecompressor().decompress(body, max_output_size=raw_len)
        else:
            import lz4.block

            out = lz4.block.decompress(body, uncompressed_size=raw_len)
    except Exception as exc:  # the libraries raise their own error types
        raise WireError(f"cannot decompress the payload ({method}): {exc}") from None
    if len(out) != raw_len:
        raise WireError(f"decompressed payload has {len(out)} bytes, expected {raw_len}")
    return out


def decode_tensor(data: bytes) -> torch.Tensor:
    """The (dequantized) tensor of a message from :func:`encode_tensor`."""
    dtype, bits, layout, axis, method, shape, params, raw_len, body = _parse(data)
    payload = _decompress(body, method, raw_len)
    count = math.prod(shape)
    if dtype.is_floating_point and bits <= 8:
        q = torch.from_numpy(unpack_bits(payload, bits, count).astype(np.float32))
        q = q.reshape(shape)
        scale = torch.from_numpy(params[:, 0].copy())
        zero = torch.from_numpy(params[:, 1].copy())
        if layout == 1:
            view = [1] * len(shape)
            view[axis] = -1
            scale, zero = scale.reshape(view), zero.reshape(view)
        return ((q - zero) * scale).to(dtype)
    if dtype.is_floating_point:
        wire = np.float16 if bits == 16 else np.float32
        return torch.from_numpy(np.frombuffer(payload, dtype=wire).copy()).reshape(shape).to(dtype)
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    return torch.from_numpy(np.frombuffer(payload, dtype=np_dtype).copy()).reshape(shape)


def message_info(data: bytes) -> dict:
    """The header of a message (validated), without decoding the payload."""
    dtype, bits, layout, axis, method, shape, params, raw_len, body = _parse(data)
    return {"dtype": str(dtype).replace("torch.", ""), "bits": bits, "shape": list(shape),
            "layout": "per-channel" if layout else "per-tensor", "axis": axis,
            "compression": method, "payload_bytes": len(body), "raw_bytes": raw_len,
            "message_bytes": len(data)}
