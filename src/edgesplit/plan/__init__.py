"""Planners that decide where a model is cut, and the Plan they return."""

from edgesplit.plan.cost import Breakdown, CostTable, EdgeCloudSetting
from edgesplit.plan.model import PLAN_VERSION, Plan, load_plan, recompute_total
from edgesplit.plan.planners import (BASELINE_METHODS, Planner, PlanningProblem, get_planner,
                                     list_planners, make_plan, register_planner)
from edgesplit.plan import quantized as _quantized  # noqa: F401  (registers u8, cloud16, ...)
from edgesplit.plan import autosplit as _autosplit  # noqa: F401  (registers "autosplit")
from edgesplit.plan.run import (best_plan, compare_methods, cut_breakdown, is_lossless,
                                passed_over, plan_document, sweep_link)

# Every edge-cloud method `edgesplit plan --method all` compares (AUTO-SPLIT's Fig. 6 set and
# the float planners); `manual` needs --split-after.
ALL_METHODS = (*BASELINE_METHODS, "qdmp_e", "qdmp_e_u4", "u8", "cloud16", "autosplit")

__all__ = [
    "Breakdown", "CostTable", "EdgeCloudSetting", "PLAN_VERSION", "Plan", "load_plan",
    "recompute_total", "BASELINE_METHODS", "Planner", "PlanningProblem", "get_planner",
    "list_planners", "make_plan", "register_planner", "best_plan", "compare_methods",
    "cut_breakdown", "is_lossless", "passed_over", "plan_document", "sweep_link",
    "ALL_METHODS",
]
