"""Planning over a topology of several devices: compare the topology planners (kept for
callers that hold a captured graph; :func:`edgesplit.plan.compare_methods` does the same on a
:class:`~edgesplit.plan.PlanningProblem`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from edgesplit.graph import LayerGraph
from edgesplit.hardware import Topology
from edgesplit.plan.chain_planners import MESH_METHODS, TOPOLOGY_METHODS, chain_costs
from edgesplit.plan.model import Plan
from edgesplit.plan.multisplit import ChainCosts
from edgesplit.plan.planners import PlanningProblem
from edgesplit.plan.run import compare_methods

__all__ = ["MESH_METHODS", "TOPOLOGY_METHODS", "compare_topology_methods", "topology_problem"]


def topology_problem(graph: LayerGraph, topology: Topology, *, source: str,
                     objective: Literal["latency", "throughput"] = "latency",
                     max_latency_ms: float | None = None) -> PlanningProblem:
    """A planning problem over ``topology`` for an already captured ``graph``."""
    problem = PlanningProblem(source, topology, objective=objective,
                              max_latency_ms=max_latency_ms)
    problem._graphs["optimized"] = graph
    return problem


def compare_topology_methods(graph: LayerGraph, topology: Topology, *, source: str,
                             objective: Literal["latency", "throughput"] = "latency",
                             max_latency_ms: float | None = None,
                             methods: Sequence[str] | None = None
                             ) -> tuple[ChainCosts | None, dict[str, Plan]]:
    """One plan per method over a chain or mesh topology (the chain's cost tables too)."""
    problem = topology_problem(graph, topology, source=source, objective=objective,
                               max_latency_ms=max_latency_ms)
    plans = compare_methods(problem, methods)
    return (chain_costs(problem)[0] if problem.kind == "chain" else None), plans
