"""The wire format: lossless packing, quantization error bounds, compression, and rejection of
malformed or hostile bytes."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesplit.errors import WireError
from edgesplit.quant import (
    MAX_DIM,
    WIRE_VERSION,
    decode_tensor,
    encode_tensor,
    message_info,
    pack_bits,
    packed_size,
    unpack_bits,
    wire,
)
from edgesplit.quant.wire import PlainCodec

SPEC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(1, 8), count=st.integers(0, 200), seed=st.integers(0, 2**16))
def test_pack_unpack_is_lossless_for_every_width_and_length(bits, count, seed):
    values = np.random.default_rng(seed).integers(0, 1 << bits, size=count, dtype=np.uint8)
    packed = pack_bits(values, bits)
    assert len(packed) == packed_size(count, bits) == -(-count * bits // 8)
    np.testing.assert_array_equal(unpack_bits(packed, bits, count), values)


def test_packing_is_dense_and_little_endian():
    # eight 4-bit values 1..8 -> nibbles low first: 0x21 0x43 0x65 0x87
    assert pack_bits(np.arange(1, 9), 4) == bytes([0x21, 0x43, 0x65, 0x87])
    assert pack_bits(np.array([1, 0, 1, 1, 0, 0, 0, 1]), 1) == bytes([0b10001101])
    assert len(pack_bits(np.zeros(288 * 1024), 6)) == 288 * 1024 * 6 // 8


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("shape", [(1, 3, 7, 5), (13,), (2, 1, 1)])
def test_quantization_error_is_within_half_a_step(bits, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(bits)) * 3 + 1
    y = decode_tensor(encode_tensor(x, bits))
    assert y.shape == x.shape and y.dtype == x.dtype
    step = (x.max() - x.min()) / ((1 << bits) - 1)
    assert (y - x).abs().max() <= step / 2 * (1 + 1e-4) + 1e-6


def test_per_channel_scales_each_channel():
    x = torch.stack([torch.linspace(-1, 1, 64), torch.linspace(-100, 100, 64)]).reshape(1, 2, 8, 8)
    per_tensor = decode_tensor(encode_tensor(x, 4))
    per_channel = decode_tensor(encode_tensor(x, 4, per_channel_axis=1))
    err = lambda y: (y - x)[:, 0].abs().max()  # noqa: E731
    assert err(per_channel) < err(per_tensor) / 50
    assert message_info(encode_tensor(x, 4, per_channel_axis=1))["layout"] == "per-channel"


def test_floats_and_integers_travel_unchanged():
    x = torch.randn(3, 5)
    assert torch.equal(decode_tensor(encode_tensor(x, 32)), x)
    assert torch.equal(decode_tensor(encode_tensor(x, 16)), x.half().float())
    ids = torch.randint(0, 30000, (1, 128))
    assert torch.equal(decode_tensor(encode_tensor(ids, 4)), ids)
    mask = torch.rand(4, 4) > 0.5
    assert torch.equal(decode_tensor(encode_tensor(mask, 8)), mask)
    assert decode_tensor(encode_tensor(torch.tensor(2.5), 32)).item() == 2.5


@pytest.mark.parametrize("method", ["zstd", "lz4", "auto"])
def test_compression_only_when_it_pays(method):
    sparse = torch.relu(torch.randn(1, 64, 28, 28) - 1.5)  # mostly zeros after ReLU
    plain, packed = encode_tensor(sparse, 8), encode_tensor(sparse, 8, method)
    assert len(packed) < len(plain) / 2
    assert torch.equal(decode_tensor(packed), decode_tensor(plain))
    noise = torch.rand(4096)
    info = message_info(encode_tensor(noise, 8, method))
    assert info["compression"] is None or info["payload_bytes"] < info["raw_bytes"]


def test_sizes_match_the_bit_width():
    x = torch.randn(1, 2048, 7, 7)  # ResNet-50 layer4 output: 100,352 elements
    sizes = {b: message_info(encode_tensor(x, b))["payload_bytes"] for b in (1, 2, 4, 6, 8, 16)}
    assert sizes == {b: 100_352 * b // 8 for b in (1, 2, 4, 6, 8, 16)}


@pytest.fixture(scope="module")
def message() -> bytes:
    return encode_tensor(torch.randn(2, 3, 5), 4, "zstd")


def test_every_truncation_is_rejected(message):
    for n in range(len(message)):
        with pytest.raises(WireError):
            decode_tensor(message[:n])
    with pytest.raises(WireError, match="unexpected bytes"):
        decode_tensor(message + b"\0")


def test_every_single_byte_corruption_is_rejected(message):
    for i in range(len(message)):
        for flip in (0x01, 0x80, 0xFF):
            corrupt = bytearray(message)
            corrupt[i] ^= flip
            with pytest.raises(WireError):
                decode_tensor(bytes(corrupt))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    with pytest.raises(WireError):
        decode_tensor(b"ESW1" + data)


def test_hostile_sizes_do_not_allocate():
    # a well-formed header claiming 2^31 elements in 8 dims: rejected before any allocation
    head = struct.pack("<4sBBBBBBBB", b"ESW1", 1, 1, 32, 0, 0, 0, 8, 0)
    shape = struct.pack("<8I", *([2**31 - 1] * 8))
    with pytest.raises(WireError, match="elements"):
        decode_tensor(head + shape + struct.pack("<I", 0) + struct.pack("<QQI", 0, 0, 0))
    with pytest.raises(WireError, match="bad magic"):
        decode_tensor(b"XXXX" + b"\0" * 40)
    with pytest.raises(WireError, match="bytes, not str"):
        decode_tensor("ESW1")  # type: ignore[arg-type]
    with pytest.raises(WireError, match="bits must be"):
        encode_tensor(torch.randn(3), 12)


@pytest.mark.parametrize("bits", [1, 2, 4, 6])
def test_fast_paths_share_the_general_layout(bits):
    """The byte layout is value k of a group of eight at bit k * bits of a little-endian word,
    whichever route packs it."""
    values = np.random.default_rng(bits).integers(0, 1 << bits, 64, dtype=np.uint8)
    words = [sum(int(v) << (k * bits) for k, v in enumerate(values[g:g + 8]))
             for g in range(0, 64, 8)]
    expected = b"".join(w.to_bytes(8, "little")[:bits] for w in words)
    assert pack_bits(values, bits) == expected


# ---- hostile messages with a valid CRC: each reaches the deep checks -----------------------------
def build(*, version=WIRE_VERSION, dtype=1, bits=32, layout=0, axis=0, compression=0, shape=(),
          params=(), raw_len=None, body=b"", reserved=0) -> bytes:
    """A message from its fields, CRC included, whatever they say."""
    head = struct.pack("<4sBBBBBBBB", b"ESW1", version, dtype, bits, layout, axis, compression,
                       len(shape), reserved)
    head += struct.pack(f"<{len(shape)}I", *shape) + struct.pack("<I", len(params))
    head += b"".join(struct.pack("<ff", s, z) for s, z in params)
    prefix = head + struct.pack("<QQ", len(body) if raw_len is None else raw_len, len(body))
    return prefix + struct.pack("<I", zlib.crc32(prefix + body)) + body


def zstd_rle_frame(total: int, content_size: int | None) -> bytes:
    """A zstd frame of ``total`` zero bytes in RLE blocks (4 bytes per 128 KiB), stating
    ``content_size`` (None: no size, a 128 KiB window): what a bomb looks like."""
    if content_size is None:
        head = b"\x28\xb5\x2f\xfd" + bytes([0x00, (17 - 10) << 3])  # window descriptor
    else:
        head = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", content_size)
    block, blocks = 1 << 17, []
    for start in range(0, total, block):
        size, last = min(block, total - start), start + block >= total
        blocks.append(((size << 3) | (1 << 1) | last).to_bytes(3, "little") + b"\0")
    return head + b"".join(blocks)


def peak_bytes(fn) -> int:
    """Bytes allocated (numpy and Python, as tracemalloc sees them) at the peak of fn()."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with contextlib.suppress(WireError):
            fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_zstd_bomb_is_refused_before_allocating():
    # 32 KiB on the wire, a 16 KiB tensor declared, a frame that holds 1 GiB of zeros
    frame = zstd_rle_frame(1 << 30, content_size=1 << 30)
    bomb = build(bits=32, shape=(4096,), compression=1, raw_len=16384, body=frame)
    assert len(bomb) < 40_000
    with pytest.raises(WireError, match="zstd frame states 1073741824 bytes"):
        decode_tensor(bomb)
    assert peak_bytes(lambda: decode_tensor(bomb)) < 4 * 16384
    # the same frame claiming the declared size, or no size at all: bounded all the same
    for claimed, error in ((16384, "decompress"), (None, "does not state its content size")):
        bomb = build(bits=32, shape=(4096,), compression=1, raw_len=16384,
                     body=zstd_rle_frame(1 << 30, content_size=claimed))
        with pytest.raises(WireError, match=error):
            decode_tensor(bomb)
        assert peak_bytes(functools.partial(decode_tensor, bomb)) < 4 * 16384


