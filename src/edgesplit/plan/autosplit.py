"""AUTO-SPLIT (Algorithm 1): the split point and the edge part's weight and activation
bit-widths, chosen together under the edge memory limit and an error threshold.

1. Potential splits (eq. 6): prefixes of the optimised graph whose crossing tensors at the lowest
   bit-width cost no more to send than the raw input, and that fit in memory at that width.
2. For each, a grid of uniform weight and activation budgets (one per bit-width of the device);
   per pair, problem 8 (weights: least distortion within the budget, `allocate_bits`) and problem
   9 (activations: each layer's widest bits whose output fits the budget), kept when the real
   working-set memory (weights + live activations at their bits) fits (5b).
3. Every candidate gets its latency (edge compute at its bits, transfer of the crossing tensors
   at their producers' activation bits, float cloud compute) and its total distortion
   (sum of D_i^w + D_i^a). The chosen plan is the fastest within the threshold; cloud-only and
   edge-only (at 8 bits when it fits) are always candidates (Remark 5).

Without evaluation data the threshold is on total distortion (default: that of uniform 8-bit
quantization of the same edge part, the U8 baseline), and the plan says accuracy was not
measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from edgesplit.graph import INPUT, LayerGraph
from edgesplit.hardware import LayerWork, estimator_for
from edgesplit.plan.cost import CostTable
from edgesplit.plan.model import Plan, PlanLayer, Prediction, Transfer
from edgesplit.plan.planners import Planner, PlanningProblem, make_plan, register_planner
from edgesplit.quant.allocation import allocate_bits
from edgesplit.quant.fakequant import DEFAULT_BITS, calibrate, distortion_table

__all__ = ["AutoSplit", "Candidate", "potential_splits", "autosplit_candidates"]

RAW_INPUT_BITS = 8  # a camera frame or any raw sensor sample: 8 bits per element


@dataclass(frozen=True)
class Candidate:
    split: int  # layers on the edge (a prefix of the topological order)
    w_bits: dict[str, int]
    a_bits: dict[str, int]
    distortion: float
    memory_bytes: int
    edge_ms: float
    transfer_ms: float
    cloud_ms: float
    rtt_ms: float
    sent: dict[str, int] = field(default_factory=dict)  # crossing tensor -> bits
    layer_ms: dict[str, float] = field(default_factory=dict)  # edge layers at their bits

    @property
    def total_ms(self) -> float:
        return self.edge_ms + self.transfer_ms + self.cloud_ms + self.rtt_ms


def _tensor_bits(graph: LayerGraph, name: str, a_bits: dict[str, int]) -> int:
    producer = graph.tensors[name].producer
    return RAW_INPUT_BITS if producer == INPUT else a_bits.get(producer, 32)


def potential_splits(graph: LayerGraph, bits: Sequence[int], memory_limit: int | None
                     ) -> list[int]:
    """AUTO-SPLIT eq. (6): prefixes n whose transfer at the lowest width is at most the raw
    input's and whose memory at the lowest width fits."""
    low = min(bits)
    cuts = graph.cuts()
    raw = sum(graph.tensors[t].bytes_at(RAW_INPUT_BITS) for t in graph.inputs)
    out = []
    for n in range(len(graph.layers) + 1):
        edge = [layer.name for layer in graph.layers[:n]]
        sent = sum(t.bytes_at(RAW_INPUT_BITS if t.producer == INPUT else low)
                   for t in cuts[n].tensors)
        if n == len(graph.layers):
            sent = 0  # edge-only sends nothing but the (tiny) result
        if sent > raw:
            continue
        if memory_limit is not None and _memory(graph, edge, dict.fromkeys(edge, low),
                                                dict.fromkeys(edge, low)) > memory_limit:
            continue
        out.append(n)
    return out


