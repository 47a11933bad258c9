"""Run several planners on one problem, pick the best feasible plan, build the JSON document of
``edgesplit plan --json``, and sweep the link bandwidth."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from edgesplit.errors import InfeasibleError, option
from edgesplit.plan.cost import EdgeCloudSetting
from edgesplit.plan.model import PLAN_VERSION, Plan
from edgesplit.plan.planners import BASELINE_METHODS, PlanningProblem, get_planner
from edgesplit.plan.planners import Manual

__all__ = ["compare_methods", "best_plan", "is_lossless", "passed_over", "plan_document",
           "sweep_link", "cut_breakdown"]


def compare_methods(problem: PlanningProblem, methods: Sequence[str] = BASELINE_METHODS,
                    *, split_after: Sequence[str] = (),
                    options: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Plan]:
    """One plan per method (``manual`` when ``split_after`` is given); ``options[method]``
    goes to that planner's constructor."""
    plans = {}
    options = options or {}
    for method in methods:
        planner = Manual(split_after) if method == "manual" else \
            get_planner(method, **options.get(method, {}))
        plans[method] = planner.plan(problem)
    if split_after and "manual" not in plans:
        plans["manual"] = Manual(split_after).plan(problem)
    return plans


def is_lossless(plan: Plan) -> bool:
    """Whether the plan computes what the float model computes: no layer at reduced precision
    (edge bits, or a cloud part in FP16) and no intermediate tensor sent quantized. The raw
    model input may travel at ``input_bits`` (a camera frame is 8-bit to begin with)."""
    if any(layer.w_bits is not None or layer.a_bits is not None for layer in plan.layers):
        return False
    inputs = {t.name for t in plan.tensors if t.producer == "input"}
    if any(name not in inputs for t in plan.transfers for name, b in t.bits.items() if b < 32):
        return False
    chosen = next((a for a in plan.alternatives if a.chosen), None)
    return plan.method != "cloud16" and (chosen is None or chosen.cloud_bits >= 32)


def _trusted(plan: Plan, accept_unmeasured: bool) -> bool:
    """A lossy plan may be chosen only when its accuracy was measured, or the user says so."""
    return accept_unmeasured or plan.quality is not None or is_lossless(plan)


def best_plan(plans: dict[str, Plan], *, accept_unmeasured: bool = False) -> tuple[str, Plan]:
    """The lowest-latency feasible plan; InfeasibleError naming the constraints otherwise.

    A quantized plan whose accuracy was never measured (no evaluation data) is chosen only
    with ``accept_unmeasured``: otherwise a plan that silently changes the model's outputs
    could win on latency alone."""
    feasible = {m: p for m, p in plans.items() if p.feasible}
    if not feasible:
        reasons = sorted({p.reason or "infeasible" for p in plans.values()})
        raise InfeasibleError("no method found a plan that meets the constraints: "
                              + "; ".join(reasons))
    trusted = {m: p for m, p in feasible.items() if _trusted(p, accept_unmeasured)}
    if not trusted:
        raise InfeasibleError(
            f"every feasible plan ({', '.join(feasible)}) quantizes the model without measured "
            f"accuracy: give evaluation data ({option('eval_data')}) to measure it, include a "
            "float method (e.g. neurosurgeon, qdmp), or accept unmeasured plans "
            f"({option('accept_unmeasured', True)})")
    return min(trusted.items(), key=lambda kv: kv[1].predicted.total_ms)


def passed_over(plans: dict[str, Plan], chosen: Plan) -> list[str]:
    """Feasible methods faster than ``chosen`` that were set aside as lossy and unmeasured."""
    return [m for m, p in plans.items() if p.feasible and not _trusted(p, False)
            and p.predicted.total_ms < chosen.predicted.total_ms]


