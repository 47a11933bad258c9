"""Where each device's stage of a causal LM starts and ends: the exact placement by dynamic
programming, a brute-force reference, and the baselines it is compared with.

A placement is boundaries ``0 = b_0 <= b_1 <= ... <= b_M = n``: device m runs blocks
``[b_m, b_{m+1})``, possibly none (it relays; allowed everywhere, the first device included,
so "everything on device k" is a placement too and the optimum is never slower than the best
single device).

Objectives (:class:`~edgesplit.llm.planning.costs.LLMWorkload`):

- ``latency``: one request, TTFT + (N-1) x TPOT. Stages and links add up, so
  ``F_m[b] = min_a F_{m-1}[a] + link_{m-1}(a) + stage_m(a, b)`` over the ranges that fit
  device m's memory is exact: the chain DP (:func:`edgesplit.plan.chain_dp.solve_chain`), in
  O(M n), since a stage's request time adds up over blocks and its memory grows with them.
- ``throughput``: the slowest stage of a decode step (a device's compute, or a link's wire and
  codec time in either direction), the bound on tokens/s of a stream with enough sessions in
  flight; ties go to the lower request latency. The optimum period is one of the stage or link
  values, so a binary search over those values for the smallest one under which the latency
  DP (with longer stages ruled out) still finds a placement is exact, and that DP's answer
  is the lowest latency at that period.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgesplit.errors import InfeasibleError, option
from edgesplit.llm.planning.costs import LLMChainCosts, Objective
from edgesplit.plan.chain_dp import solve_chain

__all__ = [
    "StagePlacement",
    "best_single_device",
    "brute_force_placement",
    "equal_split",
    "evaluate_placement",
    "memory_proportional",
    "solve_placement",
]


@dataclass(frozen=True)
class StagePlacement:
    """One placement and its numbers. Per device: compute per prefill and per decode step,
    memory. Per link: the prefill's send plus the first token back, a decode step's send plus
    its token back (latency and codec included)."""

    boundaries: tuple[int, ...]
    prefill_ms: tuple[float, ...]
    decode_ms: tuple[float, ...]
    link_prefill_ms: tuple[float, ...]
    link_decode_ms: tuple[float, ...]
    period_ms: float
    decode_steps: int
    memory_bytes: tuple[int, ...]
    over_memory: tuple[str, ...] = ()  # one line per device over its memory

    @property
    def feasible(self) -> bool:
        return not self.over_memory

    @property
    def ttft_ms(self) -> float:
        return sum(self.prefill_ms) + sum(self.link_prefill_ms)

    @property
    def tpot_ms(self) -> float:
        return sum(self.decode_ms) + sum(self.link_decode_ms)

    @property
    def request_ms(self) -> float:
        return self.ttft_ms + self.decode_steps * self.tpot_ms

    @property
    def tokens_per_s(self) -> float:
        """One session's decode speed."""
        return 1e3 / self.tpot_ms if self.tpot_ms > 0 else math.inf

    @property
    def pipeline_tokens_per_s(self) -> float:
        """A stream's bound: one token per slowest stage, with enough sessions in flight."""
        return 1e3 / self.period_ms if self.period_ms > 0 else math.inf

    def key(self, objective: Objective) -> tuple[float, ...]:
        """What the objective minimises, in order."""
        if objective == "latency":
            return (self.request_ms,)
        return (self.period_ms, self.request_ms)

    def ranges(self) -> list[tuple[int, int]]:
        return list(itertools.pairwise(self.boundaries))


