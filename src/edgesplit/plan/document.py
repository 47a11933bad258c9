"""The JSON document of ``edgesplit plan --json`` for any planning problem (schema in
docs/reference/formats.md): the model's layers and tensors, the setting or topology, one entry
per method with its full plan, and the best method."""

from __future__ import annotations

from typing import Any

from edgesplit.errors import InfeasibleError
from edgesplit.plan.mesh import plan_period_ms
from edgesplit.plan.model import PLAN_VERSION, Plan
from edgesplit.plan.planners import PlanningProblem
from edgesplit.plan.run import best_plan, is_lossless

__all__ = ["best_method", "plan_document"]


def plan_document(problem: PlanningProblem, plans: dict[str, Plan], *,
                  accept_unmeasured: bool = False) -> dict[str, Any]:
    """The document for ``plans`` made on ``problem`` (edge-cloud or topology)."""
    graph = problem.graph
    doc: dict[str, Any] = {
        "version": PLAN_VERSION,
        "model": graph.model,
        "tensors": [{"name": t.name, "producer": t.producer, "consumers": list(t.consumers),
                     "bytes": t.bytes} for t in graph.tensors.values()],
    }
    if problem.kind == "edge_cloud":
        doc.update(_edge_cloud(problem, plans, accept_unmeasured))
    else:
        doc.update(_topology(problem, plans))
    return doc


def best_method(problem: PlanningProblem, plans: dict[str, Plan], *,
                accept_unmeasured: bool = False) -> str | None:
    """The method the document calls best: the fastest trusted feasible edge-cloud plan, or
    over a topology the feasible plan best at the problem's objective; None if none."""
    if problem.kind == "edge_cloud":
        try:
            best = best_plan(plans, accept_unmeasured=accept_unmeasured)[1]
        except InfeasibleError:
            return None
        return next((m for m, p in plans.items() if p is best), None)
    feasible = [m for m, p in plans.items() if p.feasible]
    return min(feasible, key=lambda m: _objective(problem, plans[m])) if feasible else None


def _objective(problem: PlanningProblem, plan: Plan) -> float:
    return plan.predicted.total_ms if problem.objective == "latency" else plan_period_ms(plan)


def _edge_cloud(problem: PlanningProblem, plans: dict[str, Plan],
                accept_unmeasured: bool) -> dict[str, Any]:
    costs = problem.costs("optimized")
    setting = problem.edge_cloud
    link = setting.link
    return {
        "layers": [{"name": layer.name, "edge_ms": costs.edge_ms[layer.name],
                    "cloud_ms": costs.cloud_ms[layer.name], "param_bytes": layer.param_bytes}
                   for layer in costs.graph.layers],
        "link": {"name": link.name, "bandwidth_mbps": link.bandwidth_mbps,
                 "down_bandwidth_mbps": link.down_bandwidth_mbps or link.bandwidth_mbps,
                 "rtt_ms": link.rtt_ms},
        "edge": setting.edge.name,
        "cloud": setting.cloud.name,
        "edge_memory_limit_bytes": setting.memory_limit_bytes,
        "result_at": setting.result_at,
        "best": best_method(problem, plans, accept_unmeasured=accept_unmeasured),
        "methods": {method: _edge_cloud_entry(plan) for method, plan in plans.items()},
    }


def _edge_cloud_entry(plan: Plan) -> dict[str, Any]:
    return {
        "feasible": plan.feasible,
        "runnable": plan.runnable,
        "reason": plan.reason,
        "lossless": is_lossless(plan),
        "graph": plan.model.graph,
        "edge_layers": plan.edge_layers,
        "sent_bytes": plan.transfers[0].bytes if plan.transfers else 0,
        "edge_ms": plan.predicted.compute_ms.get("edge", 0.0),
        "transfer_ms": plan.predicted.transfer_ms,
        "cloud_ms": plan.predicted.compute_ms.get("cloud", 0.0),
        "rtt_ms": plan.predicted.rtt_ms,
        "serialize_ms": plan.predicted.serialize_ms,
        "total_ms": plan.predicted.total_ms,
        "edge_memory_bytes": plan.edge_memory_bytes,
        "quality": plan.quality.model_dump(mode="json") if plan.quality else None,
        "plan": plan.model_dump(mode="json"),
    }


def _latency_by_device(plans: dict[str, Plan], name: str) -> dict[str, float]:
    merged: dict[str, float] = {}
    for plan in plans.values():
        for layer in plan.layers:
            if layer.name == name:
                merged.update(layer.latency_ms)
                break
    return merged


def _topology(problem: PlanningProblem, plans: dict[str, Plan]) -> dict[str, Any]:
    assert problem.topology is not None
    topology = problem.topology
    key = "total_ms" if problem.objective == "latency" else "period_ms"
    return {
        "objective": problem.objective,
        "layers": [{"name": layer.name, "latency_ms": _latency_by_device(plans, layer.name)}
                   for layer in problem.graph.layers],
        "topology": {
            "name": topology.name,
            "devices": [d.name for d in topology.devices],
            "links": [{"src": tl.src, "dst": tl.dst, "bandwidth_mbps": tl.link.bandwidth_mbps,
                       "rtt_ms": tl.link.rtt_ms} for tl in topology.links],
        },
        "best": best_method(problem, plans),
        "methods": {
            m: {"feasible": p.feasible, "runnable": p.runnable,
                "assignment": {d.name: d.layers for d in p.devices},
                key: _objective(problem, p), "total_ms": p.predicted.total_ms,
                "serialize_ms": p.predicted.serialize_ms,
                "period_ms": plan_period_ms(p), "plan": p.model_dump(mode="json")}
            for m, p in plans.items()
        },
    }
