"""The wire format for tensors crossing a link (AUTO-SPLIT appendix, Tables 4-5).

A message is a fixed header, the shape, the quantization parameters, and the payload:

    magic "ESW1" | version u8 | dtype u8 | bits u8 | layout u8 | axis u8 | compression u8 |
    ndim u8 | reserved u8 | shape: ndim x u32 | n_params u32 | params: n_params x (scale f32,
    zero_point f32) | raw_len u64 | payload_len u64 | crc32 u32 | payload

all little-endian; docs/wire-format.md is the full specification (every field, limit and error,
and a worked example). Floating tensors at 1-8 bits are quantized asymmetrically, q = round(x /
scale + zero_point) clamped to [0, 2^bits - 1], per tensor or per channel, and packed densely
(eight b-bit values in b bytes); at 16 bits they travel as float16 (bfloat16 as bfloat16), at 32
as float32. Other dtypes (token ids, masks) travel as they are. The payload may be compressed
with zstd (one frame stating its content size) or lz4 (block format) when that makes it smaller.
The CRC covers every byte but its own.

Servers decode bytes from the network with this module, so decoding is written for hostile
input: every field and size is checked against the limits and the bytes present before anything
payload-sized is allocated, a decompressor is never asked for more than the declared raw length,
and every failure is a WireError. A server that knows what it expects passes ``expect_shape``,
``expect_dtype`` or ``max_raw_bytes`` to :func:`decode_tensor`, which refuses other messages from
their header alone.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from edgesplit.errors import WireError
from edgesplit.quant.pack import pack_bits, packed_size, unpack_bits

__all__ = [
    "MAX_DIM",
    "MAX_ELEMENTS",
    "MAX_NDIM",
    "WIRE_VERSION",
    "decode_tensor",
    "encode_tensor",
    "message_info",
]

# Version 2 changed one meaning: bfloat16 at 16 bits carries bfloat16 words (version 1 sent
# float16 words, which turned values above 65504 into inf). Version 1 messages are still read,
# with their own meaning, so an old client keeps working against a new server.
WIRE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
MAGIC = b"ESW1"
MAX_ELEMENTS = 1 << 31  # refuse to describe more than 2^31 elements (8 GiB of float32)
MAX_DIM = (1 << 31) - 1  # each dimension; with MAX_ELEMENTS it keeps strides within int64
MAX_NDIM = 8
_FIXED = struct.Struct("<4sBBBBBBBB")
_LENGTHS = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LZ4_MAX_RATIO = 255  # an lz4 block expands at most 255-fold (one 255 length byte per byte)
_LZ4_MAX_INPUT = 0x7E000000  # LZ4_MAX_INPUT_SIZE: the block format holds no more

_DTYPES = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16, 4: torch.float64,
           5: torch.int64, 6: torch.int32, 7: torch.uint8, 8: torch.bool, 9: torch.int8}
_CODES = {v: k for k, v in _DTYPES.items()}
_COMPRESSIONS = {0: None, 1: "zstd", 2: "lz4"}
_COMPRESSION_CODES = {v: k for k, v in _COMPRESSIONS.items()}
_NUMPY = {torch.int64: "<i8", torch.int32: "<i4", torch.uint8: "u1", torch.bool: "u1",
          torch.int8: "i1"}
Compress = Literal["zstd", "lz4", "auto"] | None


# ---- shared limits ------------------------------------------------------------------------------
def _check_shape(shape: Sequence[int]) -> None:
    """The limits a decoder enforces, so that the encoder never writes what it would refuse.

    A zero-size dimension makes the element count 0 whatever the others are, yet numpy and torch
    still compute strides from the nonzero ones: those are bounded too."""
    if len(shape) > MAX_NDIM:
        raise WireError(f"tensor has {len(shape)} dimensions, more than the {MAX_NDIM} allowed")
    if any(d > MAX_DIM for d in shape):
        raise WireError(f"tensor has shape {list(shape)}: a dimension above {MAX_DIM} is not "
                        f"allowed")
    nonzero = 1
    for d in shape:
        nonzero *= max(d, 1)
    if nonzero > MAX_ELEMENTS:
        raise WireError(f"tensor has shape {list(shape)}: more than the {MAX_ELEMENTS} elements "
                        f"allowed (zero-size dimensions aside)")


def _wire_numpy(dtype: torch.dtype, bits: int, version: int) -> str:
    """The numpy dtype of the words of an unquantized payload."""
    if not dtype.is_floating_point:
        return _NUMPY[dtype]
    if bits == 32:
        return "<f4"
    return "<i2" if dtype == torch.bfloat16 and version >= 2 else "<f2"  # bf16 words as int16


def _le_bytes(a: np.ndarray) -> bytes:
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


# ---- encoding -----------------------------------------------------------------------------------
def _quant_params(x: torch.Tensor, bits: int, axis: int | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    channels = 1 if axis is None else x.shape[axis]
    if x.numel() == 0:  # nothing to scale; any valid parameters do
        return np.ones(channels, np.float32), np.zeros(channels, np.float32)
    if axis is None:
        lo, hi = (v.reshape(1) for v in torch.aminmax(x))
    else:  # amin/amax along a dim are vectorised; aminmax(dim=) is 20x slower on CPU
        rows = x.movedim(axis, 0).reshape(channels, -1)
        lo, hi = rows.amin(dim=1), rows.amax(dim=1)
    if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        raise WireError(f"cannot quantize a tensor holding inf or NaN to {bits} bits: send it "
                        f"at 16 or 32 bits")
    scale = (hi - lo) / ((1 << bits) - 1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant tensors
    zero = -lo / scale
    if not (torch.isfinite(scale).all() and torch.isfinite(zero).all()):
        raise WireError(f"the values span a range float32 cannot scale at {bits} bits: send "
                        f"the tensor at 32 bits")
    return scale.numpy().astype(np.float32), zero.numpy().astype(np.float32)


def _quantize(x: torch.Tensor, bits: int, axis: int | None) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    scale, zero = _quant_params(x, bits, axis)
    view = [1] * x.dim()  # keeps a 0-d tensor 0-d
    if axis is not None:
        view[axis] = -1
    s, z = torch.from_numpy(scale).reshape(view), torch.from_numpy(zero).reshape(view)
    q = torch.clamp(torch.round(x / s + z), 0, (1 << bits) - 1).to(torch.uint8)
    return q.numpy(), scale, zero


def _compress(payload: bytes, method: Compress) -> tuple[int, bytes]:
    if method not in ("zstd", "lz4", "auto", None):
        raise WireError(f"unknown compression {method!r}: use 'zstd', 'lz4', 'auto' or None")
    candidates = ["zstd", "lz4"] if method == "auto" else [method] if method else []
    best = (0, payload)
    for name in candidates:
        if name == "zstd":
            import zstandard

            packed = zstandard.ZstdCompressor(level=3).compress(payload)  # states content size
        elif len(payload) > _LZ4_MAX_INPUT:
            continue  # beyond what an lz4 block holds: send it another way
        else:
            import lz4.block

            packed = lz4.block.compress(payload, store_size=False)
        if len(packed) < len(best[1]):  # only when it pays
            best = (_COMPRESSION_CODES[name], packed)
    return best


def _payload(t: torch.Tensor, bits: int, per_channel_axis: int | None
             ) -> tuple[int, int, int, tuple[np.ndarray, np.ndarray], bytes]:
    """(wire bits, layout, axis, (scales, zero points), raw payload) of a contiguous tensor."""
    no_params = (np.ones(0, np.float32), np.zeros(0, np.float32))
    if not t.is_floating_point():
        return t.element_size() * 8, 0, 0, no_params, _le_bytes(t.numpy())
    if bits == 16 and t.dtype == torch.bfloat16:  # its own words: lossless
        return 16, 0, 0, no_params, _le_bytes(t.view(torch.int16).numpy())
    if bits in (16, 32):
        wire = t.to(torch.float16 if bits == 16 else torch.float32)
        return bits, 0, 0, no_params, _le_bytes(wire.numpy())
    layout, axis = 0, 0
    if per_channel_axis is not None:
        if not -t.dim() <= per_channel_axis < t.dim():
            allowed = f" or {-t.dim()}..{t.dim() - 1}" if t.dim() else ""
            raise WireError(f"per_channel_axis {per_channel_axis} is not an axis of a "
                            f"{t.dim()}-d tensor: use None (per tensor){allowed}")
        layout, axis = 1, per_channel_axis % t.dim()
    q, scale, zero = _quantize(t.float(), bits, axis if layout else None)
    return bits, layout, axis, (scale, zero), pack_bits(q, bits)


def encode_tensor(t: torch.Tensor, bits: int, compress: Compress = None, *,
                  per_channel_axis: int | None = None) -> bytes:
    """Quantize (floating tensors at 1-8 bits) or convert (16/32 bits) and pack ``t``.

    Integer and bool tensors travel as they are at any valid ``bits``; ``per_channel_axis``
    applies to quantized floats only. docs/wire-format.md specifies the bytes."""
    t = t.detach().cpu().contiguous()
    if t.dtype not in _CODES:
        raise WireError(f"dtype {t.dtype} cannot be sent; supported: "
                        f"{', '.join(str(d) for d in _CODES)}")
    if not (1 <= bits <= 8 or bits in (16, 32)):
        raise WireError(f"bits must be 1-8 (quantized), 16 or 32 (float), got {bits}")
    _check_shape(t.shape)
    width, layout, axis, params, payload = _payload(t, bits, per_channel_axis)
    code, body = _compress(payload, compress)
    head = _FIXED.pack(MAGIC, WIRE_VERSION, _CODES[t.dtype], width, layout, axis, code, t.dim(), 0)
    head += struct.pack(f"<{t.dim()}I", *t.shape) + struct.pack("<I", len(params[0]))
    head += np.stack(params, axis=1).astype("<f4").tobytes()
    prefix = head + _LENGTHS.pack(len(payload), len(body))
    return prefix + _CRC.pack(zlib.crc32(body, zlib.crc32(prefix))) + body


# ---- parsing: each step checks one part of the header ------------------------------------------
@dataclass(frozen=True)
class _Header:
    version: int
    dtype: torch.dtype
    bits: int
    layout: int
    axis: int
    compression: str | None
    shape: tuple[int, ...]
    params: np.ndarray  # n_params x 2 float32: scale, zero point
    raw_len: int

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def quantized(self) -> bool:
        return self.dtype.is_floating_point and self.bits <= 8

    @property
    def tensor_bytes(self) -> int:
        return self.count * self.dtype.itemsize


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int, what: str) -> memoryview:
        if self.pos + n > len(self.data):
            raise WireError(f"truncated message: {what} needs {n} bytes, "
                            f"{len(self.data) - self.pos} left")
        chunk = self.data[self.pos: self.pos + n]
        self.pos += n
        return chunk


def _as_view(data: bytes) -> memoryview:
    """The message's bytes without copying them (a copy would be payload-sized)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"a tensor message is bytes, not {type(data).__name__}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise WireError("a tensor message must be contiguous bytes: pass bytes(message)")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _read_fixed(reader: _Reader) -> tuple[int, torch.dtype, int, int, int, str | None, int]:
    magic, version, dcode, bits, layout, axis, ccode, ndim, reserved = _FIXED.unpack(
        reader.take(_FIXED.size, "the header"))
    if magic != MAGIC:
        raise WireError("not an edgesplit tensor message (bad magic)")
    if version not in _READABLE_VERSIONS:
        raise WireError(f"wire version {version} is not supported (this edgesplit reads "
                        f"{', '.join(map(str, _READABLE_VERSIONS))}): upgrade the reader")
    if dcode not in _DTYPES:
        raise WireError(f"malformed header: unknown dtype code {dcode}")
    if ccode not in _COMPRESSIONS:
        raise WireError(f"malformed header: unknown compression code {ccode}")
    if layout not in (0, 1):
        raise WireError(f"malformed header: unknown layout {layout}")
    if ndim > MAX_NDIM:
        raise WireError(f"malformed header: rank {ndim} is above the {MAX_NDIM} allowed")
    if reserved != 0:
        raise WireError(f"malformed header: reserved byte is {reserved}, must be 0")
    return version, _DTYPES[dcode], bits, layout, axis, _COMPRESSIONS[ccode], ndim


