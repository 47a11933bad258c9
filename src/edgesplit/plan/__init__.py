"""Planners that decide where a model is cut, and the Plan they return.

Every planner is called the same way: ``get_planner(name, **options).plan(problem)``, with a
:class:`PlanningProblem` on an edge-cloud setting or a topology; every Plan is built by
:func:`assemble_plan` under one cost convention (docs/cost-model.md). A causal LM's stages
are placed by :mod:`edgesplit.llm` under the same convention.
"""

from edgesplit.plan.assemble import Network, assemble_plan, one_way_latency_ms
from edgesplit.plan.chain_planners import MESH_METHODS, TOPOLOGY_METHODS
from edgesplit.plan.cost import Breakdown, CostTable, EdgeCloudSetting
from edgesplit.plan.document import best_method, plan_document
from edgesplit.plan.model import (
    PLAN_VERSION,
    MeshLayout,
    Plan,
    PlanShape,
    StarLayout,
    load_plan,
    mesh_layout,
    recompute_total,
    star_layout,
)
from edgesplit.plan.planners import (
    BASELINE_METHODS,
    PLANNERS,
    EdgeSetPlanner,
    Planner,
    PlanningProblem,
    get_planner,
    list_planners,
    make_plan,
    planners_for,
    register_planner,
)
from edgesplit.plan.run import (
    best_plan,
    compare_methods,
    cut_breakdown,
    default_methods,
    is_lossless,
    passed_over,
    sweep_link,
)

# Every edge-cloud method `edgesplit plan --method all` compares (AUTO-SPLIT's Fig. 6 set and
# the float planners); `manual` needs split_after.
ALL_METHODS = (*BASELINE_METHODS, "qdmp_e", "qdmp_e_u4", "u8", "cloud16", "autosplit")

__all__ = [
    "ALL_METHODS",
    "BASELINE_METHODS",
    "MESH_METHODS",
    "PLANNERS",
    "PLAN_VERSION",
    "TOPOLOGY_METHODS",
    "Breakdown",
    "CostTable",
    "EdgeCloudSetting",
    "EdgeSetPlanner",
    "MeshLayout",
    "Network",
    "Plan",
    "PlanShape",
    "Planner",
    "PlanningProblem",
    "StarLayout",
    "assemble_plan",
    "best_method",
    "best_plan",
    "compare_methods",
    "cut_breakdown",
    "default_methods",
    "get_planner",
    "is_lossless",
    "list_planners",
    "load_plan",
    "make_plan",
    "mesh_layout",
    "one_way_latency_ms",
    "passed_over",
    "plan_document",
    "planners_for",
    "recompute_total",
    "register_planner",
    "star_layout",
    "sweep_link",
]
