"""Planning over a topology of several devices: compare methods and build the JSON document of
``edgesplit plan MODEL --topology T``."""

from __future__ import annotations

from typing import Any, Literal

from edgesplit.errors import ConfigError
from edgesplit.graph import LayerGraph
from edgesplit.hardware import Topology, chain
from edgesplit.plan.model import PLAN_VERSION, Plan
from edgesplit.plan.multisplit import (ChainCosts, chain_plan, evaluate_boundaries,
                                       linear_search, solve_chain_latency,
                                       solve_chain_throughput)

__all__ = ["TOPOLOGY_METHODS", "compare_topology_methods", "topology_document"]

TOPOLOGY_METHODS = ("multisplit", "linear", "source_only", "sink_only")


def compare_topology_methods(graph: LayerGraph, topology: Topology, *, source: str,
                             objective: Literal["latency", "throughput"] = "latency",
                             max_latency_ms: float | None = None,
                             methods: tuple[str, ...] = TOPOLOGY_METHODS
                             ) -> tuple[ChainCosts | None, dict[str, Plan]]:
    """One plan per method over a chain or mesh topology (the chain's cost tables too)."""
    if objective not in ("latency", "throughput"):
        raise ConfigError(f"objective must be 'latency' or 'throughput', got {objective!r}")
    if not topology.is_chain:
        return _mesh_methods(graph, topology, source=source, objective=objective,
                             max_latency_ms=max_latency_ms)
    costs = ChainCosts.build(graph, topology)
    n, m = len(graph.layers), len(costs.devices)
    plans = {}
    for method in methods:
        if method == "multisplit":
            found = (solve_chain_latency(costs) if objective == "latency"
                     else solve_chain_throughput(costs, max_latency_ms=max_latency_ms))
        elif method == "linear":
            found = linear_search(costs)
        elif method == "source_only":
            found = evaluate_boundaries(costs, (0, *([n] * m)))
        elif method == "sink_only":
            found = evaluate_boundaries(costs, (0, *([0] * (m - 1)), n))
        else:
            raise ConfigError(f"unknown multi-split method {method!r}; methods: "
                              f"{', '.join(TOPOLOGY_METHODS)}")
        plans[method] = chain_plan(costs, found, topology, method=method, source=source,
                                   objective=objective)
    return costs, plans


def _mesh_methods(graph: LayerGraph, topology: Topology, *, source: str, objective: str,
                  max_latency_ms: float | None) -> tuple[None, dict[str, Plan]]:
    from edgesplit.plan.mesh import mesh_shape, solve_mesh, solve_mesh_throughput

    shape = mesh_shape(topology)
    first = [*shape.chain, shape.branches[0], shape.aggregator]
    path = chain(f"{topology.name}-via-{shape.branches[0]}", [topology.device(d) for d in first],
                 [topology.link(a, b) for a, b in zip(first[:-1], first[1:], strict=True)])
    costs = ChainCosts.build(graph, path)
    n, m = len(graph.layers), len(first)
    plans = {
        "multisplit": (solve_mesh(graph, topology, source=source) if objective == "latency"
                       else solve_mesh_throughput(graph, topology, source=source,
                                                  max_latency_ms=max_latency_ms)).plan,
        "best_chain": solve_mesh(graph, topology, source=source, parallel=False).plan,
        "source_only": chain_plan(costs, evaluate_boundaries(costs, (0, *([n] * m))), path,
                                  method="source_only", source=source),
        "sink_only": chain_plan(costs, evaluate_boundaries(costs, (0, *([0] * (m - 1)), n)),
                                path, method="sink_only", source=source),
    }
    plans = {k: p.model_copy(update={"method": k}) for k, p in plans.items()}
    return None, plans


def _latency_by_device(plans: dict[str, Plan], name: str) -> dict[str, float]:
    merged: dict[str, float] = {}
    for plan in plans.values():
        for layer in plan.layers:
            if layer.name == name:
                merged.update(layer.latency_ms)
                break
    return merged


def _period(plan: Plan) -> float:
    from edgesplit.plan.mesh import plan_period_ms

    return plan_period_ms(plan)


def topology_document(graph: LayerGraph, topology: Topology, plans: dict[str, Plan], *,
                      objective: str) -> dict[str, Any]:
    key = "total_ms" if objective == "latency" else "period_ms"
    value = {m: (p.predicted.total_ms if objective == "latency" else _period(p))
             for m, p in plans.items()}
    feasible = [m for m, p in plans.items() if p.feasible]
    return {
        "version": PLAN_VERSION,
        "model": graph.model,
        "objective": objective,
        "layers": [{"name": layer.name, "latency_ms": _latency_by_device(plans, layer.name)}
                   for layer in graph.layers],
        "tensors": [{"name": t.name, "producer": t.producer, "consumers": list(t.consumers),
                     "bytes": t.bytes} for t in graph.tensors.values()],
        "topology": {
            "name": topology.name,
            "devices": [d.name for d in topology.devices],
            "links": [{"src": tl.src, "dst": tl.dst, "bandwidth_mbps": tl.link.bandwidth_mbps,
                       "rtt_ms": tl.link.rtt_ms} for tl in topology.links],
        },
        "best": min(feasible, key=value.__getitem__) if feasible else None,
        "methods": {
            m: {"feasible": p.feasible, "assignment": {d.name: d.layers for d in p.devices},
                key: value[m], "total_ms": p.predicted.total_ms, "period_ms": _period(p),
                "plan": p.model_dump(mode="json")}
            for m, p in plans.items()
        },
    }
