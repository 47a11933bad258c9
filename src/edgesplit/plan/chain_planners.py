"""Planners over a topology of devices (a chain, or a mesh with parallel branch devices),
behind the same protocol as the edge-cloud ones: ``get_planner(name).plan(problem)`` with a
problem built on a :class:`~edgesplit.hardware.Topology`.

``multisplit`` is JMSNAS's exact search (chain DP, or the mesh search of eq. 2) for the
problem's objective: latency, or the slowest stage under ``max_latency_ms``. The others are
the baselines the paper compares with. Over a mesh, ``source_only``/``sink_only`` run on the
chain through the first branch device and ``best_chain`` is the best plain chain (no parallel
devices), so every mesh method but ``multisplit`` gives a plan the runtime can execute.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from edgesplit.errors import ConfigError, option
from edgesplit.hardware import Topology, chain
from edgesplit.plan.model import Plan
from edgesplit.plan.multisplit import (
    ChainAssignment,
    ChainCosts,
    chain_plan,
    evaluate_boundaries,
    linear_search,
    solve_chain_latency,
    solve_chain_throughput,
)
from edgesplit.plan.planners import Planner, PlanningProblem, ProblemKind, register_planner

__all__ = [
    "MESH_METHODS",
    "TOPOLOGY_METHODS",
    "BestChain",
    "ChainManual",
    "Linear",
    "Multisplit",
    "SinkOnly",
    "SourceOnly",
    "chain_costs",
]

# What `edgesplit plan --topology` compares, in table order: over a chain, and over a mesh.
TOPOLOGY_METHODS = ("multisplit", "linear", "source_only", "sink_only")
MESH_METHODS = ("multisplit", "best_chain", "source_only", "sink_only")


def _topology(problem: PlanningProblem) -> Topology:
    assert problem.topology is not None  # Planner.check ran: a chain or mesh problem
    return problem.topology


def chain_costs(problem: PlanningProblem) -> tuple[ChainCosts, Topology]:
    """The chain cost tables of the problem (cached): its chain, or over a mesh the chain
    through the first branch device."""
    if "chain_costs" not in problem.cache:
        topology = _topology(problem)
        if not topology.is_chain:
            from edgesplit.plan.mesh import mesh_shape

            shape = mesh_shape(topology)
            path = [*shape.chain, shape.branches[0], shape.aggregator]
            topology = chain(f"{topology.name}-via-{shape.branches[0]}",
                             [topology.device(d) for d in path],
                             [topology.link(a, b) for a, b in itertools.pairwise(path)])
        problem.cache["chain_costs"] = (ChainCosts.build(problem.graph, topology), topology)
    costs, topology = problem.cache["chain_costs"]
    return costs, topology


class _ChainPlanner(Planner):
    """A planner that picks boundaries on the problem's chain (see :func:`chain_costs`)."""

    problems: ClassVar[tuple[ProblemKind, ...]] = ("chain", "mesh")

    @abstractmethod
    def assign(self, costs: ChainCosts, problem: PlanningProblem) -> ChainAssignment:
        """The boundaries of each device's range of layers."""

    def plan(self, problem: PlanningProblem) -> Plan:
        self.check(problem)
        costs, topology = chain_costs(problem)
        found = self.assign(costs, problem)
        objective = problem.objective if problem.kind == "chain" else "latency"
        return chain_plan(costs, found, topology, method=self.name, source=problem.source,
                          objective=objective)


@register_planner("multisplit")
class Multisplit(Planner):
    """JMSNAS: the exact minimum over the chain (DP) or the mesh (eq. 2), for the problem's
    objective. Mesh plans may use parallel devices, which are a prediction only."""

    problems = ("chain", "mesh")

    def plan(self, problem: PlanningProblem) -> Plan:
        self.check(problem)
        if problem.kind == "mesh":
            return self._mesh(problem)
        costs, topology = chain_costs(problem)
        found = (solve_chain_latency(costs) if problem.objective == "latency"
                 else solve_chain_throughput(costs, max_latency_ms=problem.max_latency_ms))
        return chain_plan(costs, found, topology, method=self.name, source=problem.source,
                          objective=problem.objective)

    def _mesh(self, problem: PlanningProblem) -> Plan:
        from edgesplit.plan.mesh import solve_mesh, solve_mesh_throughput

        graph, topology = problem.graph, _topology(problem)
        found = (solve_mesh(graph, topology, source=problem.source)
                 if problem.objective == "latency"
                 else solve_mesh_throughput(graph, topology, source=problem.source,
                                            max_latency_ms=problem.max_latency_ms))
        return found.plan.model_copy(update={"method": self.name})


@register_planner("best_chain")
class BestChain(Planner):
    """Over a mesh: the best plain chain through one branch device (no parallel devices)."""

    problems = ("mesh",)

    def plan(self, problem: PlanningProblem) -> Plan:
        from edgesplit.plan.mesh import solve_mesh

        self.check(problem)
        found = solve_mesh(problem.graph, _topology(problem), source=problem.source,
                           parallel=False)
        return found.plan.model_copy(update={"method": self.name})


@register_planner("linear")
class Linear(_ChainPlanner):
    """HiveMind-style linear search, hop by hop (one step of look-ahead)."""

    problems = ("chain",)

    def assign(self, costs: ChainCosts, problem: PlanningProblem) -> ChainAssignment:
        return linear_search(costs)


@register_planner("chain_manual")
class ChainManual(_ChainPlanner):
    """The assignment someone else decided: ``layers_per_device[m]`` consecutive layers (in
    graph order) on the chain's m-th device, priced like every chain plan (a NAS search that
    placed its own units, e.g. JMSNAS's |D^m|, deploys its choice through this)."""

    problems = ("chain",)
    options = ("layers_per_device",)

    def __init__(self, layers_per_device: Sequence[int] = ()) -> None:
        self.layers_per_device = list(layers_per_device)

    def assign(self, costs: ChainCosts, problem: PlanningProblem) -> ChainAssignment:
        counts, n, m = self.layers_per_device, costs.n, len(costs.devices)
        if len(counts) != m or min(counts, default=0) < 0 or sum(counts) != n:
            raise ConfigError(
                f"the chain_manual method needs one non-negative layer count per device "
                f"({m}: {', '.join(costs.devices)}) adding up to the model's {n} layers; got "
                f"{option('layers_per_device', counts)}")
        return evaluate_boundaries(costs, (0, *itertools.accumulate(counts)))


@register_planner("source_only")
class SourceOnly(_ChainPlanner):
    """Everything on the first device of the chain."""

    def assign(self, costs: ChainCosts, problem: PlanningProblem) -> ChainAssignment:
        n, m = costs.n, len(costs.devices)
        return evaluate_boundaries(costs, (0, *([n] * m)))


@register_planner("sink_only")
class SinkOnly(_ChainPlanner):
    """Everything on the last device of the chain (the source only sends the input)."""

    def assign(self, costs: ChainCosts, problem: PlanningProblem) -> ChainAssignment:
        n, m = costs.n, len(costs.devices)
        return evaluate_boundaries(costs, (0, *([0] * (m - 1)), n))
