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

Speed: quantized payloads go through the fused numba kernels of quant/_kernels.py where numba
imports (one pass each way, byte-identical to the numpy/torch reference path kept here and in
pack.py); a message is built once, in place; the CRC is python-isal's (zlib's CRC-32, faster).
An uncompressed quantized message is written by :func:`_encode_quantized`: its header bytes
known in advance from its shape, width and layout (:func:`_quantized_layout`, remembered), and
range, parameters and payload from one kernel call (two above the size where the pack runs on
several threads), since per-call Python and numpy steps were a third of a Table 6 tensor's
encode and most of a small one's. :func:`_decode_quantized` reads one back the same way: the
layout its prefix implies, compared with the rest of the header, the CRC, then one kernel call
that checks the parameters and decodes; any message it does not accept whole goes to the
parser, which gives the error.
A plain tensor (sent as its own words) has a header that depends on its shape and dtype alone:
it is built once and cached, and a decoder told what to expect compares those bytes instead of
parsing them (same checks, same errors: any other message goes through the parser).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import struct
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch

from edgesplit.errors import WireError
from edgesplit.quant.pack import pack_bits, packed_size, unpack_bits

__all__ = [
    "MAX_DIM",
    "MAX_ELEMENTS",
    "MAX_NDIM",
    "WIRE_VERSION",
    "PlainCodec",
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
_U32 = struct.Struct("<I")
_PAIR = struct.Struct("<ff")
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
# the dtypes a plain message carries as numpy's own (PlainCodec's arrays): little-endian words
_ARRAYS: dict[torch.dtype, np.dtype[Any]] = {
    torch.float32: np.dtype("<f4"), torch.float16: np.dtype("<f2"),
    torch.int64: np.dtype("<i8"), torch.int32: np.dtype("<i4"),
    torch.uint8: np.dtype("u1"), torch.int8: np.dtype("i1")}
Compress = Literal["zstd", "lz4", "auto"] | None
Message = bytes | bytearray | memoryview  # what decode_tensor reads
_HOST_LE = sys.byteorder == "little"


# ---- the compiled kernels, loaded at first use ---------------------------------------------------
_KERNELS: list[ModuleType | None] = []  # empty until the first quantized tensor


def _kernels() -> ModuleType | None:
    """The numba kernels (quant/_kernels.py), or None: then the numpy/torch reference path runs,
    with the same bytes. Imported at first use, not with edgesplit (numba takes a while to
    import, and compiles each kernel at its first call, from its on-disk cache after that).
    EDGESPLIT_WIRE_KERNELS=0 turns them off; big-endian hosts use the reference path."""
    if not _KERNELS:
        loaded: ModuleType | None = None
        if _HOST_LE and os.environ.get("EDGESPLIT_WIRE_KERNELS", "1") != "0":
            try:
                from edgesplit.quant import _kernels as loaded
            except (ImportError, OSError):  # numba or its LLVM missing or broken: numpy path
                loaded = None
        _KERNELS.append(loaded)
    return _KERNELS[0]


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


# ---- plain messages: a header known in advance --------------------------------------------------
@functools.lru_cache(maxsize=512)
def _plain_head(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[bytes, int] | None:
    """The bytes before the CRC field of an uncompressed message whose payload is ``dtype``'s
    own words (float32 at 32 bits, float16 and bfloat16 at 16, integers and bool), and their
    CRC; None for dtypes sent otherwise (float64) or shapes the format refuses.

    A request's tensors have the plan's shapes, so their headers repeat call after call: the
    encoder writes this one without building it, and a decoder that expects it compares bytes
    instead of parsing fields (a served request runs its codec right after compute, with cold
    caches, where each of the ~30 field checks costs several microseconds)."""
    bits = dtype.itemsize * 8
    if dtype not in _CODES or not _HOST_LE or (dtype.is_floating_point and bits not in (16, 32)):
        return None
    try:
        _check_shape(shape)
    except WireError:
        return None
    raw_len = math.prod(shape) * dtype.itemsize
    head = (_FIXED.pack(MAGIC, WIRE_VERSION, _CODES[dtype], bits, 0, 0, 0, len(shape), 0)
            + struct.pack(f"<{len(shape) + 1}I", *shape, 0) + _LENGTHS.pack(raw_len, raw_len))
    return head, int(_crc32(head))


def _words(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array, a view (numpy has no bfloat16: int16 words)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().reshape(-1).view(np.uint8)


def _encode_plain(t: torch.Tensor, head: bytes, head_crc: int) -> bytes:
    """The message of a contiguous tensor sent as its own words: one copy, checksummed as
    copied. Below the size where checksumming during the copy pays, the message is joined
    from its pieces: three calls instead of a dozen, which is what counts in the cold path
    right after compute (a 4 KB reply 3x faster)."""
    if t.nbytes < _FUSE_MIN:
        # the tensor's own bytes, read in place (through numpy where ctypes is missing)
        array = _memory(t) if _BYTES_API is not None else memoryview(_words(t).data)
        return b"".join((head, _CRC.pack(_crc32(array, head_crc)), array))
    source = _words(t)
    message, view = _new_message(len(head) + _CRC.size + source.size)
    view[: len(head)] = head
    body = np.frombuffer(view, np.uint8, offset=len(head) + _CRC.size)
    _CRC.pack_into(view, len(head), _copy_crc(body, source, head_crc))
    del view, body  # no writable view outlives the build
    return bytes(message) if isinstance(message, bytearray) else message


def _decode_expected(data: Message, shape: tuple[int, ...], dtype: torch.dtype,
                     max_raw_bytes: int | None,
                     plain: tuple[bytes, int] | None = None) -> torch.Tensor | None:
    """The tensor of a plain message whose header is byte for byte the one expected (and whose
    length fits it exactly); None for any other message, which the full parser then reads and
    reports on. Same checks, same result: the header's fields hold what the parser would
    accept, so only the CRC is left to verify. ``plain``: the expected header and its CRC
    (:func:`_plain_head`), when the caller keeps them."""
    if plain is None:
        plain = _plain_head(shape, dtype)
    if plain is None or type(data) not in (bytes, bytearray, memoryview):
        return None
    head, head_crc = plain
    at = len(head) + _CRC.size
    view = memoryview(data)
    if (view.nbytes - at != math.prod(shape) * dtype.itemsize or view[: len(head)] != head
            or (type(data) is memoryview
                and (view.format != "B" or view.ndim != 1 or not view.c_contiguous))
            or (max_raw_bytes is not None and view.nbytes - at > max_raw_bytes)):
        return None
    expected = _CRC.unpack_from(view, len(head))[0]
    body = view[at:]
    if dtype == torch.bool or not body.nbytes or body.nbytes >= _FUSE_MIN:
        return _copy_out(body, shape, dtype, _Checksum(head_crc, expected))
    if _crc32(body, head_crc) != expected:
        raise WireError("checksum mismatch: the message was corrupted")
    # one copy into memory the tensor owns, in the fewest calls (the cold path again: a view
    # of the flat tensor costs less than a reshape there)
    return torch.frombuffer(bytearray(body), dtype=dtype).view(shape)


class PlainCodec:
    """The plain messages of one planned tensor (its shape and dtype; its own words, 16 or 32
    bits, uncompressed): :func:`encode_tensor` and :func:`decode_tensor` with the header built
    and the expectations checked once, for a served request's cold path right after compute,
    where every call costs microseconds. It runs the general functions' own plain-message
    steps (:func:`_encode_plain`, :func:`_decode_expected`), so the bytes and errors are
    theirs; any tensor or message it does not fit goes through them whole."""

    def __init__(self, shape: Sequence[int], dtype: torch.dtype) -> None:
        self.shape, self.dtype = tuple(shape), dtype
        self.bits = dtype.itemsize * 8
        self.plain = _plain_head(self.shape, dtype)  # None: this tensor never travels plain

    def encode(self, t: torch.Tensor, bits: int) -> bytes:
        """``encode_tensor(t, bits)``."""
        if not (self.plain is not None and bits == self.bits and t.dtype is self.dtype
                and t.shape == self.shape and t.is_cpu and t.layout is torch.strided
                and t.is_contiguous()):
            return encode_tensor(t, bits)
        return _encode_plain(t, *self.plain)

    def encode_pieces(self, t: torch.Tensor, bits: int) -> bytes | tuple[bytes, memoryview]:
        """:meth:`encode`'s message, for a plain tensor of :data:`PIECES_MIN` bytes or more as
        two pieces to send back to back: its header with the checksum, and the tensor's own
        memory, not copied (valid while ``t`` lives unchanged: a sender's scatter-gather
        write joins them in the kernel). Anything else comes as :meth:`encode`'s bytes."""
        if not (self.plain is not None and bits == self.bits and t.dtype is self.dtype
                and t.nbytes >= PIECES_MIN and t.shape == self.shape and t.is_cpu
                and t.layout is torch.strided and t.is_contiguous()):
            return self.encode(t, bits)
        head, head_crc = self.plain
        body = memoryview(_words(t).data)  # holds the array, which holds the tensor
        return head + _CRC.pack(int(_crc32(body, head_crc))), body

    def decode(self, data: Message) -> torch.Tensor:
        """``decode_tensor(data, expect_shape=shape, expect_dtype=dtype)``."""
        if self.plain is not None:
            out = _decode_expected(data, self.shape, self.dtype, None, self.plain)
            if out is not None:
                return out
        return decode_tensor(data, expect_shape=self.shape, expect_dtype=self.dtype)

    def encode_array(self, a: np.ndarray) -> bytes:
        """``encode_tensor(torch.from_numpy(a), bits)`` at the dtype's own bits, for a caller
        that holds a numpy array (an ONNX Runtime stage's output): no tensor is made, which
        costs tens of microseconds in the cold path right after compute. An array of another
        shape or dtype, or not contiguous, goes through :func:`encode_tensor`."""
        if not (self.plain is not None and self.dtype in _ARRAYS and a.shape == self.shape
                and a.dtype == _ARRAYS[self.dtype] and a.flags.c_contiguous
                and a.nbytes < _FUSE_MIN):
            return encode_tensor(torch.from_numpy(np.ascontiguousarray(a)), min(self.bits, 32))
        head, head_crc = self.plain
        body = a.reshape(-1).view(np.uint8).data
        return b"".join((head, _CRC.pack(_crc32(body, head_crc)), body))

    def decode_array(self, data: Message) -> np.ndarray:
        """:meth:`decode` as a numpy array that owns its memory (no tensor made), for a codec
        of a dtype numpy has (float32, float16, integers: not bfloat16 or bool). A message
        that is not the plain one expected decodes through :meth:`decode`, its errors
        included."""
        plain, want = self.plain, _ARRAYS.get(self.dtype)
        if plain is not None and want is not None and type(data) in (bytes, bytearray,
                                                                     memoryview):
            head, head_crc = plain
            at = len(head) + _CRC.size
            view = memoryview(data)
            if (view.nbytes - at == math.prod(self.shape) * self.dtype.itemsize
                    and view[: len(head)] == head and view.format == "B" and view.ndim == 1
                    and view.c_contiguous and view.nbytes - at < _FUSE_MIN):
                body = view[at:]
                if _crc32(body, head_crc) != _CRC.unpack_from(view, len(head))[0]:
                    raise WireError("checksum mismatch: the message was corrupted")
                return np.frombuffer(bytearray(body), want).reshape(self.shape)
        return self.decode(data).numpy()

    def decode_in_place(self, data: Message) -> torch.Tensor:
        """:meth:`decode`, but a plain message in a writable buffer whose payload is aligned
        for the dtype is read where it lies: the tensor is a view of ``data`` (checksummed,
        not copied), valid only while the caller leaves the buffer alone. For a server that
        computes on a request before it reads the next one into the same buffer; anything
        else is decoded as :meth:`decode` does."""
        if self.plain is not None and type(data) is memoryview and not data.readonly \
                and self.dtype != torch.bool:
            out = _view_expected(data, self.shape, self.dtype, self.plain)
            if out is not None:
                return out
        return self.decode(data)


def _view_expected(data: memoryview, shape: tuple[int, ...], dtype: torch.dtype,
                   plain: tuple[bytes, int]) -> torch.Tensor | None:
    """The tensor of a plain message whose header is the one expected, as a view of its
    payload in ``data`` after the CRC matched; None when the message is not that, or its
    payload is empty or not aligned for the dtype (the copying decoder then reads it)."""
    head, head_crc = plain
    at = len(head) + _CRC.size
    if (data.nbytes - at != math.prod(shape) * dtype.itemsize or data.nbytes == at
            or data.format != "B" or data.ndim != 1 or not data.c_contiguous
            or data[: len(head)] != head):
        return None
    body = data[at:]
    if int(_crc32(body, head_crc)) != _CRC.unpack_from(data, len(head))[0]:
        raise WireError("checksum mismatch: the message was corrupted")
    flat = torch.frombuffer(body, dtype=torch.uint8)
    if flat.data_ptr() % dtype.itemsize:
        return None
    return flat.view(dtype).view(shape)


def _memory(t: torch.Tensor) -> memoryview:
    """A read-only view of a contiguous CPU tensor's bytes (valid while ``t`` lives)."""
    assert _BYTES_API is not None
    return _BYTES_API[2](t.data_ptr(), t.nbytes, _PYBUF_READ)


# ---- the message buffer and the checksum ------------------------------------------------------
def _crc_function() -> Callable[..., int]:
    """CRC-32 of zlib from python-isal when it imports (same polynomial and values, about ten
    times faster than zlib's here), else zlib's own: the format does not change."""
    try:
        from isal import isal_zlib
    except ImportError:  # pragma: no cover - isal is a dependency; kept for odd platforms
        return zlib.crc32
    return isal_zlib.crc32


_crc32 = _crc_function()
PIECES_MIN = 1 << 20  # below this a copy costs less than building the pieces (a 131 KB
# message was about 0.04 ms slower as pieces in the cold path after compute, 803 KB no faster)
_FUSE_MIN = 2 << 20  # above this, copy and checksum in cache-sized steps (measured: 4 MB 1.7x)
_FUSE_STEP = 256 << 10


def _copy_crc(dst: np.ndarray, src: np.ndarray, crc: int) -> int:
    """Copy ``src`` into ``dst`` (uint8, same size) and return the CRC of the copied bytes.

    A payload larger than the cache is checksummed step by step right after each step is
    copied, while it is still in cache, instead of being read from memory a second time."""
    if dst.size < _FUSE_MIN:
        np.copyto(dst, src)
        return int(_crc32(dst, crc))
    for at in range(0, dst.size, _FUSE_STEP):
        step = dst[at: at + _FUSE_STEP]
        np.copyto(step, src[at: at + _FUSE_STEP])
        crc = _crc32(step, crc)
    return int(crc)


def _bytes_api() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]] | None:
    if sys.implementation.name != "cpython":
        return None
    api = ctypes.pythonapi
    new, at, view = api.PyBytes_FromStringAndSize, api.PyBytes_AsString, api.PyMemoryView_FromMemory
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
    at.restype, at.argtypes = ctypes.c_void_p, (ctypes.py_object,)
    view.restype = ctypes.py_object
    view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
    return new, at, view


_BYTES_API = _bytes_api()
_PYBUF_WRITE = 0x200
_PYBUF_READ = 0x100


def _new_message(size: int) -> tuple[bytes | bytearray, memoryview]:
    """A message of ``size`` bytes and a writable view of it, to be filled in place.

    Messages are ``bytes`` (gRPC's protobuf fields take nothing else), and building one in a
    bytearray would cost a payload-sized copy at the end. CPython's documented way to build
    bytes without that copy is PyBytes_FromStringAndSize(NULL, size), filled through its
    buffer before anyone else sees the object; elsewhere a bytearray is filled and copied."""
    if _BYTES_API is None or size < 2:  # 0 and 1 byte objects are shared singletons
        buf = bytearray(size)
        return buf, memoryview(buf)
    new, at, view = _BYTES_API
    message = new(None, size)
    return message, view(at(message), size, _PYBUF_WRITE)


def _assemble(head: bytes, raw_len: int, body_len: int, fill: Callable[[np.ndarray], None] | None,
              source: np.ndarray | None) -> bytes:
    """The message: ``head``, the two lengths, the CRC, and a body of ``body_len`` bytes either
    copied from ``source`` (uint8) or written in place by ``fill``; one buffer, no copy."""
    crc_at = len(head) + _LENGTHS.size
    message, view = _new_message(crc_at + _CRC.size + body_len)
    view[: len(head)] = head
    _LENGTHS.pack_into(view, len(head), raw_len, body_len)
    body = np.frombuffer(view, np.uint8)[crc_at + _CRC.size:]
    crc = _crc32(view[:crc_at])
    if source is not None:
        crc = _copy_crc(body, source, crc)
    else:
        assert fill is not None
        fill(body)
        crc = _crc32(body, crc)
    _CRC.pack_into(view, crc_at, crc)
    del view, body  # no writable view outlives the build
    return bytes(message) if isinstance(message, bytearray) else message


# ---- encoding -----------------------------------------------------------------------------------
def _params_from_range(lo: np.ndarray, hi: np.ndarray, bits: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) per channel from the float32 range, in float32, each operation
    rounded as torch rounds it. A minimum of -0.0 is taken as +0.0: which zero a min-reduction
    returns depends on its order, and the zero point's sign would show in the header."""
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise _not_finite(bits)
    lo = lo.astype(np.float32) + np.float32(0.0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scale = (hi.astype(np.float32) - lo) / np.float32((1 << bits) - 1)
        scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)  # constant
        zero = (-lo / scale).astype(np.float32)
    if not (np.isfinite(scale).all() and np.isfinite(zero).all()):
        raise _unscalable(bits)
    return scale, zero


def _not_finite(bits: int) -> WireError:
    return WireError(f"cannot quantize a tensor holding inf or NaN to {bits} bits: send it at "
                     f"16 or 32 bits")


def _unscalable(bits: int) -> WireError:
    return WireError(f"the values span a range float32 cannot scale at {bits} bits: send the "
                     f"tensor at 32 bits")


def _quant_params(x: torch.Tensor, bits: int, axis: int | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The reference path's range: torch reductions."""
    channels = 1 if axis is None else x.shape[axis]
    if x.numel() == 0:  # nothing to scale; any valid parameters do
        return np.ones(channels, np.float32), np.zeros(channels, np.float32)
    if axis is None:
        lo, hi = (v.reshape(1) for v in torch.aminmax(x))
    else:  # amin/amax along a dim are vectorised; aminmax(dim=) is 20x slower on CPU
        rows = x.movedim(axis, 0).reshape(channels, -1)
        lo, hi = rows.amin(dim=1), rows.amax(dim=1)
    return _params_from_range(lo.numpy(), hi.numpy(), bits)


def _quantize(x: torch.Tensor, bits: int, axis: int | None) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    """The reference quantization (torch, several passes): codes, scales, zero points."""
    scale, zero = _quant_params(x, bits, axis)
    view = [1] * x.dim()  # keeps a 0-d tensor 0-d
    if axis is not None:
        view[axis] = -1
    s, z = torch.from_numpy(scale).reshape(view), torch.from_numpy(zero).reshape(view)
    q = torch.clamp(torch.round(x / s + z), 0, (1 << bits) - 1).to(torch.uint8)
    return q.numpy(), scale, zero


def _rows(shape: Sequence[int], axis: int | None) -> tuple[int, int, int]:
    """(outer, channels, inner): the flat tensor as outer x channels x inner."""
    if axis is None:
        return 1, 1, math.prod(shape)
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _fast_params(kernels: ModuleType, x: np.ndarray, bits: int, channels: int, inner: int,
                 out: np.ndarray | None = None) -> np.ndarray:
    """The kernels' parameters: one call of the range kernel on this thread, exact, the same
    minimum and maximum as torch's reductions (whose thread pool made this step
    machine-dependent: waking a pool of many cores, or one whose threads wait for a busy core,
    cost 2-60x the reduction itself for a Table 6 tensor), and from them the scales and zero
    points in :func:`_params_from_range`'s float32 operations. Returns one float32 array of
    4 x ``channels``: scales, zero points, then the (scale, zero point) pairs of the header;
    raises what :func:`_params_from_range` raises. With ``out`` (the payload, uint8), a tensor
    small enough for one thread is packed into it by the same call."""
    params = np.empty(4 * channels, np.float32)
    scale, zero, pairs = params[:channels], params[channels: 2 * channels], params[2 * channels:]
    if out is not None and kernels.workers_for(x.size) < 2:
        status = kernels.range_quantize_pack(x, channels, inner, bits, scale, zero, pairs, out)
    else:
        status = kernels.range_params(x.view(np.uint32), channels, inner, bits, scale, zero,
                                      pairs)
        if out is not None and status == kernels.RANGE_OK and x.size:
            kernels.run(kernels.quantize_pack, x.size, x, scale, zero, inner, bits, out)
    _check_range(kernels, status, bits)
    return params


def _check_range(kernels: ModuleType, status: int, bits: int) -> None:
    """The error a range kernel's status stands for, if any."""
    if status == kernels.RANGE_NOT_FINITE:
        raise _not_finite(bits)
    if status != kernels.RANGE_OK:
        raise _unscalable(bits)


@dataclass(frozen=True)
class _Body:
    """What a payload is, and how to put it in the message: copied from ``source`` (uint8
    bytes) or written in place by ``fill``."""
    bits: int
    layout: int
    axis: int
    params: tuple[np.ndarray, np.ndarray]
    raw_len: int
    source: np.ndarray | None = None
    fill: Callable[[np.ndarray], None] | None = None


_NO_PARAMS = (np.ones(0, np.float32), np.zeros(0, np.float32))
_NO_PARAMS_READ = np.zeros((0, 2), "<f4")


def _raw_bytes(a: np.ndarray) -> np.ndarray:
    """The little-endian bytes of ``a`` as a flat uint8 array (a view on little-endian hosts)."""
    if _HOST_LE or a.dtype.itemsize == 1:
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return np.frombuffer(_le_bytes(a), np.uint8)


def _converting(t: torch.Tensor, wire: torch.dtype) -> Callable[[np.ndarray], None]:
    """Write ``t`` converted to ``wire`` (float16 or float32) straight into the payload, with
    torch's conversion (the rounding the reference's ``t.to(wire)`` does)."""
    kernels = _kernels() if (t.dtype, wire) == (torch.float32, torch.float16) else None

    def fill(out: np.ndarray) -> None:
        if kernels is not None:  # torch's own threads crawl on a busy machine (20x at 4 MB)
            flat = t.numpy().reshape(-1)
            kernels.run(kernels.float_to_half, flat.size, flat, out.view(np.uint16))
            return
        words = out.view(np.float16 if wire == torch.float16 else np.float32)
        torch.from_numpy(words).copy_(t.reshape(-1))
    return fill


def _plain(t: torch.Tensor, bits: int) -> _Body:
    """A payload that is not quantized: integers, bfloat16 at 16 bits, floats at 16/32."""
    if not t.is_floating_point():
        return _Body(t.element_size() * 8, 0, 0, _NO_PARAMS, t.numel() * t.element_size(),
                     source=_raw_bytes(t.numpy()))
    if bits == 16 and t.dtype == torch.bfloat16:  # its own words: lossless
        return _Body(16, 0, 0, _NO_PARAMS, t.numel() * 2,
                     source=_raw_bytes(t.view(torch.int16).numpy()))
    wire = torch.float16 if bits == 16 else torch.float32
    if t.dtype == wire:
        return _Body(bits, 0, 0, _NO_PARAMS, t.numel() * bits // 8, source=_raw_bytes(t.numpy()))
    if _HOST_LE:
        return _Body(bits, 0, 0, _NO_PARAMS, t.numel() * bits // 8, fill=_converting(t, wire))
    return _Body(bits, 0, 0, _NO_PARAMS, t.numel() * bits // 8,
                 source=_raw_bytes(t.to(wire).numpy()))


def _quantized(t: torch.Tensor, bits: int, axis: int | None) -> _Body:
    """A quantized payload: fused kernels where they load, else the reference path."""
    layout, axis_field, x = (0 if axis is None else 1), axis or 0, t.float()
    raw_len = packed_size(x.numel(), bits)
    kernels = _kernels()
    if kernels is None:
        q, scale, zero = _quantize(x, bits, axis)
        return _Body(bits, layout, axis_field, (scale, zero), raw_len,
                     source=np.frombuffer(pack_bits(q, bits), np.uint8))
    flat = x.numpy().reshape(-1)
    _, channels, inner = _rows(x.shape, axis)
    params = _fast_params(kernels, flat, bits, channels, inner)
    scale, zero = params[:channels], params[channels: 2 * channels]

    def fill(out: np.ndarray) -> None:
        if flat.size:
            kernels.run(kernels.quantize_pack, flat.size, flat, scale, zero, inner, bits, out)
    return _Body(bits, layout, axis_field, (scale, zero), raw_len, fill=fill)


def _body(t: torch.Tensor, bits: int, per_channel_axis: int | None) -> _Body:
    """The payload of a contiguous tensor."""
    if not t.is_floating_point() or bits in (16, 32):
        return _plain(t, bits)
    return _quantized(t, bits, _channel_axis(t, per_channel_axis))


def _channel_axis(t: torch.Tensor, per_channel_axis: int | None) -> int | None:
    """The per-channel axis as a non-negative index (None: per tensor), or the error."""
    return _axis_index(t.dim(), per_channel_axis)


def _axis_index(ndim: int, per_channel_axis: int | None) -> int | None:
    """:func:`_channel_axis` for a tensor of rank ``ndim``."""
    if per_channel_axis is None:
        return None
    if not -ndim <= per_channel_axis < ndim:
        allowed = f" or {-ndim}..{ndim - 1}" if ndim else ""
        raise WireError(f"per_channel_axis {per_channel_axis} is not an axis of a "
                        f"{ndim}-d tensor: use None (per tensor){allowed}")
    return per_channel_axis % ndim


@functools.lru_cache(maxsize=MAX_NDIM + 1)
def _quantized_fields(ndim: int) -> struct.Struct:
    """The fixed header, the shape and the parameter count of a message of rank ``ndim``."""
    return struct.Struct(f"<4sBBBBBBBB{ndim + 1}I")


@dataclass(frozen=True)
class _QuantizedLayout:
    """Where the fields of an uncompressed quantized message of one shape, dtype, width and
    layout lie, and the bytes that depend on those alone: a served tensor's messages repeat
    them call after call, so the encoder copies them and the decoder compares them instead of
    building and checking each field (what the Python side of a Table 6 encode and decode was
    spending most of its 15 us each on, with caches cold after the kernel's pass)."""
    prefix: bytes  # the fixed header, the shape and the parameter count
    lengths: bytes  # raw_len and payload_len, equal: the payload is not compressed
    shape: tuple[int, ...]
    dtype: torch.dtype
    bits: int
    channels: int
    inner: int  # the run length of one channel (0 for an empty tensor)
    count: int
    pairs_at: int
    crc_at: int
    body_at: int
    size: int  # of the whole message

    @property
    def lengths_at(self) -> int:
        return self.crc_at - _LENGTHS.size


@functools.lru_cache(maxsize=256)
def _quantized_layout(shape: tuple[int, ...], dtype: torch.dtype, bits: int,
                      per_channel_axis: int | None) -> _QuantizedLayout:
    """The layout of the message of a ``dtype`` tensor of ``shape`` at ``bits`` (1-8),
    quantized per tensor (``per_channel_axis`` None) or along that axis (negative counts
    from the end); raises what :func:`_check_shape` and then :func:`_axis_index` raise, in
    encode_tensor's order (an error is not remembered)."""
    _check_shape(shape)
    axis = _axis_index(len(shape), per_channel_axis)
    _, channels, inner = _rows(shape, axis)
    count = math.prod(shape)
    raw_len = packed_size(count, bits)
    prefix = _quantized_fields(len(shape)).pack(
        MAGIC, WIRE_VERSION, _CODES[dtype], bits, int(axis is not None), axis or 0, 0,
        len(shape), 0, *shape, channels)
    crc_at = len(prefix) + 8 * channels + _LENGTHS.size
    body_at = crc_at + _CRC.size
    return _QuantizedLayout(prefix, _LENGTHS.pack(raw_len, raw_len), shape, dtype, bits,
                            channels, inner if count else 0, count, len(prefix), crc_at,
                            body_at, body_at + raw_len)


@functools.lru_cache(maxsize=256)
def _known_quantized(prefix: bytes) -> _QuantizedLayout | None:
    """The layout that a message's prefix (:func:`_known_prefix`'s bytes) implies, when it
    is that of an uncompressed quantized message, else None; raises what the parser raises
    for the prefix. One remembered lookup per decoded message."""
    _, dtype, bits, layout, axis, compression, dims, _ = _known_prefix(prefix)
    if compression is not None or not (dtype.is_floating_point and bits <= 8):
        return None
    return _quantized_layout(dims, dtype, bits, axis if layout else None)


def _encode_quantized(kernels: ModuleType, t: torch.Tensor, bits: int,
                      per_channel_axis: int | None) -> bytes:
    """:func:`encode_tensor`'s uncompressed quantized message through the kernels, written in
    place: the header's bytes known in advance (:func:`_quantized_layout`) copied in, the
    parameters and the payload written by one kernel call straight into the message (the
    same bytes as :func:`_body` and :func:`_assemble`, with a dozen Python and numpy calls
    fewer). A tensor large enough for several threads goes through :func:`_fast_params`.
    Raises :func:`_quantized_layout`'s errors (the shape's, then the axis')."""
    layout = _quantized_layout(tuple(t.shape), t.dtype, bits, per_channel_axis)
    x = t if t.dtype == torch.float32 else t.float()
    flat = x.numpy().reshape(-1)
    message, view = _new_message(layout.size)
    out = np.frombuffer(view, np.uint8)
    if kernels.workers_for(flat.size) < 2:
        _check_range(kernels, kernels.encode_message(
            flat, layout.channels, layout.inner, bits, out, layout.pairs_at, layout.body_at),
            bits)
    else:
        params = _fast_params(kernels, flat, bits, layout.channels, layout.inner,
                              out[layout.body_at:])
        out[layout.pairs_at: layout.lengths_at] = params[2 * layout.channels:].view(np.uint8)
    view[: layout.pairs_at] = layout.prefix
    view[layout.lengths_at: layout.crc_at] = layout.lengths
    _CRC.pack_into(view, layout.crc_at,
                   _crc32(out[layout.body_at:], _crc32(view[: layout.crc_at])))
    del view, out  # no writable view outlives the build
    return bytes(message) if isinstance(message, bytearray) else message


def _compress(payload: np.ndarray, method: Compress) -> tuple[int, np.ndarray | bytes]:
    candidates = ["zstd", "lz4"] if method == "auto" else [method] if method else []
    best: tuple[int, np.ndarray | bytes] = (0, payload)
    for name in candidates:
        if name == "zstd":
            import zstandard

            # one call: the frame states its content size
            packed = zstandard.ZstdCompressor(level=3).compress(payload.data)
        elif len(payload) > _LZ4_MAX_INPUT:
            continue  # beyond what an lz4 block holds: send it another way
        else:
            import lz4.block

            packed = lz4.block.compress(payload, store_size=False)
        if len(packed) < len(best[1]):  # only when it pays
            best = (_COMPRESSION_CODES[name], packed)
    return best


def _head(t: torch.Tensor, body: _Body, code: int) -> bytes:
    head = _FIXED.pack(MAGIC, WIRE_VERSION, _CODES[t.dtype], body.bits, body.layout, body.axis,
                       code, t.dim(), 0)
    scale, zero = body.params
    head += struct.pack(f"<{t.dim() + 1}I", *t.shape, len(scale))
    if not len(scale):
        return head
    pairs = np.empty((len(scale), 2), "<f4")
    pairs[:, 0], pairs[:, 1] = scale, zero
    return head + pairs.tobytes()


def encode_tensor(t: torch.Tensor, bits: int, compress: Compress = None, *,
                  per_channel_axis: int | None = None) -> bytes:
    """Quantize (floating tensors at 1-8 bits) or convert (16/32 bits) and pack ``t``.

    Integer and bool tensors travel as they are at any valid ``bits``; ``per_channel_axis``
    applies to quantized floats only. docs/wire-format.md specifies the bytes. Uncompressed,
    the message is built in one buffer: the payload is written (or quantized and packed)
    straight into it."""
    if t.requires_grad or not t.is_cpu or t.layout != torch.strided or not t.is_contiguous():
        # three dispatched calls that return ``t`` itself otherwise, each costly in the cold
        # path right after compute (a served reply's encode: 65 -> 12 us for 4 KB)
        t = t.detach().cpu().contiguous()
    if t.dtype not in _CODES:
        raise WireError(f"dtype {t.dtype} cannot be sent; supported: "
                        f"{', '.join(str(d) for d in _CODES)}")
    if not (1 <= bits <= 8 or bits in (16, 32)):
        raise WireError(f"bits must be 1-8 (quantized), 16 or 32 (float), got {bits}")
    if compress not in ("zstd", "lz4", "auto", None):
        raise WireError(f"unknown compression {compress!r}: use 'zstd', 'lz4', 'auto' or None")
    if compress is None and bits == t.dtype.itemsize * 8:
        plain = _plain_head(tuple(t.shape), t.dtype)
        if plain is not None:
            return _encode_plain(t, *plain)
    if compress is None and bits <= 8 and t.is_floating_point():
        kernels = _kernels()
        if kernels is not None:  # checks the shape and then the axis, as below
            return _encode_quantized(kernels, t, bits, per_channel_axis)
    _check_shape(t.shape)
    body = _body(t, bits, per_channel_axis)
    if compress is None:
        return _assemble(_head(t, body, 0), body.raw_len, body.raw_len, body.fill, body.source)
    payload = body.source
    if payload is None:
        payload = np.empty(body.raw_len, np.uint8)
        assert body.fill is not None
        body.fill(payload)
    code, packed = _compress(payload, compress)
    return _assemble(_head(t, body, code), body.raw_len, len(packed), None,
                     np.frombuffer(packed, np.uint8))


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
    count: int  # elements: the product of the shape

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

    def unpack(self, fields: struct.Struct, what: str) -> tuple[Any, ...]:
        """:meth:`take` and unpack in one step (no slice of the message)."""
        if self.pos + fields.size > len(self.data):
            raise WireError(f"truncated message: {what} needs {fields.size} bytes, "
                            f"{len(self.data) - self.pos} left")
        values = fields.unpack_from(self.data, self.pos)
        self.pos += fields.size
        return values


def _as_view(data: Message) -> memoryview:
    """The message's bytes without copying them (a copy would be payload-sized)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"a tensor message is bytes, not {type(data).__name__}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise WireError("a tensor message must be contiguous bytes: pass bytes(message)")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


@functools.lru_cache(maxsize=MAX_NDIM + 1)
def _shape_fields(ndim: int) -> struct.Struct:
    """The shape's fields of a message of rank ``ndim`` (at most MAX_NDIM: _read_fixed checks
    it first)."""
    return struct.Struct(f"<{ndim}I")


def _read_fixed(reader: _Reader) -> tuple[int, torch.dtype, int, int, int, str | None, int]:
    magic, version, dcode, bits, layout, axis, ccode, ndim, reserved = reader.unpack(
        _FIXED, "the header")
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


def _read_param_count(reader: _Reader, quantized: bool, layout: int, axis: int,
                      shape: tuple[int, ...]) -> int:
    (n_params,) = reader.unpack(_U32, "the parameter count")
    expected = 0 if not quantized else shape[axis] if layout == 1 else 1
    if n_params != expected:
        raise WireError(f"malformed header: {n_params} quantization parameters, the layout "
                        f"needs {expected}")
    return int(n_params)


def _read_params(reader: _Reader, n_params: int) -> np.ndarray:
    if n_params == 0:  # unquantized: nothing to check (numpy calls cost microseconds each)
        return _NO_PARAMS_READ
    at = reader.pos
    params = np.frombuffer(reader.take(8 * n_params, "the parameters"), dtype="<f4")
    params = params.reshape(n_params, 2)
    kernels = _kernels()
    if n_params == 1:  # per tensor: two numbers, checked without numpy's calls
        scale, zero = _PAIR.unpack_from(reader.data, at)
        finite, positive = math.isfinite(scale) and math.isfinite(zero), scale > 0
    elif kernels is not None:  # per channel: one call
        status = kernels.check_params(params)
        finite, positive = status != kernels.PARAMS_NOT_FINITE, status == kernels.PARAMS_OK
    else:
        finite = bool(np.isfinite(params).all())
        positive = finite and not (params[:, 0] <= 0).any()
    if not finite:
        raise WireError("malformed header: a scale or zero point is not finite")
    if not positive:
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


_Prefix = tuple[int, torch.dtype, int, int, int, str | None, tuple[int, ...], int]


def _read_prefix(reader: _Reader) -> _Prefix:
    """The fields before the parameters (the fixed header, the shape, the parameter count),
    each checked: what depends on them alone."""
    version, dt, bits, layout, axis, compression, ndim = _read_fixed(reader)
    dims = reader.unpack(_shape_fields(ndim), "the shape")
    _check_shape(dims)
    _check_width(dt, bits)
    quantized = dt.is_floating_point and bits <= 8
    _check_layout(quantized, layout, axis, ndim)
    n_params = _read_param_count(reader, quantized, layout, axis, dims)
    return version, dt, bits, layout, axis, compression, dims, n_params


def _prefix_size(view: memoryview) -> int:
    """The length of the fields :func:`_read_prefix` reads, when the message holds them all
    (its rank byte within the limit), else 0."""
    if len(view) < _FIXED.size or view[10] > MAX_NDIM:
        return 0
    size = _FIXED.size + 4 * view[10] + _U32.size
    return size if len(view) >= size else 0


@functools.lru_cache(maxsize=256)
def _known_prefix(prefix: bytes) -> _Prefix:
    """:func:`_read_prefix` of a message's first bytes, remembered: a server's requests repeat
    their shapes and widths, and these ~20 checks were 1.4 of the 6.6 us a small message took
    to parse. The checks depend on these bytes alone, so a remembered result is the one the
    reader would give; a refused prefix raises and is not remembered."""
    return _read_prefix(_Reader(memoryview(prefix)))


def _parse(data: Message, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
           max_raw_bytes: int | None = None) -> tuple[_Header, memoryview, _Checksum]:
    """The checked header, the (still compressed) payload, and what its CRC must be; nothing
    payload-sized allocated."""
    return _parse_view(_as_view(data), shape, dtype, max_raw_bytes)


def _parse_view(view: memoryview, shape: Sequence[int] | None, dtype: torch.dtype | None,
                max_raw_bytes: int | None) -> tuple[_Header, memoryview, _Checksum]:
    """:func:`_parse` of a message's :func:`_as_view`."""
    reader = _Reader(view)
    size = _prefix_size(view)
    if size:  # the fields up to the parameters, each checked once per distinct prefix
        prefix = _known_prefix(bytes(view[:size]))
        reader.pos = size
    else:  # too short to hold them: the reader says what is missing
        prefix = _read_prefix(reader)
    version, dt, bits, layout, axis, compression, dims, n_params = prefix
    params = _read_params(reader, n_params)
    raw_len, body_len = reader.unpack(_LENGTHS, "the lengths")
    header = _Header(version, dt, bits, layout, axis, compression, dims, params, raw_len,
                     math.prod(dims))
    if raw_len != _raw_size(dt, bits, header.count):
        raise WireError(f"payload size {raw_len} does not match shape {list(dims)} at {bits} "
                        f"bits")
    _check_body_len(compression, raw_len, body_len)
    _check_expectations(header, shape, dtype, max_raw_bytes)
    crc_end = reader.pos
    (crc,) = reader.unpack(_CRC, "the checksum")
    body = reader.take(body_len, "the payload")
    if reader.pos != len(view):
        raise WireError(f"{len(view) - reader.pos} unexpected bytes after the payload")
    return header, body, _Checksum(int(_crc32(view[:crc_end])), crc)


@dataclass(frozen=True)
class _Checksum:
    """The CRC of the bytes before the checksum field, and the field: the payload's part is
    added by whoever reads the payload (a large plain payload is checked while copied)."""
    head: int
    expected: int

    def verify(self, payload_crc: int) -> None:
        if payload_crc != self.expected:
            raise WireError("checksum mismatch: the message was corrupted")


def _parse_checked(data: Message, shape: Sequence[int] | None = None,
                   dtype: torch.dtype | None = None, max_raw_bytes: int | None = None
                   ) -> tuple[_Header, memoryview]:
    """The header and the payload of a message whose CRC matches."""
    header, body, checksum = _parse(data, shape, dtype, max_raw_bytes)
    checksum.verify(int(_crc32(body, checksum.head)))
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


def _layout(h: _Header) -> tuple[np.ndarray, np.ndarray, int]:
    """Scales, zero points (fresh float32 arrays: one copy of the header's pairs, as rows) and
    the run length of one channel."""
    scale, zero = np.array(h.params.T, dtype=np.float32, order="C")
    inner = h.count // h.shape[h.axis] // math.prod(h.shape[:h.axis]) if h.layout else h.count
    return scale, zero, inner


def _dequantize_reference(raw: memoryview | bytes, h: _Header) -> torch.Tensor:
    """x = (q - zero_point) * scale in float32, in place on one float32 array.

    The unpacked values are freed before the result is used, so the peak stays near 5 bytes a
    value plus the result."""
    q = np.frombuffer(raw, np.uint8) if h.bits == 8 else unpack_bits(raw, h.bits, h.count)
    x = torch.from_numpy(q.astype(np.float32).reshape(h.shape))
    del q
    view = [1] * len(h.shape)  # per tensor: broadcast everywhere, and a 0-d tensor stays 0-d
    if h.layout == 1:
        view[h.axis] = -1
    x.sub_(torch.from_numpy(h.params[:, 1].astype(np.float32)).reshape(view))
    x.mul_(torch.from_numpy(h.params[:, 0].astype(np.float32)).reshape(view))
    return x


def _dequantize(body: memoryview, h: _Header) -> torch.Tensor:
    """The float32 values of a quantized payload, then cast to the tensor's dtype: unpacked and
    dequantized in one pass straight into the result where the kernels load."""
    raw = _decompress(body, h.compression, h.raw_len)
    kernels = _kernels()
    if kernels is None:
        x = _dequantize_reference(raw, h)
    else:
        x = torch.empty(h.shape, dtype=torch.float32)
        if h.count:
            scale, zero, inner = _layout(h)
            kernels.run(kernels.unpack_dequantize, h.count, np.frombuffer(raw, np.uint8), scale,
                        zero, inner, h.bits, x.numpy().reshape(-1))
    del raw
    return x if h.dtype == torch.float32 else x.to(h.dtype)


def _copied(body: memoryview, h: _Header, checksum: _Checksum) -> torch.Tensor:
    return _copy_out(body, h.shape, h.dtype, checksum)


def _copy_out(body: memoryview, shape: tuple[int, ...], dtype: torch.dtype,
              checksum: _Checksum) -> torch.Tensor:
    """An uncompressed payload whose words are the tensor's own (float32 at 32 bits, float16 or
    bfloat16 at 16, integers, bool): one copy into a tensor that owns its memory (the message
    may be a receive buffer about to be reused), checksummed as it is copied."""
    source = np.frombuffer(body, np.uint8)
    if source.size < _FUSE_MIN:  # checked before anything payload-sized is allocated
        checksum.verify(int(_crc32(source, checksum.head)))
    out = torch.empty(shape, dtype=dtype)
    target = _words(out)
    if source.size < _FUSE_MIN:
        np.copyto(target, source)
    else:  # the size of bytes received, allocated before the CRC is known (docs/wire-format.md)
        checksum.verify(_copy_crc(target, source, checksum.head))
    if dtype == torch.bool and target.size and target.max() > 1:
        raise WireError("malformed payload: a bool byte other than 0 or 1")
    return out


def _is_copy(h: _Header) -> bool:
    if h.compression is not None or not _HOST_LE:
        return False
    if not h.dtype.is_floating_point:
        return True
    if h.bits == 16 and h.dtype == torch.bfloat16:
        return h.version >= 2  # version 1 sent float16 words
    return h.bits == h.dtype.itemsize * 8


def _unquantized(body: memoryview, h: _Header) -> torch.Tensor:
    """Payloads to convert (or decompress): float16 words to float32 with the kernel, others
    as numpy words converted by torch."""
    wire = np.dtype(_wire_numpy(h.dtype, h.bits, h.version))
    payload = _decompress(body, h.compression, h.raw_len)
    kernels = _kernels()
    if wire == np.dtype("<f2") and h.dtype == torch.float32 and kernels is not None:
        out = torch.empty(h.shape, dtype=torch.float32)
        if h.count:
            kernels.run(kernels.half_to_float, h.count, np.frombuffer(payload, np.uint8),
                        out.view(-1).view(torch.int32).numpy().view(np.uint32))
        return out
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


def _decode_quantized(view: memoryview, shape: Sequence[int] | None,
                      dtype: torch.dtype | None, max_raw_bytes: int | None
                      ) -> torch.Tensor | None:
    """The tensor of an uncompressed quantized message that is well-formed in every respect,
    read in one kernel call; None for any other message, which the parser then reads and
    refuses with its own error. Its prefix is checked as the parser checks it (the same
    remembered checks, the same errors); every byte after it is compared with the layout
    that prefix implies (:func:`_quantized_layout`: the lengths, and the message's own
    length), the CRC verified, and the parameters checked by the kernel before it decodes:
    what the parser's two dozen steps establish, in a few. For a tensor small enough for one
    thread (larger ones are not spending their time here)."""
    if len(view) < _FIXED.size or view[6] > 8 or view[9]:  # 16/32 bits or compressed:
        return None  # left to the parser at once (a plain message's decode stays as fast)
    size = _prefix_size(view)
    kernels = _kernels()
    if not size or kernels is None:
        return None
    fields = _known_quantized(bytes(view[:size]))
    if fields is None:
        return None
    dims, dt = fields.shape, fields.dtype
    if (view.nbytes != fields.size or kernels.workers_for(fields.count) > 1
            or view[fields.lengths_at: fields.crc_at] != fields.lengths
            or (shape is not None and tuple(shape) != dims) or (dtype is not None and dtype != dt)
            or (max_raw_bytes is not None
                and max(fields.size - fields.body_at, fields.count * dt.itemsize)
                > max_raw_bytes)
            or _crc32(view[fields.body_at:], _crc32(view[: fields.crc_at]))
            != _CRC.unpack_from(view, fields.crc_at)[0]):
        return None
    # numpy's memory, as the reference path's: allocated in a third of torch.empty's time,
    # and the kernel wrote into it faster (38 against 43 us for a Table 6 tensor)
    out = np.empty(dims, np.float32)
    if kernels.decode_message(np.frombuffer(view, np.uint8), fields.pairs_at, fields.channels,
                              fields.body_at, fields.inner, fields.bits, out.reshape(-1)
                              ) != kernels.PARAMS_OK:
        return None
    x = torch.from_numpy(out)
    return x if dt == torch.float32 else x.to(dt)


def decode_tensor(data: Message, *,
                  expect_shape: Sequence[int] | None = None,
                  expect_dtype: torch.dtype | None = None,
                  max_raw_bytes: int | None = None) -> torch.Tensor:
    """The (dequantized) tensor of a message from :func:`encode_tensor`.

    ``data`` may be bytes, a bytearray or a memoryview (a slice of a larger receive buffer
    included); the tensor never shares memory with it. Any malformed, truncated, corrupted or
    hostile message raises WireError. A caller that knows what it expects refuses other
    messages from their header, before anything payload-sized is allocated: ``expect_shape``
    and ``expect_dtype`` must match exactly; ``max_raw_bytes`` bounds both the uncompressed
    payload and the decoded tensor (elements x element size)."""
    if expect_shape is not None and expect_dtype is not None:
        fast = _decode_expected(data, tuple(expect_shape), expect_dtype, max_raw_bytes)
        if fast is not None:
            return fast
    view = _as_view(data)
    quantized = _decode_quantized(view, expect_shape, expect_dtype, max_raw_bytes)
    if quantized is not None:
        return quantized
    header, body, checksum = _parse_view(view, expect_shape, expect_dtype, max_raw_bytes)
    if _is_copy(header):
        return _copied(body, header, checksum)
    checksum.verify(int(_crc32(body, checksum.head)))
    return _dequantize(body, header) if header.quantized else _unquantized(body, header)


def message_info(data: Message) -> dict:
    """The header of a message (validated, CRC included), without decoding the payload."""
    h, body = _parse_checked(data)
    return {"version": h.version, "dtype": str(h.dtype).replace("torch.", ""), "bits": h.bits,
            "shape": list(h.shape), "layout": "per-channel" if h.layout else "per-tensor",
            "axis": h.axis, "compression": h.compression, "payload_bytes": len(body),
            "raw_bytes": h.raw_len, "message_bytes": memoryview(data).nbytes}