def test_lz4_body_too_small_for_its_raw_length_is_refused_before_allocating():
    bomb = build(bits=32, shape=(1 << 18,), compression=2, raw_len=1 << 20, body=b"\x1f" * 64)
    with pytest.raises(WireError, match="cannot expand"):
        decode_tensor(bomb)
    assert peak_bytes(lambda: decode_tensor(bomb)) < 1 << 16


def test_expectations_refuse_from_the_header():
    x = torch.randn(2, 3)
    message = encode_tensor(x, 8)
    assert torch.equal(decode_tensor(message, expect_shape=(2, 3), expect_dtype=torch.float32,
                                     max_raw_bytes=24), decode_tensor(message))
    with pytest.raises(WireError, match=r"tensor has shape \[2, 3\], expected \[3, 2\]"):
        decode_tensor(message, expect_shape=[3, 2])
    with pytest.raises(WireError, match=r"tensor has dtype torch\.float32, expected torch\.int64"):
        decode_tensor(message, expect_dtype=torch.int64)
    with pytest.raises(WireError, match="max_raw_bytes=23"):  # 6 float32 decoded: 24 bytes
        decode_tensor(message, max_raw_bytes=23)
    # a real zstd frame of 8 GiB of zeros (256 KiB on the wire) declaring 2^31 float32 values:
    # well-formed, so only the caller's bound stops it, and it does before allocating
    huge = build(bits=32, shape=(1 << 16, 1 << 15), compression=1, raw_len=1 << 33,
                 body=zstd_rle_frame(1 << 33, content_size=1 << 33))
    assert peak_bytes(lambda: decode_tensor(huge, max_raw_bytes=1 << 20)) < 1 << 16
    with pytest.raises(WireError, match="max_raw_bytes"):
        decode_tensor(huge, max_raw_bytes=1 << 20)
    with pytest.raises(WireError, match="expected"):
        decode_tensor(huge, expect_shape=(4, 4))


@pytest.mark.parametrize("fields, error", [
    (dict(bits=0, shape=(4,), params=[(1.0, 0.0)]), "at 0 bits"),
    (dict(bits=12, shape=(4,), raw_len=6, body=b"\0" * 6), "at 12 bits"),
    (dict(bits=4, layout=1, shape=(), params=[(1.0, 0.0)], body=b"\0"), "axis 0 of a 0-d"),
    (dict(bits=4, layout=1, axis=2, shape=(2, 2), params=[(1.0, 0.0)] * 2, body=b"\0\0"),
     "axis 2 of a 2-d"),
    (dict(bits=4, layout=0, axis=1, shape=(2, 2), params=[(1.0, 0.0)], body=b"\0\0"),
     "per-tensor layout"),
    (dict(dtype=5, bits=64, layout=1, shape=(2,), body=b"\0" * 16), "not quantized"),
    (dict(bits=32, shape=(4,), raw_len=16, body=b"\0" * 12), "uncompressed payload of 12"),
    (dict(bits=4, shape=(4,), params=[(1.0, 0.0)], raw_len=2, body=b"\0" * 3),
     "uncompressed payload of 3"),
    (dict(bits=32, shape=(0, MAX_DIM, MAX_DIM), body=b""), "elements"),
    (dict(bits=32, shape=(0, 1 << 31), body=b""), "dimension above"),
    (dict(bits=32, shape=(0,) + (MAX_DIM,) * 7, body=b""), "elements"),
    (dict(bits=4, shape=(2,), params=[(1.0, float("inf"))], body=b"\0"), "not finite"),
    (dict(bits=4, shape=(2,), params=[(float("nan"), 0.0)], body=b"\0"), "not finite"),
    (dict(bits=4, shape=(2,), params=[(-1.0, 0.0)], body=b"\0"), "not positive"),
    (dict(bits=4, shape=(2,), params=[(0.0, 0.0)], body=b"\0"), "not positive"),
    (dict(bits=4, shape=(2,), params=[], body=b"\0"), "needs 1"),
    (dict(bits=4, layout=1, shape=(3, 2), params=[(1.0, 0.0)], body=b"\0" * 3), "needs 3"),
    (dict(bits=32, shape=(2,), params=[(1.0, 0.0)], body=b"\0" * 8), "needs 0"),
    (dict(dtype=8, bits=8, shape=(3,), body=b"\0\1\2"), "bool byte"),
    (dict(dtype=5, bits=32, shape=(2,), body=b"\0" * 8), "travels at 64"),
    (dict(dtype=0, shape=(1,), body=b"\0" * 4), "dtype code"),
    (dict(compression=3, shape=(1,), body=b"\0" * 4), "compression code"),
    (dict(layout=2, shape=(1,), body=b"\0" * 4), "layout"),
    (dict(reserved=1, shape=(1,), body=b"\0" * 4), "reserved"),
    (dict(version=3, shape=(1,), body=b"\0" * 4), "version 3"),
    (dict(compression=1, shape=(4,), raw_len=16, body=b"\0" * 8), "not a zstd frame"),
    (dict(compression=1, shape=(4,), raw_len=16, body=b"\x28\xb5\x2f\xfd"), "frame header"),
    (dict(compression=2, shape=(4,), raw_len=16, body=b"\xff" * 8), "lz4"),
    (dict(compression=1, shape=(0,), body=bytes.fromhex("28b52ffd2000010000") + b"junk",
          raw_len=0), "empty payload is sent uncompressed"),
    (dict(compression=2, shape=(0, 4), body=b"\0", raw_len=0), "empty payload"),
])
def test_every_decode_failure_is_a_wire_error(fields, error):
    """Messages with a valid CRC whose fields disagree: each a WireError naming the field."""
    with pytest.raises(WireError, match=error):
        decode_tensor(build(**fields))


