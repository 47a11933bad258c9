"""Multi-split over device chains: DP against brute force for both objectives, JMSNAS setting."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dag_models import SpecDAG, dag_specs, example_input
from edgesplit.errors import InfeasibleError
from edgesplit.graph import capture
from edgesplit.hardware import AnalyticalCompute, Device, Link, chain, get_topology
from edgesplit.plan.model import recompute_total
from edgesplit.plan.multisplit import (
    ChainCosts,
    chain_plan,
    evaluate_boundaries,
    linear_search,
    solve_chain_latency,
    solve_chain_throughput,
)


def _all_boundaries(n: int, m: int):
    for inner in itertools.combinations_with_replacement(range(n + 1), m - 1):
        yield (0, *inner, n)


def _random_chain_costs(graph, data, m: int, limits=None) -> ChainCosts:
    n = len(graph.layers)
    floats = st.floats(0.01, 10.0, allow_nan=False)
    layer_ms = np.array([[data.draw(floats) for _ in range(n)] for _ in range(m)])
    link_ms = np.array([[data.draw(floats) if b else 0.0 for b in range(n + 1)]
                        for _ in range(m - 1)]).reshape(m - 1, n + 1)
    costs = ChainCosts.build(graph, _topology(m))
    costs.layer_ms, costs.link_ms = layer_ms, link_ms
    costs.link_ms[:, 0] = [data.draw(floats) for _ in range(m - 1)]
    if limits is not None:
        costs.memory_limits = limits
    return costs


def _topology(m: int):
    devices = [Device(name=f"d{i}", kind="cpu", compute=AnalyticalCompute(
        peak_gops={32: 10.0 * (i + 1)}, memory_bandwidth_gb_per_s=10.0)) for i in range(m)]
    links = [Link(name=f"l{i}", bandwidth_mbps=10.0 * (i + 1), rtt_ms=1.0) for i in range(m - 1)]
    return chain("test-chain", devices, links)


def _feasible(costs, bounds) -> bool:
    return all(lim is None or costs.range_memory(a, b) <= lim
               for lim, (a, b) in zip(costs.memory_limits, itertools.pairwise(bounds),
                                      strict=True))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_specs(max_nodes=5), data=st.data(), m=st.sampled_from([2, 3, 4]))
def test_latency_dp_equals_brute_force(spec, data, m):
    graph = capture(SpecDAG(spec), example_input())
    costs = _random_chain_costs(graph, data, m)
    peak = max(costs.range_memory(0, len(graph.layers)), 1)
    if data.draw(st.booleans()):  # memory limits that rule out long ranges
        costs.memory_limits = [int(peak * data.draw(st.floats(0.3, 1.2))) for _ in range(m)]
    candidates = [b for b in _all_boundaries(len(graph.layers), m) if _feasible(costs, b)]
    if not candidates:
        with pytest.raises(InfeasibleError, match="device memory"):
            solve_chain_latency(costs)
        return
    brute = min(evaluate_boundaries(costs, b).total_ms for b in candidates)
    got = solve_chain_latency(costs)
    assert _feasible(costs, got.boundaries)
    assert got.total_ms == pytest.approx(brute)
    linear = linear_search(costs)
    if _feasible(costs, linear.boundaries):  # the greedy may paint itself into a corner
        assert linear.total_ms >= got.total_ms - 1e-9


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_specs(max_nodes=5), data=st.data(), m=st.sampled_from([2, 3, 4]),
       slack=st.sampled_from([None, 1.0, 1.3]))
def test_throughput_dp_equals_brute_force(spec, data, m, slack):
    graph = capture(SpecDAG(spec), example_input())
    costs = _random_chain_costs(graph, data, m)
    fastest = min(evaluate_boundaries(costs, b).total_ms
                  for b in _all_boundaries(len(graph.layers), m))
    bound = None if slack is None else fastest * slack
    allowed = [evaluate_boundaries(costs, b) for b in _all_boundaries(len(graph.layers), m)]
    allowed = [a for a in allowed if bound is None or a.total_ms <= bound * (1 + 1e-12)]
    got = solve_chain_throughput(costs, max_latency_ms=bound)
    assert got.period_ms == pytest.approx(min(a.period_ms for a in allowed), rel=1e-6)
    assert bound is None or got.total_ms <= bound * (1 + 1e-9)


def test_throughput_bound_below_fastest_is_named():
    graph = capture(SpecDAG([("conv", 0, 0), ("conv", 1, 1)]), example_input())
    costs = ChainCosts.build(graph, _topology(3))
    with pytest.raises(InfeasibleError, match="latency bound"):
        solve_chain_throughput(costs, max_latency_ms=1e-9)


@pytest.mark.parametrize("model", ["mobilenet_v2", "resnet50"])
def test_jmsnas_chain_setting(model):
    from helpers import captured

    graph = captured(model)
    topo = get_topology("jmsnas-chain")
    costs = ChainCosts.build(graph, topo)
    best = solve_chain_latency(costs)
    n = len(graph.layers)
    cloud_only = evaluate_boundaries(costs, (0, 0, 0, 0, n))
    ue_only = evaluate_boundaries(costs, (0, n, n, n, n))
    assert best.total_ms <= min(cloud_only.total_ms, ue_only.total_ms,
                                linear_search(costs).total_ms)
    plan = chain_plan(costs, best, topo, method="multisplit", source=model)
    assert [d.name for d in plan.devices] == ["ue", "sbs", "mbs", "cloud"]
    assert recompute_total(plan) == pytest.approx(plan.predicted.total_ms)
    assert sum(len(d.layers) for d in plan.devices) == n
    # a tensor crossing from device i to j is on every link between them
    for transfer, b in zip(plan.transfers, best.boundaries[1:-1], strict=True):
        assert transfer.bytes == graph.cuts()[b].bytes


def test_chain_manual_prices_a_given_assignment_like_the_dp_and_refuses_bad_counts():
    from edgesplit.errors import ConfigError
    from edgesplit.plan import PlanningProblem, get_planner

    module = SpecDAG([("conv", 0, 0), ("conv", 1, 1), ("conv", 2, 0)])
    topo = _topology(3)
    problem = PlanningProblem(model=module, example_inputs=example_input(), setting=topo)
    graph = problem.graph
    best = get_planner("multisplit").plan(problem)
    counts = [len(d.layers) for d in best.devices]
    again = get_planner("chain_manual", layers_per_device=counts).plan(problem)
    assert again.predicted.total_ms == pytest.approx(best.predicted.total_ms)
    assert [d.layers for d in again.devices] == [d.layers for d in best.devices]
    n = len(graph.layers)
    costs = ChainCosts.build(graph, topo)
    other = get_planner("chain_manual", layers_per_device=[0, 0, n]).plan(problem)
    assert other.predicted.total_ms == pytest.approx(
        evaluate_boundaries(costs, (0, 0, 0, n)).total_ms)
    for bad in ([n], [n, 0, 1], [-1, 1, n]):
        with pytest.raises(ConfigError, match="one non-negative layer count per device"):
            get_planner("chain_manual", layers_per_device=bad).plan(problem)
