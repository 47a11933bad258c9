"""The ``this-machine`` device: an analytical model whose peaks are measured live.

Peak FP32 throughput from a large matrix product, memory bandwidth from a large copy, and the
per-layer overhead from calling an empty partition. Measured once per process (about a second).
"""

from __future__ import annotations

import functools
import os

import torch

from edgesplit.hardware.catalog import register_device
from edgesplit.hardware.device import AnalyticalCompute, Device
from edgesplit.hardware.profile import time_call

__all__ = ["measure_this_machine"]


@functools.lru_cache(maxsize=1)
def measure_this_machine() -> Device:
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    matmul_ms = time_call(lambda: a @ b, warmup=2, repeats=10)["median"]
    gops = 2 * n**3 / (matmul_ms * 1e-3) / 1e9
    src = torch.empty(32 * 2**20 // 4)
    dst = torch.empty_like(src)
    copy_ms = time_call(lambda: dst.copy_(src), warmup=2, repeats=10)["median"]
    bandwidth = 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9  # read + write
    graph = torch.fx.symbolic_trace(torch.nn.Identity())
    x = torch.zeros(1)
    overhead_ms = time_call(lambda: graph(x), warmup=10, repeats=50)["median"]
    return Device(
        name="this-machine",
        kind="cpu",
        compute=AnalyticalCompute(
            peak_gops={32: round(gops, 2)},
            memory_bandwidth_gb_per_s=round(bandwidth, 2),
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
        source="measured at run time: 1024x1024 FP32 matmul, 32 MiB copy, empty FX call",
    )


register_device(measure_this_machine, name="this-machine")