def test_a_memoryview_is_decoded_without_copying_the_message():
    x = torch.randn(3, 4)
    assert torch.equal(decode_tensor(memoryview(encode_tensor(x, 32))), x)
    assert torch.equal(decode_tensor(bytearray(encode_tensor(x, 32))), x)
    with pytest.raises(WireError, match="contiguous"):
        decode_tensor(memoryview(encode_tensor(x, 32) * 2)[::2])


# ---- round trips ------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_0d_tensor_stays_0d(bits):
    y = decode_tensor(encode_tensor(torch.tensor(-2.5), bits))
    assert y.shape == () and y.item() == -2.5
    assert decode_tensor(encode_tensor(torch.tensor(7, dtype=torch.int32), bits)).shape == ()


@pytest.mark.parametrize("bits", [1, 3, 4, 8, 16, 32])
@pytest.mark.parametrize("shape, axis", [((0,), None), ((0,), 0), ((2, 0, 3), None),
                                         ((2, 0, 3), 0), ((2, 0, 3), 1), ((2, 0, 3), -1)])
def test_empty_tensors_round_trip(bits, shape, axis):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        y = decode_tensor(encode_tensor(torch.zeros(shape, dtype=dtype), bits, "auto",
                                        per_channel_axis=axis))
        assert y.shape == shape and y.dtype == dtype


def test_bfloat16_at_16_bits_is_lossless():
    x = torch.tensor([99_840.0, -3.0e38, 1e-30, 0.1, float("inf"), float("nan")],
                     dtype=torch.bfloat16)
    y = decode_tensor(encode_tensor(x, 16))
    assert y.dtype == torch.bfloat16
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))  # bit for bit, NaN included
    assert message_info(encode_tensor(x, 16))["version"] == WIRE_VERSION == 2


def test_version_1_messages_keep_their_meaning():
    """Version 1 sent bfloat16 at 16 bits as float16 words; a version-2 reader still reads them
    so, and every other version-1 message as before."""
    words = np.array([1.5, -2.0], dtype="<f2").tobytes()
    old = build(version=1, dtype=3, bits=16, shape=(2,), body=words)
    y = decode_tensor(old)
    assert y.dtype == torch.bfloat16 and y.tolist() == [1.5, -2.0]
    v1 = bytearray(encode_tensor(torch.randn(2, 3), 4, "zstd"))
    v1[4] = 1  # the version byte; then re-seal the CRC (after shape, one parameter, lengths)
    crc_at = 12 + 4 * 2 + 4 + 8 + 16
    v1[crc_at:crc_at + 4] = struct.pack("<I", zlib.crc32(v1[:crc_at] + v1[crc_at + 4:]))
    assert decode_tensor(bytes(v1)).shape == (2, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bits", [16, 32])
def test_floats_at_16_and_32_bits(dtype, bits):
    x = (torch.randn(4, 5, dtype=torch.float64) * 100).to(dtype)
    y = decode_tensor(encode_tensor(x, bits, "auto"))
    assert y.dtype == dtype and y.shape == x.shape
    wire = torch.bfloat16 if (bits == 16 and dtype == torch.bfloat16) else \
        torch.float16 if bits == 16 else torch.float32
    assert torch.equal(y, x.to(wire).to(dtype))  # exactly one rounding to the wire's format


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8,
                                   torch.bool])
@pytest.mark.parametrize("compress", [None, "zstd", "lz4", "auto"])
def test_integers_travel_as_they_are(dtype, compress):
    if dtype == torch.bool:
        x = torch.rand(3, 50) > 0.5
    else:
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (3, 50), dtype=dtype)
        x[0, :3] = torch.tensor([info.min, info.max, 0], dtype=dtype)
    for bits in (1, 8, 16, 32):
        y = decode_tensor(encode_tensor(x, bits, compress))
        assert y.dtype == dtype and torch.equal(y, x)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("compress", [None, "zstd", "lz4", "auto"])
