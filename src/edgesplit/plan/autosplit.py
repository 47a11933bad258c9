"""AUTO-SPLIT (Algorithm 1): the split point and the edge part's weight and activation
bit-widths, chosen together under the edge memory limit and an accuracy-drop threshold.

1. Potential splits (eq. 6): prefixes of the optimised graph whose crossing tensors at the lowest
   bit-width cost no more to send than the raw input, and that fit in memory at that width.
2. For each, a grid of uniform weight and activation budgets (one per bit-width of the device);
   per pair, problem 8 (weights: least distortion within the budget, `allocate_bits`) and problem
   9 (activations: each layer's widest bits whose output fits the budget), kept when the real
   working-set memory (weights + live activations at their bits) fits (5b).
3. Every candidate gets its latency (edge compute at its bits, transfer of the crossing tensors
   at their producers' activation bits, float cloud compute), its total distortion
   (sum of D_i^w + D_i^a) and, with evaluation data, its measured accuracy drop on held-out
   samples. The chosen plan is the fastest within the threshold (``max_acc_drop`` percentage
   points when measured); cloud-only is always a candidate (Remark 5), and so is edge-only at
   every uniform width that fits.

Measuring is the expensive step on real data (a pass over the evaluation set per candidate:
about a minute for MobileNetV2 at 96x96 on 10,000 images, and a real model has hundreds of
candidates), so candidates are measured in order of latency, ties together, and the first
group with one within the threshold holds the choice: the plan measuring every candidate would
choose (the fastest within the threshold, then the smallest drop), after measuring only those
no slower than it. ``measure_all=True`` measures them all (a fully measured Pareto front).

Without evaluation data the threshold is on total distortion (default: each candidate's edge
part may distort no more than uniform 8-bit quantization of the same layers, the U8 baseline's
choice), and the plan says accuracy was not measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgesplit.errors import ConfigError, option
from edgesplit.graph import INPUT, LayerGraph
from edgesplit.plan.cost import CostTable
from edgesplit.plan.model import Plan, PlanAlternative
from edgesplit.plan.planners import Planner, PlanningProblem, register_planner
from edgesplit.plan.quantized import (
    QuantSetup,
    Solution,
    device_bits,
    evaluate,
    measure,
    memory_bytes,
    plan_quality,
    quant_setup,
    quantized_plan,
    total_distortion,
)
from edgesplit.quant.allocation import allocate_bits
from edgesplit.quant.fakequant import DistortionTable

__all__ = [
    "DEFAULT_MAX_ACC_DROP",
    "AutoSplit",
    "Selection",
    "autosplit_candidates",
    "pareto_front",
    "potential_splits",
]

DEFAULT_MAX_ACC_DROP = 1.0  # percentage points of the quality measure


def potential_splits(costs: CostTable, bits: Sequence[int]) -> list[int]:
    """AUTO-SPLIT eq. (6): prefixes n whose transfer at the lowest width is at most the raw
    input's (at the setting's ``input_bits``) and whose memory at the lowest width fits."""
    graph = costs.graph
    low = min(bits)
    limit = costs.setting.memory_limit_bytes
    cuts = graph.cuts()
    raw = sum(costs.wire_bytes[t] for t in graph.inputs)
    out = []
    for n in range(len(graph.layers) + 1):
        sent = sum(costs.wire_bytes[t.name] if t.producer == INPUT else t.bytes_at(low)
                   for t in cuts[n].tensors)
        if n == len(graph.layers):
            sent = 0  # edge-only sends nothing but the (tiny) result
        if sent > raw:
            continue
        edge = [layer.name for layer in graph.layers[:n]]
        low_bits = dict.fromkeys(edge, low)
        if limit is not None and memory_bytes(costs, edge, low_bits, low_bits) > limit:
            continue
        out.append(n)
    return out


def _weight_elements(graph: LayerGraph) -> dict[str, int]:
    program = graph.program
    assert program is not None  # a captured graph keeps its program
    attrs = {**dict(program.named_parameters()), **dict(program.named_buffers())}
    return {layer.name: sum(attrs[p].numel() for p in layer.param_names
                            if p in attrs and attrs[p].dim() >= 2)  # not biases
            for layer in graph.layers}


def autosplit_candidates(costs: CostTable, table: DistortionTable, bits: Sequence[int]
                         ) -> list[Solution]:
    """Algorithm 1's candidate list S plus cloud-only, each with latency and distortion."""
    graph = costs.graph
    limit = costs.setting.memory_limit_bytes
    weights = _weight_elements(graph)
    # cloud-only, in float and in FP16 (the paper's CLOUD16): never worse than either
    fp16 = total_distortion(table, {layer.name: (16, 16) for layer in graph.layers})
    candidates = [evaluate(costs, [], {}, {}),
                  evaluate(costs, [], {}, {}, distortion=fp16, cloud_bits=16)]
    for n in potential_splits(costs, bits):
        if n == 0:
            continue
        edge = [layer.name for layer in graph.layers[:n]]
        act_sizes = {name: sum(graph.tensors[t].elements for t in graph.layer(name).outputs)
                     for name in edge}
        with_weights = {name: weights[name] for name in edge if weights[name] > 0}
        pairs = []
        for bw in bits:
            alloc = allocate_bits({name: table.weight[name] for name in with_weights},
                                  with_weights, sum(with_weights.values()) * bw)
            w_bits = {name: alloc.bits.get(name, bw) for name in edge}
            for ba in bits:
                budget_a = max(act_sizes.values()) * ba
                pairs.append((w_bits, {name: max((b for b in bits if act_sizes[name] * b
                                                  <= budget_a), default=min(bits))
                                       for name in edge}))
            # the uniform widths too, so U8-style solutions are never missed (Remark 5)
            pairs.append((dict.fromkeys(edge, bw), dict.fromkeys(edge, bw)))
        seen = set()
        for w_bits, a_bits in pairs:
            key = (tuple(w_bits.values()), tuple(a_bits.values()))
            if key in seen:
                continue
            seen.add(key)
            if limit is not None and memory_bytes(costs, edge, w_bits, a_bits) > limit:
                continue
            distortion = total_distortion(table, {n: (w_bits[n], a_bits[n]) for n in edge})
            candidates.append(evaluate(costs, edge, w_bits, a_bits, distortion))
    return candidates


