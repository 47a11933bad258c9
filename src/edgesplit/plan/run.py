"""Run several planners on one problem, pick the best feasible plan, and sweep the link
bandwidth (the ``edgesplit plan --json`` document: :mod:`edgesplit.plan.document`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgesplit.errors import InfeasibleError, option
from edgesplit.plan.cost import EdgeCloudSetting
from edgesplit.plan.model import PLAN_VERSION, Plan
from edgesplit.plan.planners import BASELINE_METHODS, Manual, PlanningProblem, get_planner

__all__ = [
    "best_plan",
    "compare_methods",
    "cut_breakdown",
    "default_methods",
    "is_lossless",
    "passed_over",
    "sweep_link",
]


def default_methods(problem: PlanningProblem) -> tuple[str, ...]:
    """What is compared when no methods are named: the float edge-cloud baselines, or the
    topology planners for the problem's chain or mesh."""
    from edgesplit.plan.chain_planners import MESH_METHODS, TOPOLOGY_METHODS

    return {"edge_cloud": BASELINE_METHODS, "chain": TOPOLOGY_METHODS,
            "mesh": MESH_METHODS}[problem.kind]


def compare_methods(problem: PlanningProblem, methods: Sequence[str] | None = None,
                    *, split_after: Sequence[str] = (),
                    options: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Plan]:
    """One plan per method (default: :func:`default_methods`; ``manual`` when
    ``split_after`` is given); ``options[method]`` goes to that planner's constructor."""
    plans = {}
    options = options or {}
    for method in default_methods(problem) if methods is None else methods:
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


def sweep_link(problem: PlanningProblem, methods: Sequence[str] = BASELINE_METHODS, *,
               low_mbps: float = 0.1, high_mbps: float = 1000.0, points: int = 25
               ) -> dict[str, Any]:
    """How each method's plan moves as the uplink goes from ``low_mbps`` to ``high_mbps``
    (log-spaced); the downlink scales with it."""
    link = problem.edge_cloud.link
    ratio = (link.down_bandwidth_mbps or link.bandwidth_mbps) / link.bandwidth_mbps
    rows = []
    for mbps in np.geomspace(low_mbps, high_mbps, points):
        swept = link.model_copy(update={"bandwidth_mbps": float(mbps),
                                        "down_bandwidth_mbps": float(mbps * ratio)})
        setting = EdgeCloudSetting(**{**problem.edge_cloud.__dict__, "link": swept})
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
                     "serialize_ms": b.serialize_ms, "total_ms": b.total_ms,
                     "sent_bytes": b.sent_bytes})
    return rows
