"""Multi-split over a chain of devices (JMSNAS eq. 1), exact by dynamic programming, for a
latency or a streaming-throughput objective.

Device m of the chain runs a contiguous range [b_{m-1}, b_m) of the layers' topological order
(possibly empty). The link after device m carries every tensor live across position b_m (skip
connections and the raw input included; a tensor produced on device i and read on device j
travels every link in between; the model's outputs travel to the last device, where JMSNAS
collects the result). A link that carries data also costs its one-way latency, half its round
trip (the convention of every plan: :mod:`edgesplit.plan.assemble`).

Latency  = sum of device compute + sum of link transfers.
Period   = the slowest stage (a device's compute or a link's transfer) when frames stream
           through the pipeline; throughput = 1000 / period per second.

The search is the chain DP (:func:`edgesplit.plan.chain_dp.solve_chain`, O(devices x layers)):
a device's memory (and, for the throughput objective, its stage bound) only rules out ranges
that are too long, as that DP needs; ties go to the assignment whose later devices run fewer
layers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.graph import LayerGraph
from edgesplit.graph.memory import live_bytes
from edgesplit.hardware import (
    LatencyEstimator,
    LayerWork,
    Topology,
    estimator_for,
    serialize_ms,
)
from edgesplit.plan.assemble import Network, assemble_plan, one_way_latency_ms
from edgesplit.plan.chain_dp import solve_chain

if TYPE_CHECKING:
    from edgesplit.plan.model import Plan

__all__ = [
    "ChainAssignment",
    "ChainCosts",
    "chain_plan",
    "evaluate_boundaries",
    "linear_search",
    "solve_chain_latency",
    "solve_chain_throughput",
]


@dataclass
class ChainCosts:
    """Everything the chain DP needs, per device and per cut position (0..n layers done)."""

    graph: LayerGraph
    devices: list[str]
    layer_ms: np.ndarray  # [M, n]
    link_ms: np.ndarray  # [M-1, n+1]: link m carrying the cut at position b
    cut_bytes: list[int]  # [n+1]
    live_bytes: np.ndarray  # [n]: activation bytes live while layer j runs (whole schedule)
    weight_prefix: np.ndarray  # [n+1]
    memory_limits: list[int | None]  # [M]

    @classmethod
    def build(cls, graph: LayerGraph, topology: Topology, *,
              estimators: dict[str, LatencyEstimator] | None = None) -> ChainCosts:
        try:
            order = topology.chain_order()
        except ValueError:
            raise ConfigError(f"topology {topology.name!r} is not a chain; use the mesh planner "
                              "or a chain topology") from None
        devices = [topology.device(name) for name in order]
        works = [LayerWork.of(graph, layer) for layer in graph.layers]
        layer_ms = np.array([[(estimators or {}).get(d.name, estimator_for(d)).layer_ms(w, d)
                              for w in works] for d in devices])
        cuts = graph.cuts()
        cut_bytes = [c.bytes for c in cuts]
        links = [topology.link(a, b) for a, b in itertools.pairwise(order)]
        # a cut's tensors cross the link between devices m and m+1: wire time, latency and
        # their encode on m and decode on m+1
        link_ms = np.array([[link.transfer_ms(c.bytes) + one_way_latency_ms(link, c.bytes > 0)
                             + sum(serialize_ms(a, b, t.bytes) for t in c.tensors)
                             for c in cuts]
                            for link, a, b in zip(links, devices, devices[1:], strict=False)]
                           ).reshape(len(links), len(cut_bytes))
        return cls(graph, order, layer_ms, link_ms, cut_bytes,
                   np.array(live_bytes(graph), dtype=np.int64),
                   np.concatenate([[0], np.cumsum([l.param_bytes for l in graph.layers])]),
                   [d.memory_bytes for d in devices])

    @property
    def n(self) -> int:
        return self.layer_ms.shape[1]

    def range_memory(self, a: int, b: int) -> int:
        """Memory of running layers [a, b) on one device: their weights plus the largest live
        set while they run (an empty range still buffers what it relays)."""
        act = int(self.live_bytes[a:b].max()) if b > a else self.cut_bytes[a]
        return int(self.weight_prefix[b] - self.weight_prefix[a]) + act


@dataclass(frozen=True)
class ChainAssignment:
    """Boundaries b_0=0 <= b_1 <= ... <= b_M=n and the resulting numbers."""

    boundaries: tuple[int, ...]
    compute_ms: tuple[float, ...]
    link_ms: tuple[float, ...]

    @property
    def total_ms(self) -> float:
        return sum(self.compute_ms) + sum(self.link_ms)

    @property
    def period_ms(self) -> float:
        return max((*self.compute_ms, *self.link_ms), default=0.0)

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.boundaries[:-1], self.boundaries[1:], strict=True))


def evaluate_boundaries(costs: ChainCosts, boundaries: Sequence[int]) -> ChainAssignment:
    """The numbers of one assignment (also the brute-force oracle of the tests)."""
    b = list(boundaries)
    prefix = np.concatenate([np.zeros((costs.layer_ms.shape[0], 1)),
                             np.cumsum(costs.layer_ms, axis=1)], axis=1)
    compute = tuple(float(prefix[m, b[m + 1]] - prefix[m, b[m]]) for m in range(len(b) - 1))
    links = tuple(float(costs.link_ms[m, b[m + 1]]) for m in range(len(b) - 2))
    return ChainAssignment(tuple(b), compute, links)


def _feasible_memory(costs: ChainCosts, m: int, a: int, b: int) -> bool:
    limit = costs.memory_limits[m]
    return limit is None or costs.range_memory(a, b) <= limit


def _solve(costs: ChainCosts, period_bound: float = math.inf, *, return_table: bool = False):
    """Minimum-latency assignment whose every stage is at most ``period_bound``; None if none.
    With ``return_table`` also the best latency of finishing exactly at every position and a
    function rebuilding the assignment that does (used by the mesh planner)."""
    M = costs.layer_ms.shape[0]
    prefix = np.concatenate([np.zeros((M, 1)), np.cumsum(costs.layer_ms, axis=1)], axis=1)

    def transfer(hop: int, cut: int) -> float:
        ms = costs.link_ms[hop, cut]
        return ms if ms <= period_bound else math.inf

    def fits(m: int, a: int, b: int) -> bool:
        # memory and the stage bound both grow with the range, as solve_chain needs
        return (_feasible_memory(costs, m, a, b)
                and prefix[m, b] - prefix[m, a] <= period_bound)

    table = solve_chain(prefix, transfer, fits, ties="last")

    def rebuild(end: int) -> ChainAssignment:
        bounds = table.boundaries(end)
        assert bounds is not None, "rebuild only ends the table reaches"
        return evaluate_boundaries(costs, bounds)

    result = None if table.cost == math.inf else rebuild(costs.n)
    return (result, table.finish, rebuild) if return_table else result


def solve_chain_latency(costs: ChainCosts) -> ChainAssignment:
    """JMSNAS eq. (1) minimum over all contiguous assignments, under device memory limits."""
    result = _solve(costs)
    if result is None:
        raise InfeasibleError("device memory: no assignment of the layers to the chain fits every "
                              "device's memory_bytes")
    return result


def solve_chain_throughput(costs: ChainCosts, *, max_latency_ms: float | None = None,
                           rel_tol: float = 1e-9) -> ChainAssignment:
    """Minimum period (slowest stage) subject to latency <= ``max_latency_ms``; among
    assignments with that period, the lowest latency."""
    fastest = _solve(costs)
    if fastest is None:
        raise InfeasibleError("device memory: no assignment of the layers to the chain fits every "
                              "device's memory_bytes")
    if max_latency_ms is not None and fastest.total_ms > max_latency_ms * (1 + 1e-12):
        raise InfeasibleError(f"latency bound: the fastest assignment takes "
                              f"{fastest.total_ms:.3f} ms > {max_latency_ms:.3f} ms")
    bound = max_latency_ms if max_latency_ms is not None else math.inf

    def ok(period: float) -> ChainAssignment | None:
        found = _solve(costs, period)
        return found if found is not None and found.total_ms <= bound * (1 + 1e-12) else None

    lo, hi, best = 0.0, fastest.period_ms, fastest
    while hi - lo > rel_tol * max(hi, 1e-12):
        mid = (lo + hi) / 2
        found = ok(mid)
        if found is not None:
            hi, best = found.period_ms, found
        else:
            lo = mid
    return best


def linear_search(costs: ChainCosts) -> ChainAssignment:
    """A HiveMind-style linear search: hop by hop, each device keeps the range that minimises
    its own compute, its outgoing transfer and the rest of the model run on the next device
    (one step of look-ahead), never revisiting earlier hops."""
    M, n = costs.layer_ms.shape
    prefix = np.concatenate([np.zeros((M, 1)), np.cumsum(costs.layer_ms, axis=1)], axis=1)
    bounds = [0]
    for m in range(M - 1):
        a = bounds[-1]
        options = [b for b in range(a, n + 1) if _feasible_memory(costs, m, a, b)
                   and (m < M - 2 or _feasible_memory(costs, M - 1, b, n))] or [a]
        bounds.append(min(options, key=lambda b: (prefix[m, b] - prefix[m, a]
                                                  + costs.link_ms[m, b]
                                                  + prefix[m + 1, n] - prefix[m + 1, b])))
    bounds.append(n)
    return evaluate_boundaries(costs, bounds)


def chain_plan(costs: ChainCosts, assignment: ChainAssignment, topology: Topology, *,
               method: str, source: str, objective: str = "latency") -> Plan:
    """A Plan with one device per chain hop and one transfer per link."""
    graph = costs.graph
    names = [layer.name for layer in graph.layers]
    memory = [costs.range_memory(a, b) for a, b in assignment.ranges()]
    over = [f"device memory: {d} needs {need:,} bytes, has {lim:,}"
            for d, need, lim in zip(costs.devices, memory, costs.memory_limits, strict=True)
            if lim is not None and need > lim]
    return assemble_plan(
        graph, {d: names[a:b] for d, (a, b) in zip(costs.devices, assignment.ranges(),
                                                    strict=True)},
        Network.of_topology(topology, costs.devices),
        layer_ms={n: {d: float(costs.layer_ms[m, i]) for m, d in enumerate(costs.devices)}
                  for i, n in enumerate(names)},
        method=method, source=source, edge_memory_bytes=memory[0], feasible=not over,
        reason="; ".join(over) or (f"period {assignment.period_ms:.4f} ms"
                                   if objective == "throughput" else None))