def test_per_channel_on_every_axis(bits, compress):
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(bits))
    x = x * torch.arange(1, 6)  # channels of different ranges along the last axis
    for axis in (0, 1, 2, -1, -3):
        message = encode_tensor(x, bits, compress, per_channel_axis=axis)
        assert message_info(message)["axis"] == axis % 3
        y = decode_tensor(message)
        assert y.shape == x.shape
        moved = x.movedim(axis, 0).reshape(x.shape[axis], -1)
        step = (moved.amax(1) - moved.amin(1)) / ((1 << bits) - 1)
        err = (y - x).movedim(axis, 0).reshape(x.shape[axis], -1).abs().amax(1)
        assert (err <= step / 2 * (1 + 1e-4) + 1e-6).all()
    with pytest.raises(WireError, match="not an axis"):
        encode_tensor(x, bits, per_channel_axis=3)
    with pytest.raises(WireError, match=r"0-d tensor: use None \(per tensor\)$"):
        encode_tensor(torch.tensor(1.0), bits, per_channel_axis=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_quantized_floats_come_back_in_their_dtype(dtype):
    x = torch.randn(6, 7).to(dtype)
    y = decode_tensor(encode_tensor(x, 5, "auto"))
    assert y.dtype == dtype and y.shape == x.shape


def test_encoding_what_cannot_be_quantized_says_so():
    for bad in (float("inf"), float("nan")):
        with pytest.raises(WireError, match=r"inf or NaN.*16 or 32 bits"):
            encode_tensor(torch.tensor([1.0, bad]), 4)
    with pytest.raises(WireError, match="send the tensor at 32 bits"):
        encode_tensor(torch.tensor([-3e38, 3e38]), 1)
    with pytest.raises(WireError, match="unknown compression"):
        encode_tensor(torch.randn(3), 4, "gzip")  # type: ignore[arg-type]
    with pytest.raises(WireError, match="dimension above"):
        encode_tensor(torch.zeros(0, 1 << 31), 32)


# ---- the specification's worked example --------------------------------------------------------
def _spec_block(kind: str) -> str:
    match = re.search(rf"```{kind} wire-example\n(.*?)```", SPEC.read_text(), re.S)
    assert match, f"docs/wire-format.md has no ```{kind} wire-example block"
    return match.group(1)


def test_the_specification_example_decodes_and_encodes_to_its_bytes():
    hex_lines = [line.split("#")[0] for line in _spec_block("hex").splitlines()]
    message = bytes.fromhex("".join(hex_lines))
    example = json.loads(_spec_block("json"))
    x = torch.tensor(example["input"], dtype=getattr(torch, example["dtype"]))
    y = decode_tensor(message)
    assert list(y.shape) == example["shape"] and y.tolist() == example["decoded"]
    assert encode_tensor(x, example["bits"]) == message
    assert len(message) == example["message_bytes"]
    assert message.endswith(bytes.fromhex(example["payload_hex"]))
    assert message[48:52] == struct.pack("<I", int(example["crc32"], 16))
    assert zlib.crc32(message[:48] + message[52:]) == int(example["crc32"], 16)


# ---- the compiled kernels against the numpy/torch reference -------------------------------------
@contextlib.contextmanager
def reference_path():
    """Encode and decode with the numpy/torch reference path, as where numba does not import."""
    saved = list(wire._KERNELS)
    wire._KERNELS[:] = [None]
    try:
        yield
    finally:
        wire._KERNELS[:] = saved


def kernels_load() -> bool:
    return wire._kernels() is not None


def _tensors():
    g = torch.Generator().manual_seed(0)
    halves = torch.arange(-40, 41, dtype=torch.float32) / 4  # x / s + z lands on .5 often
    yield "halves", halves, None
    yield "0-d", torch.tensor(-2.5), None
    yield "empty", torch.zeros(0, 3), None
    yield "empty per-channel", torch.zeros(2, 0, 3), 0
    yield "constant", torch.full((5, 7), 3.25), None
    yield "zeros with -0.0", torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0]), None
    yield "relu", torch.relu(torch.randn(1, 16, 9, 7, generator=g)), 1
    for n in (1, 7, 8, 9, 15, 17, 63, 1001):
        yield f"odd length {n}", torch.randn(n, generator=g) * 5 - 1, None
    x = torch.randn(2, 5, 3, 8, generator=g) * torch.arange(1, 6).reshape(1, 5, 1, 1)
    for axis in (0, 1, 2, 3):  # rows of 1, 3, 8 and 120 values: streamed and row by row
        yield f"per-channel axis {axis}", x, axis
    yield "Table 6", torch.randn(1, 256, 36, 64, generator=g), None
    yield "Table 6 per-channel", torch.randn(1, 256, 36, 64, generator=g), 1
    yield "large", torch.randn(3, 100_003, generator=g), None  # chunked across threads
    yield "float64", torch.randn(33, dtype=torch.float64, generator=g), None
    yield "bfloat16", torch.randn(4, 9, generator=g).bfloat16(), 1
    yield "float16", torch.randn(41, generator=g).half(), None


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
def test_kernels_give_the_reference_bytes_and_values(bits, monkeypatch):
    monkeypatch.setattr(kernels_module(), "PARALLEL_MIN", 1 << 16)  # chunk the large ones
    for name, x, axis in _tensors():
        fast = encode_tensor(x, bits, per_channel_axis=axis)
        with reference_path():
            slow = encode_tensor(x, bits, per_channel_axis=axis)
            expected = decode_tensor(slow)
        assert fast == slow, f"{name}: the kernels' message differs"
        decoded = decode_tensor(fast)
        assert decoded.dtype == expected.dtype and decoded.shape == expected.shape, name
        assert torch.equal(decoded.float().view(torch.int32).reshape(-1),
                           expected.float().view(torch.int32).reshape(-1)), name
        for compress in ("zstd", "lz4"):  # the kernels write the raw payload the same way
            with reference_path():
                packed = encode_tensor(x, bits, compress, per_channel_axis=axis)
            assert encode_tensor(x, bits, compress, per_channel_axis=axis) == packed, name
            assert torch.equal(decode_tensor(packed), decoded), name


def _random_case(rng: np.random.Generator):
    """A random tensor (rank 0-4, odd sizes and empty dimensions among them, several dtypes and
    scales) and a per-channel axis (None, or one of its axes, negative ones included)."""
    shape = tuple(int(d) for d in rng.choice([0, 1, 2, 3, 5, 7, 8, 9, 16, 17, 33],
                                             size=rng.integers(0, 5)))
    dtype = [torch.float32, torch.float32, torch.float16, torch.bfloat16, torch.float64][
        rng.integers(0, 5)]
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    x = (x * float(10.0 ** rng.integers(-3, 4)) + float(rng.standard_normal())).to(dtype)
    axis = None if not shape or rng.random() < 0.4 else int(rng.integers(-len(shape), len(shape)))
    return x, axis


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
def test_fast_encoder_gives_the_reference_bytes_on_random_tensors():
    """The uncompressed quantized encoder (fields packed in one call, parameters from the range
    kernel written straight into the message) against the numpy/torch reference path, on
    random shapes (odd lengths, empty dimensions, 0-d), dtypes, axes and every width."""
    rng = np.random.default_rng(39)
    for case in range(300):
        x, axis = _random_case(rng)
        for bits in range(1, 9):
            fast = encode_tensor(x, bits, per_channel_axis=axis)
            with reference_path():
                slow = encode_tensor(x, bits, per_channel_axis=axis)
                expected = decode_tensor(slow)
            assert fast == slow, (case, tuple(x.shape), x.dtype, axis, bits)
            decoded = decode_tensor(fast)
            assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
            assert torch.equal(decoded.float().view(torch.int32), expected.float().view(
                torch.int32)), (case, tuple(x.shape), x.dtype, axis, bits)


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
@pytest.mark.parametrize("values", [[1.0, float("inf")], [float("nan"), 0.0],
                                    [-3e38, 3e38], [-1e-45, 1e-45], [0.0, -0.0, 5e-45]])