class _Tables:
    """Prefix sums and per-range matrices shared by evaluation and the DP, so both compute
    every number the same way (the throughput search compares them exactly)."""

    def __init__(self, costs: LLMChainCosts) -> None:
        zeros = np.zeros((costs.m, 1))
        self.pre = np.concatenate([zeros, np.cumsum(costs.prefill_ms, axis=1)], axis=1)
        self.dec = np.concatenate([zeros, np.cumsum(costs.decode_ms, axis=1)], axis=1)
        steps = costs.workload.decode_steps
        n = costs.n
        upper = np.triu(np.ones((n + 1, n + 1), dtype=bool))  # a <= b
        # [m, a, b]: a device's decode step over blocks [a, b), and its whole request
        decode = self.dec[:, None, :] - self.dec[:, :, None]
        self.stage_decode = np.where(upper, decode, np.inf)
        self.stage_request = np.where(
            upper, (self.pre[:, None, :] - self.pre[:, :, None]) + steps * decode, np.inf)
        limits = np.array([np.inf if x is None else x for x in costs.memory_limits])
        self.fits = upper[None] & (costs.memory_need[None] <= limits[:, None, None])
        # [m, c]: link m's whole request, and its busiest direction in a decode step
        self.link_request = np.array([[costs.link_request_ms(m, c) for c in range(n + 1)]
                                      for m in range(costs.m - 1)]).reshape(costs.m - 1, n + 1)
        self.link_period = np.array(
            [[max(costs.forward_decode[m][c].occupancy_ms, costs.back[m][c].occupancy_ms)
              for c in range(n + 1)] for m in range(costs.m - 1)]).reshape(costs.m - 1, n + 1)


def evaluate_placement(costs: LLMChainCosts, boundaries: Sequence[int], *,
                       tables: _Tables | None = None) -> StagePlacement:
    """The numbers of one placement (memory overruns reported, not refused). ``tables``: the
    cost tables' sums, when the caller evaluates many placements."""
    b = tuple(int(x) for x in boundaries)
    if len(b) != costs.m + 1 or b[0] != 0 or b[-1] != costs.n or any(
            x > y for x, y in itertools.pairwise(b)):
        raise ValueError(f"boundaries must rise from 0 to {costs.n} over {costs.m} devices, "
                         f"got {b}")
    t = tables or _Tables(costs)
    ranges = list(itertools.pairwise(b))
    decode = tuple(float(t.stage_decode[m, lo, hi]) for m, (lo, hi) in enumerate(ranges))
    cuts = b[1:-1]
    fwd_p = [costs.forward_prefill[m][c] for m, c in enumerate(cuts)]
    fwd_d = [costs.forward_decode[m][c] for m, c in enumerate(cuts)]
    back = [costs.back[m][c] for m, c in enumerate(cuts)]
    memory = tuple(int(costs.memory_need[lo, hi]) for lo, hi in ranges)
    over = tuple(f"device memory: {d} needs {need:,} bytes, has {limit:,}"
                 for d, need, limit in zip(costs.devices, memory, costs.memory_limits,
                                           strict=True)
                 if limit is not None and need > limit)
    period = max([*decode, *(float(t.link_period[m, c]) for m, c in enumerate(cuts))])
    return StagePlacement(
        boundaries=b,
        prefill_ms=tuple(float(t.pre[m, hi] - t.pre[m, lo]) for m, (lo, hi) in enumerate(ranges)),
        decode_ms=decode,
        link_prefill_ms=tuple(f.ms + k.ms for f, k in zip(fwd_p, back, strict=True)),
        link_decode_ms=tuple(f.ms + k.ms for f, k in zip(fwd_d, back, strict=True)),
        period_ms=period, decode_steps=costs.workload.decode_steps, memory_bytes=memory,
        over_memory=over)


def _dp(costs: LLMChainCosts, t: _Tables, bound: float = math.inf) -> tuple[int, ...] | None:
    """Boundaries of the lowest-latency placement whose every stage and link is at most
    ``bound`` per decode step; None if no placement fits. Ties go to the earlier boundary."""
    request_prefix = t.pre + costs.workload.decode_steps * t.dec

    def transfer(hop: int, cut: int) -> float:
        return float(t.link_request[hop, cut]) if t.link_period[hop, cut] <= bound else math.inf

    def fits(m: int, a: int, b: int) -> bool:
        return bool(t.fits[m, a, b]) and t.stage_decode[m, a, b] <= bound

    return solve_chain(request_prefix, transfer, fits, ties="first").boundaries()


