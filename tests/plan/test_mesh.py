"""Mesh topologies (JMSNAS Fig. 2b, eq. 2): parallel branches of a model on parallel devices,
checked against brute force over the same search space computed by hand."""

from __future__ import annotations

import itertools

import pytest
import torch

from edgesplit.graph import capture
from edgesplit.hardware import LayerWork, estimator_for, get_topology, serialize_ms
from edgesplit.plan.mesh import (
    mesh_shape,
    parallel_regions,
    plan_period_ms,
    solve_mesh,
    solve_mesh_throughput,
)
from edgesplit.plan.model import recompute_total
from edgesplit.plan.multisplit import ChainCosts, evaluate_boundaries
from mesh_models import TwoHeads, _mesh


def _by_hand(graph, topo) -> list[tuple[float, float]]:
    """(latency, period) of every plain chain via one branch, and of every region x branch
    assignment x chain split."""
    shape = mesh_shape(topo)
    n = len(graph.layers)
    options = []
    for branch in shape.branches:
        from edgesplit.hardware import chain

        path = [*shape.chain, branch, shape.aggregator]
        links = [topo.link(a, b) for a, b in itertools.pairwise(path)]
        costs = ChainCosts.build(graph, chain("p", [topo.device(d) for d in path], links))
        for inner in itertools.combinations_with_replacement(range(n + 1), len(path) - 1):
            found = evaluate_boundaries(costs, (0, *inner, n))
            options.append((found.total_ms, found.period_ms))
    prefix = ChainCosts.build(graph, chain("c", [topo.device(d) for d in shape.chain],
                                           [topo.link(a, b) for a, b in
                                            itertools.pairwise(shape.chain)]))
    ms = {d: [estimator_for(topo.device(d)).layer_ms(LayerWork.of(graph, l), topo.device(d))
              for l in graph.layers] for d in (*shape.branches, shape.aggregator)}
    for region in parallel_regions(graph):
        fork = graph.cuts()[region.fork].tensors
        fork_bytes = sum(t.bytes for t in fork)
        chains = [evaluate_boundaries(prefix, (0, *inner, region.fork))
                  for inner in itertools.combinations_with_replacement(range(region.fork + 1),
                                                                       len(shape.chain) - 1)]
        for choice in itertools.product(range(len(shape.branches)), repeat=len(region.components)):
            loads, stages = [], []
            for j, d in enumerate(shape.branches):
                layers = [i for c, dev in zip(region.components, choice, strict=True) if dev == j
                          for i in c]
                if not layers:
                    loads.append(0.0)
                    continue
                names = {graph.layers[i].name for i in layers}
                sent = [graph.tensors[t] for i in layers for t in graph.layers[i].outputs
                        if any(c not in names for c in graph.tensors[t].consumers)]
                out = sum(t.bytes for t in sent)
                lin, lout = topo.link(shape.chain[-1], d), topo.link(d, shape.aggregator)
                root, here, agg_dev = (topo.device(shape.chain[-1]), topo.device(d),
                                       topo.device(shape.aggregator))
                # every crossing tensor is encoded by its sender and decoded by its receiver
                parts = (lin.transfer_ms(fork_bytes) + lin.rtt_ms / 2
                         + sum(serialize_ms(root, here, t.bytes) for t in fork),
                         sum(ms[d][i] for i in layers),
                         lout.transfer_ms(out) + lout.rtt_ms / 2
                         + sum(serialize_ms(here, agg_dev, t.bytes) for t in sent))
                loads.append(sum(parts))
                stages.extend(parts)
            agg = sum(ms[shape.aggregator][region.join:])
            for c in chains:
                options.append((c.total_ms + max(loads) + agg, max(c.period_ms, *stages, agg)))
    return options


@pytest.fixture(scope="module")
def two_heads():
    return capture(TwoHeads(), torch.randn(1, 3, 16, 16))


def test_parallel_regions_find_the_branches(two_heads):
    (region,) = parallel_regions(two_heads)
    names = [[two_heads.layers[i].name for i in comp] for comp in region.components]
    assert sorted(names) == [["left.0", "left.2"], ["right.0"]]
    assert two_heads.layers[region.join].op == "add"


@pytest.mark.parametrize("branch_gops, root_gops, rtt_ms", [
    (2.0, 1.0, 0.0), (50.0, 1.0, 0.2), (0.2, 1.0, 0.2), (50.0, 100.0, 0.0)])
def test_mesh_plan_equals_brute_force(two_heads, branch_gops, root_gops, rtt_ms):
    topo = _mesh(branch_gops, root_gops, rtt_ms)
    solution = solve_mesh(two_heads, topo, source="two-heads")
    options = _by_hand(two_heads, topo)
    assert solution.total_ms == pytest.approx(min(lat for lat, _ in options))
    assert recompute_total(solution.plan) == pytest.approx(solution.total_ms)
    for slack in (None, 1.0, 1.5):  # throughput: min period under a latency bound
        bound = None if slack is None else solution.total_ms * slack
        allowed = [per for lat, per in options if bound is None or lat <= bound * (1 + 1e-9)]
        got = solve_mesh_throughput(two_heads, topo, source="x", max_latency_ms=bound)
        assert plan_period_ms(got.plan) == pytest.approx(min(allowed), rel=1e-6)
        assert bound is None or got.total_ms <= bound * (1 + 1e-9)


def test_fast_parallel_devices_run_the_branches_side_by_side(two_heads):
    topo = _mesh(2.0, 1.0, rtt_ms=0.0)  # branches compute-bound, links free
    solution = solve_mesh(two_heads, topo, source="two-heads")
    placed = {d.name: d.layers for d in solution.plan.devices}
    assert sorted([placed["b0"], placed["b1"]]) == [["left.0", "left.2"], ["right.0"]]
    assert solution.plan.parallel_devices == ["b0", "b1"]
    sequential = solve_mesh(two_heads, topo, source="x", parallel=False)
    assert solution.total_ms < sequential.total_ms


def test_jmsnas_mesh_runs_for_googlenet():
    from helpers import captured

    graph = captured("googlenet")
    assert len(parallel_regions(graph)) == 9  # the nine inception blocks
    solution = solve_mesh(graph, get_topology("jmsnas-mesh"), source="googlenet")
    assert recompute_total(solution.plan) == pytest.approx(solution.total_ms)
    assert sum(len(d.layers) for d in solution.plan.devices) == len(graph.layers)


def test_mesh_assignment_drawing(two_heads, tmp_path):
    from edgesplit.report.plots import plot_assignment

    solution = solve_mesh(two_heads, _mesh(2.0, 1.0, rtt_ms=0.0), source="two-heads")
    path = plot_assignment(solution.plan, tmp_path / "mesh.png")
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000


def test_branch_devices_memory_limits_exclude_parallel_use(two_heads):
    topo = _mesh(2.0, 1.0, rtt_ms=0.0)
    small = [d.model_copy(update={"memory_bytes": 20_000}) if d.name.startswith("b") else d
             for d in topo.devices]
    limited = topo.model_copy(update={"devices": tuple(small)})
    solution = solve_mesh(two_heads, limited, source="x")
    assert solution.plan.parallel_devices == []  # no branch can hold a whole model branch
    for device in solution.plan.devices:
        if device.name.startswith("b"):
            weights = sum(two_heads.layer(n).param_bytes for n in device.layers)
            assert weights <= 20_000
    assert solution.total_ms > solve_mesh(two_heads, topo, source="x").total_ms
