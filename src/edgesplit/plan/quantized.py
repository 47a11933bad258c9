"""Plans whose edge part (or cloud) runs quantized: the shared machinery of AUTO-SPLIT and of
its quantized baselines (U8, QDMP_E, QDMP_E + U4, CLOUD16).

- ``quant_setup(problem, bits)``: the distortion table (D_i^w, D_i^a) and, with evaluation
  data, a ``QualityMeter`` on a copy of the model captured at the evaluation batch size;
  computed once per problem and shared by every method.
- ``evaluate(costs, edge, w_bits, a_bits)``: latency and memory of one solution. Edge layers
  take the roofline at their bits (sub-8-bit computes at INT8 speed and moves fewer bytes),
  crossing tensors travel at their producer's activation bits (raw inputs at the setting's
  ``input_bits``), the cloud computes at ``cloud_bits``.
- ``quantized_plan``: that solution as a Plan, with its measured quality when there is data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesplit.data.images import EvalSet
from edgesplit.errors import ConfigError, GraphError, option
from edgesplit.graph import INPUT, LayerGraph, capture
from edgesplit.hardware import LayerWork, estimator_for, serialize_ms
from edgesplit.plan.assemble import Network, assemble_plan, one_way_latency_ms
from edgesplit.plan.cost import CostTable
from edgesplit.plan.mincut import min_cut_edge_set
from edgesplit.plan.model import Plan, PlanQuality
from edgesplit.plan.planners import Planner, PlanningProblem, register_planner
from edgesplit.quant.accuracy import QualityMeter
from edgesplit.quant.fakequant import DEFAULT_BITS, DistortionTable, calibrate, distortion_table

__all__ = [
    "U8",
    "Cloud16",
    "QdmpE",
    "QdmpEU4",
    "QuantSetup",
    "Solution",
    "device_bits",
    "evaluate",
    "float_min_cut",
    "quant_setup",
    "quantized_plan",
]


@dataclass
class QuantSetup:
    bits: tuple[int, ...]
    table: DistortionTable
    meter: QualityMeter | None  # None: no evaluation data, accuracy is not measured
    data: str | None = None


@dataclass(frozen=True)
class Solution:
    """One way to run the model: the first layers (a down-set) on the edge at these bits."""

    edge: tuple[str, ...]  # topological order
    w_bits: dict[str, int]
    a_bits: dict[str, int]
    distortion: float
    memory_bytes: int
    edge_ms: float
    transfer_ms: float
    cloud_ms: float
    rtt_ms: float
    sent: dict[str, int] = field(default_factory=dict)  # crossing tensor -> bits
    sent_bytes: int = 0
    layer_ms: dict[str, float] = field(default_factory=dict)  # edge layers at their bits
    cloud_layer_ms: dict[str, float] = field(default_factory=dict)
    drop: float | None = None  # measured accuracy drop (percentage points)
    cloud_bits: int = 32  # the cloud part's width (16: CLOUD16's FP16)
    serialize_ms: float = 0.0  # encode + decode of what crosses (see cost.CostTable)

    @property
    def split(self) -> int:
        return len(self.edge)

    @property
    def total_ms(self) -> float:
        return self.edge_ms + self.transfer_ms + self.cloud_ms + self.rtt_ms + self.serialize_ms

    def bits(self) -> dict[str, tuple[int, int]]:
        """Every layer that does not run in float, with its (weight, activation) width."""
        out = {n: (self.w_bits[n], self.a_bits[n]) for n in self.edge
               if (self.w_bits[n], self.a_bits[n]) != (32, 32)}
        if self.cloud_bits < 32:
            out.update({n: (self.cloud_bits, self.cloud_bits) for n in self.cloud_layer_ms})
        return out


def device_bits(problem_bits: Sequence[int] | None, supported: Iterable[int]) -> tuple[int, ...]:
    """The bit-widths to search: the user's, else the device's supported ones that fake-quant
    models, else the default {2, 4, 6, 8, 16}."""
    chosen = [b for b in supported if b in DEFAULT_BITS]
    return tuple(sorted(set(problem_bits or chosen or DEFAULT_BITS)))


# ---- latency and memory of a solution ----------------------------------------------------
def tensor_bits(costs: CostTable, name: str, a_bits: dict[str, int]) -> int:
    info = costs.graph.tensors[name]
    if info.producer == INPUT:  # at the setting's input width, or as captured (token ids)
        return costs.wire_bits(name) or info.bytes * 8 // max(1, info.elements)
    return a_bits.get(info.producer, 32)


def memory_bytes(costs: CostTable, edge: Sequence[str], w_bits: dict[str, int],
                 a_bits: dict[str, int]) -> int:
    """Edge working set (AUTO-SPLIT 5b): weights at their bits + the live activations."""
    graph = costs.graph
    if not edge:
        return costs.memory_bytes(frozenset())
    tensor_bytes = {t: graph.tensors[t].bytes_at(tensor_bits(costs, t, a_bits))
                    for t in graph.tensors}
    attribute_bytes = {}
    for name in edge:
        for attr in graph.layer(name).param_names:
            attribute_bytes[attr] = math.ceil(graph.attribute_numel.get(attr, 0)
                                              * w_bits.get(name, 32) / 8)
    return graph.peak_memory(list(edge), tensor_bytes=tensor_bytes,
                             attribute_bytes=attribute_bytes).total_bytes


def evaluate(costs: CostTable, edge: Sequence[str], w_bits: dict[str, int],
             a_bits: dict[str, int], distortion: float = 0.0, cloud_bits: int = 32
             ) -> Solution:
    graph, setting = costs.graph, costs.setting
    edge_set = frozenset(edge)
    order = [layer.name for layer in graph.layers if layer.name in edge_set]
    estimator = estimator_for(setting.edge)
    layer_ms = {n: estimator.layer_ms(LayerWork.of(graph, n, w_bits=w_bits.get(n, 32),
                                                   a_bits=a_bits.get(n, 32)), setting.edge)
                for n in order}
    cloud_layers = [layer.name for layer in graph.layers if layer.name not in edge_set]
    if cloud_bits >= 32:
        cloud_layer_ms = {n: costs.cloud_ms[n] for n in cloud_layers}
    else:
        cloud_est = estimator_for(setting.cloud)
        cloud_layer_ms = {n: cloud_est.layer_ms(LayerWork.of(graph, n, w_bits=cloud_bits,
                                                             a_bits=cloud_bits), setting.cloud)
                          for n in cloud_layers}
    sent = {t: tensor_bits(costs, t, a_bits) for t in costs.crossing(edge_set)}
    sent_bytes = sum(graph.tensors[t].bytes_at(b) for t, b in sent.items())
    returned = costs.returned(edge_set)
    transfer = sum(setting.link.transfer_ms(graph.tensors[t].bytes_at(b)) for t, b in sent.items())
    down_codec = sum(costs.down_codec_ms.get(t, 0.0) for t in returned)
    transfer += sum(costs.down_ms[t] for t in returned) - down_codec
    # the codec reads the tensor as computed; at 8 bits or fewer it quantizes and packs
    codec = down_codec + sum(serialize_ms(setting.edge, setting.cloud, graph.tensors[t].bytes,
                                          quantized=b <= 8) for t, b in sent.items())
    return Solution(
        edge=tuple(order), w_bits={n: w_bits.get(n, 32) for n in order},
        a_bits={n: a_bits.get(n, 32) for n in order}, distortion=distortion,
        memory_bytes=memory_bytes(costs, order, w_bits, a_bits), edge_ms=sum(layer_ms.values()),
        transfer_ms=transfer, cloud_ms=sum(cloud_layer_ms.values()),
        rtt_ms=one_way_latency_ms(setting.link, bool(sent))
        + one_way_latency_ms(setting.link, bool(returned)), sent=sent,
        sent_bytes=sent_bytes, layer_ms=layer_ms, cloud_layer_ms=cloud_layer_ms,
        cloud_bits=cloud_bits, serialize_ms=codec)


def total_distortion(table: DistortionTable, solution_bits: dict[str, tuple[int, int]]) -> float:
    """Sum of D_i^w + D_i^a over the quantized layers (32 bits: no distortion)."""
    return sum(table.weight[n].get(w, 0.0) + table.activation[n].get(a, 0.0)
               for n, (w, a) in solution_bits.items())



# ---- distortion table and quality meter, once per problem --------------------------------
def _eval_graph(problem: PlanningProblem, data: EvalSet, batch: int) -> LayerGraph:
    """The model captured again at the evaluation batch size, with the same layer names."""
    base = problem.graph
    samples = data.example(1)
    for i, (x, sample) in enumerate(zip(base.example_inputs, samples, strict=False)):
        if tuple(x.shape[1:]) != tuple(sample.shape[1:]) or x.dtype != sample.dtype:
            raise ConfigError(
                f"evaluation data input {i} has samples of shape {list(sample.shape[1:])} "
                f"({sample.dtype}); {base.model} takes {list(x.shape[1:])} ({x.dtype})")
    if len(samples) != len(base.example_inputs):
        raise ConfigError(f"evaluation data has {len(samples)} input(s); {base.model} takes "
                          f"{len(base.example_inputs)}")
    model = problem.model
    if batch == base.example_inputs[0].shape[0]:
        return base
    if isinstance(model, (str, Path)):
        # a built-in, or a .pt2 whose batch dimension was exported dynamic
        shape = (batch, *base.example_inputs[0].shape[1:])
        graph = capture(model, input_shape=shape, name=base.model)
    else:
        example = tuple(t.expand(batch, *t.shape[1:]).clone() for t in samples)
        graph = capture(model, example, name=base.model)
    if [layer.name for layer in graph.layers] != [layer.name for layer in base.layers]:
        raise GraphError(f"{base.model} captured at batch {batch} has different layers than at "
                         f"batch {base.example_inputs[0].shape[0]}; use "
                         f"{option('eval_batch_size', int(base.example_inputs[0].shape[0]))}")
    return graph


def _eval_batch(problem: PlanningProblem, held: int) -> int:
    """The evaluation batch: the asked size, or a saved program's own batch when that is fixed."""
    batch = min(problem.eval_batch_size, held)
    model = problem.model
    if isinstance(model, (str, Path)) and str(model).endswith(".pt2"):
        from edgesplit.graph import check_input_shape

        exported = int(problem.graph.example_inputs[0].shape[0])
        try:
            check_input_shape(str(model), (batch, *problem.graph.example_inputs[0].shape[1:]))
        except ConfigError:
            return exported  # specialised to its batch when it was exported
    return batch