def solve_placement(costs: LLMChainCosts, objective: Objective | None = None) -> StagePlacement:
    """The exact best placement for ``objective`` (default: the workload's) under every
    device's memory; InfeasibleError saying what to change if none fits."""
    objective = objective or costs.workload.objective
    t = _Tables(costs)  # once: the throughput search runs the DP a dozen times
    found = _dp(costs, t)
    if found is None:
        raise _infeasible(costs)
    if objective == "throughput":
        values = np.concatenate([t.stage_decode[t.fits], t.link_period.ravel(), [0.0]])
        candidates = np.unique(values[np.isfinite(values)])
        lo, hi = 0, len(candidates) - 1  # the largest candidate bounds nothing: feasible
        while lo < hi:
            mid = (lo + hi) // 2
            if _dp(costs, t, float(candidates[mid])) is not None:
                hi = mid
            else:
                lo = mid + 1
        found = _dp(costs, t, float(candidates[lo]))
        assert found is not None
    return evaluate_placement(costs, found, tables=t)


def brute_force_placement(costs: LLMChainCosts, objective: Objective | None = None
                          ) -> StagePlacement:
    """Every placement evaluated: the reference the DP is tested against (small chains)."""
    objective = objective or costs.workload.objective
    t = _Tables(costs)
    found = [evaluate_placement(costs, (0, *cuts, costs.n), tables=t) for cuts in
             itertools.combinations_with_replacement(range(costs.n + 1), costs.m - 1)]
    feasible = [p for p in found if p.feasible]
    if not feasible:
        raise _infeasible(costs)
    return min(feasible, key=lambda p: p.key(objective))


def _infeasible(costs: LLMChainCosts) -> InfeasibleError:
    lm, w = costs.lm, costs.workload
    limits = ", ".join(f"{d} {'unbounded' if x is None else f'{x:,}'}"
                       for d, x in zip(costs.devices, costs.memory_limits, strict=True))
    return InfeasibleError(
        f"device memory: {lm.name} in {lm.dtype} needs {int(costs.weight_bytes[0, lm.n]):,} "
        f"bytes of weights and {int(costs.kv_bytes[0, lm.n]):,} of KV cache ({w.sessions} "
        f"session(s) x {w.context} tokens), and no split into contiguous stages fits the "
        f"devices of {costs.topology.name} ({limits} bytes). Use a narrower "
        f"{option('dtype', flag='--precision')}, a shorter {option('max_context')}, "
        f"fewer {option('sessions')}, or "
        "devices with more memory")


# ---- baselines --------------------------------------------------------------------------------

def _from_counts(costs: LLMChainCosts, counts: Sequence[int]) -> StagePlacement:
    """Decoder blocks per device in chain order; the embedding goes with the first device, the
    head with the last (how exo and llama.cpp shard: layer ranges, ends attached)."""
    inner = [1 + int(x) for x in np.cumsum(counts)[:-1]]
    return evaluate_placement(costs, (0, *inner, costs.n))


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` items in proportion to ``weights``, largest remainders first (ties: earlier
    devices)."""
    quotas = [total * w / sum(weights) for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


def memory_proportional(costs: LLMChainCosts) -> StagePlacement:
    """exo's placement: decoder blocks in proportion to each device's memory (a device with
    no stated memory weighs as much as the largest stated one), whatever the speeds."""
    known = [x for x in costs.memory_limits if x is not None]
    weights = [float(x if x is not None else max(known, default=1))
               for x in costs.memory_limits]
    return _from_counts(costs, _apportion(costs.lm.shape.num_layers, weights))


def equal_split(costs: LLMChainCosts) -> StagePlacement:
    """The same number of decoder blocks on every device (the first ones take the rest)."""
    layers, m = costs.lm.shape.num_layers, costs.m
    return _from_counts(costs, [layers // m + (1 if i < layers % m else 0) for i in range(m)])


def best_single_device(costs: LLMChainCosts, objective: Objective | None = None
                       ) -> StagePlacement:
    """Every block on one device (the others relay the prompt and the tokens): the best that
    fits, else the one with the most memory, infeasible."""
    objective = objective or costs.workload.objective
    t = _Tables(costs)
    options = [evaluate_placement(costs, (0,) * (k + 1) + (costs.n,) * (costs.m - k), tables=t)
               for k in range(costs.m)]
    feasible = [p for p in options if p.feasible]
    if feasible:
        return min(feasible, key=lambda p: p.key(objective))
    room = [math.inf if x is None else float(x) for x in costs.memory_limits]
    roomiest = max(range(costs.m), key=room.__getitem__)
    return options[roomiest]

