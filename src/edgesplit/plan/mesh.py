"""Multi-split over a mesh (JMSNAS Fig. 2b, eq. 2): a chain of devices up to a root, which
broadcasts to parallel branch devices, whose results an aggregator joins.

    T = chain part (compute + links, up to the root)
        + max over branch devices (root->branch transfer + branch compute + branch->aggregator)
        + aggregator compute.

Which models fit: the parallel devices run the *parallel branches of the model* between two
single-tensor cuts (a fork tensor and the join layer that merges them): the branches of an
inception block, a ResNet block's main path and projection shortcut, the heads of a multi-head
model. Branches go to branch devices (several may share one, some devices may idle); the join
and everything after it run on the aggregator. A region whose join also reads the fork tensor
directly (an identity skip) is skipped. Besides the parallel options, the planner also
considers every plain chain through one branch device (no parallelism), so a model without
parallel branches still gets the best chain plan over the mesh.

Search: one chain DP gives the best chain part ending at every fork position; every parallel
region and every assignment of its branches to branch devices is then evaluated (exhaustively
up to 4,096 assignments, greedily by longest branch first beyond that).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.graph import LayerGraph, TensorInfo
from edgesplit.hardware import Device, LayerWork, Topology, chain, estimator_for, serialize_ms
from edgesplit.plan.assemble import Network, assemble_plan, one_way_latency_ms
from edgesplit.plan.model import Plan
from edgesplit.plan.multisplit import ChainCosts, _solve, chain_plan

__all__ = [
    "MeshShape",
    "MeshSolution",
    "Region",
    "mesh_shape",
    "parallel_regions",
    "plan_period_ms",
    "solve_mesh",
    "solve_mesh_throughput",
]

_EXHAUSTIVE = 4096


@dataclass(frozen=True)
class MeshShape:
    chain: tuple[str, ...]  # source ... root
    branches: tuple[str, ...]
    aggregator: str


def mesh_shape(topology: Topology) -> MeshShape:
    """Read the chain -> root -> branches -> aggregator shape off a topology."""
    g = topology.graph()
    roots = [n for n in g if g.out_degree(n) >= 2]
    sources = [n for n in g if g.in_degree(n) == 0]
    if len(roots) != 1 or len(sources) != 1:
        raise ConfigError(f"topology {topology.name!r} is not a supported mesh: expected one "
                          "source, a chain to one root that fans out to parallel devices, and "
                          "one aggregator they all send to (JMSNAS Fig. 2b)")
    root, source = roots[0], sources[0]
    path = nx.shortest_path(g, source, root)
    branches = tuple(g.successors(root))
    aggs = {s for b in branches for s in g.successors(b)}
    if len(aggs) != 1 or any(g.out_degree(b) != 1 or g.in_degree(b) != 1 for b in branches) \
            or any(g.out_degree(n) != 1 for n in path[:-1]):
        raise ConfigError(f"topology {topology.name!r} is not a supported mesh: every branch "
                          "device must receive from the root and send to one common aggregator")
    aggregator = aggs.pop()
    if g.out_degree(aggregator) != 0:
        raise ConfigError(f"topology {topology.name!r}: the aggregator must be the last device")
    return MeshShape(tuple(path), branches, aggregator)


@dataclass(frozen=True)
class Region:
    """Layers [fork, join] in topological order: parallel components, then the join layer."""

    fork: int  # position: layers before it are done; one tensor crosses it
    join: int  # index of the layer that merges the components
    components: tuple[tuple[int, ...], ...]


def parallel_regions(graph: LayerGraph) -> list[Region]:
    """Stretches between consecutive single-tensor cuts whose layers (but the last) split into
    at least two independent components, the last layer joining them."""
    positions = [c.index + 1 for c in graph.single_tensor_cuts()]
    names = [layer.name for layer in graph.layers]
    regions = []
    for p, q in itertools.pairwise(positions):
        if q - p < 3:
            continue
        inner = set(range(p, q - 1))
        fork_tensors = {t.name for t in graph.cuts()[p].tensors}
        if fork_tensors & set(graph.layers[q - 1].inputs):
            continue  # an identity skip straight to the join: nothing to run in parallel with it
        undirected: nx.Graph[int] = nx.Graph()
        undirected.add_nodes_from(inner)
        for i in inner:
            for pred in graph.predecessors(names[i]):
                if graph.index_of(pred) in inner:
                    undirected.add_edge(i, graph.index_of(pred))
        parts = sorted(tuple(sorted(c)) for c in nx.connected_components(undirected))
        if len(parts) >= 2:
            regions.append(Region(p, q - 1, tuple(parts)))
    return regions


@dataclass
class MeshSolution:
    total_ms: float
    plan: Plan
    description: str


def _branch_stages(graph: LayerGraph, layer_ms: np.ndarray, comps, fork: Sequence[TensorInfo],
                   link_in, link_out, devices: tuple[Device, Device, Device]
                   ) -> tuple[float, float, float]:
    """(incoming transfer, compute, outgoing transfer) of one branch device; ``devices``: the
    chain's last device, this branch's and the aggregator (who encodes and decodes)."""
    if not comps:
        return (0.0, 0.0, 0.0)
    root, here, agg = devices
    layers = [i for comp in comps for i in comp]
    names = {graph.layers[i].name for i in layers}
    out = [graph.tensors[t] for i in layers for t in graph.layers[i].outputs
           if any(c not in names for c in graph.tensors[t].consumers)]
    fork_bytes, out_bytes = sum(t.bytes for t in fork), sum(t.bytes for t in out)
    return (link_in.transfer_ms(fork_bytes) + one_way_latency_ms(link_in, fork_bytes > 0)
            + sum(serialize_ms(root, here, t.bytes) for t in fork),
            float(layer_ms[layers].sum()),
            link_out.transfer_ms(out_bytes) + one_way_latency_ms(link_out, out_bytes > 0)
            + sum(serialize_ms(here, agg, t.bytes) for t in out))


def _fits(costs: ChainCosts, device, layers) -> bool:
    """Memory check for a set of layers on one device: their weights plus the largest live set
    of the whole schedule at their steps (conservative: other branches' tensors count too)."""
    layers = list(layers)
    if device.memory_bytes is None or not layers:
        return True
    weights = sum(costs.graph.layers[i].param_bytes for i in layers)
    return weights + int(costs.live_bytes[layers].max()) <= device.memory_bytes


def plan_period_ms(plan) -> float:
    """The slowest pipeline stage of a plan: one device's compute or one transfer (its
    serialisation, latency and encode/decode)."""
    return max((*plan.predicted.compute_ms.values(),
                *(t.ms + t.latency_ms + t.serialize_ms for t in plan.transfers)),
               default=0.0)


def _assignments(costs: list[list[float]], k: int, r: int):
    """Ways to give k components to r devices: all of them when few, else greedy."""
    if r ** k <= _EXHAUSTIVE:
        yield from itertools.product(range(r), repeat=k)
        return
    order = sorted(range(k), key=lambda c: -min(costs[d][c] for d in range(r)))
    load = [0.0] * r
    choice = [0] * k
    for c in order:
        d = min(range(r), key=lambda d: load[d] + costs[d][c])
        choice[c] = d
        load[d] += costs[d][c]
    yield tuple(choice)


def solve_mesh(graph: LayerGraph, topology: Topology, *, source: str, parallel: bool = True,
               period_bound: float = float("inf")) -> MeshSolution:
    """The lowest-latency plan over a mesh whose every stage is at most ``period_bound``:
    every chain through one branch device, and (``parallel``) every parallel region of the
    model spread over the branch devices (eq. 2)."""
    found = _solve_mesh(graph, topology, source, parallel, period_bound)
    if found is None:
        raise InfeasibleError("device memory: no assignment over the mesh fits the devices")
    return found


def _solve_mesh(graph, topology, source, parallel, period_bound) -> MeshSolution | None:
    shape = mesh_shape(topology)
    best: MeshSolution | None = None
    for branch in shape.branches:  # plain chains through one branch device
        path = [*shape.chain, branch, shape.aggregator]
        sub = chain(f"{topology.name}-via-{branch}", [topology.device(d) for d in path],
                    [topology.link(a, b) for a, b in itertools.pairwise(path)])
        costs = ChainCosts.build(graph, sub)
        found = _solve(costs, period_bound)
        if found is not None and (best is None or found.total_ms < best.total_ms):
            best = MeshSolution(found.total_ms, chain_plan(costs, found, sub, method="multisplit",
                                                           source=source), f"chain via {branch}")
    spread = _best_parallel(graph, topology, shape, source, period_bound) if parallel else None
    if spread is not None and (best is None or spread.total_ms < best.total_ms):
        best = spread
    return best


def solve_mesh_throughput(graph: LayerGraph, topology: Topology, *, source: str,
                          max_latency_ms: float | None = None, rel_tol: float = 1e-9
                          ) -> MeshSolution:
    """Minimum period (slowest stage) over the mesh subject to latency <= ``max_latency_ms``,
    by bisection on the period with the latency search restricted to stages under it."""
    fastest = solve_mesh(graph, topology, source=source)
    if max_latency_ms is not None and fastest.total_ms > max_latency_ms * (1 + 1e-12):
        raise InfeasibleError(f"latency bound: the fastest plan takes {fastest.total_ms:.3f} ms "
                              f"> {max_latency_ms:.3f} ms")
    bound = max_latency_ms if max_latency_ms is not None else float("inf")
    lo, hi, best = 0.0, plan_period_ms(fastest.plan), fastest
    while hi - lo > rel_tol * max(hi, 1e-12):
        mid = (lo + hi) / 2
        found = _solve_mesh(graph, topology, source, True, mid)
        if found is not None and found.total_ms <= bound * (1 + 1e-12):
            hi, best = plan_period_ms(found.plan), found
        else:
            lo = mid
    return best


def _best_parallel(graph: LayerGraph, topology: Topology, shape: MeshShape, source: str,
                   period_bound: float = float("inf")) -> MeshSolution | None:
    regions = parallel_regions(graph)
    if not regions:
        return None
    prefix_topo = chain(f"{topology.name}-prefix", [topology.device(d) for d in shape.chain],
                        [topology.link(a, b) for a, b in zip(shape.chain[:-1], shape.chain[1:],
                                                              strict=True)])
    prefix = ChainCosts.build(graph, prefix_topo)
    _, best_end, rebuild = _solve(prefix, period_bound, return_table=True)
    works = [LayerWork.of(graph, layer) for layer in graph.layers]
    layer_ms = {d: np.array([estimator_for(topology.device(d)).layer_ms(w, topology.device(d))
                             for w in works]) for d in (*shape.branches, shape.aggregator)}
    agg_suffix = np.concatenate([np.cumsum(layer_ms[shape.aggregator][::-1])[::-1], [0.0]])
    cuts = graph.cuts()
    found = None
    for region in regions:
        chain_ms = best_end[region.fork]
        if chain_ms == float("inf"):
            continue
        fork = cuts[region.fork].tensors
        branch_costs = [[float(layer_ms[d][list(c)].sum()) for c in region.components]
                        for d in shape.branches]
        agg_ms = float(agg_suffix[region.join])
        if agg_ms > period_bound or not _fits(prefix, topology.device(shape.aggregator),
                                               range(region.join, len(graph.layers))):
            continue
        for choice in _assignments(branch_costs, len(region.components), len(shape.branches)):
            stages = []
            for j, d in enumerate(shape.branches):
                comps = [c for c, dev in zip(region.components, choice, strict=True) if dev == j]
                stages.append(_branch_stages(
                    graph, layer_ms[d], comps, fork, topology.link(shape.chain[-1], d),
                    topology.link(d, shape.aggregator),
                    (topology.device(shape.chain[-1]), topology.device(d),
                     topology.device(shape.aggregator))))
            if max(max(st) for st in stages) > period_bound or not all(
                    _fits(prefix, topology.device(d),
                          [i for c, dev in zip(region.components, choice, strict=True)
                           if dev == j for i in c])
                    for j, d in enumerate(shape.branches)):
                continue
            total = chain_ms + max(sum(st) for st in stages) + agg_ms
            if found is None or total < found[0]:
                found = (total, region, choice)
    if found is None:
        return None
    total, region, choice = found
    plan = _mesh_plan(graph, topology, shape, prefix, rebuild(region.fork), region, choice,
                      layer_ms, source, total)
    return MeshSolution(total, plan, f"parallel region at layer {region.join}")


def _mesh_plan(graph, topology, shape, prefix, chain_part, region, choice, layer_ms, source,
               total):
    """The chosen parallel solution as a Plan (``total`` is what the search computed; the
    assembler prices the same placement)."""
    names = [layer.name for layer in graph.layers]
    placement = {d: names[a:b] for d, (a, b) in zip(shape.chain, chain_part.ranges(),
                                                     strict=True)}
    for j, d in enumerate(shape.branches):
        placement[d] = [names[i] for i in sorted(
            i for c, dev in zip(region.components, choice, strict=True) if dev == j for i in c)]
    placement[shape.aggregator] = names[region.join:]
    on_chain = {d: m for m, d in enumerate(shape.chain)}
    order = [*shape.chain, *shape.branches, shape.aggregator]
    return assemble_plan(
        graph, placement, Network.of_topology(topology, order),
        layer_ms={n: {d: float(prefix.layer_ms[on_chain[d], i]) if d in on_chain
                      else float(layer_ms[d][i]) for d in order} for i, n in enumerate(names)},
        method="multisplit", source=source,
        edge_memory_bytes=prefix.range_memory(*chain_part.ranges()[0]),
        parallel_devices=shape.branches,
        reason=f"parallel branches of the layers before {names[region.join]}")
