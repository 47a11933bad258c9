"""The planner protocol, the registry that finds planners by name, and the edge-cloud planners.

Every planner, edge-cloud or over a topology, is called the same way::

    get_planner(name, **options).plan(problem) -> Plan

``problem`` is a :class:`PlanningProblem`: a model and either an :class:`EdgeCloudSetting`
or a :class:`~edgesplit.hardware.Topology` (chain or mesh). A planner declares which problems
it plans (``problems``) and its constructor keywords (``options``); it only *decides*, and the
Plan is built by :func:`edgesplit.plan.assemble.assemble_plan`. Planners never execute anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from edgesplit.data.images import EvalSet
from edgesplit.errors import ConfigError, option
from edgesplit.graph import Exported, LayerGraph, capture, export_for_capture
from edgesplit.hardware import Topology
from edgesplit.plan.assemble import Network, assemble_plan
from edgesplit.plan.cost import CostTable, EdgeCloudSetting
from edgesplit.plan.mincut import min_cut_edge_set
from edgesplit.plan.model import Plan
from edgesplit.registry import Registry

__all__ = [
    "BASELINE_METHODS",
    "PLANNERS",
    "EdgeSetPlanner",
    "Planner",
    "PlanningProblem",
    "get_planner",
    "list_planners",
    "make_plan",
    "register_planner",
]

BASELINE_METHODS = ("neurosurgeon", "dads", "qdmp", "cloud_only", "edge_only")

ProblemKind = Literal["edge_cloud", "chain", "mesh"]


@dataclass
class PlanningProblem:
    """A model (as captured graphs) and where it runs (``setting``): an edge-cloud setting or
    a topology of devices; the cost tables are cached.

    ``model`` is anything :func:`edgesplit.graph.capture` accepts; the raw graph (for DADS) is
    captured from it on first use. ``objective`` and ``max_latency_ms`` apply to topologies:
    minimise latency, or the slowest pipeline stage under a latency bound."""

    model: Any
    setting: EdgeCloudSetting | Topology
    example_inputs: Any = None
    input_shape: Sequence[int] | None = None
    # Held-out data to measure quantized plans' accuracy on (AUTO-SPLIT and its quantized
    # baselines); without it they are judged by distortion and say accuracy was not measured.
    eval_data: EvalSet | None = None
    calibration_samples: int | None = None  # taken from the front of eval_data
    eval_batch_size: int = 64
    progress: Callable[[str, int, int], None] | None = None  # (task, done, total)
    objective: Literal["latency", "throughput"] = "latency"
    max_latency_ms: float | None = None
    _exported: Exported | None = field(default=None, repr=False)
    _graphs: dict[str, LayerGraph] = field(default_factory=dict, repr=False)
    _costs: dict[str, CostTable] = field(default_factory=dict, repr=False)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # planners' shared work

    def __post_init__(self) -> None:
        if not isinstance(self.setting, (EdgeCloudSetting, Topology)):
            raise ConfigError(f"a planning problem runs on an EdgeCloudSetting or a Topology, "
                              f"got {type(self.setting).__name__}")
        if self.objective not in ("latency", "throughput"):
            raise ConfigError(f"objective must be 'latency' or 'throughput', got "
                              f"{self.objective!r}")
        if self.topology is None and (self.objective != "latency"
                                      or self.max_latency_ms is not None):
            raise ConfigError(f"{option('objective')} and {option('max_latency_ms')} apply to "
                              f"{option('topology')} planning")

    @property
    def kind(self) -> ProblemKind:
        """``edge_cloud``, or the topology's shape: ``chain`` or ``mesh``."""
        if self.topology is None:
            return "edge_cloud"
        return "chain" if self.topology.is_chain else "mesh"

    @property
    def topology(self) -> Topology | None:
        """The topology planned over; None for an edge-cloud problem."""
        return self.setting if isinstance(self.setting, Topology) else None

    @property
    def edge_cloud(self) -> EdgeCloudSetting:
        """The edge-cloud setting; ConfigError for a topology problem."""
        if not isinstance(self.setting, EdgeCloudSetting):
            raise ConfigError("this planner plans an edge-cloud setting (edge, cloud, link), "
                              "not a topology")
        return self.setting

    @property
    def source(self) -> str:
        return str(self.model) if isinstance(self.model, (str, Path)) else self.graph.model

    @property
    def graph(self) -> LayerGraph:
        return self.graph_of("optimized")

    def graph_of(self, kind: str) -> LayerGraph:
        if kind not in self._graphs:
            if self._exported is None:  # one export for both graphs (torch.export: seconds)
                self._exported = export_for_capture(self.model, self.example_inputs,
                                                    input_shape=self.input_shape)
            self._graphs[kind] = capture(self._exported, optimize=kind == "optimized")
        return self._graphs[kind]

    def costs(self, kind: str = "optimized") -> CostTable:
        if kind not in self._costs:
            self._costs[kind] = CostTable.build(self.graph_of(kind), self.edge_cloud)
        return self._costs[kind]