def plan_document(problem: PlanningProblem, plans: dict[str, Plan], *,
                  accept_unmeasured: bool = False) -> dict[str, Any]:
    """The ``edgesplit plan --json`` document (schema in the README)."""
    costs = problem.costs("optimized")
    graph = costs.graph
    link = problem.setting.link
    try:
        best = best_plan(plans, accept_unmeasured=accept_unmeasured)[1]
    except InfeasibleError:
        best = None
    return {
        "version": PLAN_VERSION,
        "model": graph.model,
        "layers": [{"name": layer.name, "edge_ms": costs.edge_ms[layer.name],
                    "cloud_ms": costs.cloud_ms[layer.name], "param_bytes": layer.param_bytes}
                   for layer in graph.layers],
        "tensors": [{"name": t.name, "producer": t.producer, "consumers": list(t.consumers),
                     "bytes": t.bytes} for t in graph.tensors.values()],
        "link": {"name": link.name, "bandwidth_mbps": link.bandwidth_mbps,
                 "down_bandwidth_mbps": link.down_bandwidth_mbps or link.bandwidth_mbps,
                 "rtt_ms": link.rtt_ms},
        "edge": problem.setting.edge.name,
        "cloud": problem.setting.cloud.name,
        "edge_memory_limit_bytes": problem.setting.memory_limit_bytes,
        "result_at": problem.setting.result_at,
        "best": next((m for m, p in plans.items() if p is best), None),
        "methods": {method: _method_entry(plan) for method, plan in plans.items()},
    }


def _method_entry(plan: Plan) -> dict[str, Any]:
    return {
        "feasible": plan.feasible,
        "reason": plan.reason,
        "lossless": is_lossless(plan),
        "graph": plan.model.graph,
        "edge_layers": plan.edge_layers,
        "sent_bytes": plan.transfers[0].bytes if plan.transfers else 0,
        "edge_ms": plan.predicted.compute_ms.get("edge", 0.0),
        "transfer_ms": plan.predicted.transfer_ms,
        "cloud_ms": plan.predicted.compute_ms.get("cloud", 0.0),
        "rtt_ms": plan.predicted.rtt_ms,
        "total_ms": plan.predicted.total_ms,
        "edge_memory_bytes": plan.edge_memory_bytes,
        "quality": plan.quality.model_dump(mode="json") if plan.quality else None,
        "plan": plan.model_dump(mode="json"),
    }


def sweep_link(problem: PlanningProblem, methods: Sequence[str] = BASELINE_METHODS, *,
               low_mbps: float = 0.1, high_mbps: float = 1000.0, points: int = 25
               ) -> dict[str, Any]:
    """How each method's plan moves as the uplink goes from ``low_mbps`` to ``high_mbps``
    (log-spaced); the downlink scales with it."""
    link = problem.setting.link
    ratio = (link.down_bandwidth_mbps or link.bandwidth_mbps) / link.bandwidth_mbps
    rows = []
    for mbps in np.geomspace(low_mbps, high_mbps, points):
        swept = link.model_copy(update={"bandwidth_mbps": float(mbps),
                                        "down_bandwidth_mbps": float(mbps * ratio)})
        setting = EdgeCloudSetting(**{**problem.setting.__dict__, "link": swept})
        # same graphs and quantization work (neither depends on the link), fresh cost tables
        sub = dataclasses.replace(problem, setting=setting, _costs={})
        plans = compare_methods(sub, methods)
        rows.append({"bandwidth_mbps": float(mbps), "methods": {
            m: {"total_ms": p.predicted.total_ms, "edge_layers": len(p.edge_layers),
                "total_layers": len(p.layers),
                "last_edge_layer": p.edge_layers[-1] if p.edge_layers else None,
                "sent_bytes": p.transfers[0].bytes if p.transfers else 0,
                "feasible": p.feasible}
            for m, p in plans.items()}})
    return {"version": PLAN_VERSION, "model": problem.graph.model, "link": link.name,
            "points": rows}


def cut_breakdown(problem: PlanningProblem, *, single_tensor_only: bool = True
                  ) -> list[dict[str, Any]]:
    """Latency breakdown (edge, transfer, cloud, RTT) at every cut of the topological order
    (L2S Fig. 1): -1 is cloud-only, the last index edge-only."""
    costs = problem.costs("optimized")
    layers = costs.graph.layers
    rows = []
    for cut in costs.graph.cuts():
        if single_tensor_only and len(cut.tensors) != 1 and cut.index != len(layers) - 1:
            continue
        b = costs.evaluate([layer.name for layer in layers[: cut.index + 1]])
        rows.append({"index": cut.index, "after": cut.after, "edge_ms": b.edge_ms,
                     "transfer_ms": b.transfer_ms, "cloud_ms": b.cloud_ms, "rtt_ms": b.rtt_ms,
                     "total_ms": b.total_ms, "sent_bytes": b.sent_bytes})
    return rows