@pytest.mark.parametrize("axis", [None, 0])
def test_fast_encoder_refuses_and_scales_edge_ranges_as_the_reference(values, axis):
    """Infinite, NaN, unscalable and subnormal ranges: the same error or the same bytes."""
    x = torch.tensor([values, values[::-1]])
    for bits in (1, 4, 8):
        try:
            fast: bytes | str = encode_tensor(x, bits, per_channel_axis=axis)
        except WireError as exc:
            fast = str(exc)
        with reference_path():
            try:
                slow: bytes | str = encode_tensor(x, bits, per_channel_axis=axis)
            except WireError as exc:
                slow = str(exc)
        assert fast == slow, (values, axis, bits)


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
def test_the_range_kernel_finds_every_kind_of_inf_and_nan_by_its_keys():
    """value_range tells a non-finite value from the extremes of its order keys alone: every
    NaN payload of either sign, both infinities, and the finite values next to them."""
    k = kernels_module()
    patterns = [0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC00000,
                0x7FFFFFFF, 0xFFFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000000, 0x80000000,
                0x00000001, 0x80000001]
    for pattern in patterns:
        for at in (0, 3, 8):
            u = np.full(9, 0x3F800000, np.uint32)  # 1.0
            u[at] = pattern
            expected = bool(np.isfinite(u.view(np.float32)).all())
            for channels, inner in ((1, 9), (3, 3), (9, 1)):
                lo, hi = np.empty((2, channels), np.uint32)
                assert k.value_range(u, channels, inner, lo, hi) == expected, (hex(pattern), at)


def test_a_remembered_header_prefix_does_not_excuse_what_follows_it():
    """The parser remembers the checked fields before the parameters; a message that shares
    them is still checked from the parameters on, and one too short for them is read field by
    field, with the same errors."""
    message = encode_tensor(torch.randn(3, 5), 4)
    decode_tensor(message)  # its prefix is remembered now
    prefix = 16 + 4 * 2
    bad_scale = bytearray(message)
    bad_scale[prefix: prefix + 4] = struct.pack("<f", float("nan"))
    with pytest.raises(WireError, match="not finite"):
        decode_tensor(bytes(bad_scale))
    with pytest.raises(WireError, match="truncated message: the parameters"):
        decode_tensor(message[: prefix + 3])
    with pytest.raises(WireError, match="truncated message: the parameter count"):
        decode_tensor(message[: prefix - 1])
    wire._known_prefix.cache_clear()
    for damaged in (bytes(bad_scale), message[: prefix + 3]):
        with pytest.raises(WireError) as cold:
            decode_tensor(damaged)
        with pytest.raises(WireError) as warm:
            decode_tensor(damaged)
        assert str(cold.value) == str(warm.value)
    assert torch.equal(decode_tensor(message), decode_tensor(bytes(message)))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, -1.0,
                                   1e-45])
@pytest.mark.parametrize("field", ["scale", "zero point"])
def test_per_channel_parameters_are_refused_alike_with_and_without_the_kernels(value, field):
    """A per-channel header's pairs are checked by one kernel call where numba loads: the
    same verdict and error as numpy's checks, for each kind of bad scale or zero point."""
    message = encode_tensor(torch.randn(2, 5, 3), 4, per_channel_axis=1)
    at = 16 + 4 * 3 + 8 * 3 + (0 if field == "scale" else 4)  # the fourth channel's pair
    damaged = bytearray(message)
    damaged[at: at + 4] = struct.pack("<f", value)
    crc_at = 16 + 4 * 3 + 8 * 5 + 16
    damaged[crc_at: crc_at + 4] = struct.pack(
        "<I", zlib.crc32(bytes(damaged[:crc_at]) + bytes(damaged[crc_at + 4:])))
    outcomes = []
    for path in (contextlib.nullcontext, reference_path):
        with path():
            try:
                outcomes.append(decode_tensor(bytes(damaged)).view(torch.int32).tolist())
            except WireError as exc:
                outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    refused = not math.isfinite(value) or (field == "scale" and value <= 0)
    assert isinstance(outcomes[0], str) == refused, outcomes[0]


def kernels_module():
    from edgesplit.quant import _kernels

    return _kernels


def _with_crc(message: bytearray) -> bytes:
    """``message`` with its CRC field rewritten to match its other bytes (where the rank and
    parameter count it states put that field)."""
    count_at = 16 + 4 * message[10]
    crc_at = count_at + 4 + 8 * struct.unpack_from("<I", message, count_at)[0] + 16
    message[crc_at: crc_at + 4] = struct.pack(
        "<I", zlib.crc32(bytes(message[:crc_at]) + bytes(message[crc_at + 4:])))
    return bytes(message)


def _outcome(data, **expect) -> list[int] | str:
    try:
        return decode_tensor(data, **expect).float().view(torch.int32).reshape(-1).tolist()
    except WireError as exc:
        return str(exc)


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
@pytest.mark.parametrize("axis", [None, 1])
def test_quantized_messages_are_refused_alike_with_and_without_the_shortcut(axis, monkeypatch):
    """Every truncation and corruption of a quantized message (with its CRC broken, and with
    it rewritten so that the damage reaches the field checks), and every expectation it
    misses, gives the parser's own error (or value) whether the quantized shortcut reads it
    first or not: the shortcut only ever accepts what the parser accepts."""
    message = encode_tensor(torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(5)), 4,
                            per_channel_axis=axis)
    assert wire._decode_quantized(memoryview(message), None, None, None) is not None
    variants: list[bytes | bytearray | memoryview] = [message[:n] for n in range(len(message))]
    variants += [message + b"\0", bytearray(message), memoryview(b"xyz" + message)[3:]]
    for i in range(len(message)):
        for flip in (0x01, 0x80, 0xFF):
            corrupt = bytearray(message)
            corrupt[i] ^= flip
            variants.append(bytes(corrupt))
            if i < 16 + 4 * 3 + 4 + 8 * (3 if axis else 1) + 16 and i != 10:  # not the rank
                variants.append(_with_crc(corrupt))
    expectations = [{}, {"expect_shape": (2, 3, 4)}, {"expect_shape": (2, 3, 5)},
                    {"expect_dtype": torch.float16}, {"max_raw_bytes": 95},
                    {"max_raw_bytes": 96}]
    for data in variants:
        for expect in expectations:
            shortcut = _outcome(data, **expect)
            with monkeypatch.context() as m:
                m.setattr(wire, "_decode_quantized", lambda *args: None)
                assert _outcome(data, **expect) == shortcut, (bytes(data), expect)