def _memory(graph: LayerGraph, edge: list[str], w_bits: dict[str, int], a_bits: dict[str, int]
            ) -> int:
    tensor_bytes = {t: graph.tensors[t].bytes_at(_tensor_bits(graph, t, a_bits))
                    for t in graph.tensors}
    attribute_bytes = {}
    for name in edge:
        for attr in graph.layer(name).param_names:
            attribute_bytes[attr] = math.ceil(graph.attribute_numel.get(attr, 0)
                                              * w_bits[name] / 8)
    return graph.peak_memory(edge, tensor_bytes=tensor_bytes,
                             attribute_bytes=attribute_bytes).total_bytes


def _evaluate(costs: CostTable, n: int, w_bits: dict[str, int], a_bits: dict[str, int],
              distortion: float) -> Candidate:
    graph, setting = costs.graph, costs.setting
    estimator = estimator_for(setting.edge)
    edge = [layer.name for layer in graph.layers[:n]]
    layer_ms = {name: estimator.layer_ms(LayerWork.of(graph, name, w_bits=w_bits[name],
                                                      a_bits=a_bits[name]), setting.edge)
                for name in edge}
    edge_ms = sum(layer_ms.values())
    crossing = costs.crossing(frozenset(edge))
    sent = {t: _tensor_bits(graph, t, a_bits) for t in crossing}
    transfer = sum(setting.link.transfer_ms(graph.tensors[t].bytes_at(b)) for t, b in sent.items())
    returned = costs.returned(frozenset(edge))
    transfer += sum(costs.down_ms[t] for t in returned)
    return Candidate(
        split=n, w_bits=w_bits, a_bits=a_bits, distortion=distortion,
        memory_bytes=_memory(graph, edge, w_bits, a_bits) if edge else
        sum(graph.tensors[t].bytes_at(RAW_INPUT_BITS) for t in graph.inputs),
        edge_ms=edge_ms, transfer_ms=transfer,
        cloud_ms=sum(costs.cloud_ms[layer.name] for layer in graph.layers[n:]),
        rtt_ms=setting.link.rtt_ms if (sent or returned) else 0.0, sent=sent,
        layer_ms=layer_ms)


def autosplit_candidates(costs: CostTable, table, bits: Sequence[int]) -> list[Candidate]:
    """Algorithm 1's candidate list S (plus cloud-only), each with latency and distortion."""
    graph = costs.graph
    limit = costs.setting.memory_limit_bytes
    attrs = {**dict(graph.program.named_parameters()), **dict(graph.program.named_buffers())}
    weights = {layer.name: sum(attrs[p].numel() for p in layer.param_names
                               if p in attrs and attrs[p].dim() >= 2)  # not biases
               for layer in graph.layers}
    candidates = [_evaluate(costs, 0, {}, {}, 0.0)]
    for n in potential_splits(graph, bits, limit):
        if n == 0:
            continue
        edge = [layer.name for layer in graph.layers[:n]]
        act_sizes = {name: sum(graph.tensors[t].elements for t in graph.layer(name).outputs)
                     for name in edge}
        seen = set()
        for bw in bits:
            budget_w = sum(weights[name] for name in edge) * bw
            with_weights = {name: weights[name] for name in edge if weights[name] > 0}
            alloc = allocate_bits({name: table.weight[name] for name in with_weights},
                                  with_weights, budget_w)
            w_bits = {name: alloc.bits.get(name, bw) for name in edge}
            for ba in bits:
                budget_a = max(act_sizes.values()) * ba
                a_bits = {name: max((b for b in bits if act_sizes[name] * b <= budget_a),
                                    default=min(bits)) for name in edge}
                key = (tuple(w_bits.values()), tuple(a_bits.values()))
                if key in seen:
                    continue
                seen.add(key)
                if limit is not None and _memory(graph, edge, w_bits, a_bits) > limit:
                    continue
                distortion = sum(table.weight[name][w_bits[name]]
                                 + table.activation[name][a_bits[name]] for name in edge)
                candidates.append(_evaluate(costs, n, w_bits, a_bits, distortion))
    return candidates