class Planner(ABC):
    """The protocol: ``plan(problem) -> Plan``. ``problems``: the problem kinds it plans;
    ``options``: its constructor keywords (what ``get_planner(name, **options)`` passes);
    ``reads``: the problem's optional fields it uses (e.g. ``eval_data``)."""

    name: ClassVar[str] = ""
    problems: ClassVar[tuple[ProblemKind, ...]] = ("edge_cloud",)
    options: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def plan(self, problem: PlanningProblem) -> Plan:
        """The plan this planner decides for ``problem``."""

    def check(self, problem: PlanningProblem) -> None:
        """ConfigError unless this planner plans problems of ``problem``'s kind."""
        if problem.kind not in self.problems:
            raise ConfigError(f"planning method {self.name!r} plans {' or '.join(self.problems)}"
                              f" problems, not {problem.kind} (methods for it: "
                              f"{', '.join(planners_for(problem.kind))})")


class EdgeSetPlanner(Planner):
    """An edge-cloud planner that decides the edge part (a down-set of layers) from one cost
    table; ``graph_kind`` says which graph it plans on (a class default: a caller that maps
    its own cut onto the other graph sets it on the instance, as train.decision does)."""

    graph_kind: Literal["optimized", "raw"] = "optimized"

    @abstractmethod
    def choose(self, costs: CostTable) -> frozenset[str]:
        """The edge layers (a down-set)."""

    def plan(self, problem: PlanningProblem) -> Plan:
        self.check(problem)
        costs = problem.costs(self.graph_kind)
        edge = self.choose(costs)
        return make_plan(costs, edge, method=self.name, source=problem.source,
                         graph_kind=self.graph_kind)


def _load_planners() -> None:
    # The modules register their planners on import.
    from edgesplit.plan import autosplit, chain_planners, quantized  # noqa: F401


PLANNERS: Registry[type[Planner]] = Registry("planning method", label="Methods",
                                             hint="(or all)", loader=_load_planners)


def register_planner(name: str) -> Callable[[type[Planner]], type[Planner]]:
    """Class decorator: register a planner under ``name``."""
    def deco(cls: type[Planner]) -> type[Planner]:
        cls.name = name
        return PLANNERS.register(name, cls)

    return deco


def get_planner(name: str, **options: Any) -> Planner:
    """A planner by name; ``options`` go to its constructor (e.g. AUTO-SPLIT's thresholds)."""
    cls = PLANNERS.get(name)
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        raise ConfigError(f"planning method {name!r} takes no option {', '.join(unknown)} "
                          f"(its options: {', '.join(cls.options) or 'none'})")
    return cls(**options)


def list_planners() -> list[str]:
    return PLANNERS.names()


def planners_for(kind: ProblemKind) -> list[str]:
    """Every registered planner that plans problems of ``kind``."""
    return [n for n, cls in PLANNERS.items() if kind in cls.problems]


def _best(costs: CostTable, candidates: list[frozenset[str]]) -> frozenset[str]:
    """The lowest-latency feasible candidate; if none is feasible, the lowest-latency one (its
    plan then reports why it is infeasible)."""
    feasible = [e for e in candidates if costs.violation(e) is None]
    pool = feasible or candidates
    return min(pool, key=lambda e: (costs.evaluate(e).total_ms, len(e)))


@register_planner("cloud_only")
class CloudOnly(EdgeSetPlanner):
    """Everything on the cloud; the edge only sends the input."""

    def choose(self, costs: CostTable) -> frozenset[str]:
        return frozenset()


@register_planner("edge_only")
class EdgeOnly(EdgeSetPlanner):
    """Everything on the edge."""

    def choose(self, costs: CostTable) -> frozenset[str]:
        return frozenset(layer.name for layer in costs.graph.layers)


