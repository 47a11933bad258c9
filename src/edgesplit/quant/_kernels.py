# numba types these kernels (uint32 arithmetic, intrinsics) in ways mypy cannot follow.
# mypy: disable-error-code="import-untyped,call-arg,var-annotated,assignment"
"""Compiled kernels of the wire format: fused quantize + pack and unpack + dequantize.

The numpy/torch path in wire.py and pack.py makes several passes and a temporary array per step
(x / s, + z, round, clamp, a uint8 array, lanes, the packed bytes, then a copy into the
message); these kernels make one pass, reading the float32 input and writing the packed bytes
straight into the message (and back: the packed bytes straight into the result's float32
memory). numba compiles them on first use (``cache=True`` keeps the machine code across
processes) and they release the GIL, so server threads encode and decode side by side.

The results are byte-identical to the reference path (tests/quant/test_wire.py compares them): every
operation is the reference's, in float32, in the same order, rounded after each step (no
fastmath, so no reassociation and no fused multiply-add): ``q = clamp(rint(x / s + z), 0, top)``
with round-half-even, and ``x = (float32(q) - z) * s``. Bit widths 1, 2, 4, 6 and 8 have
loops of their own; 3, 5 and 7 go through a 64-bit word per group of eight values, as pack.py
does. Per-channel tensors whose rows (the elements of one channel between two others) are a
multiple of eight values long run row by row through the same loops; other per-channel shapes
go value by value with a running channel index.

Every index is derived from sizes that the caller (wire.py) has checked against the message;
numba does not check bounds, so these functions are private and take only checked sizes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["PARALLEL_MIN", "PARAMS_NOT_FINITE", "PARAMS_NOT_POSITIVE", "PARAMS_OK",
           "RANGE_NOT_FINITE", "RANGE_OK", "RANGE_UNSCALABLE", "check_params", "decode_message",
           "encode_message", "float_to_half", "half_to_float", "quantize_pack", "range_params",
           "range_quantize_pack", "run", "unpack_dequantize", "value_range", "workers_for"]

_F0 = np.float32(0.0)
_U = np.uint32
_U64_FF = np.uint64(0xFF)
_BLOCK6 = 3072  # packed bytes of 6-bit codes per step (4096 values: their bytes stay in L1)


@intrinsic
def _lrint(typingctx, value):
    """A float32 rounded to an int32 in the current rounding mode (half to even unless a
    program changed it, as for every float operation here): LLVM's lrint, one conversion
    instruction where it vectorises (vcvtps2dq), where adding and subtracting 2^23 took
    three operations and the pack loops are bound by their operation count (4-bit packing
    of a Table 6 tensor about 8 % faster)."""
    def codegen(context, builder, signature, args):
        i32, f32 = ir.IntType(32), ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.lrint", [i32, f32],
                                              ir.FunctionType(i32, [f32]))
        return builder.call(fn, [args[0]])
    return types.int32(types.float32), codegen


@njit(inline="always")
def _q(v, s, z, top):
    """One value's code, float32 throughout as the reference computes it. Clamping before
    rounding gives the reference's clamp(rint(.)) (0 and top are integers, no NaN reaches
    here), and on [0, top] the rounding is rint's, half to even."""
    r = v / s + z
    if r < _F0:
        r = _F0
    if r > top:
        r = top
    return np.uint32(_lrint(r))


@njit(inline="always")
def _dq(q, s, z):
    """One value from its code (below 2^8: converted as a signed integer, one instruction
    under every instruction set, where an unsigned conversion is several without AVX-512)."""
    return (np.float32(np.int32(q)) - z) * s