@pytest.mark.parametrize("shape,axis", [((2, 3), 2), ((2, 3), -3), ((), 0), ((1,) * 9, 0),
                                        ((1,) * 9, 12), ((2, 3), -2)])
def test_shape_and_axis_errors_come_in_the_same_order_on_every_path(shape, axis):
    """The kernels' encoder checks the shape and then the axis from its remembered layout;
    the reference path checks them one by one: the same outcome, the same message."""
    outcomes = []
    for path in (contextlib.nullcontext, reference_path):
        with path():
            try:
                outcomes.append(encode_tensor(torch.zeros(shape), 4, per_channel_axis=axis))
            except WireError as exc:
                outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    assert isinstance(outcomes[0], bytes) == (shape == (2, 3) and axis == -2), outcomes[0]


def test_zero_point_sign_does_not_depend_on_which_zero_is_the_minimum():
    a = encode_tensor(torch.tensor([0.0, -0.0, 1.0]), 4)
    b = encode_tensor(torch.tensor([-0.0, 0.0, 1.0]), 4)
    assert a == b and message_info(a)["shape"] == [3]


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
def test_float16_conversions_match_torch_bit_for_bit():
    every_half = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    decoded = decode_tensor(encode_tensor(every_half, 16), expect_dtype=torch.float16)
    assert torch.equal(decoded.view(torch.int16), every_half.view(torch.int16))
    as_float = every_half.float()
    y = decode_tensor(encode_tensor(as_float, 16))  # f32 -> f16 -> f32 through both kernels
    numbers = ~torch.isnan(as_float)
    assert torch.equal(y[numbers].view(torch.int32), as_float[numbers].view(torch.int32))
    assert torch.isnan(y[~numbers]).all()
    bits = torch.randint(-2**31, 2**31 - 1, (200_000,), dtype=torch.int64,
                         generator=torch.Generator().manual_seed(1)).to(torch.int32)
    edges = torch.tensor([0x33000000, 0x33000001, 0x387FFFFF, 0x38800000, 0x477FEFFF, 0x477FF000,
                          0x47800000, 0x7F800000, 0x00000001], dtype=torch.int32)
    x = torch.cat([bits, edges, edges | -2**31]).view(torch.float32)
    numbers = ~torch.isnan(x)
    fast = decode_tensor(encode_tensor(x, 16))
    with reference_path():
        slow = decode_tensor(encode_tensor(x, 16))
    assert torch.equal(fast[numbers].view(torch.int32), slow[numbers].view(torch.int32))
    assert torch.equal(fast[numbers].view(torch.int32), x[numbers].half().float().view(torch.int32))
    assert torch.isnan(fast[~numbers]).all()


@pytest.mark.parametrize("bits", [16, 32])
def test_plain_floats_from_a_slice_of_a_reused_receive_buffer(bits):
    """The data plane decodes a memoryview slice of its receive buffer, at any offset, and then
    reuses the buffer: the tensor must own its memory. Large payloads take the copy that
    checksums as it goes; a corrupted one is refused all the same."""
    for n in (5, 25_000, 1 << 20):
        x = torch.randn(n)
        message = encode_tensor(x, bits)
        receive = bytearray(3 + len(message) + 5)
        receive[3:3 + len(message)] = message
        y = decode_tensor(memoryview(receive)[3:3 + len(message)])
        receive[:] = bytes(len(receive))  # the buffer is reused
        assert torch.equal(y, x if bits == 32 else x.half().float())
        corrupt = bytearray(message)
        corrupt[-1] ^= 0x40
        with pytest.raises(WireError, match="checksum"):
            decode_tensor(memoryview(corrupt))


def test_reference_path_decodes_what_the_kernels_encode():
    x = torch.randn(2, 3, 17)
    for bits in (2, 4, 6, 8, 16):
        message = encode_tensor(x, bits, per_channel_axis=2 if bits <= 8 else None)
        with reference_path():
            assert encode_tensor(x, bits, per_channel_axis=2 if bits <= 8 else None) == message
            expected = decode_tensor(message)
        assert torch.equal(decode_tensor(message), expected)


def test_messages_are_bytes():
    """gRPC's protobuf fields take bytes only; the message is built in place all the same."""
    for x, bits in ((torch.randn(3), 4), (torch.randn(3), 32), (torch.tensor([1, 2]), 8)):
        assert type(encode_tensor(x, bits)) is bytes


def test_without_numba_the_reference_path_runs(monkeypatch):
    import sys

    import edgesplit.quant

    monkeypatch.setattr(wire, "_KERNELS", [])
    monkeypatch.delattr(edgesplit.quant, "_kernels", raising=False)
    monkeypatch.setitem(sys.modules, "edgesplit.quant._kernels", None)  # import fails
    monkeypatch.setitem(sys.modules, "numba", None)
    assert wire._kernels() is None
    x = torch.randn(4, 9)
    assert decode_tensor(encode_tensor(x, 4)).shape == (4, 9)


def test_kernels_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(wire, "_KERNELS", [])
    monkeypatch.setenv("EDGESPLIT_WIRE_KERNELS", "0")
    assert wire._kernels() is None


# ---- plain messages whose header is known in advance -------------------------------------------
PLAIN = [(torch.float32, 32), (torch.float16, 16), (torch.bfloat16, 16), (torch.int64, 8),
         (torch.int32, 32), (torch.uint8, 8), (torch.bool, 8), (torch.int8, 8)]


def _general_path(monkeypatch) -> None:
    """Encode and decode without the known-header shortcut (the full builder and parser)."""
    monkeypatch.setattr(wire, "_plain_head", lambda *args: None)


@pytest.mark.parametrize("dtype,bits", PLAIN)
@pytest.mark.parametrize("shape", [(1, 64, 7, 7), (3,), (), (0, 4)])
def test_known_headers_give_the_general_bytes_and_values(dtype, bits, shape, monkeypatch):
    g = torch.Generator().manual_seed(len(shape))
    t = (torch.randn(shape, generator=g) * 9).to(dtype) if dtype.is_floating_point \
        else torch.randint(0, 2, shape, generator=g).to(dtype)
    fast = encode_tensor(t, bits)
    decoded = decode_tensor(memoryview(fast), expect_shape=shape, expect_dtype=dtype)
    with monkeypatch.context() as m:
        _general_path(m)
        assert encode_tensor(t, bits) == fast
        general = decode_tensor(fast, expect_shape=shape, expect_dtype=dtype)
    assert decoded.dtype == dtype and torch.equal(decoded, general) and torch.equal(decoded, t)