@register_planner("neurosurgeon")
class Neurosurgeon(EdgeSetPlanner):
    """Neurosurgeon (Kang et al. 2017) as published: layers in topological order treated as a
    chain, every cut position tried, and the transfer at position i taken to be the output of
    layer i alone. On a DAG that misses skip connections crossing the cut; the plan is then
    charged the true cost (every crossing tensor), which is how it would really run. Like DADS
    it plans on the raw graph: it profiles framework layers, before any graph optimisation."""

    graph_kind = "raw"

    def chain_costs_ms(self, costs: CostTable) -> list[float]:
        """Neurosurgeon's own estimate for the cut after every layer i = -1 (cloud-only) .. n-1
        (edge-only), from running sums."""
        layers = costs.graph.layers
        n = len(layers)
        edge = [0.0]
        for layer in layers:
            edge.append(edge[-1] + costs.edge_ms[layer.name])
        cloud = [0.0]
        for layer in reversed(layers):
            cloud.append(cloud[-1] + costs.cloud_ms[layer.name])
        cloud.reverse()  # cloud[k]: layers k.. on the cloud
        result = []
        for i in range(-1, n):
            if i == n - 1:
                sent = sum(costs.up_ms[t] for t in costs.graph.outputs) \
                    if costs.setting.result_at == "cloud" else 0.0
            else:
                sent = sum(costs.up_ms[t] for t in (layers[i].outputs if i >= 0
                                                     else costs.graph.inputs))
            crosses = sent > 0 or i < n - 1
            result.append(edge[i + 1] + sent + cloud[i + 1]
                          + (costs.setting.link.rtt_ms if crosses else 0.0))
        return result

    def choose(self, costs: CostTable) -> frozenset[str]:
        names = [layer.name for layer in costs.graph.layers]
        violations = costs.prefix_violations()
        positions = [i for i in range(-1, len(names)) if violations[i + 1] is None]
        if not positions:  # nothing feasible: the plan will say why
            positions = list(range(-1, len(names)))
        own = self.chain_costs_ms(costs)
        best = min(positions, key=lambda i: (own[i + 1], i))
        return frozenset(names[: best + 1])


class _MinCut(EdgeSetPlanner):
    """Min s-t cut on the DAG; exact for the latency objective. The link latency is the same
    for every plan but edge-only (a full RTT with the result on the edge; rtt/2 for every plan
    with the result on the cloud), so the optimum is the cheaper of the cut and edge-only. A
    memory limit, which a cut cannot express, is met by pricing edge weight bytes (Lagrangian
    search)."""

    def choose(self, costs: CostTable) -> frozenset[str]:
        forced = costs.forced_edge()
        everything = frozenset(layer.name for layer in costs.graph.layers)
        candidates = [min_cut_edge_set(costs, forced_edge=forced), everything]
        if all(costs.violation(e) is not None for e in candidates):
            candidates += self._priced(costs, forced)
        return _best(costs, candidates)

    @staticmethod
    def _priced(costs: CostTable, forced: frozenset[str]) -> list[frozenset[str]]:
        found: list[frozenset[str]] = []
        price, low, high = 1e-9, 0.0, None
        for _ in range(60):  # grow the price until the cut fits
            edge = min_cut_edge_set(costs, forced_edge=forced, weight_penalty_ms_per_byte=price)
            found.append(edge)
            if costs.violation(edge) is None:
                high = price
                break
            low, price = price, price * 4
        if high is None:
            return found
        for _ in range(25):  # then the smallest price that still fits
            mid = (low + high) / 2
            edge = min_cut_edge_set(costs, forced_edge=forced, weight_penalty_ms_per_byte=mid)
            found.append(edge)
            if costs.violation(edge) is None:
                high = mid
            else:
                low = mid
        return found


@register_planner("dads")
class Dads(_MinCut):
    """DADS (Hu et al. 2019): min-cut on the raw captured graph (BN, activations separate)."""

    graph_kind = "raw"


@register_planner("qdmp")
class Qdmp(_MinCut):
    """QDMP (Zhang et al. 2020): min-cut on the optimised graph (BN folded, activations fused)."""


@register_planner("manual")
class Manual(EdgeSetPlanner):
    """The edge runs ``split_after`` (layer names or module paths, see
    :meth:`LayerGraph.resolve_split_point`) and everything they depend on."""

    options = ("split_after",)

    def __init__(self, split_after: Sequence[str] = ()) -> None:
        self.split_after = list(split_after)

    def choose(self, costs: CostTable) -> frozenset[str]:
        if not self.split_after:
            raise ConfigError(f"the manual method needs the layers or modules to split "
                              f"after: {option('split_after', 'LAYER[,LAYER...]')}")
        return frozenset(costs.graph.split_layers(self.split_after))


def make_plan(costs: CostTable, edge: frozenset[str], *, method: str, source: str,
              graph_kind: Literal["optimized", "raw"] = "optimized") -> Plan:
    """Turn an edge part into a Plan with the shared cost model."""
    graph, setting = costs.graph, costs.setting
    order = [layer.name for layer in graph.layers]
    violation = costs.violation(edge)
    return assemble_plan(
        graph, {"edge": [n for n in order if n in edge], "cloud": [n for n in order
                                                               if n not in edge]},
        Network.edge_cloud(setting.edge, setting.cloud, setting.link, setting.result_at),
        layer_ms={n: {"edge": costs.edge_ms[n], "cloud": costs.cloud_ms[n]} for n in order},
        method=method, source=source, graph_kind=graph_kind, tensor_bits=costs.tensor_bits(),
        edge_memory_bytes=costs.memory_bytes(edge), feasible=violation is None,
        reason=violation)
