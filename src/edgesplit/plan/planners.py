"""Edge-cloud planners behind one interface, and the registry that finds them by name.

A planner only *decides* (returns the edge part as a down-set of layers); ``make_plan`` turns a
decision into a :class:`Plan` with the shared cost model. Planners never execute anything.
"""

from __future__ import annotations

import difflib
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from edgesplit.data import EvalData
from edgesplit.errors import ConfigError, UnknownNameError
from edgesplit.graph import LayerGraph, capture
from edgesplit.plan.cost import CostTable, EdgeCloudSetting
from edgesplit.plan.mincut import min_cut_edge_set
from edgesplit.plan.model import (ModelRef, Plan, PlanDevice, PlanLayer, PlanLink, PlanTensor,
                                  Prediction, Transfer)

__all__ = ["PlanningProblem", "Planner", "register_planner", "get_planner", "list_planners",
           "make_plan", "BASELINE_METHODS"]

BASELINE_METHODS = ("neurosurgeon", "dads", "qdmp", "cloud_only", "edge_only")


@dataclass
class PlanningProblem:
    """A model (as captured graphs), the edge-cloud setting, and the cost tables (cached).

    ``model`` is anything :func:`edgesplit.graph.capture` accepts; the raw graph (for DADS) is
    captured from it on first use."""

    model: Any
    setting: EdgeCloudSetting
    example_inputs: Any = None
    input_shape: Sequence[int] | None = None
    # Held-out data to measure quantized plans' accuracy on (AUTO-SPLIT and its quantized
    # baselines); without it they are judged by distortion and say accuracy was not measured.
    eval_data: EvalData | None = None
    calibration_samples: int | None = None  # taken from the front of eval_data
    eval_batch_size: int = 64
    progress: Callable[[str, int, int], None] | None = None  # (task, done, total)
    _graphs: dict[str, LayerGraph] = field(default_factory=dict, repr=False)
    _costs: dict[str, CostTable] = field(default_factory=dict, repr=False)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # planners' shared work

    @property
    def source(self) -> str:
        return str(self.model) if isinstance(self.model, (str, Path)) else self.graph.model

    @property
    def graph(self) -> LayerGraph:
        return self.graph_of("optimized")

    def graph_of(self, kind: str) -> LayerGraph:
        if kind not in self._graphs:
            self._graphs[kind] = capture(self.model, self.example_inputs,
                                         input_shape=self.input_shape,
                                         optimize=kind == "optimized")
        return self._graphs[kind]

    def costs(self, kind: str = "optimized") -> CostTable:
        if kind not in self._costs:
            self._costs[kind] = CostTable.build(self.graph_of(kind), self.setting)
        return self._costs[kind]


class Planner(ABC):
    """Decides an edge part for one cost table. ``graph_kind`` says which graph it plans on."""

    name: str = ""
    graph_kind: str = "optimized"

    @abstractmethod
    def choose(self, costs: CostTable) -> frozenset[str]:
        """The edge layers (a down-set)."""

    def plan(self, problem: PlanningProblem) -> Plan:
        costs = problem.costs(self.graph_kind)
        edge = self.choose(costs)
        return make_plan(costs, edge, method=self.name, source=problem.source,
                         graph_kind=self.graph_kind)


_PLANNERS: dict[str, Callable[[], Planner]] = {}


def register_planner(name: str) -> Callable[[type[Planner]], type[Planner]]:
    def deco(cls: type[Planner]) -> type[Planner]:
        if name in _PLANNERS:
            warnings.warn(f"planner {name!r} registered twice; the later one wins", stacklevel=2)
        cls.name = name
        _PLANNERS[name] = cls
        return cls

    return deco