def _check_width(dtype: torch.dtype, bits: int) -> None:
    if dtype.is_floating_point and not (1 <= bits <= 8 or bits in (16, 32)):
        raise WireError(f"malformed header: a {dtype} payload at {bits} bits (1-8, 16 or 32)")
    if not dtype.is_floating_point and bits != dtype.itemsize * 8:
        raise WireError(f"malformed header: a {dtype} payload at {bits} bits (it travels at "
                        f"{dtype.itemsize * 8})")


def _check_layout(quantized: bool, layout: int, axis: int, ndim: int) -> None:
    if layout == 0 and axis != 0:
        raise WireError(f"malformed header: axis {axis} with a per-tensor layout (must be 0)")
    if layout == 1 and not quantized:
        raise WireError("malformed header: per-channel layout on a payload that is not "
                        "quantized")
    if layout == 1 and axis >= ndim:
        raise WireError(f"malformed header: per-channel axis {axis} of a {ndim}-d tensor")


def _read_params(reader: _Reader, quantized: bool, layout: int, axis: int,
                 shape: tuple[int, ...]) -> np.ndarray:
    (n_params,) = struct.unpack("<I", reader.take(4, "the parameter count"))
    expected = 0 if not quantized else shape[axis] if layout == 1 else 1
    if n_params != expected:
        raise WireError(f"malformed header: {n_params} quantization parameters, the layout "
                        f"needs {expected}")
    params = np.frombuffer(reader.take(8 * n_params, "the parameters"), dtype="<f4")
    params = params.reshape(n_params, 2)
    if not np.isfinite(params).all():
        raise WireError("malformed header: a scale or zero point is not finite")
    if (params[:, 0] <= 0).any():
        raise WireError("malformed header: a scale is not positive")
    return params


