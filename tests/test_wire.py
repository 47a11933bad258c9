"""The wire format: lossless packing, quantization error bounds, compression, and rejection of
malformed or hostile bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesplit.errors import WireError
from edgesplit.quant import (decode_tensor, encode_tensor, message_info, pack_bits, packed_size,
                             unpack_bits)


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