def pareto_front(candidates: Sequence[Solution]) -> list[Solution]:
    """Candidates no other beats in both latency and error: measured drop where every
    candidate was measured, else distortion (never the two mixed: they are different units)."""
    error = _error if all(c.drop is not None for c in candidates) else _distortion
    front, best = [], math.inf
    for c in sorted(candidates, key=lambda c: (c.total_ms, error(c))):
        if error(c) < best:
            front.append(c)
            best = error(c)
    return front


def _error(c: Solution) -> float:
    return c.drop if c.drop is not None else c.distortion


def _distortion(c: Solution) -> float:
    return c.distortion


def _latency_groups(candidates: Sequence[Solution]) -> list[list[Solution]]:
    """Candidates by latency, fastest first, equal latencies in one group."""
    groups: list[list[Solution]] = []
    for c in sorted(candidates, key=lambda c: c.total_ms):
        if groups and groups[-1][0].total_ms == c.total_ms:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


@dataclass
class Selection:
    best: Solution
    candidates: list[Solution]
    threshold: float
    measured: bool  # threshold on measured accuracy drop (else on distortion)
    setup: QuantSetup


@register_planner("autosplit")
class AutoSplit(Planner):
    """AUTO-SPLIT: joint split point and mixed-precision edge part (see the module docstring).

    ``max_acc_drop`` (percentage points) applies when the problem has evaluation data;
    ``max_distortion`` when it has none."""

    options = ("bits", "max_distortion", "max_acc_drop", "measure_all")
    reads = ("eval_data", "calibration_samples", "eval_batch_size")

    def __init__(self, bits: Sequence[int] | None = None, max_distortion: float | None = None,
                 max_acc_drop: float | None = None, measure_all: bool = False) -> None:
        if max_acc_drop is not None and max_acc_drop < 0:
            raise ConfigError(f"{option('max_acc_drop')} must be >= 0 percentage points, got "
                              f"{max_acc_drop}")
        self.bits = bits
        self.max_distortion = max_distortion
        self.max_acc_drop = max_acc_drop
        self.measure_all = measure_all

    def select(self, problem: PlanningProblem) -> Selection:
        """The chosen candidate, every candidate, and the threshold used."""
        costs = problem.costs("optimized")
        bits = device_bits(self.bits, costs.setting.edge.supported_bits)
        setup = quant_setup(problem, bits)
        candidates = autosplit_candidates(costs, setup.table, bits)
        if setup.meter is not None:
            return self._by_accuracy(problem, setup, candidates)
        if self.max_acc_drop is not None:
            raise ConfigError(f"{option('max_acc_drop')} needs evaluation data to measure "
                              f"accuracy on: pass {option('eval_data')} (a built-in data set "
                              "or a .pt/.npz file)")
        u8 = 8 if 8 in bits else max(b for b in bits if b <= 16)

        def limit(c: Solution) -> float:
            """The user's threshold, else uniform 8-bit's distortion on the same layers (a
            whole-model figure would let a short prefix at 2 bits pass)."""
            if self.max_distortion is not None:
                return self.max_distortion
            return total_distortion(setup.table, {n: (u8, u8) for n in c.bits()})

        allowed = [c for c in candidates if c.distortion <= limit(c) * (1 + 1e-9)]
        best = min(allowed, key=lambda c: (c.total_ms, c.distortion))
        return Selection(best, candidates, limit(best), False, setup)

    def _by_accuracy(self, problem: PlanningProblem, setup: QuantSetup,
                     candidates: list[Solution]) -> Selection:
        """Measure groups of equal latency, fastest first (see the module docstring)."""
        threshold = DEFAULT_MAX_ACC_DROP if self.max_acc_drop is None else self.max_acc_drop

        def within(c: Solution) -> bool:  # measure() sets the drop when there is a meter
            return c.drop is not None and c.drop <= threshold + 1e-9

        done: list[Solution] = []
        best: Solution | None = None
        groups = _latency_groups(candidates)
        for k, group in enumerate(groups):
            for c in group:
                done.append(measure(setup, c))
                if problem.progress:
                    problem.progress("measuring candidates", len(done), len(candidates))
            allowed = [c for c in done[-len(group):] if within(c)]
            if best is None and allowed:
                best = min(allowed, key=_error)  # every allowed one was measured
                if not self.measure_all:
                    done += [c for rest in groups[k + 1:] for c in rest]  # left unmeasured
                    break
        if best is None:  # cloud-only is float and always a candidate: its drop is 0
            raise ConfigError("no AUTO-SPLIT candidate is within the accuracy threshold")
        return Selection(best, done, threshold, True, setup)

    def plan(self, problem: PlanningProblem) -> Plan:
        self.check(problem)
        costs = problem.costs("optimized")
        sel = self.select(problem)
        front = pareto_front(sel.candidates)
        on_front = {id(c) for c in front}
        graph = costs.graph
        alternatives = [PlanAlternative(
            split=c.split, split_after=c.edge[-1] if c.edge else None, total_ms=c.total_ms,
            edge_memory_bytes=c.memory_bytes, sent_bytes=c.sent_bytes, distortion=c.distortion,
            drop=c.drop, pareto=id(c) in on_front, chosen=c is sel.best, w_bits=c.w_bits,
            a_bits=c.a_bits, cloud_bits=c.cloud_bits)
            for c in sorted(sel.candidates, key=lambda c: (c.total_ms, _error(c)))]
        meter = sel.setup.meter
        if meter is not None:
            measured = sum(c.drop is not None for c in sel.candidates)
            note = (f"accuracy measured on {meter.data.name} "
                    f"({len(meter.data)} held-out samples): drop "
                    f"{sel.best.drop:.2f} <= {sel.threshold:g} points"
                    + ("" if measured == len(sel.candidates) else
                       f"; {measured} candidates measured, fastest first, up to the choice"))
        else:
            note = (f"accuracy not measured: selected by total distortion "
                    f"{sel.best.distortion:.3g} <= {sel.threshold:.3g}"
                    + (" (uniform 8-bit on the same layers)" if self.max_distortion is None
                       else ""))
        note += (f"; {len(sel.candidates)} candidates over {len(graph.layers)} layers, "
                 f"{len(front)} on the latency/accuracy Pareto front")
        return quantized_plan(costs, sel.best, method=self.name, source=problem.source,
                              quality=plan_quality(sel.setup, sel.best), note=note
                              ).model_copy(update={"alternatives": alternatives})