@njit(inline="always")
def _qpack_tail(x, start, stop, s, z, bits, top, out):
    """The last, partial group of eight: only the bytes its values need are written."""
    word = np.uint64(0)
    for j in range(stop - start):
        word |= np.uint64(_q(x[start + j], s, z, top)) << np.uint64(j * bits)
    first = start // 8 * bits
    for b in range(((stop - start) * bits + 7) // 8):
        out[first + b] = np.uint8((word >> np.uint64(8 * b)) & _U64_FF)


@njit(inline="always")
def _qpack6(v, s, z, top, o):
    """6 bits: four values in three bytes, a block at a time: the codes as bytes first (a loop
    over contiguous values, which vectorises as the 8-bit one does), then the bytes packed;
    one loop over groups of four values vectorised worse (a Table 6 tensor's pack 100 ->
    92 us)."""
    codes = np.empty(_BLOCK6 // 3 * 4, np.uint8)
    for start in range(0, o.size, _BLOCK6):
        ob = o[start: min(start + _BLOCK6, o.size)]
        vb = v[start // 3 * 4: (start + ob.size) // 3 * 4]
        for i in range(vb.size):
            codes[i] = np.uint8(_q(vb[i], s, z, top))
        for g in range(ob.size // 3):
            a, b, c, d = codes[4 * g], codes[4 * g + 1], codes[4 * g + 2], codes[4 * g + 3]
            ob[3 * g] = a | (b << np.uint8(6))
            ob[3 * g + 1] = (b >> np.uint8(2)) | (c << np.uint8(4))
            ob[3 * g + 2] = (c >> np.uint8(4)) | (d << np.uint8(2))


@njit(inline="always")
def _qpack_words(v, s, z, bits, o):
    """Groups of eight values in ``bits`` bytes through a 64-bit word; inlined with ``bits`` a
    constant, so that the loops over a group unroll (3 bits: 3.5x faster than a variable
    width; 5 and 7 bits stay scalar, about as slow as before)."""
    top = np.float32((1 << bits) - 1)
    for g in range(o.size // bits):
        word = np.uint64(0)
        for k in range(8):
            word |= np.uint64(_q(v[8 * g + k], s, z, top)) << np.uint64(k * bits)
        for b in range(bits):
            o[g * bits + b] = np.uint8((word >> np.uint64(8 * b)) & _U64_FF)


@njit(nogil=True, cache=True)
def _qpack_run(x, start, stop, s, z, bits, out):
    """Values [start, stop) of ``x`` (start a multiple of 8) at one scale and zero point.

    The loops run over slices from index 0: numba wraps negative indices, and only an index
    known to be non-negative lets LLVM drop that check and vectorise."""
    top = np.float32((1 << bits) - 1)
    full = start + (stop - start) // 8 * 8
    v = x[start:full]
    o = out[start // 8 * bits: full // 8 * bits]
    if bits == 8:
        for i in range(o.size):
            o[i] = np.uint8(_q(v[i], s, z, top))
    elif bits == 4:
        for i in range(o.size):
            o[i] = np.uint8(_q(v[2 * i], s, z, top) | (_q(v[2 * i + 1], s, z, top) << 4))
    elif bits == 2:
        for i in range(o.size):
            j = 4 * i
            o[i] = np.uint8(_q(v[j], s, z, top) | (_q(v[j + 1], s, z, top) << 2)
                            | (_q(v[j + 2], s, z, top) << 4) | (_q(v[j + 3], s, z, top) << 6))
    elif bits == 1:
        for i in range(o.size):
            j = 8 * i
            b = np.uint32(0)
            for k in range(8):
                b |= _q(v[j + k], s, z, top) << k
            o[i] = np.uint8(b)
    elif bits == 6:  # four values in three bytes
        _qpack6(v, s, z, top, o)
    elif bits == 3:  # 3, 5, 7: a 64-bit word per group of eight, its low `bits` bytes kept
        _qpack_words(v, s, z, 3, o)
    elif bits == 5:
        _qpack_words(v, s, z, 5, o)
    else:
        _qpack_words(v, s, z, 7, o)
    if full < stop:
        _qpack_tail(x, full, stop, s, z, bits, top, out)


@njit(nogil=True, cache=True)
def _qpack_stream(x, scale, zero, inner, bits, out, start, stop):
    """Per channel, rows of any length: groups of eight with a running channel index."""
    top = np.float32((1 << bits) - 1)
    channels = scale.size
    c, k = (start // inner) % channels, start % inner
    i = start
    while i < stop:
        m = min(8, stop - i)
        word = np.uint64(0)
        for j in range(m):
            word |= np.uint64(_q(x[i + j], scale[c], zero[c], top)) << np.uint64(j * bits)
            k += 1
            if k == inner:
                k = 0
                c = c + 1 if c + 1 < channels else 0
        first = i // 8 * bits
        for b in range((m * bits + 7) // 8):
            out[first + b] = np.uint8((word >> np.uint64(8 * b)) & _U64_FF)
        i += m


@njit(nogil=True, cache=True)
def quantize_pack(x, scale, zero, inner, bits, out, start, stop):
    """Quantize values [start, stop) of the flat float32 ``x`` and pack them into ``out``.

    ``scale``/``zero`` hold one pair (per tensor) or one per channel, channel c covering the
    runs of ``inner`` values at flat index (o * channels + c) * inner. ``start`` is a multiple
    of 8, so chunks write disjoint bytes."""
    if scale.size == 1:
        _qpack_run(x, start, stop, scale[0], zero[0], bits, out)
    elif inner % 8 == 0:
        row, pos = start // inner, start
        while pos < stop:
            end = min((row + 1) * inner, stop)
            c = row % scale.size
            _qpack_run(x, pos, end, scale[c], zero[c], bits, out)
            pos, row = end, row + 1
    else:
        _qpack_stream(x, scale, zero, inner, bits, out, start, stop)


# ---- the range of a tensor or of each channel ----------------------------------------------------
_I32_MAX = np.int32(0x7FFFFFFF)
_I32_MIN = np.int32(-0x7FFFFFFF - 1)
_KEY_INF = np.int32(0x7F800000)  # _key(+inf); a +NaN's key is above it
_KEY_NEG_INF = np.int32(-0x7F800001)  # _key(-inf); a -NaN's key is below it


@njit(inline="always")
def _key(u):
    """float32 bits as an int32 that orders as the float does (-0.0 just below +0.0; NaNs at
    the ends, beyond the infinities, where value_range finds them): min/max on integers, which
    vectorise under every instruction set and are exact, where a float min/max reduction
    only vectorises with fast-math."""
    return np.int32(u ^ (np.uint32(np.int32(u) >> np.int32(31)) >> np.uint32(1)))


@njit(inline="always")
def _range_run(u, start, stop, lo, hi):
    v = u[start:stop]
    for i in range(v.size):
        k = _key(v[i])
        lo = min(lo, k)
        hi = max(hi, k)
    return lo, hi


@njit(nogil=True, cache=True)
def value_range(u, channels, inner, lo, hi):
    """The smallest and largest value of each channel of the float32 bits ``u`` (laid out as
    outer x channels x inner), written as float32 bits into ``lo``/``hi`` (uint32, one per
    channel); returns False when a value is inf or NaN (the range is then meaningless). One
    pass on the caller's thread: a tensor this size costs less than waking a thread pool.

    The keys say whether a value is inf or NaN as well: those are the keys beyond the
    infinities' (a NaN orders beyond the infinity of its sign), so a channel's extremes
    tell, with no third reduction over the magnitudes (a sixth less time)."""
    klo = np.full(channels, _I32_MAX, np.int32)
    khi = np.full(channels, _I32_MIN, np.int32)
    if channels == 1:
        klo[0], khi[0] = _range_run(u, 0, u.size, klo[0], khi[0])
    elif inner >= 8:  # rows long enough to vectorise along
        for row in range(u.size // inner):
            c = row % channels
            klo[c], khi[c] = _range_run(u, row * inner, (row + 1) * inner, klo[c], khi[c])
    else:  # short rows: vectorise across the channels (inner 1: the last axis)
        for o in range(u.size // (channels * inner)):
            for k in range(inner):
                v = u[o * channels * inner + k:]
                for c in range(channels):
                    k = _key(v[c * inner])
                    klo[c] = min(klo[c], k)
                    khi[c] = max(khi[c], k)
    finite = True
    for c in range(channels):  # the keys back to float bits: _key is its own inverse
        finite = finite and klo[c] > _KEY_NEG_INF and khi[c] < _KEY_INF
        lo[c] = np.uint32(_key(np.uint32(klo[c])))
        hi[c] = np.uint32(_key(np.uint32(khi[c])))
    return finite


RANGE_OK, RANGE_NOT_FINITE, RANGE_UNSCALABLE = 0, 1, 2


@njit(nogil=True, cache=True)
def range_params(u, channels, inner, bits, scale, zero, pairs):
    """The quantization parameters of each channel of the float32 bits ``u``, in one call:
    :func:`value_range`, then wire.py's ``_params_from_range`` in the same float32 operations
    (a -0.0 minimum taken as +0.0, scale = (hi - lo) / top or 1 when that is not positive,
    zero = -lo / scale), written to ``scale``, ``zero`` and interleaved to ``pairs`` (the
    header's scale, zero point pairs). Returns RANGE_OK, RANGE_NOT_FINITE (a value is inf or
    NaN) or RANGE_UNSCALABLE (a scale or zero point is not finite). About 12 us of numpy calls
    fewer per message than computing them in numpy."""
    if u.size == 0:  # nothing to scale; any valid parameters do
        for c in range(channels):
            scale[c], zero[c] = np.float32(1.0), _F0
            pairs[2 * c], pairs[2 * c + 1] = np.float32(1.0), _F0
        return RANGE_OK
    lo = np.empty(channels, np.uint32)
    hi = np.empty(channels, np.uint32)
    if not value_range(u, channels, inner, lo, hi):
        return RANGE_NOT_FINITE
    lows, highs = lo.view(np.float32), hi.view(np.float32)
    top = np.float32((1 << bits) - 1)
    status = RANGE_OK
    for c in range(channels):
        low = lows[c] + _F0
        s = (highs[c] - low) / top
        if not s > _F0:  # a constant channel
            s = np.float32(1.0)
        z = -low / s
        if not (np.isfinite(s) and np.isfinite(z)):
            status = RANGE_UNSCALABLE
        scale[c], zero[c] = s, z
        pairs[2 * c], pairs[2 * c + 1] = s, z
    return status


@njit(nogil=True, cache=True)
def range_quantize_pack(x, channels, inner, bits, scale, zero, pairs, out):
    """:func:`range_params` then :func:`quantize_pack` over all of the flat float32 ``x``, in
    one call on this thread (a tensor below :data:`PARALLEL_MIN` values: one dispatch fewer);
    returns range_params' status, and packs nothing unless it is RANGE_OK."""
    status = range_params(x.view(np.uint32), channels, inner, bits, scale, zero, pairs)
    if status == RANGE_OK and x.size:
        quantize_pack(x, scale, zero, inner, bits, out, 0, x.size)
    return status


PARAMS_OK, PARAMS_NOT_FINITE, PARAMS_NOT_POSITIVE = 0, 1, 2


@njit(nogil=True, cache=True)
def check_params(params):
    """What a decoder must refuse in a message's (scale, zero point) pairs (float32, n x 2):
    PARAMS_NOT_FINITE if any number is inf or NaN, else PARAMS_NOT_POSITIVE if a scale is not
    above 0, else PARAMS_OK; one call where numpy's two reductions and their temporaries
    took about 3.5 us for a 256-channel header."""
    for i in range(params.shape[0]):
        if not (np.isfinite(params[i, 0]) and np.isfinite(params[i, 1])):
            return PARAMS_NOT_FINITE
    for i in range(params.shape[0]):
        if not params[i, 0] > _F0:
            return PARAMS_NOT_POSITIVE
    return PARAMS_OK


@njit(nogil=True, cache=True)
def encode_message(x, channels, inner, bits, message, pairs_at, body_at):
    """:func:`range_quantize_pack` writing into the message itself (uint8): the (scale, zero
    point) pairs as little-endian float32 at ``pairs_at``, the packed payload from ``body_at``
    on (the caller sized the message for both), with the scales and zero points in scratch of
    its own; one call with two arrays, where the separate scratch arrays and views cost a
    third of the Python side of a Table 6 encode. Returns range_params' status; writes the
    pairs and packs only when it is RANGE_OK."""
    scale = np.empty(channels, np.float32)
    zero = np.empty(channels, np.float32)
    pairs = np.empty(2 * channels, np.float32)
    status = range_params(x.view(np.uint32), channels, inner, bits, scale, zero, pairs)
    if status != RANGE_OK:
        return status
    for i in range(pairs.size):
        u = _bits(pairs[i])
        for b in range(4):
            message[pairs_at + 4 * i + b] = np.uint8((u >> np.uint32(8 * b)) & np.uint32(0xFF))
    if x.size:
        quantize_pack(x, scale, zero, inner, bits, message[body_at:], 0, x.size)
    return status


@njit(nogil=True, cache=True)
def decode_message(message, pairs_at, channels, body_at, inner, bits, out):
    """:func:`check_params` then :func:`unpack_dequantize` over all of ``out``, reading the
    (scale, zero point) pairs at ``pairs_at`` and the payload from ``body_at`` on of the
    message (uint8, whose length and layout the caller checked). The pairs are copied once,
    checked, and only the copies used: a buffer changed meanwhile cannot slip an unchecked
    scale past the check. Returns check_params' status; decodes only when it is PARAMS_OK."""
    scale = np.empty(channels, np.float32)
    zero = np.empty(channels, np.float32)
    for c in range(channels):
        scale[c] = _float(_le32(message, pairs_at + 8 * c))
        zero[c] = _float(_le32(message, pairs_at + 8 * c + 4))
    for c in range(channels):  # check_params' order: finiteness first, then the sign
        if not (np.isfinite(scale[c]) and np.isfinite(zero[c])):
            return PARAMS_NOT_FINITE
    for c in range(channels):
        if not scale[c] > _F0:
            return PARAMS_NOT_POSITIVE
    if out.size:
        unpack_dequantize(message[body_at:], scale, zero, inner, bits, out, 0, out.size)
    return PARAMS_OK


@njit(inline="always")
def _le32(raw, at):
    """The little-endian uint32 at byte ``at`` (any alignment)."""
    return (np.uint32(raw[at]) | (np.uint32(raw[at + 1]) << 8) | (np.uint32(raw[at + 2]) << 16)
            | (np.uint32(raw[at + 3]) << 24))


@njit(inline="always")
def _code(raw, i, bits, mask):
    """Value i of the packed stream, read from the (at most two) bytes that hold it."""
    bit = i * bits
    lo = np.uint32(raw[bit >> 3])
    if (bit & 7) + bits > 8:
        lo |= np.uint32(raw[(bit >> 3) + 1]) << 8
    return (lo >> np.uint32(bit & 7)) & mask


@njit(inline="always")
def _dq6(r, s, z, v):
    """6 bits, a block at a time: the codes unpacked to bytes first, then the bytes to floats
    in a loop over contiguous values, which vectorises as the 8-bit one does; one loop over
    groups of three bytes did not (a Table 6 tensor's unpack 117 -> 60 us)."""
    codes = np.empty(_BLOCK6 // 3 * 4, np.uint8)
    for start in range(0, r.size, _BLOCK6):
        rb = r[start: min(start + _BLOCK6, r.size)]
        for g in range(rb.size // 3):
            b0, b1, b2 = rb[3 * g], rb[3 * g + 1], rb[3 * g + 2]
            codes[4 * g] = b0 & np.uint8(63)
            codes[4 * g + 1] = (b0 >> np.uint8(6)) | ((b1 & np.uint8(15)) << np.uint8(2))
            codes[4 * g + 2] = (b1 >> np.uint8(4)) | ((b2 & np.uint8(3)) << np.uint8(4))
            codes[4 * g + 3] = b2 >> np.uint8(2)
        vb = v[start // 3 * 4: (start + rb.size) // 3 * 4]
        for j in range(vb.size):
            vb[j] = _dq(np.uint32(codes[j]), s, z)


@njit(inline="always")
def _dq_words(r, s, z, bits, v):
    """3, 5 and 7 bits: eight values from ``bits`` bytes through a 64-bit word, inlined with
    ``bits`` a constant (15-20x faster than reading each value's bytes at a variable width)."""
    mask = np.uint64((1 << bits) - 1)
    for g in range(r.size // bits):
        word = np.uint64(0)
        for b in range(bits):
            word |= np.uint64(r[g * bits + b]) << np.uint64(8 * b)
        for k in range(8):
            v[8 * g + k] = _dq(np.int32((word >> np.uint64(k * bits)) & mask), s, z)


@njit(nogil=True, cache=True)
def _dq_run(raw, start, stop, s, z, bits, out):
    """Values [start, stop) (start a multiple of 8) at one scale and zero point; loops over
    slices from index 0, as in _qpack_run."""
    full = start + (stop - start) // 8 * 8
    mask = np.uint32((1 << bits) - 1)
    r = raw[start // 8 * bits: full // 8 * bits]
    v = out[start:full]
    if bits == 8:
        for i in range(r.size):
            v[i] = _dq(r[i], s, z)
    elif bits == 4:
        for i in range(r.size):
            b = np.uint32(r[i])
            v[2 * i] = _dq(b & 15, s, z)
            v[2 * i + 1] = _dq(b >> 4, s, z)
    elif bits == 2:
        for i in range(r.size):
            b = np.uint32(r[i])
            v[4 * i] = _dq(b & 3, s, z)
            v[4 * i + 1] = _dq((b >> 2) & 3, s, z)
            v[4 * i + 2] = _dq((b >> 4) & 3, s, z)
            v[4 * i + 3] = _dq(b >> 6, s, z)
    elif bits == 1:
        for i in range(r.size):
            b = np.uint32(r[i])
            for k in range(8):
                v[8 * i + k] = _dq((b >> k) & 1, s, z)
    elif bits == 6:
        _dq6(r, s, z, v)
    elif bits == 3:
        _dq_words(r, s, z, 3, v)
    elif bits == 5:
        _dq_words(r, s, z, 5, v)
    else:
        _dq_words(r, s, z, 7, v)
    for i in range(full, stop):
        out[i] = _dq(_code(raw, i, bits, mask), s, z)


@njit(nogil=True, cache=True)
def unpack_dequantize(raw, scale, zero, inner, bits, out, start, stop):
    """Unpack values [start, stop) of ``raw`` and dequantize them into the flat float32 ``out``
    (the layout of :func:`quantize_pack`)."""
    if scale.size == 1:
        _dq_run(raw, start, stop, scale[0], zero[0], bits, out)
    elif inner % 8 == 0:
        row, pos = start // inner, start
        while pos < stop:
            end = min((row + 1) * inner, stop)
            c = row % scale.size
            _dq_run(raw, pos, end, scale[c], zero[c], bits, out)
            pos, row = end, row + 1
    else:
        mask = np.uint32((1 << bits) - 1)
        channels = scale.size
        c, k = (start // inner) % channels, start % inner
        for i in range(start, stop):
            out[i] = _dq(_code(raw, i, bits, mask), scale[c], zero[c])
            k += 1
            if k == inner:
                k = 0
                c = c + 1 if c + 1 < channels else 0


@intrinsic
def _bits(typingctx, value):
    """The IEEE bits of a float32 as a uint32 (numba has no scalar view)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _float(typingctx, value):
    """The float32 whose IEEE bits are a uint32 (the inverse of :func:`_bits`)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@njit(nogil=True, cache=True)
def half_to_float(raw, out, start, stop):
    """IEEE binary16 words (little-endian bytes, any alignment) to float32 bits in ``out``
    (uint32), branch-free so that it vectorises: exact for every number, as torch converts
    them; a NaN stays a NaN of its sign, made quiet with its payload kept (what torch's
    vectorised conversion does; its scalar one returns one canonical NaN, so NaN bits are not
    part of the contract)."""
    r = raw[2 * start: 2 * stop]
    o = out[start:stop]
    for i in range(o.size):
        h = np.uint32(r[2 * i]) | (np.uint32(r[2 * i + 1]) << 8)
        sign = (h & 0x8000) << 16
        exp = (h >> 10) & 0x1F
        man = h & 0x3FF
        normal = sign | ((exp + 112) << 23) | (man << 13)
        special = sign | 0x7F800000 | (man << 13) | (np.uint32(man != 0) << 22)
        small = sign | _bits(np.float32(man) * np.float32(2.0 ** -24))  # exact: man * 2^-24
        o[i] = special if exp == 0x1F else (small if exp == 0 else normal)


@njit(nogil=True, cache=True)
def float_to_half(x, out, start, stop):
    """float32 to IEEE binary16 words (uint16), rounded to nearest, ties to even, branch-free
    (F. Giesen's float_to_half_fast3_rtne): bit for bit what torch's conversion gives for every
    number (beyond binary16's range: infinity); a NaN stays a NaN, made quiet, its payload's
    high bits kept as the hardware conversion keeps them."""
    v = x[start:stop]
    o = out[start:stop]
    for i in range(o.size):
        u = _bits(v[i])
        sign = (u >> _U(16)) & _U(0x8000)
        a = u & _U(0x7FFFFFFF)
        nan = _U(0x200) | ((a >> _U(13)) & _U(0x3FF))
        special = _U(0x7C00) | (nan if a > _U(0x7F800000) else _U(0))
        # below 2^-14: adding 0.5 rounds |x| to a multiple of 2^-24 (0.5's ulp), half to even
        small = _bits(np.abs(v[i]) + np.float32(0.5)) - _U(0x3F000000)
        # rebias the exponent (-112 << 23), round half to even at bit 13 (+0xFFF + odd), shift
        normal = (a - _U(0x37FFF001) + ((a >> _U(13)) & _U(1))) >> _U(13)
        w = special if a >= _U(0x47800000) else (small if a < _U(0x38800000) else normal)
        o[i] = np.uint16(w | sign)


# ---- running a kernel over chunks ---------------------------------------------------------------
# Below this many values one call on the caller's thread is faster than a hand-off to another.
PARALLEL_MIN = 1 << 20
# Each thread gets at least half of that, and at most this many threads run one call: a
# pass over memory saturates the bandwidth with a few threads, and on a many-core machine one
# thread per core made a call's start-up and its wait for the slowest (or a preempted) thread
# grow with the core count instead of the tensor.
MAX_WORKERS = 8
_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's share, not
    the machine's count), at most MAX_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def _pool() -> ThreadPoolExecutor:
    """One small pool shared by every caller (:func:`_cpus` threads, started on first use).

    Not numba's parallel=True: its default threading layer aborts the process when two threads
    call a parallel kernel at once, and servers encode and decode from many threads."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max_workers=_cpus(),
                                            thread_name_prefix="edgesplit-wire"))
        return _POOL[0]


def workers_for(count: int) -> int:
    """How many threads :func:`run` uses for ``count`` values: 1 below PARALLEL_MIN, else one
    per PARALLEL_MIN / 2 values, bounded by :func:`_cpus`."""
    if count < PARALLEL_MIN:
        return 1
    return max(1, min(_cpus(), count // (PARALLEL_MIN // 2)))


def run(kernel: Callable[..., None], count: int, *args: Any) -> None:
    """``kernel(*args, start, stop)`` over [0, count): on this thread for small tensors, else in
    chunks of a multiple of 8 values (packed bytes never straddle two chunks), one per worker
    (:func:`workers_for`), the first on this thread while the pool runs the others. The bytes
    do not depend on the split: each value's code depends on that value alone."""
    workers = workers_for(count)
    if workers < 2:
        kernel(*args, 0, count)
        return
    step = (-(-count // workers) + 7) // 8 * 8
    pool = _pool()
    futures = [pool.submit(kernel, *args, at, min(at + step, count))
               for at in range(step, count, step)]
    try:
        kernel(*args, 0, step)
    finally:
        for future in futures:
            future.result()
