"""How fast this machine encodes and decodes tensors in the wire format: the
:class:`~edgesplit.hardware.WireCodec` a calibrated device carries, so that plans price the
serialisation of crossing tensors as measured here (``edgesplit calibrate``).

It lives in ``plan`` because it runs the wire format (``quant``, above ``hardware``) to price
what the plan's cost model charges per crossing tensor.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from edgesplit.hardware import WireCodec
from edgesplit.quant.wire import decode_tensor, encode_tensor

__all__ = ["measure_wire_codec"]

# two sizes of float32 activation: the small one is mostly the fixed cost, the large one the rate
_SMALL, _LARGE = 1024, 256 * 1024  # elements


def _line(small_ms: float, large_ms: float) -> tuple[float, float]:
    """(fixed ms, GB/s) of the line through two timings of _SMALL and _LARGE float32 tensors."""
    nbytes = (_LARGE - _SMALL) * 4
    per_byte_ms = max(large_ms - small_ms, 1e-9) / nbytes
    fixed = max(0.0, small_ms - _SMALL * 4 * per_byte_ms)
    return fixed, 1.0 / (per_byte_ms * 1e-3) / 1e9


class _Compute:
    """A partition's worth of work (one 64-channel 3x3 convolution on 56x56) run before each
    timed call: in a request the codec runs right after compute, which has evicted its code
    and data from the caches. Timed hot in a loop, encoding 4 KB took 20 us here; after this
    convolution 88 us, and served requests paid 65-90 us per tensor and direction."""

    def __init__(self) -> None:
        self.conv = torch.nn.Conv2d(64, 64, 3, padding=1).eval()
        self.x = torch.randn(1, 64, 56, 56)

    def __call__(self) -> None:
        with torch.no_grad():
            self.conv(self.x)


def _after(before: Callable[[], None], fn: Callable[[], object], repeats: int) -> float:
    """Median ms of ``fn`` over ``repeats`` calls, each right after ``before()``."""
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(statistics.median(times))


def _encode_decode_ms(n: int, bits: int, repeats: int, before: Callable[[], None]
                      ) -> tuple[float, float]:
    x = torch.randn(n)
    data = encode_tensor(x, bits)
    for _ in range(3):  # first calls compile and allocate
        decode_tensor(encode_tensor(x, bits))
    enc = _after(before, lambda: encode_tensor(x, bits), repeats)
    dec = _after(before, lambda: decode_tensor(data), repeats)
    return enc, dec


def measure_wire_codec(repeats: int = 30) -> WireCodec:
    """The wire codec's speed here as a request sees it (each call timed right after a
    convolution, see :class:`_Compute`): float32 sent as is and at 8 bits, each encoded and
    decoded at two sizes (medians of ``repeats``); a fixed cost per tensor and a rate."""
    before = _Compute()
    raw_small, raw_large = (_encode_decode_ms(n, 32, repeats, before) for n in (_SMALL, _LARGE))
    q_small, q_large = (_encode_decode_ms(n, 8, repeats, before) for n in (_SMALL, _LARGE))
    enc_fixed, enc_rate = _line(raw_small[0], raw_large[0])
    dec_fixed, dec_rate = _line(raw_small[1], raw_large[1])
    _, q_enc_rate = _line(q_small[0], q_large[0])
    _, q_dec_rate = _line(q_small[1], q_large[1])
    return WireCodec(encode_gb_per_s=round(enc_rate, 4), decode_gb_per_s=round(dec_rate, 4),
                     quantized_encode_gb_per_s=round(q_enc_rate, 4),
                     quantized_decode_gb_per_s=round(q_dec_rate, 4),
                     encode_tensor_ms=round(enc_fixed, 5), decode_tensor_ms=round(dec_fixed, 5),
                     source=f"measured here: wire format at 32 and 8 bits, {_SMALL} and "
                            f"{_LARGE} float32 elements, medians of {repeats}, each right "
                            "after a convolution (caches as a request leaves them)")
