"""One dynamic program for every placement of an ordered list of items (layers, decoder blocks,
network units) in contiguous ranges on a chain of devices, at the least total cost. Multisplit
(:mod:`edgesplit.plan.multisplit`), the LLM stage placement
(:mod:`edgesplit.llm.planning.placement`) and JMSNAS's unit placement
(:mod:`edgesplit.nas.jmsnas.chain_latency`) call it, each with its own costs.

A placement is boundaries ``0 = b_0 <= b_1 <= ... <= b_M = n``: device m runs items
``[b_m, b_{m+1})``, possibly none (it relays), and hop m (device m to m+1) carries what is live
at cut ``b_{m+1}``. Its cost is

    sum over m of compute_m(b_m, b_{m+1})  +  sum over m < M-1 of transfer(m, b_{m+1}),

with compute additive over items, given by its prefix sums: ``compute_m(a, b) = P_m[b] -
P_m[a]``; a range allowed only where ``fits(m, a, b)``, a cut only where ``transfer`` is finite.

Recurrence (``F_m[b]``: the least cost of items ``[0, b)`` on devices 0..m, device m's range
ending at b; the answer is ``F_{M-1}[n]``)::

    F_0[b] = P_0[b] - P_0[0]                          if fits(0, 0, b), else inf
    F_m[b] = P_m[b] + min over a in W_m(b) of G_m(a)
    G_m(a) = F_{m-1}[a] + transfer(m-1, a) - P_m[a],  W_m(b) = {a <= b : fits(m, a, b)}

Invariant asked of ``fits``: a sub-range of an allowed range is allowed (weights, the peak live
set and a stage's time all grow with the range). Then ``W_m(b)`` is an interval
``[lo_m(b), b]`` whose ``lo_m`` never moves left as b grows, and a deque of the candidates a,
increasing in a and in ``G_m(a)``, holds each minimum at its front (sliding-window minimum).

Ties (equal ``G_m(a)``): ``ties="last"`` takes the largest a, so that, read back from the end,
later devices run as few items as they can (multisplit; JMSNAS's placement, which gives the
last unit the lowest device, then the unit before, and so on: the same order);
``ties="first"`` takes the smallest a (the LLM placement).

Objectives: the DP minimises a sum (latency). A max (a pipeline's period, its slowest stage)
is the caller's search over a bound, ruling out longer stages through ``fits`` and slower cuts
through ``transfer``; the DP then gives the least sum under that period.

Complexity: O(M n) time (every a enters and leaves each device's deque at most once, and
``fits`` and ``transfer`` are called O(M n) times) and O(M n) memory for the starts kept to
rebuild the boundaries.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["ChainTable", "Ties", "solve_chain"]

Ties = Literal["first", "last"]
Transfer = Callable[[int, int], float]  # (hop, cut) -> ms, inf: the cut is ruled out there
Fits = Callable[[int, int, int], bool]  # (device, start, end) -> whether it may run [start, end)


def _everything_fits(device: int, start: int, end: int) -> bool:
    return True


@dataclass(frozen=True)
class ChainTable:
    """The DP's last row and the starts that rebuild a placement from it."""

    finish: list[float]  # F_{M-1}[b]: items [0, b) on the whole chain; inf where none fits
    starts: list[list[int]]  # starts[m][b]: where device m's range starts in F_m[b]'s placement

    @property
    def cost(self) -> float:
        """The least cost of every item on the chain (inf if no placement fits)."""
        return self.finish[-1]

    def boundaries(self, end: int | None = None) -> tuple[int, ...] | None:
        """``b_0..b_M`` of the best placement of items ``[0, end)`` (default: all of them);
        None if none fits."""
        end = len(self.finish) - 1 if end is None else end
        if self.finish[end] == math.inf:
            return None
        bounds = [end]
        for m in range(len(self.starts) - 1, 0, -1):
            bounds.append(self.starts[m][bounds[-1]])
        bounds.append(0)
        return tuple(reversed(bounds))


def solve_chain(compute_prefix: np.ndarray, transfer: Transfer, fits: Fits = _everything_fits,
                *, ties: Ties = "last") -> ChainTable:
    """The least-cost placement of n items on M devices (the module's recurrence).

    ``compute_prefix``: [M, n+1], device m's compute over items [0, b) at ``[m, b]``.
    ``transfer(hop, cut)``: ms of the cut's data over hop m (device m to m+1), inf to rule the
    cut out there. ``fits(device, start, end)``: whether the device may run [start, end); a
    sub-range of an allowed range must be allowed."""
    prefix = compute_prefix
    n = prefix.shape[1] - 1
    finish = [float(prefix[0, b] - prefix[0, 0]) if fits(0, 0, b) else math.inf
              for b in range(n + 1)]
    starts = [[0] * (n + 1)]
    for m in range(1, prefix.shape[0]):
        finish, chosen = _next_device(m, finish, prefix[m], transfer, fits, ties)
        starts.append(chosen)
    return ChainTable(finish, starts)


def _next_device(m: int, before: list[float], prefix: np.ndarray, transfer: Transfer,
                 fits: Fits, ties: Ties) -> tuple[list[float], list[int]]:
    """``F_m`` and its argmins from ``F_{m-1}`` (``before``), by a sliding-window minimum."""
    n = len(before) - 1
    # a later candidate with a key no worse (ties "last") or strictly better drops older ones
    dominates = operator.le if ties == "last" else operator.lt
    reach = [math.inf] * (n + 1)  # F_{m-1}[a] + transfer(m-1, a)
    key = [math.inf] * (n + 1)  # G_m(a)
    window: deque[int] = deque()  # candidate a's, increasing in a and in key
    finish, chosen = [math.inf] * (n + 1), [-1] * (n + 1)
    lo = 0
    for b in range(n + 1):
        if before[b] < math.inf:
            reach[b] = before[b] + transfer(m - 1, b)
        if reach[b] < math.inf:
            key[b] = reach[b] - prefix[b]
            while window and dominates(key[b], key[window[-1]]):
                window.pop()
            window.append(b)
        while lo <= b and not fits(m, lo, b):  # W_m(b) = [lo, b]
            lo += 1
        while window and window[0] < lo:
            window.popleft()
        if window:
            a = window[0]
            finish[b], chosen[b] = reach[a] + prefix[b] - prefix[a], a
    return finish, chosen
