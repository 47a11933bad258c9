"""Timing primitives the latency tables of the NAS systems share: the conditions timed calls
run under, a block of back-to-back calls (warm-up, then repeats), the median, and what makes
this computer's timings its own.

Whole networks are timed in blocks, not one call each in a round-robin over many networks: on
a 2-core Xeon a round-robin over 30 networks made each about 5 % slower than the same network
serving requests back to back, which is what a deployment does.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from edgesplit.errors import ConfigError

__all__ = ["check_counts", "machine_identity", "median_ms", "synced", "time_block",
           "timing_conditions"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_identity() -> dict[str, Any]:
    """What makes this computer's timings its own: CPU model, logical CPUs, architecture, OS.

    ``this-machine`` is re-measured in every process, so its peaks differ run to run; a table
    measured here is tied to this identity instead, so that it loads again on this computer
    (and on an identical one) but not on another."""
    return {"processor": _cpu_model(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "system": platform.system()}


@contextmanager
def timing_conditions(threads: int) -> Iterator[None]:
    """Timing conditions: ``threads`` torch threads, no autograd (as the runtime runs), no
    garbage-collection pauses inside timed calls. Restores the caller's settings."""
    before = torch.get_num_threads()
    gc_was_enabled = gc.isenabled()
    torch.set_num_threads(threads)
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            yield
    finally:
        if gc_was_enabled:
            gc.enable()
        torch.set_num_threads(before)


def time_block(fn: Callable[[], object], untimed: int, timed: int, samples: list[int]) -> None:
    """``fn`` run ``untimed`` then ``timed`` times back to back, appending the timed calls'
    nanoseconds to ``samples``: warm, the way a network serving one request after another
    runs."""
    for _ in range(untimed):
        fn()
    for _ in range(timed):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)


def synced(fn: Callable[[], object], like: torch.Tensor) -> Callable[[], object]:
    """``fn``, waiting for the GPU when ``like`` lives there: an asynchronous launch would
    otherwise time only the launch."""
    if like.is_cuda:
        def timed() -> object:
            out = fn()
            torch.cuda.synchronize(like.device)
            return out
        return timed
    return fn


def median_ms(samples_ns: Sequence[int]) -> float:
    """The median of nanosecond samples, in milliseconds."""
    return statistics.median(samples_ns) / 1e6


def check_counts(**counts: tuple[Any, int]) -> None:
    """Each ``name=(value, least)`` an integer of at least ``least`` (warm-up and repeat
    counts, samples, threads), else a ConfigError naming it."""
    for what, (value, low) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{what}={value!r} must be an integer >= {low}")
