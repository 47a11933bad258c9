"""The in-context timer both latency tables are measured with.

A part of a network (a block, an op, a stem) is timed *where it sits in a chain*: a chain of
parts runs as a deployed network would, and each call is timed on its own, so a part sees the
caches, weights and activations its neighbours leave behind. Timing a part alone in a loop
keeps its weights and activations hot and predicts whole networks too fast (about 18 % for
JMSNAS's ops on a 2-core Xeon; AdaptiveNet's first, memory-bound block read twice as slow as
inside a network); in context the parts sum to within a few percent of the whole.

Each chain runs in a burst of :data:`BURST` passes back to back and the first pass is not
kept, so weights are as warm as in a network serving one request after another. The blocks of
whole-network calls, the warm-up and repeat counts and the median live a layer down, in
:mod:`edgesplit.hardware.timing`.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

import torch

__all__ = ["BURST", "InContextTimer"]

BURST = 3  # passes of a chain per burst; the first is not kept


class InContextTimer:
    """Nanosecond samples of calls timed where they sit in a chain, per key (a block's name,
    a (layer, op) position, ``"stem"``). Calls on a CUDA ``device`` wait for the GPU before
    the clock stops: an asynchronous launch would otherwise time only the launch."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.samples: defaultdict[Hashable, list[int]] = defaultdict(list)
        self._cuda = device if device is not None and device.type == "cuda" else None
        self._keep = False

    def call(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, its nanoseconds added to ``key``'s samples in a kept pass."""
        t0 = time.perf_counter_ns()
        out = fn(*args)
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
        t1 = time.perf_counter_ns()
        if self._keep:
            self.samples[key].append(t1 - t0)
        return out

    def burst(self, chain: Callable[[], object], timed: bool) -> None:
        """``chain()`` run :data:`BURST` times back to back; all passes but the first are
        kept when ``timed`` (none during warm-up)."""
        try:
            for keep in (False, *[timed] * (BURST - 1)):
                self._keep = keep
                chain()
        finally:
            self._keep = False

    def seconds(self, key: Hashable) -> float:
        """The median of ``key``'s samples, in seconds (the unit of every latency table)."""
        return statistics.median(self.samples[key]) / 1e9

    def count(self, key: Hashable) -> int:
        return len(self.samples.get(key, ()))