def _raw_size(dtype: torch.dtype, bits: int, count: int) -> int:
    if dtype.is_floating_point and bits <= 8:
        return packed_size(count, bits)
    return count * bits // 8


def _check_body_len(compression: str | None, raw_len: int, body_len: int) -> None:
    """What the payload's length alone rules out, before any byte of it is decompressed."""
    if compression is None and body_len != raw_len:
        raise WireError(f"uncompressed payload of {body_len} bytes, the header declares "
                        f"{raw_len}")
    if compression is not None and raw_len == 0:
        raise WireError(f"a {compression} payload declares 0 raw bytes: an empty payload is "
                        f"sent uncompressed")
    if compression == "lz4" and raw_len > _LZ4_MAX_INPUT:
        raise WireError(f"lz4 payload declares {raw_len} raw bytes, more than an lz4 block holds")
    if compression == "lz4" and raw_len > _LZ4_MAX_RATIO * body_len:
        raise WireError(f"lz4 payload of {body_len} bytes cannot expand to the {raw_len} "
                        f"declared (at most {_LZ4_MAX_RATIO}x)")


def _check_expectations(header: _Header, shape: Sequence[int] | None,
                        dtype: torch.dtype | None, max_raw_bytes: int | None) -> None:
    if shape is not None and header.shape != tuple(shape):
        raise WireError(f"tensor has shape {list(header.shape)}, expected {list(shape)}")
    if dtype is not None and header.dtype != dtype:
        raise WireError(f"tensor has dtype {header.dtype}, expected {dtype}")
    if max_raw_bytes is not None:
        size = max(header.raw_len, header.tensor_bytes)
        if size > max_raw_bytes:
            raise WireError(f"tensor of shape {list(header.shape)} ({header.dtype}, "
                            f"{header.raw_len} payload bytes) needs {size} bytes, more than "
                            f"max_raw_bytes={max_raw_bytes}")