def quant_setup(problem: PlanningProblem, bits: Sequence[int]) -> QuantSetup:
    key = f"quant:{tuple(bits)}"
    if key in problem.cache:
        return problem.cache[key]
    data = problem.eval_data
    if data is None:
        graph = problem.graph
        calibration = calibrate(graph, [graph.example_inputs])
        setup = QuantSetup(tuple(bits), distortion_table(graph, calibration, bits), None)
    else:
        n_cal = problem.calibration_samples or max(1, min(128, len(data) // 5))
        cal, held = data.split(n_cal)
        batch = _eval_batch(problem, len(held))
        graph = _eval_graph(problem, data, batch)
        calibration = calibrate(graph, [b for b, _ in cal.batches(batch)])
        table = distortion_table(graph, calibration, bits)
        setup = QuantSetup(tuple(bits), table, QualityMeter(graph, held, calibration, batch),
                           data.name)
    problem.cache[key] = setup
    return setup


def measure(setup: QuantSetup, solution: Solution) -> Solution:
    """The solution with its measured accuracy drop (unchanged without a meter)."""
    if setup.meter is None:
        return solution
    return _replace(solution, drop=setup.meter.measure(solution.bits()).drop)


def _replace(solution: Solution, **changes) -> Solution:
    return dataclasses.replace(solution, **changes)


def plan_quality(setup: QuantSetup, solution: Solution) -> PlanQuality | None:
    if setup.meter is None:
        return None
    q = setup.meter.measure(solution.bits())
    metric: Any = q.metric  # "top1" or "cosine", as PlanQuality requires
    return PlanQuality(metric=metric, value=q.value, reference=q.reference, drop=q.drop,
                       samples=q.samples, data=setup.data or "")


# ---- a solution as a Plan -----------------------------------------------------------------
def _quantized(bits: int | None) -> int | None:
    return bits if bits is not None and bits < 32 else None  # 32: the layer stays float


def quantized_plan(costs: CostTable, solution: Solution, *, method: str, source: str,
                   quality: PlanQuality | None = None, note: str | None = None,
                   feasible: bool | None = None) -> Plan:
    """The solution as a Plan: its layers' latencies at their bits, its crossing tensors at
    their producers' activation bits, priced by the one assembler."""
    graph, setting = costs.graph, costs.setting
    edge = frozenset(solution.edge)
    order = [layer.name for layer in graph.layers]
    limit = setting.memory_limit_bytes
    fits = limit is None or solution.memory_bytes <= limit
    privacy = costs.forced_edge() <= edge
    reason = note
    if not fits:
        reason = (f"edge memory: needs {solution.memory_bytes:,} bytes, limit is {limit:,} bytes"
                  + (f"; {note}" if note else ""))
    elif not privacy:
        reason = costs.violation(edge)
    return assemble_plan(
        graph, {"edge": list(solution.edge), "cloud": [n for n in order if n not in edge]},
        Network.edge_cloud(setting.edge, setting.cloud, setting.link, setting.result_at),
        layer_ms={n: {"edge": solution.layer_ms.get(n, costs.edge_ms[n]),
                      "cloud": solution.cloud_layer_ms.get(n, costs.cloud_ms[n])}
                  for n in order},
        method=method, source=source, tensor_bits=solution.sent,
        layer_bits={n: (_quantized(solution.w_bits.get(n)), _quantized(solution.a_bits.get(n)))
                    for n in solution.edge},
        edge_memory_bytes=solution.memory_bytes,
        feasible=(fits and privacy) if feasible is None else feasible,
        reason=reason, quality=quality)


# ---- the quantized baselines -------------------------------------------------------------
class _Quantized(Planner):
    """A fixed edge part at uniform bits; accuracy measured when the problem has data."""

    w_bits = a_bits = 32
    cloud_bits = 32
    reads = ("eval_data", "calibration_samples", "eval_batch_size")

    def edge_part(self, problem: PlanningProblem, costs: CostTable) -> frozenset[str]:
        """The layers this baseline runs on the edge (here: none, everything on the cloud)."""
        return frozenset()

    def plan(self, problem: PlanningProblem) -> Plan:
        self.check(problem)
        costs = problem.costs("optimized")
        edge = self.edge_part(problem, costs)
        order = [layer.name for layer in costs.graph.layers if layer.name in edge]
        w = dict.fromkeys(order, self.w_bits)
        a = dict.fromkeys(order, self.a_bits)
        bits = device_bits(None, costs.setting.edge.supported_bits)
        needs_table = self.w_bits < 32 or self.cloud_bits < 32 or problem.eval_data is not None
        # share the setup AUTO-SPLIT builds unless this method needs a width it lacks
        wanted = bits if self.w_bits >= 32 or self.w_bits in bits \
            else tuple(sorted({*bits, self.w_bits}))
        setup = quant_setup(problem, wanted) if needs_table else None
        distortion = total_distortion(setup.table, {n: (self.w_bits, self.a_bits) for n in order}
                                      ) if setup and self.w_bits < 32 else 0.0
        solution = evaluate(costs, order, w, a, distortion, cloud_bits=self.cloud_bits)
        quality = plan_quality(setup, solution) if setup else None
        note = None if quality else self.note(setup)
        supported = costs.setting.edge.supported_bits
        unsupported = order and self.w_bits < 32 and supported and self.w_bits not in supported
        if unsupported:
            note = (f"{costs.setting.edge.name} does not support {self.w_bits}-bit arithmetic "
                    f"(it supports {', '.join(map(str, supported))} bits)")
        return quantized_plan(costs, solution, method=self.name, source=problem.source,
                              quality=quality, note=note,
                              feasible=False if unsupported else None)

    def note(self, setup: QuantSetup | None) -> str | None:
        if self.w_bits >= 32 and self.cloud_bits >= 32:
            return None
        return "accuracy not measured (no evaluation data)"


@register_planner("u8")
class U8(_Quantized):
    """U8 (AUTO-SPLIT's baseline): the whole model on the edge, weights and activations at
    uniform 8 bits."""

    w_bits = a_bits = 8

    def edge_part(self, problem: PlanningProblem, costs: CostTable) -> frozenset[str]:
        return frozenset(layer.name for layer in costs.graph.layers)


@register_planner("cloud16")
class Cloud16(_Quantized):
    """CLOUD16: everything on the cloud in FP16; the edge only sends the raw input."""

    cloud_bits = 16


def float_min_cut(costs: CostTable) -> frozenset[str]:
    """QDMP's float split (min-cut or edge-only, whichever is faster), ignoring the edge
    memory limit: QDMP_E keeps the split and is infeasible when its edge part does not fit."""
    everything = frozenset(layer.name for layer in costs.graph.layers)
    cut = min_cut_edge_set(costs, forced_edge=costs.forced_edge())
    return min((cut, everything), key=lambda e: (costs.evaluate(e).total_ms, len(e)))


@register_planner("qdmp_e")
class QdmpE(_Quantized):
    """QDMP_E (AUTO-SPLIT 5.3): QDMP's float split with only the edge part stored on the edge;
    the memory limit does not move the split, it can only make the plan infeasible."""

    def edge_part(self, problem: PlanningProblem, costs: CostTable) -> frozenset[str]:
        return float_min_cut(costs)


@register_planner("qdmp_e_u4")
class QdmpEU4(QdmpE):
    """QDMP_E + U4 (AUTO-SPLIT 5.4): QDMP_E's split with its edge part at uniform 4 bits
    (weights, activations, and the tensors it sends)."""

    w_bits = a_bits = 4
