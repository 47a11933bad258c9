"""What every search ends in: a model *and* a Plan the runtime executes, in one folder.

``save_search_result(folder, net, topology)`` writes

- ``arch.json`` + ``weights.safetensors``: the network (:mod:`edgesplit.nas.jmsnas.checkpoint`);
- ``model.pt2``: the network exported with ``torch.export`` (plain tensor weights, so it loads
  without ``trust_model_file``), which the plan names as its model;
- ``plan.json``: the network planned over ``topology`` by the same planners as any model
  (``multisplit`` by default: the exact chain DP; the search's own placement was fixed before
  the architecture existed, this one is chosen for it);
- ``plan_chain.json``, only for a parallel plan the runtime does not execute (a mesh plan of
  :func:`edgesplit.plan.mesh_layout`'s shape runs as it is): the best chain through the mesh,
  which runs;
- ``search.json``: the search's summary (whatever the caller passes) with the plan's method,
  predicted latency and where each device's layers are.

``edgesplit serve plan.json`` / ``edgesplit run plan.json`` then execute it like any plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgesplit.hardware import Topology
from edgesplit.nas.files import write_json
from edgesplit.nas.jmsnas.checkpoint import save_network
from edgesplit.nas.jmsnas.network import ArchNet
from edgesplit.plan import Plan, PlanningProblem, get_planner

__all__ = ["CHAIN_PLAN_FILE", "MODEL_FILE", "PLAN_FILE", "SUMMARY_FILE", "SearchResult",
           "save_search_result"]

MODEL_FILE = "model.pt2"
PLAN_FILE = "plan.json"
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


def save_search_result(folder: str | Path, net: ArchNet, topology: Topology, *,
                       summary: dict[str, Any] | None = None, method: str = "multisplit"
                       ) -> SearchResult:
    """Write the network, its exported program and its plan over ``topology`` to ``folder``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_network(out, net)
    model_path = export_network(net, out / MODEL_FILE)
    problem = PlanningProblem(model=str(model_path), setting=topology)
    plan = get_planner(method).plan(problem)
    plan.save(out / PLAN_FILE)
    doc = dict(summary or {})
    doc["plan"] = _describe(plan, PLAN_FILE)
    if not plan.runnable:  # a mesh of another shape predicts; the best chain through it runs
        chain = get_planner("best_chain").plan(problem)
        chain.save(out / CHAIN_PLAN_FILE)
        doc["runnable_plan"] = _describe(chain, CHAIN_PLAN_FILE)
    write_json(out / SUMMARY_FILE, doc)
    return SearchResult(out, plan, doc)