def _parse(data: bytes, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
           max_raw_bytes: int | None = None) -> tuple[_Header, memoryview]:
    """The checked header and the (still compressed) payload; nothing payload-sized allocated."""
    view = _as_view(data)
    reader = _Reader(view)
    version, dt, bits, layout, axis, compression, ndim = _read_fixed(reader)
    dims = tuple(struct.unpack(f"<{ndim}I", reader.take(4 * ndim, "the shape")))
    _check_shape(dims)
    _check_width(dt, bits)
    quantized = dt.is_floating_point and bits <= 8
    _check_layout(quantized, layout, axis, ndim)
    params = _read_params(reader, quantized, layout, axis, dims)
    raw_len, body_len = _LENGTHS.unpack(reader.take(_LENGTHS.size, "the lengths"))
    header = _Header(version, dt, bits, layout, axis, compression, dims, params, raw_len)
    if raw_len != _raw_size(dt, bits, header.count):
        raise WireError(f"payload size {raw_len} does not match shape {list(dims)} at {bits} "
                        f"bits")
    _check_body_len(compression, raw_len, body_len)
    _check_expectations(header, shape, dtype, max_raw_bytes)
    crc_end = reader.pos
    (crc,) = _CRC.unpack(reader.take(_CRC.size, "the checksum"))
    body = reader.take(body_len, "the payload")
    if reader.pos != len(view):
        raise WireError(f"{len(view) - reader.pos} unexpected bytes after the payload")
    if zlib.crc32(body, zlib.crc32(view[:crc_end])) != crc:
        raise WireError("checksum mismatch: the message was corrupted")
    return header, body


