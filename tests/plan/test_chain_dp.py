"""The one chain DP (plan/chain_dp.py) against the three it replaced, on random instances.

Each old DP is kept here verbatim as the reference: multisplit's window DP, the LLM
placement's vectorised DP (with its throughput search) and JMSNAS's unit-by-unit placement.
Costs are drawn two ways: small integers, where float sums are exact so every tie is a real
tie and the tie rules must agree (same plans, same tables), and arbitrary floats, where
multisplit (the same arithmetic as before) must still agree bit for bit and the other two,
whose sums are now taken in another order, must reach the same cost.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from transformers import LlamaConfig

from edgesplit.errors import InfeasibleError
from edgesplit.hardware import AnalyticalCompute, Device, Link, chain
from edgesplit.llm import describe_causal_lm
from edgesplit.llm.planning.costs import LLMChainCosts, LLMWorkload, SendCost
from edgesplit.llm.planning.placement import _Tables, evaluate_placement, solve_placement
from edgesplit.nas.jmsnas import chain_latency
from edgesplit.nas.jmsnas.chain_latency import _relay_ms
from edgesplit.plan import multisplit
from edgesplit.plan.multisplit import ChainAssignment, ChainCosts, evaluate_boundaries

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _values(exact: bool, high: float = 4.0):
    """Small integers (exact sums, many ties, zeros included) or arbitrary floats."""
    if exact:
        return st.integers(0, int(high)).map(float)
    return st.floats(0.0, high * 2.5, allow_nan=False)


# ---- reference 1: plan/multisplit.py's _solve, as it was ----------------------------------


def _old_multisplit_solve(costs: ChainCosts, period_bound: float = math.inf, *,
                          return_table: bool = False):
    M, n = costs.layer_ms.shape
    prefix = np.concatenate([np.zeros((M, 1)), np.cumsum(costs.layer_ms, axis=1)], axis=1)
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(M)]
    arg = [[-1] * (n + 1) for _ in range(M)]
    for b in range(n + 1):  # device 0 runs [0, b)
        if prefix[0, b] <= period_bound and _old_feasible_memory(costs, 0, 0, b):
            best[0][b] = float(prefix[0, b])
            arg[0][b] = 0
    for m in range(1, M):
        link = costs.link_ms[m - 1]
        window: deque[int] = deque()  # candidate a's, increasing G
        lo = 0
        for b in range(n + 1):
            if best[m - 1][b] < inf and link[b] <= period_bound:
                g = best[m - 1][b] + link[b] - prefix[m, b]
                while window and (best[m - 1][window[-1]] + link[window[-1]]
                                  - prefix[m, window[-1]]) >= g:
                    window.pop()
                window.append(b)
            # the range [a, b) must fit: memory and stage bound grow as a moves left
            while lo <= b and not (_old_feasible_memory(costs, m, lo, b)
                                   and prefix[m, b] - prefix[m, lo] <= period_bound):
                lo += 1
            while window and window[0] < lo:
                window.popleft()
            if window:
                a = window[0]
                best[m][b] = best[m - 1][a] + link[a] + prefix[m, b] - prefix[m, a]
                arg[m][b] = a

    def rebuild(end: int) -> ChainAssignment:
        bounds = [end]
        for m in range(M - 1, 0, -1):
            bounds.append(arg[m][bounds[-1]])
        bounds.append(0)
        return evaluate_boundaries(costs, bounds[::-1])

    result = None if best[M - 1][n] == inf else rebuild(n)
    return (result, best[M - 1], rebuild) if return_table else result


def _old_feasible_memory(costs: ChainCosts, m: int, a: int, b: int) -> bool:
    limit = costs.memory_limits[m]
    return limit is None or costs.range_memory(a, b) <= limit


@st.composite
def _chain_costs(draw, exact: bool) -> tuple[ChainCosts, float]:
    m, n = draw(st.integers(1, 4)), draw(st.integers(0, 7))
    values = _values(exact)
    layer_ms = draw(arrays(float, (m, n), elements=values))
    link_ms = draw(arrays(float, (m - 1, n + 1), elements=values))
    cut_bytes = draw(st.lists(st.integers(0, 60), min_size=n + 1, max_size=n + 1))
    live = draw(arrays(np.int64, n, elements=st.integers(0, 100)))
    weights = draw(arrays(np.int64, n, elements=st.integers(0, 50)))
    limits = draw(st.lists(st.none() | st.integers(0, 400), min_size=m, max_size=m))
    costs = ChainCosts(None, [f"d{i}" for i in range(m)], layer_ms, link_ms,  # type: ignore[arg-type]
                       cut_bytes, live, np.concatenate([[0], np.cumsum(weights)]), limits)
    stages = [float(v) for v in (*layer_ms.ravel(), *link_ms.ravel())]
    bound = draw(st.just(math.inf) | (st.sampled_from(stages) if stages else st.just(math.inf))
                 | _values(exact, 12.0))
    return costs, bound


def _same_multisplit(costs: ChainCosts, bound: float) -> None:
    old_found, old_table, old_rebuild = _old_multisplit_solve(costs, bound, return_table=True)
    found, table, rebuild = multisplit._solve(costs, bound, return_table=True)
    assert (found is None) == (old_found is None)
    if found is not None:
        assert found == old_found
    assert list(table) == list(old_table)  # bit for bit, inf included
    for end, ms in enumerate(old_table):
        if ms < math.inf:
            assert rebuild(end) == old_rebuild(end)


@SETTINGS
@given(data=st.data(), exact=st.booleans())
def test_multisplit_plans_and_tables_are_unchanged(data, exact):
    costs, bound = data.draw(_chain_costs(exact))
    _same_multisplit(costs, bound)
    _same_multisplit(costs, math.inf)


# ---- reference 2: plan/llm_placement.py's _dp and solve_placement, as they were -------------


def _old_llm_dp(costs: LLMChainCosts, t: _Tables, bound: float = math.inf
                ) -> tuple[int, ...] | None:
    allowed = t.fits & (t.stage_decode <= bound)
    stage = np.where(allowed, t.stage_request, np.inf)
    link = np.where(t.link_period <= bound, t.link_request, np.inf)
    best = stage[0, 0].copy()  # device 0 runs [0, b)
    args = []
    for m in range(1, costs.m):
        total = (best + link[m - 1])[:, None] + stage[m]  # [a, b]
        arg = np.argmin(total, axis=0)
        best = total[arg, np.arange(costs.n + 1)]
        args.append(arg)
    if not np.isfinite(best[costs.n]):
        return None
    bounds = [costs.n]
    for arg in reversed(args):
        bounds.append(int(arg[bounds[-1]]))
    return (0, *reversed(bounds))


def _old_solve_placement(costs: LLMChainCosts, objective):
    t = _Tables(costs)
    found = _old_llm_dp(costs, t)
    if found is None:
        raise InfeasibleError("no placement fits")
    if objective == "throughput":
        values = np.concatenate([t.stage_decode[t.fits], t.link_period.ravel(), [0.0]])
        candidates = np.unique(values[np.isfinite(values)])
        lo, hi = 0, len(candidates) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _old_llm_dp(costs, t, float(candidates[mid])) is not None:
                hi = mid
            else:
                lo = mid + 1
        found = _old_llm_dp(costs, t, float(candidates[lo]))
        assert found is not None
    return evaluate_placement(costs, found, tables=t)


@functools.cache
def _llm_costs(devices: int, layers: int, new_tokens: int) -> LLMChainCosts:
    lm = describe_causal_lm(LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    devs = [Device(name=f"d{i}", kind="cpu", compute=AnalyticalCompute(
        peak_gops={32: 10.0}, memory_bandwidth_gb_per_s=10.0)) for i in range(devices)]
    links = [Link(name=f"l{i}", bandwidth_mbps=100.0, rtt_ms=1.0) for i in range(devices - 1)]
    return LLMChainCosts.build(lm, chain("random", devs, links),
                               LLMWorkload(prompt_tokens=8, new_tokens=new_tokens))


@st.composite
def _llm_instance(draw, exact: bool) -> LLMChainCosts:
    m, layers = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    costs = _llm_costs(m, layers, draw(st.sampled_from([1, 2, 5])))
    n, values = costs.n, _values(exact)

    def sends() -> list[list[SendCost]]:
        return [[SendCost(8, draw(values), draw(values), draw(values)) for _ in range(n + 1)]
                for _ in range(m - 1)]

    total = int(costs.memory_need[0, n])
    limits = [None if draw(st.booleans()) else int(total * draw(st.floats(0.2, 1.2)))
              for _ in range(m)]
    return dataclasses.replace(
        costs, prefill_ms=draw(arrays(float, (m, n), elements=values)),
        decode_ms=draw(arrays(float, (m, n), elements=values)), forward_prefill=sends(),
        forward_decode=sends(), back=sends(), memory_limits=limits)


@SETTINGS
@given(data=st.data(), exact=st.booleans(), objective=st.sampled_from(["latency", "throughput"]))
def test_llm_placements_are_unchanged(data, exact, objective):
    costs = data.draw(_llm_instance(exact))
    try:
        old = _old_solve_placement(costs, objective)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_placement(costs, objective)
        return
    new = solve_placement(costs, objective)
    if exact:
        assert new == old
    else:  # the latency sums are taken in another order: equal up to rounding
        assert new.period_ms == old.period_ms or objective == "latency"
        assert new.request_ms == pytest.approx(old.request_ms, rel=1e-12, abs=1e-12)


# ---- reference 3: nas/jmsnas/chain_latency.py's _place, as it was --------------------------


def _old_place(topology, devices, cost: np.ndarray, out_bytes, input_bytes) -> tuple[int, ...]:
    n_units, n_dev = cost.shape
    relay = [[[_relay_ms(topology, devices, a, b, nb) if b >= a else math.inf
               for b in range(n_dev)] for a in range(n_dev)] for nb in (input_bytes, *out_bytes)]
    best = np.full((n_units, n_dev), math.inf)
    prev = np.zeros((n_units, n_dev), dtype=int)
    for m in range(n_dev):
        best[0, m] = relay[0][0][m] + cost[0, m]
    for u in range(1, n_units):
        for m in range(n_dev):
            options = [best[u - 1, a] + relay[u][a][m] for a in range(m + 1)]
            prev[u, m] = int(np.argmin(options))
            best[u, m] = options[prev[u, m]] + cost[u, m]
    last = [best[-1, m] + relay[n_units][m][n_dev - 1] for m in range(n_dev)]
    m = int(np.argmin(last))
    units = [m]
    for u in range(n_units - 1, 0, -1):
        m = int(prev[u, m])
        units.append(m)
    return tuple(reversed(units))


@dataclass(frozen=True)
class _FakeLink:
    """What _hop_ms reads of a link, with a per-byte time that keeps integer sums exact."""

    ms_per_byte: float
    rtt_ms: float

    def transfer_ms(self, nbytes: int) -> float:
        return nbytes * self.ms_per_byte


@dataclass(frozen=True)
class _FakeTopology:
    links: dict[tuple[str, str], _FakeLink]

    def link(self, a: str, b: str) -> _FakeLink:
        return self.links[(a, b)]


def _placement_ms(topology, devices, cost, out_bytes, input_bytes, units) -> float:
    stops, sizes = [0, *units, len(devices) - 1], [input_bytes, *out_bytes]
    return (sum(float(cost[u, m]) for u, m in enumerate(units))
            + sum(_relay_ms(topology, devices, a, b, nb)
                  for a, b, nb in zip(stops[:-1], stops[1:], sizes, strict=True)))


@SETTINGS
@given(data=st.data(), exact=st.booleans())
def test_jmsnas_placements_are_unchanged(data, exact):
    n_dev, n_units = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 7))
    devices = [f"d{i}" for i in range(n_dev)]
    cost = data.draw(arrays(float, (n_units, n_dev), elements=_values(exact)))
    out_bytes = data.draw(st.lists(st.integers(0, 5), min_size=n_units, max_size=n_units))
    input_bytes = data.draw(st.integers(0, 5))
    topology = _FakeTopology({
        (a, b): _FakeLink(data.draw(_values(exact, 2.0)), 2 * data.draw(_values(exact, 2.0)))
        for a, b in itertools.pairwise(devices)})
    old = _old_place(topology, devices, cost, out_bytes, input_bytes)
    new = chain_latency._place(topology, devices, cost, out_bytes, input_bytes)
    if exact:
        assert new == old
    else:
        assert _placement_ms(topology, devices, cost, out_bytes, input_bytes, new) == (
            pytest.approx(_placement_ms(topology, devices, cost, out_bytes, input_bytes, old),
                          rel=1e-12, abs=1e-12))