@register_planner("autosplit")
class AutoSplit(Planner):
    """AUTO-SPLIT: joint split point and mixed-precision edge part (see the module docstring)."""

    def __init__(self, bits: Sequence[int] | None = None, max_distortion: float | None = None,
                 calibration: Sequence[Sequence[torch.Tensor]] | None = None) -> None:
        self.bits = bits
        self.max_distortion = max_distortion
        self.calibration = calibration

    def choose(self, costs: CostTable) -> frozenset[str]:
        best = self.select(costs)[0]
        return frozenset(layer.name for layer in costs.graph.layers[: best.split])

    def select(self, costs: CostTable) -> tuple[Candidate, list[Candidate], float]:
        """The chosen candidate, every candidate, and the distortion threshold used."""
        graph = costs.graph
        device_bits = [b for b in costs.setting.edge.supported_bits if b in DEFAULT_BITS]
        bits = tuple(sorted(self.bits or device_bits or DEFAULT_BITS))
        batches = self.calibration or [graph.example_inputs]
        table = distortion_table(graph, calibrate(graph, batches), bits=bits)
        candidates = autosplit_candidates(costs, table, bits)
        threshold = self.max_distortion
        if threshold is None:  # the U8 baseline's distortion over the whole model
            u8 = 8 if 8 in bits else max(b for b in bits if b <= 16)
            threshold = sum(table.weight[n][u8] + table.activation[n][u8]
                            for n in table.weight)
        allowed = [c for c in candidates if c.distortion <= threshold * (1 + 1e-9)]
        best = min(allowed, key=lambda c: (c.total_ms, c.distortion))
        return best, candidates, threshold

    def plan(self, problem: PlanningProblem) -> Plan:
        costs = problem.costs("optimized")
        best, candidates, threshold = self.select(costs)
        edge = frozenset(layer.name for layer in costs.graph.layers[: best.split])
        base = make_plan(costs, edge, method=self.name, source=problem.source)
        layers = [PlanLayer(name=layer.name,
                            latency_ms={**layer.latency_ms,
                                        "edge": best.layer_ms.get(layer.name,
                                                                  layer.latency_ms["edge"])},
                            param_bytes=layer.param_bytes, w_bits=best.w_bits.get(layer.name),
                            a_bits=best.a_bits.get(layer.name)) for layer in base.layers]
        graph = costs.graph
        transfers = [Transfer(src="edge", dst="cloud", tensors=list(best.sent), bits=best.sent,
                              bytes=sum(graph.tensors[t].bytes_at(b) for t, b in best.sent.items()),
                              ms=best.transfer_ms - sum(costs.down_ms[t]
                                                        for t in costs.returned(edge)))]
        transfers += base.transfers[1:]
        devices = [d.model_copy(update={"compute_ms": best.edge_ms if d.role == "edge"
                                        else best.cloud_ms}) for d in base.devices]
        front = _pareto_front(candidates)
        note = (f"accuracy not measured: selected by total distortion {best.distortion:.3g} <= "
                f"{threshold:.3g} (uniform 8-bit); {len(candidates)} candidates, "
                f"{len(front)} on the latency/distortion Pareto front")
        return base.model_copy(update={
            "layers": layers, "transfers": transfers, "devices": devices,
            "edge_memory_bytes": best.memory_bytes,
            "predicted": Prediction(compute_ms={"edge": best.edge_ms, "cloud": best.cloud_ms},
                                    transfer_ms=best.transfer_ms, rtt_ms=best.rtt_ms,
                                    total_ms=best.total_ms),
            "feasible": True, "reason": note})


def _pareto_front(candidates: list[Candidate]) -> list[Candidate]:
    front, best = [], math.inf
    for c in sorted(candidates, key=lambda c: (c.total_ms, c.distortion)):
        if c.distortion < best:
            front.append(c)
            best = c.distortion
    return front