# ---- decoding -----------------------------------------------------------------------------------
def _unzstd(body: memoryview, raw_len: int) -> bytes:
    """Decompress one zstd frame whose header states exactly ``raw_len`` bytes.

    zstandard sizes its output from the frame's own content size (max_output_size is ignored
    when the frame states one), so that size is checked against the declared raw length first:
    the only allocation is then raw_len bytes."""
    import zstandard

    if bytes(body[:4]) != _ZSTD_MAGIC:
        raise WireError("zstd payload is not a zstd frame (bad frame magic)")
    try:
        size = zstandard.frame_content_size(body)
        dict_id = zstandard.get_frame_parameters(body).dict_id
    except zstandard.ZstdError as exc:
        raise WireError(f"zstd payload has a malformed frame header: {exc}") from None
    if size in (-1, zstandard.CONTENTSIZE_UNKNOWN):  # the C backend says -1
        raise WireError("zstd frame does not state its content size: compress in one call "
                        "(ZSTD_compress) or pledge the size")
    if size != raw_len:
        raise WireError(f"zstd frame states {size} bytes, the header declares {raw_len}")
    if dict_id:
        raise WireError(f"zstd frame needs dictionary {dict_id}; messages use none")
    try:
        return zstandard.ZstdDecompressor().decompress(body, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise WireError(f"cannot decompress the payload (zstd): {exc}") from None


def _unlz4(body: memoryview, raw_len: int) -> bytes:
    """Decompress an lz4 block into at most raw_len bytes (allocated up front: checked before)."""
    import lz4.block

    try:
        return lz4.block.decompress(body, uncompressed_size=raw_len)
    except (lz4.block.LZ4BlockError, ValueError) as exc:
        raise WireError(f"cannot decompress the payload (lz4): {exc}") from None


def _decompress(body: memoryview, method: str | None, raw_len: int) -> memoryview | bytes:
    if method is None:
        return body
    out = _unzstd(body, raw_len) if method == "zstd" else _unlz4(body, raw_len)
    if len(out) != raw_len:
        raise WireError(f"decompressed payload has {len(out)} bytes, expected {raw_len}")
    return out


def _dequantize(body: memoryview, h: _Header) -> torch.Tensor:
    """x = (q - zero_point) * scale in float32, in place on one float32 array, then cast.

    The decompressed bytes and the unpacked values are freed before the cast allocates the
    result, so the peak stays near 5 bytes a value plus the result."""
    raw = _decompress(body, h.compression, h.raw_len)
    q = np.frombuffer(raw, np.uint8) if h.bits == 8 else unpack_bits(raw, h.bits, h.count)
    del raw
    x = torch.from_numpy(q.astype(np.float32).reshape(h.shape))
    del q
    view = [1] * len(h.shape)  # per tensor: broadcast everywhere, and a 0-d tensor stays 0-d
    if h.layout == 1:
        view[h.axis] = -1
    x.sub_(torch.from_numpy(h.params[:, 1].astype(np.float32)).reshape(view))
    x.mul_(torch.from_numpy(h.params[:, 0].astype(np.float32)).reshape(view))
    return x if h.dtype == torch.float32 else x.to(h.dtype)


def _unquantized(body: memoryview, h: _Header) -> torch.Tensor:
    wire = np.dtype(_wire_numpy(h.dtype, h.bits, h.version))
    payload = _decompress(body, h.compression, h.raw_len)
    words = np.frombuffer(payload, dtype=wire).astype(wire.newbyteorder("="))  # owned copy
    del payload
    if h.dtype == torch.bool:
        if words.size and words.max() > 1:
            raise WireError("malformed payload: a bool byte other than 0 or 1")
        words = words.view(np.bool_)
    t = torch.from_numpy(words).reshape(h.shape)
    if wire == np.dtype("<i2"):
        return t.view(torch.bfloat16)
    return t if t.dtype == h.dtype else t.to(h.dtype)


def decode_tensor(data: bytes, *, expect_shape: Sequence[int] | None = None,
                  expect_dtype: torch.dtype | None = None,
                  max_raw_bytes: int | None = None) -> torch.Tensor:
    """The (dequantized) tensor of a message from :func:`encode_tensor`.

    Any malformed, truncated, corrupted or hostile message raises WireError. A caller that knows
    what it expects refuses other messages from their header, before anything payload-sized is
    allocated: ``expect_shape`` and ``expect_dtype`` must match exactly; ``max_raw_bytes`` bounds
    both the uncompressed payload and the decoded tensor (elements x element size)."""
    header, body = _parse(data, expect_shape, expect_dtype, max_raw_bytes)
    return _dequantize(body, header) if header.quantized else _unquantized(body, header)


def message_info(data: bytes) -> dict:
    """The header of a message (validated, CRC included), without decoding the payload."""
    h, body = _parse(data)
    return {"version": h.version, "dtype": str(h.dtype).replace("torch.", ""), "bits": h.bits,
            "shape": list(h.shape), "layout": "per-channel" if h.layout else "per-tensor",
            "axis": h.axis, "compression": h.compression, "payload_bytes": len(body),
            "raw_bytes": h.raw_len, "message_bytes": memoryview(data).nbytes}
