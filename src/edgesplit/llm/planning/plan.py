"""Plan a causal LM over a chain of devices: the exact stage placement and its baselines, as
Plans (:func:`plan_llm`), a placement given by its boundaries (:func:`plan_llm_at`), and the
``edgesplit llm plan --json`` document.

LLM placement is not a planner of the registry (``get_planner``): those plan a captured
LayerGraph for one forward pass, while this plans a causal LM's blocks for two phases (prefill
and decode) with KV caches, from its config alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgesplit.hardware import LatencyEstimator, Topology
from edgesplit.llm.model.description import CausalLM, describe_causal_lm
from edgesplit.llm.planning.assemble import assemble_llm_plan
from edgesplit.llm.planning.costs import LLMChainCosts, LLMWorkload
from edgesplit.llm.planning.placement import (
    StagePlacement,
    best_single_device,
    equal_split,
    evaluate_placement,
    memory_proportional,
    solve_placement,
)
from edgesplit.plan.model import PLAN_VERSION, Plan

__all__ = ["LLM_METHODS", "LLMPlanning", "llm_plan_document", "plan_llm", "plan_llm_at"]

# In table order: the optimum first, then the baselines it is compared with.
LLM_METHODS: dict[str, Callable[[LLMChainCosts], StagePlacement]] = {
    "dp": solve_placement,
    "single_device": best_single_device,
    "memory_proportional": memory_proportional,
    "equal_split": equal_split,
}
_REASONS = {
    "single_device": "every block on the best device that fits",
    "memory_proportional": "decoder blocks in proportion to device memory (exo)",
    "equal_split": "the same number of decoder blocks per device",
}


@dataclass
class LLMPlanning:
    """Every method's placement and Plan on one cost table; ``plan`` is the optimum's."""

    costs: LLMChainCosts
    placements: dict[str, StagePlacement]
    plans: dict[str, Plan]

    @property
    def plan(self) -> Plan:
        return self.plans["dp"]

    @property
    def lm(self) -> CausalLM:
        return self.costs.lm


def plan_llm(model: Any, topology: Topology, workload: LLMWorkload | None = None, *,
             dtype: str = "float32",
             estimators: Mapping[str, LatencyEstimator] | None = None) -> LLMPlanning:
    """Place ``model`` (anything :func:`~edgesplit.graph.describe_causal_lm` takes, or a
    :class:`CausalLM`, whose own dtype then applies) on the chain ``topology``.
    InfeasibleError if no placement fits the devices' memory; the baselines are returned even
    when they do not fit (``feasible=False``, the reason naming the device)."""
    costs = _costs(model, topology, workload, dtype, estimators)
    placements = {name: method(costs) for name, method in LLM_METHODS.items()}
    plans = {name: assemble_llm_plan(costs, p, method=name, reason=_REASONS.get(name))
             for name, p in placements.items()}
    return LLMPlanning(costs, placements, plans)


def plan_llm_at(model: Any, topology: Topology, boundaries: Sequence[int],
                workload: LLMWorkload | None = None, *, dtype: str = "float32",
                method: str = "manual",
                estimators: Mapping[str, LatencyEstimator] | None = None) -> Plan:
    """``model`` split at ``boundaries`` on the chain ``topology``, priced and assembled as
    :func:`plan_llm` prices its placements, without searching: device m runs blocks
    ``boundaries[m]:boundaries[m + 1]`` (0 first and the model's block count last, one more
    than devices; an empty range holds nothing). ``method`` names the placement in the Plan.
    A placement that does not fit the devices' memory is returned with ``feasible=False``."""
    costs = _costs(model, topology, workload, dtype, estimators)
    return assemble_llm_plan(costs, evaluate_placement(costs, boundaries), method=method)


def _costs(model: Any, topology: Topology, workload: LLMWorkload | None, dtype: str,
           estimators: Mapping[str, LatencyEstimator] | None) -> LLMChainCosts:
    lm = model if isinstance(model, CausalLM) else describe_causal_lm(model, dtype=dtype)
    return LLMChainCosts.build(lm, topology, workload or LLMWorkload(), estimators=estimators)


def llm_plan_document(result: LLMPlanning) -> dict[str, Any]:
    """The ``llm plan --json`` document (schema in docs/reference/formats.md)."""
    costs, lm, w = result.costs, result.lm, result.costs.workload
    topology = costs.topology
    return {
        "version": PLAN_VERSION,
        "model": lm.name,
        "source": lm.source,
        "fingerprint": lm.fingerprint,
        "dtype": lm.dtype,
        "group_size": lm.weights.group_size,
        "activations": w.activations,
        "objective": w.objective,
        "workload": {"prompt_tokens": w.prompt_tokens, "new_tokens": w.new_tokens,
                     "max_context": w.context, "sessions": w.sessions,
                     "decode_cached_tokens": w.decode_cached},
        "topology": {
            "name": topology.name,
            "devices": [{"name": d, "memory_bytes": limit}
                        for d, limit in zip(costs.devices, costs.memory_limits, strict=True)],
            "links": [{"src": tl.src, "dst": tl.dst, "bandwidth_mbps": tl.link.bandwidth_mbps,
                       "rtt_ms": tl.link.rtt_ms} for tl in topology.links],
        },
        "blocks": [{"name": b.name, "kind": b.kind, "param_bytes": b.param_bytes,
                    "kv_bytes_per_token": b.kv_bytes_per_token} for b in lm.blocks],
        "best": "dp",
        "methods": {name: _entry(p, result.plans[name]) for name, p in result.placements.items()},
    }


def _entry(p: StagePlacement, plan: Plan) -> dict[str, Any]:
    assert plan.llm is not None
    return {
        "feasible": p.feasible,
        "reason": plan.reason,
        "boundaries": list(p.boundaries),
        "assignment": {s.device: s.blocks for s in plan.llm.stages},
        "ttft_ms": p.ttft_ms,
        "tpot_ms": p.tpot_ms,
        "request_ms": p.request_ms,
        "period_ms": p.period_ms,
        "tokens_per_s": p.tokens_per_s,
        "pipeline_tokens_per_s": p.pipeline_tokens_per_s,
        "stages": [s.model_dump(mode="json") for s in plan.llm.stages],
        "hops": [h.model_dump(mode="json") for h in plan.llm.hops],
        "plan": plan.model_dump(mode="json"),
    }
