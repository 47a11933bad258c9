"""What every search ends in: a model *and* a Plan the runtime executes, in one folder.

``save_search_result(folder, net, topology)`` writes

- ``arch.json`` + ``weights.safetensors``: the network (:mod:`edgesplit.nas.jmsnas.checkpoint`);
- ``model.pt2``: the network exported with ``torch.export`` (plain tensor weights, so it loads
  without ``trust_model_file``), which the plan names as its model;
- ``plan.json``: the faster of two plans, both priced by the same estimator: over a chain
  with the search's ``placement`` given, the search's own device assignment (its units per
  device, deployed by the ``chain_manual`` planner, ``plan_own.json``), and the network
  re-planned by the same planners as any model (``multisplit`` by default: the exact chain
  DP, chosen for the architecture the search fixed before it existed, ``plan_replan.json``);
  without a placement, the re-plan alone;
- ``plan_chain.json``, only for a parallel plan the runtime does not execute (a mesh plan of
  :func:`edgesplit.plan.mesh_layout`'s shape runs as it is): the best chain through the mesh,
  which runs;
- ``search.json``: the search's summary (whatever the caller passes) with the kept plan's
  method, predicted latency and where each device's layers are (``plan``), both candidates
  (``plans``: ``own`` and ``replan``) and which was kept (``kept``).

``edgesplit serve plan.json`` / ``edgesplit run plan.json`` then execute it like any plan.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgesplit.graph.ir import LayerGraph
from edgesplit.hardware import Topology
from edgesplit.nas.core.files import write_json
from edgesplit.nas.jmsnas.chain_latency import ChainPlacement
from edgesplit.nas.jmsnas.checkpoint import save_network
from edgesplit.nas.jmsnas.network import ArchNet
from edgesplit.plan import Plan, PlanningProblem, get_planner

__all__ = ["CHAIN_PLAN_FILE", "MODEL_FILE", "OWN_PLAN_FILE", "PLAN_FILE", "REPLAN_FILE",
           "SUMMARY_FILE", "SearchResult", "placement_layer_counts", "save_search_result"]

MODEL_FILE = "model.pt2"
PLAN_FILE = "plan.json"
OWN_PLAN_FILE = "plan_own.json"  # the search's own device assignment
REPLAN_FILE = "plan_replan.json"  # the network re-planned by the planner
CHAIN_PLAN_FILE = "plan_chain.json"  # only for a mesh: the best chain through it, which runs
SUMMARY_FILE = "search.json"


@dataclass(frozen=True)
class SearchResult:
    folder: Path
    plan: Plan
    summary: dict[str, Any]


def _describe(plan: Plan, file: str) -> dict[str, Any]:
    return {"file": file, "method": plan.method, "predicted_ms": plan.predicted.total_ms,
            "runnable": plan.runnable, "devices": {d.name: len(d.layers) for d in plan.devices}}


def export_network(net: ArchNet, path: Path) -> Path:
    """``net`` exported with ``torch.export`` at batch 1 and saved to ``path``."""
    example = torch.zeros(1, *net.space.input_shape)
    program = torch.export.export(net.eval(), (example,))
    torch.export.save(program, path)
    return path


def _unit_of(layer_name: str, n_units: int) -> int:
    """The unit (0 stem, i+1 for ``layers.i``, the last for the head) a graph layer belongs to;
    identity layers have no graph layer, head, pool and classifier all belong to the head."""
    parts = layer_name.split(".")
    if parts[0] == "stem":
        return 0
    if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
        return int(parts[1]) + 1
    return n_units - 1


def placement_layer_counts(graph: LayerGraph, placement: ChainPlacement) -> list[int]:
    """How many of ``graph``'s layers (an exported searched network) each device of
    ``placement`` runs: every layer goes where its unit was placed."""
    n_units = len(placement.unit_device)
    devices = [placement.unit_device[_unit_of(layer.name, n_units)] for layer in graph.layers]
    if any(b < a for a, b in itertools.pairwise(devices)):
        raise ValueError(f"the graph's layers do not follow the units' order: {devices}")
    return [devices.count(m) for m in range(len(placement.devices))]


def _candidates(problem: PlanningProblem, method: str, placement: ChainPlacement | None
                ) -> dict[str, Plan]:
    """The re-plan and, given a placement, the search's own assignment, priced alike."""
    plans = {"replan": get_planner(method).plan(problem)}
    if placement is not None:
        counts = placement_layer_counts(problem.graph, placement)
        plans["own"] = get_planner("chain_manual", layers_per_device=counts).plan(problem)
    return plans


def _faster(plans: dict[str, Plan], tie_ms: float = 1e-9) -> str:
    """``replan`` if it is faster than the search's own plan (beyond rounding), else ``own``:
    priced alike, the exact re-plan is never slower, so the search's choice is kept exactly
    when it is optimal."""
    if "own" not in plans:
        return "replan"
    faster = plans["replan"].predicted.total_ms < plans["own"].predicted.total_ms - tie_ms
    return "replan" if faster else "own"


def save_search_result(folder: str | Path, net: ArchNet, topology: Topology, *,
                       summary: dict[str, Any] | None = None, method: str = "multisplit",
                       placement: ChainPlacement | None = None) -> SearchResult:
    """Write the network, its exported program and its plan over ``topology`` to ``folder``:
    the faster of the search's own ``placement`` (a chain's units per device) and the
    ``method``'s re-plan, the search's own on a tie."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_network(out, net)
    model_path = export_network(net, out / MODEL_FILE)
    problem = PlanningProblem(model=str(model_path), setting=topology)
    plans = _candidates(problem, method, placement)
    files = {"own": OWN_PLAN_FILE, "replan": REPLAN_FILE}
    kept = _faster(plans)
    plan = plans[kept]
    plan.save(out / PLAN_FILE)
    doc = dict(summary or {})
    doc["plan"] = _describe(plan, PLAN_FILE)
    doc["kept"] = kept
    doc["plans"] = {}
    for name, candidate in plans.items():
        candidate.save(out / files[name])
        doc["plans"][name] = _describe(candidate, files[name])
    if not plan.runnable:  # a mesh of another shape predicts; the best chain through it runs
        chain = get_planner("best_chain").plan(problem)
        chain.save(out / CHAIN_PLAN_FILE)
        doc["runnable_plan"] = _describe(chain, CHAIN_PLAN_FILE)
    write_json(out / SUMMARY_FILE, doc)
    return SearchResult(out, plan, doc)