def get_planner(name: str, **options: Any) -> Planner:
    """A planner by name; ``options`` go to its constructor (e.g. AUTO-SPLIT's thresholds)."""
    if name not in _PLANNERS:
        close = difflib.get_close_matches(name, _PLANNERS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownNameError(f"unknown planning method {name!r}.{hint} Methods: "
                               f"{', '.join(sorted(_PLANNERS))}, all")
    return _PLANNERS[name](**options)


def list_planners() -> list[str]:
    return sorted(_PLANNERS)


def _best(costs: CostTable, candidates: list[frozenset[str]]) -> frozenset[str]:
    """The lowest-latency feasible candidate; if none is feasible, the lowest-latency one (its
    plan then reports why it is infeasible)."""
    feasible = [e for e in candidates if costs.violation(e) is None]
    pool = feasible or candidates
    return min(pool, key=lambda e: (costs.evaluate(e).total_ms, len(e)))


@register_planner("cloud_only")
class CloudOnly(Planner):
    """Everything on the cloud; the edge only sends the input."""

    def choose(self, costs: CostTable) -> frozenset[str]:
        return frozenset()


@register_planner("edge_only")
class EdgeOnly(Planner):
    """Everything on the edge."""

    def choose(self, costs: CostTable) -> frozenset[str]:
        return frozenset(layer.name for layer in costs.graph.layers)


@register_planner("neurosurgeon")
class Neurosurgeon(Planner):
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


class _MinCut(Planner):
    """Min s-t cut on the DAG; exact for the latency objective. The round trip is paid by every
    plan but edge-only, so the optimum is the cheaper of the cut (+RTT) and edge-only. A memory
    limit, which a cut cannot express, is met by pricing edge weight bytes (Lagrangian search)."""

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
class Manual(Planner):
    """The edge runs ``split_after`` and everything they depend on."""

    def __init__(self, split_after: Sequence[str] = ()) -> None:
        self.split_after = list(split_after)

    def choose(self, costs: CostTable) -> frozenset[str]:
        if not self.split_after:
            raise ConfigError("the manual method needs --split-after LAYER[,LAYER...]")
        return frozenset(costs.graph.ancestors_closure(self.split_after))


def make_plan(costs: CostTable, edge: frozenset[str], *, method: str, source: str,
              graph_kind: str = "optimized") -> Plan:
    """Turn an edge part into a Plan with the shared cost model."""
    graph, setting = costs.graph, costs.setting
    breakdown = costs.evaluate(edge)
    edge_name, cloud_name = "edge", "cloud"
    order = [layer.name for layer in graph.layers]
    edge_layers = [n for n in order if n in edge]
    cloud_layers = [n for n in order if n not in edge]
    returned = costs.returned(edge)
    bits = {t: b for t in breakdown.crossing if (b := costs.wire_bits(t)) is not None}
    transfers = [Transfer(src=edge_name, dst=cloud_name, tensors=list(breakdown.crossing),
                          bits=bits, bytes=breakdown.sent_bytes,
                          ms=sum(costs.up_ms[t] for t in breakdown.crossing))]
    if returned:
        transfers.append(Transfer(src=cloud_name, dst=edge_name, tensors=returned,
                                  bytes=sum(graph.tensors[t].bytes for t in returned),
                                  ms=sum(costs.down_ms[t] for t in returned)))
    violation = costs.violation(edge)
    return Plan(
        method=method,
        model=ModelRef(name=graph.model, source=source,
                       input_shapes=[list(x.shape) for x in graph.example_inputs],
                       graph=graph_kind),
        devices=[
            PlanDevice(name=edge_name, role="edge", device=setting.edge, layers=edge_layers,
                       compute_ms=breakdown.edge_ms),
            PlanDevice(name=cloud_name, role="cloud", device=setting.cloud, layers=cloud_layers,
                       compute_ms=breakdown.cloud_ms),
        ],
        links=[PlanLink(src=edge_name, dst=cloud_name, link=setting.link)],
        layers=[PlanLayer(name=n, latency_ms={edge_name: costs.edge_ms[n],
                                              cloud_name: costs.cloud_ms[n]},
                          param_bytes=graph.layer(n).param_bytes) for n in order],
        tensors=[PlanTensor(name=t.name, producer=t.producer, consumers=list(t.consumers),
                            shape=list(t.shape), dtype=t.dtype, bytes=t.bytes)
                 for t in graph.tensors.values()],
        transfers=transfers,
        predicted=Prediction(compute_ms={edge_name: breakdown.edge_ms,
                                         cloud_name: breakdown.cloud_ms},
                             transfer_ms=breakdown.transfer_ms, rtt_ms=breakdown.rtt_ms,
                             total_ms=breakdown.total_ms),
        edge_memory_bytes=costs.memory_bytes(edge),
        feasible=violation is None,
        reason=violation,
    )
