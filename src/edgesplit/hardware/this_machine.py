"""The ``this-machine`` device: an analytical model whose peaks are measured live.

Peak FP32 throughput from a large matrix product; memory bandwidth by working-set size from
streaming reads of 256 KiB to 256 MiB (the largest is the off-chip bandwidth, the smaller ones
the memory tiers: caches); the per-layer overhead from calling an empty partition. Measured
once per process (about a second).
"""

from __future__ import annotations

import functools
import os

import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware.catalog import register_device
from edgesplit.hardware.device import AnalyticalCompute, Device, MemoryTier
from edgesplit.hardware.profile import time_call

__all__ = ["TIER_SIZES", "measure_memory_tiers", "measure_this_machine", "monotone_tiers"]

# Working sets streamed, x4 apart: from well inside a core's L2 to well beyond the last-level
# cache a VM slice of a server CPU really gets (its nominal L3 is shared with other tenants).
TIER_SIZES = tuple(256 * 1024 * 4**k for k in range(6))  # 256 KiB ... 256 MiB
_STREAMED_PER_SIZE = 128 * 2**20  # bytes read per size, so small sizes repeat enough


def _read_gb_per_s(nbytes: int) -> float:
    """GB/s of reading a float32 matrix of ``nbytes`` once with a matrix-vector product: the
    kernel of a fully-connected layer at batch 1, whose weights are read once per call."""
    cols = 1024
    rows = max(1, nbytes // (4 * cols))
    matrix = torch.ones(rows, cols)
    vector = torch.ones(cols)
    repeats = min(200, max(8, _STREAMED_PER_SIZE // nbytes))
    # the fastest call, not the median: the least disturbed by other processes (STREAM's rule)
    best_ms = time_call(lambda: torch.mv(matrix, vector), warmup=2, repeats=repeats)["min"]
    return rows * cols * 4 / (best_ms * 1e-3) / 1e9


def monotone_tiers(measured: dict[int, float]) -> tuple[tuple[MemoryTier, ...], float]:
    """(tiers, off-chip GB/s) from GB/s measured by working-set size. A larger working set never
    streams faster, so each size takes the best rate of any size at least as large (a small
    buffer's call overhead must not make its level look slower than the next); tiers no faster
    than the next larger one merge into it. The largest size is the off-chip bandwidth."""
    if not measured or min(measured.values()) <= 0:
        raise ConfigError(f"memory tiers need positive GB/s at one size or more, got {measured}")
    sizes = sorted(measured)
    rates: dict[int, float] = {}
    best = 0.0
    for size in reversed(sizes):
        best = max(best, measured[size])
        rates[size] = best
    off_chip = round(rates[sizes[-1]], 2)
    tiers: list[MemoryTier] = []
    for size in reversed(sizes[:-1]):
        next_rate = tiers[0].bandwidth_gb_per_s if tiers else off_chip
        if round(rates[size], 2) > next_rate:  # else the next larger tier holds it as fast
            tiers.insert(0, MemoryTier(max_bytes=size, bandwidth_gb_per_s=round(rates[size], 2)))
    return tuple(tiers), off_chip


def measure_memory_tiers(sizes: tuple[int, ...] = TIER_SIZES
                         ) -> tuple[tuple[MemoryTier, ...], float]:
    """Memory tiers and off-chip bandwidth of this machine, streamed at ``sizes`` (bytes) with
    torch's current thread count (the one layers run with)."""
    return monotone_tiers({size: _read_gb_per_s(size) for size in sizes})


@functools.lru_cache(maxsize=1)
def measure_this_machine() -> Device:
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    matmul_ms = time_call(lambda: a @ b, warmup=2, repeats=10)["median"]
    gops = 2 * n**3 / (matmul_ms * 1e-3) / 1e9
    tiers, off_chip = measure_memory_tiers()
    graph = torch.fx.symbolic_trace(torch.nn.Identity())
    x = torch.zeros(1)
    overhead_ms = time_call(lambda: graph(x), warmup=10, repeats=50)["median"]
    return Device(
        name="this-machine",
        kind="cpu",
        compute=AnalyticalCompute(
            peak_gops={32: round(gops, 2)},
            memory_bandwidth_gb_per_s=off_chip,
            memory_tiers=tiers,
            # CPU libraries reach most of the matmul peak on large dense products and much less
            # on depthwise and element-wise work.
            efficiency={"conv": 0.6, "dwconv": 0.15, "matmul": 0.8, "attention": 0.5,
                        "pool": 0.3, "norm": 0.3, "elementwise": 0.3, "embedding": 0.3},
            default_efficiency=0.5,
            layer_overhead_ms=round(overhead_ms, 4),
        ),
        memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        supported_bits=(8, 16, 32),
        description=f"this machine, {torch.get_num_threads()} threads, measured live",
        source="measured at run time: 1024x1024 FP32 matmul, matrix-vector reads of 256 KiB "
               "to 256 MiB (memory tiers, off-chip), empty FX call",
    )


register_device(measure_this_machine, name="this-machine")
