"""The ``this-machine`` device: an analytical model whose peaks are measured on this machine.

Peak FP32 throughput from a large matrix product; memory bandwidth by working-set size from
streaming reads of 256 KiB to 256 MiB (the largest is the off-chip bandwidth, the smaller ones
the memory tiers: caches); the per-layer overhead from calling an empty partition. Measuring
takes seconds and half a gigabyte, so the result is kept in the cache folder under a
fingerprint of what it depends on (processor, cores, memory, torch's build and thread count)
and measured again only when that changes, or when asked (:func:`remeasure_this_machine`,
``edgesplit devices --remeasure``, ``EDGESPLIT_REMEASURE=1``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import time
from pathlib import Path

import torch

from edgesplit.data.cache import cache_dir
from edgesplit.errors import ConfigError
from edgesplit.hardware.catalog import register_device
from edgesplit.hardware.device import AnalyticalCompute, Device, MemoryTier
from edgesplit.hardware.profile import time_call

__all__ = ["TIER_SIZES", "machine_fingerprint", "measure_memory_tiers", "measure_this_machine",
           "monotone_tiers", "remeasure_this_machine"]

log = logging.getLogger(__name__)
MEASUREMENT_VERSION = 1  # raise when what is measured changes: older caches are not taken

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


def _fingerprint() -> str:
    """What the measurement depends on, hashed: a cached one measured elsewhere (another
    processor, more cores, another torch, another thread count) is never taken."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [line.split(":", 1)[1].strip() for line in
                 Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    key = (f"{cpu}|{os.cpu_count()}|{_memory_bytes()}|{torch.__version__}|"
           f"{torch.get_num_threads()}|{MEASUREMENT_VERSION}")
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def machine_fingerprint() -> str:
    """What a measurement made here depends on (processor, cores, memory, torch's build and
    thread count), hashed: the key of every measurement cached for this machine (its peaks
    here, an LLM's block times in ``llm.planning.calibration``)."""
    return _fingerprint()


def _cache_path() -> Path:
    return cache_dir() / "hardware" / f"this-machine-{_fingerprint()}.json"


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@functools.lru_cache(maxsize=1)
def measure_this_machine() -> Device:
    """This machine as a device: read from the cache when measured here before, else measured
    now and cached (a cache that cannot be written or read is measured around)."""
    path = _cache_path()
    if not os.environ.get("EDGESPLIT_REMEASURE") and path.is_file():
        try:
            return Device.model_validate_json(path.read_text())
        except (OSError, ValueError):
            log.warning("unreadable %s: measuring this machine again", path)
    return _measured_and_cached(path)


def remeasure_this_machine() -> Device:
    """Measure this machine now (the cached measurement replaced): after a change the
    fingerprint does not see, or one taken while the machine was busy."""
    measure_this_machine.cache_clear()
    device = _measured_and_cached(_cache_path())
    measure_this_machine.cache_clear()
    return device


def _measured_and_cached(path: Path) -> Device:
    device = _measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(device.model_dump_json(indent=1))
        partial.replace(path)  # whole or not at all: a reader never sees half a file
    except OSError as exc:
        log.warning("could not cache this machine's measurement at %s (%s)", path, exc)
    return device


def _measure() -> Device:
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
        memory_bytes=_memory_bytes(),
        supported_bits=(8, 16, 32),
        description=f"this machine, {torch.get_num_threads()} threads, measured here",
        source=f"measured {time.strftime('%Y-%m-%d %H:%M')} (cached; `edgesplit devices "
               "--remeasure` measures again): 1024x1024 FP32 matmul, matrix-vector reads of "
               "256 KiB to 256 MiB (memory tiers, off-chip), empty FX call",
    )


register_device(measure_this_machine, name="this-machine")