def test_known_header_decoding_refuses_what_the_parser_refuses(monkeypatch):
    """Every corruption and truncation of a plain message fails with the same error whether
    its header is the expected one or not."""
    shape, message = (2, 3), encode_tensor(torch.randn(2, 3), 32)
    variants = [message[:n] for n in range(len(message))] + [message + b"\0"]
    for i in range(len(message)):
        corrupt = bytearray(message)
        corrupt[i] ^= 0x80
        variants.append(bytes(corrupt))
    for data in variants:
        errors = []
        for general in (False, True):
            with monkeypatch.context() as m:
                if general:
                    _general_path(m)
                with pytest.raises(WireError) as info:
                    decode_tensor(data, expect_shape=shape, expect_dtype=torch.float32)
                errors.append(str(info.value))
        assert errors[0] == errors[1]
    with pytest.raises(WireError, match="max_raw_bytes"):
        decode_tensor(message, expect_shape=shape, expect_dtype=torch.float32, max_raw_bytes=8)


# ---- PlainCodec: one planned tensor's messages, the header checked once ----------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bfloat16,
                                   torch.bool])
def test_plain_codec_writes_and_reads_what_the_general_functions_do(dtype):
    shape = (2, 3, 5)
    t = (torch.randn(shape) * 3).to(dtype)
    codec = PlainCodec(shape, dtype)
    bits = 32 if dtype == torch.int64 else dtype.itemsize * 8  # ids travel as they are
    message = codec.encode(t, bits)
    assert message == encode_tensor(t, bits)
    for data in (message, memoryview(message), bytearray(message),
                 memoryview(b"xx" + message)[2:]):
        out = codec.decode(data)
        assert out.dtype == dtype and tuple(out.shape) == shape and torch.equal(out, t)
        out.add_(1) if dtype != torch.bool else None  # the tensor owns its memory
    assert bytes(message) == encode_tensor(t, bits)  # the message was not written to


def test_plain_codec_hands_what_it_does_not_fit_to_the_general_functions():
    codec = PlainCodec((4, 6), torch.float32)
    x = torch.randn(4, 6)
    others = [x.t().contiguous().t(),               # not contiguous
              x.clone().requires_grad_(),           # with grad: the same bytes
              x[:2],                                 # another shape
              x.double()]                            # another dtype
    for t in others:
        assert codec.encode(t, 32) == encode_tensor(t, 32)
    assert codec.encode(x, 8) == encode_tensor(x, 8)  # quantized
    quantized = encode_tensor(x, 4)
    assert torch.equal(codec.decode(quantized),
                       decode_tensor(quantized, expect_shape=(4, 6), expect_dtype=torch.float32))


