"""Bit allocation under a memory budget (AUTO-SPLIT problems 8 and 9) by the Lagrangian method
of Shoham and Gersho: for a price lambda each layer independently takes the bit-width that
minimises D_i(b) + lambda * s_i * b; bisection on lambda finds the cheapest price whose choice
fits the budget. Such a choice is optimal for the memory it uses (Everett's theorem), but it may
leave budget unused, so the result is the best of: that choice with the leftover spent greedily,
the choice just over budget repaired by the cheapest downgrades, and every uniform width that
fits (the points of AUTO-SPLIT's budget grid). Before that, an exact dynamic program over
layers keeping the Pareto frontier of (memory, distortion) answers exactly for up to
``EXACT_LAYERS`` layers; the Lagrangian search answers larger problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from edgesplit.errors import InfeasibleError

__all__ = ["EXACT_LAYERS", "Allocation", "allocate_bits", "choice_at_price"]

EXACT_LAYERS = 12  # up to this many layers the Pareto dynamic program answers (exact)


@dataclass(frozen=True)
class Allocation:
    bits: dict[str, int]
    distortion: float
    memory_bits: int


def _cost(sizes: Mapping[str, int], bits: Mapping[str, int]) -> int:
    return sum(sizes[n] * bits[n] for n in sizes)


def choice_at_price(distortion: Mapping[str, Mapping[int, float]], sizes: Mapping[str, int],
                    price: float) -> dict[str, int]:
    """argmin over b of D_i(b) + price * s_i * b, per layer (ties: fewer bits)."""
    return {n: min(distortion[n], key=lambda b: (distortion[n][b] + price * sizes[n] * b, b))
            for n in sizes}


def _evaluate(distortion, sizes, bits) -> Allocation:
    return Allocation(dict(bits), sum(distortion[n][bits[n]] for n in sizes), _cost(sizes, bits))


def allocate_bits(distortion: Mapping[str, Mapping[int, float]], sizes: Mapping[str, int],
                  budget_bits: int, *, iterations: int = 60) -> Allocation:
    """Minimise total distortion subject to sum(s_i * b_i) <= ``budget_bits``.

    ``distortion[layer][bits]`` is D_i(b); ``sizes[layer]`` the element count s_i (weights for
    problem 8, activations for problem 9)."""
    if not sizes:
        return Allocation({}, 0.0, 0)
    lowest = {n: min(distortion[n]) for n in sizes}
    if _cost(sizes, lowest) > budget_bits:
        raise InfeasibleError(f"memory budget of {budget_bits:,} bits is below the lowest "
                              f"bit-widths' {_cost(sizes, lowest):,} bits")
    free = choice_at_price(distortion, sizes, 0.0)
    if _cost(sizes, free) <= budget_bits:
        return _evaluate(distortion, sizes, free)
    exact = _pareto(distortion, sizes, budget_bits) if len(sizes) <= EXACT_LAYERS else None
    if exact is not None:
        return _evaluate(distortion, sizes, exact)
    span = max(max(d.values()) for d in distortion.values()) or 1.0
    low, high = 0.0, span / max(1, min(sizes.values()))
    while _cost(sizes, choice_at_price(distortion, sizes, high)) > budget_bits:
        high *= 2
    for _ in range(iterations):
        mid = (low + high) / 2
        if _cost(sizes, choice_at_price(distortion, sizes, mid)) > budget_bits:
            low = mid
        else:
            high = mid
    # The price search lands on a hull vertex that may leave budget unused: also try filling it,
    # repairing the vertex just over budget, and the uniform widths that fit (AUTO-SPLIT's grid).
    candidates = [_fill(distortion, sizes, choice_at_price(distortion, sizes, high), budget_bits),
                  _repair(distortion, sizes, choice_at_price(distortion, sizes, low),
                          budget_bits)]
    widths = sorted(set.intersection(*(set(d) for d in distortion.values())))
    for b in widths:
        uniform = dict.fromkeys(sizes, b)
        if _cost(sizes, uniform) <= budget_bits:
            candidates.append(_fill(distortion, sizes, uniform, budget_bits))
    return min((_evaluate(distortion, sizes, c) for c in candidates if c is not None),
               key=lambda a: (a.distortion, a.memory_bits))


def _fill(distortion, sizes, bits: dict[str, int], budget_bits: int) -> dict[str, int]:
    """Spend what the price search left over: upgrades with the largest distortion drop per
    extra bit first, while they fit."""
    bits = dict(bits)
    spare = budget_bits - _cost(sizes, bits)
    while True:
        moves = [((distortion[n][bits[n]] - distortion[n][b]) / (sizes[n] * (b - bits[n])), n, b)
                 for n in sizes for b in distortion[n]
                 if b > bits[n] and sizes[n] * (b - bits[n]) <= spare
                 and distortion[n][b] < distortion[n][bits[n]]]
        if not moves:
            return bits
        _, n, b = max(moves)
        spare -= sizes[n] * (b - bits[n])
        bits[n] = b


def _repair(distortion, sizes, bits: dict[str, int], budget_bits: int) -> dict[str, int] | None:
    """Bring an over-budget choice within budget by the downgrades that cost the least
    distortion per bit saved, then fill what is left."""
    bits = dict(bits)
    while _cost(sizes, bits) > budget_bits:
        moves = [((distortion[n][b] - distortion[n][bits[n]]) / (sizes[n] * (bits[n] - b)), n, b)
                 for n in sizes for b in distortion[n] if b < bits[n]]
        if not moves:
            return None
        _, n, b = min(moves)
        bits[n] = b
    return _fill(distortion, sizes, bits, budget_bits)


def _pareto(distortion, sizes, budget_bits: int, cap: int = 5_000) -> dict[str, int] | None:
    """Exact: dynamic programming over layers keeping only the (memory, distortion) pairs no
    other pair beats on both. None when the frontier outgrows ``cap`` (then the Lagrangian
    search answers)."""
    names = list(sizes)
    cheapest_rest = [0] * (len(names) + 1)
    for i in range(len(names) - 1, -1, -1):
        cheapest_rest[i] = cheapest_rest[i + 1] + sizes[names[i]] * min(distortion[names[i]])
    frontier: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]
    for i, name in enumerate(names):
        grown = [(mem + sizes[name] * b, d + db, (*choice, b))
                 for mem, d, choice in frontier for b, db in distortion[name].items()
                 if mem + sizes[name] * b + cheapest_rest[i + 1] <= budget_bits]
        grown.sort(key=lambda item: (item[0], item[1]))
        frontier, best = [], float("inf")
        for item in grown:
            if item[1] < best:
                frontier.append(item)
                best = item[1]
        if len(frontier) > cap:
            return None
    _, _, choice = min(frontier, key=lambda item: (item[1], item[0]))
    return dict(zip(names, choice, strict=True))
