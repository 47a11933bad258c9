"""Lagrangian bit allocation (AUTO-SPLIT problems 8/9) against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesplit.errors import InfeasibleError
from edgesplit.quant.allocation import allocate_bits, choice_at_price

BITS = (2, 4, 6, 8)


@st.composite
def problems(draw):
    n = draw(st.integers(1, 5))
    sizes = {f"l{i}": draw(st.integers(1, 1000)) for i in range(n)}
    # distortion falls with bits (roughly 4x per extra bit, as uniform quantization does)
    distortion = {}
    for name in sizes:
        scale = draw(st.floats(0.01, 100.0))
        noise = [draw(st.floats(0.5, 2.0)) for _ in BITS]
        values = sorted((scale * 4.0 ** -b * k for b, k in zip(BITS, noise, strict=True)),
                        reverse=True)
        distortion[name] = dict(zip(BITS, values, strict=True))
    return distortion, sizes


def _brute(distortion, sizes, budget):
    best = None
    for choice in itertools.product(BITS, repeat=len(sizes)):
        bits = dict(zip(sizes, choice, strict=True))
        if sum(sizes[n] * bits[n] for n in sizes) <= budget:
            d = sum(distortion[n][bits[n]] for n in sizes)
            best = d if best is None else min(best, d)
    return best


@settings(max_examples=150, deadline=None)
@given(problem=problems(), price=st.floats(0.0, 10.0))
def test_price_choice_is_optimal_for_the_memory_it_uses(problem, price):
    """Everett: minimising D + lambda M gives the optimum for budget M(lambda)."""
    distortion, sizes = problem
    bits = choice_at_price(distortion, sizes, price)
    budget = sum(sizes[n] * bits[n] for n in sizes)
    got = sum(distortion[n][bits[n]] for n in sizes)
    assert got == pytest.approx(_brute(distortion, sizes, budget))


@settings(max_examples=150, deadline=None)
@given(problem=problems(), fraction=st.floats(0.0, 1.0))
def test_allocation_matches_brute_force(problem, fraction):
    distortion, sizes = problem
    low = sum(s * 2 for s in sizes.values())
    high = sum(s * 8 for s in sizes.values())
    budget = int(low + fraction * (high - low))
    result = allocate_bits(distortion, sizes, budget)
    assert result.memory_bits <= budget
    optimum = _brute(distortion, sizes, budget)
    assert result.distortion == pytest.approx(optimum, rel=1e-9, abs=1e-15)
    # never worse than the best uniform bit-width that fits
    uniform = [sum(distortion[n][b] for n in sizes) for b in BITS
               if sum(sizes.values()) * b <= budget]
    assert result.distortion <= min(uniform) + 1e-12


def test_budget_below_the_lowest_bits_is_named():
    with pytest.raises(InfeasibleError, match="below the lowest"):
        allocate_bits({"a": {2: 1.0, 8: 0.0}}, {"a": 100}, 150)
    assert allocate_bits({"a": {2: 1.0, 8: 0.0}}, {"a": 100}, 800).bits == {"a": 8}


def test_lagrangian_fallback_fits_and_beats_uniform(monkeypatch):
    """Large problems go to the price search: it fits the budget and is never worse than the
    best uniform width."""
    import random

    from edgesplit.quant import allocation

    monkeypatch.setattr(allocation, "_pareto", lambda *a, **k: None)
    rng = random.Random(1)
    for _ in range(200):
        sizes = {f"l{i}": rng.randint(1, 1000) for i in range(rng.randint(1, 6))}
        distortion = {n: dict(zip(BITS, sorted((rng.uniform(0.01, 100) * 4.0 ** -b
                                                for b in BITS), reverse=True), strict=True))
                      for n in sizes}
        budget = int(sum(sizes.values()) * rng.uniform(2, 8))
        result = allocate_bits(distortion, sizes, budget)
        assert result.memory_bits <= budget
        uniform = [sum(distortion[n][b] for n in sizes) for b in BITS
                   if sum(sizes.values()) * b <= budget]
        assert result.distortion <= min(uniform) + 1e-12
        assert result.distortion >= _brute(distortion, sizes, budget) - 1e-12