@pytest.mark.parametrize("method", ["decode", "decode_array"])
@pytest.mark.parametrize("damage", ["checksum", "shape", "truncated"])
def test_plain_codec_refuses_bad_messages_in_the_general_words(damage, method):
    codec = PlainCodec((4, 6), torch.float32)
    good = bytearray(encode_tensor(torch.randn(4, 6), 32))
    if damage == "checksum":
        good[-2] ^= 0x10
        bad = bytes(good)
    elif damage == "shape":
        bad = encode_tensor(torch.randn(6, 4), 32)
    else:
        bad = bytes(good[:-4])
    with pytest.raises(WireError) as mine:
        getattr(codec, method)(bad)  # tensors and arrays alike
    with pytest.raises(WireError) as general:
        decode_tensor(bad, expect_shape=(4, 6), expect_dtype=torch.float32)
    assert str(mine.value) == str(general.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_plain_codec_arrays_are_the_tensors_messages(dtype):
    shape = (2, 3, 5)
    t = (torch.randn(shape) * 3).to(dtype)
    codec = PlainCodec(shape, dtype)
    bits = 32 if dtype == torch.int64 else dtype.itemsize * 8
    assert codec.encode_array(t.numpy()) == encode_tensor(t, bits)
    wrong = t.numpy()[:1]  # another shape: the general encoder's message
    assert codec.encode_array(wrong) == encode_tensor(torch.from_numpy(wrong), bits)
    message = encode_tensor(t, bits)
    for data in (message, bytearray(message), memoryview(b"xx" + message)[2:]):
        out = codec.decode_array(data)
        assert isinstance(out, np.ndarray) and out.shape == shape
        assert torch.equal(torch.from_numpy(out), t)
        out += 1  # the array owns its memory
    assert bytes(message) == encode_tensor(t, bits)


# ---- reading a plain message in place (a server's receive buffer) -----------------------------
def test_plain_codec_reads_an_aligned_message_in_place_and_equal_to_a_copy():
    shape, t = (2, 3, 5), torch.randn(2, 3, 5)
    codec = PlainCodec(shape, torch.float32)
    message = codec.encode(t, 32)
    buffer = bytearray(len(message) + 16)
    at = 16 - (len(message) - t.nbytes) % 16  # the payload 16-aligned in the buffer
    view = memoryview(buffer)[at:at + len(message)]
    view[:] = message
    out = codec.decode_in_place(view)
    assert torch.equal(out, t) and torch.equal(out, codec.decode(view))
    base = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    assert base <= out.data_ptr() < base + len(buffer)  # a view of the buffer, not a copy
    del out


@pytest.mark.parametrize("case", ["misaligned", "read-only", "bool"])
def test_plain_codec_copies_what_it_cannot_read_in_place(case):
    dtype = torch.bool if case == "bool" else torch.float32
    t = torch.randn(4, 6) > 0 if case == "bool" else torch.randn(4, 6)
    codec = PlainCodec((4, 6), dtype)
    message = codec.encode(t, dtype.itemsize * 8)
    if case == "read-only":
        data = memoryview(message)
    else:
        buffer = bytearray(len(message) + 16)
        start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
        at = next(a for a in range(1, 16)  # the payload off its 4-byte alignment
                  if (start + a + len(message) - t.nbytes) % 4)
        data = memoryview(buffer)[at:at + len(message)]
        data[:] = message
    out = codec.decode_in_place(data)
    assert torch.equal(out, t)
    out.logical_not_() if dtype == torch.bool else out.add_(1)  # its own memory
    assert torch.equal(codec.decode(data), t)


def test_plain_codec_in_place_refuses_a_corrupted_message():
    codec = PlainCodec((4, 6), torch.float32)
    message = bytearray(codec.encode(torch.randn(4, 6), 32))
    message[-2] ^= 0x10
    with pytest.raises(WireError, match="checksum"):
        codec.decode_in_place(memoryview(message))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_plain_codec_pieces_join_to_the_message(dtype):
    """A large plain tensor's message comes as its header with the checksum and the tensor's
    own memory (not copied); joined, the pieces are encode()'s bytes. Small or non-plain
    tensors come as those bytes."""
    shape = (1, 512, 32, 32)  # 1 MB at 16 bits: PIECES_MIN
    t = torch.randn(shape).to(dtype)
    codec = PlainCodec(shape, dtype)
    head, body = codec.encode_pieces(t, dtype.itemsize * 8)
    assert head + bytes(body) == codec.encode(t, dtype.itemsize * 8)
    assert torch.frombuffer(body, dtype=torch.uint8).data_ptr() == t.data_ptr()
    small, x = PlainCodec((2, 3), dtype), torch.randn(2, 3).to(dtype)
    assert small.encode_pieces(x, dtype.itemsize * 8) == small.encode(x, dtype.itemsize * 8)
    assert codec.encode_pieces(t, 8) == codec.encode(t, 8)  # quantized: a message of its own


# ---- speed that does not depend on the machine's threads (issue 39, item 5) ---------------------
def _table6(seed: int = 3) -> torch.Tensor:
    return torch.randn(1, 256, 36, 64, generator=torch.Generator().manual_seed(seed))


@contextlib.contextmanager
def _torch_threads(n: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def test_encoded_bytes_do_not_depend_on_torchs_thread_count():
    x = _table6()
    for bits, axis in ((4, None), (4, 1), (2, 3), (6, None), (8, 1)):
        with _torch_threads(1):
            one = encode_tensor(x, bits, per_channel_axis=axis)
        with _torch_threads(2):
            two = encode_tensor(x, bits, per_channel_axis=axis)
        assert one == two, (bits, axis)
        with _torch_threads(1):
            y1 = decode_tensor(one)
        with _torch_threads(2):
            y2 = decode_tensor(one)
        assert torch.equal(y1.view(torch.int32), y2.view(torch.int32)), (bits, axis)


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
def test_quantized_encode_and_decode_make_no_torch_reduction(monkeypatch):
    """The range of a quantized tensor comes from the one-pass kernel on the caller's thread:
    torch's reductions run on its intra-op pool, whose cost followed the core count and the
    machine's load rather than the tensor (the wire speed differed 2x between machines)."""
    x = _table6()
    expected = {axis: encode_tensor(x, 4, per_channel_axis=axis) for axis in (None, 1, 3)}

    def refuse(*args, **kwargs):
        raise AssertionError("a torch reduction ran on the kernel path")

    for name in ("aminmax", "amin", "amax", "min", "max"):
        monkeypatch.setattr(torch, name, refuse)
        monkeypatch.setattr(torch.Tensor, name, refuse)
    for axis, message in expected.items():
        assert encode_tensor(x, 4, per_channel_axis=axis) == message
        decode_tensor(message)


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
def test_the_range_kernel_agrees_with_torch_on_edge_values():
    k = kernels_module()
    special = torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 1.0, -2.5])
    cases = [special, special.flip(0), torch.tensor([-0.0]), torch.tensor([5.0, 5.0, 5.0]),
             torch.randn(7, 3, 5), torch.randn(1000) * 1e-40]
    for x in cases:
        for channels in (1, x.shape[0]):
            u = x.numpy().reshape(-1).view(np.uint32)
            lo, hi = np.empty((2, channels), np.float32)
            assert k.value_range(u, channels, x.numel() // channels, lo.view(np.uint32),
                                 hi.view(np.uint32))
            rows = x.reshape(channels, -1)
            zero = np.float32(0.0)  # which zero a reduction returns depends on its order
            assert np.array_equal(lo + zero, rows.amin(dim=1).numpy() + zero)
            assert np.array_equal(hi + zero, rows.amax(dim=1).numpy() + zero)
    x = torch.randn(3, 4, 5, 2)  # per channel along axis 1: outer 3, rows of 10 and of 5
    for axis in (1, 2):
        outer, channels = math.prod(x.shape[:axis]), x.shape[axis]
        lo, hi = np.empty((2, channels), np.float32)
        assert k.value_range(x.numpy().reshape(-1).view(np.uint32), channels,
                             x.numel() // (outer * channels), lo.view(np.uint32),
                             hi.view(np.uint32))
        rows = x.movedim(axis, 0).reshape(channels, -1)
        assert np.array_equal(lo, rows.amin(dim=1).numpy()), axis
        assert np.array_equal(hi, rows.amax(dim=1).numpy()), axis
    for bad in (float("inf"), float("-inf"), float("nan"), -float("nan")):
        for at in (0, 5, 12):
            x = torch.randn(13)
            x[at] = bad
            lo, hi = np.empty((2, 1), np.uint32)
            assert not k.value_range(x.numpy().view(np.uint32), 1, 13, lo, hi)
            with pytest.raises(WireError, match="inf or NaN"):
                encode_tensor(x.reshape(1, 13), 4, per_channel_axis=0)


@pytest.mark.skipif(not kernels_load(), reason="numba does not import here")
def test_kernel_threads_are_bounded_by_the_tensor_and_the_affinity(monkeypatch):
    """A Table 6 tensor runs on the caller's thread whatever the core count; larger ones use
    at most one thread per half PARALLEL_MIN values, MAX_WORKERS, and the CPUs the process
    may run on (not the machine's count)."""
    k = kernels_module()
    monkeypatch.setattr(k.os, "sched_getaffinity", lambda pid: set(range(96)), raising=False)
    monkeypatch.setattr(k.os, "cpu_count", lambda: 96)
    assert k.workers_for(1 * 256 * 36 * 64) == 1
    assert k.workers_for(k.PARALLEL_MIN) == 2
    assert k.workers_for(1 << 30) == k.MAX_WORKERS < 96
    monkeypatch.setattr(k.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert k.workers_for(1 << 30) == 3


def test_decoded_tensors_never_share_memory_with_each_other_or_the_message():
    """Whatever buffers the codec keeps between calls, a returned tensor owns its memory."""
    x = _table6()
    for bits, axis in ((4, None), (4, 1), (16, None), (32, None)):
        message = encode_tensor(x, bits, per_channel_axis=axis)
        receive = bytearray(message)
        first = decode_tensor(memoryview(receive))
        kept = first.clone()
        second = decode_tensor(memoryview(receive))
        again = encode_tensor(x, bits, per_channel_axis=axis)
        assert first.data_ptr() != second.data_ptr()
        second.fill_(7.0)
        receive[:] = bytes(len(receive))
        assert torch.equal(first, kept) and again == message, (bits, axis)
