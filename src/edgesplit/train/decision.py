"""An L2S decision (a cut of the training chain) as an edge/cloud :class:`Plan`.

The decision is L2S's, the mechanics the planners': the chain is captured as one graph
(:func:`edgesplit.train.chain.capturable`, so every layer's module path starts with its chain
index), the chain cut is mapped onto that graph (``graph_cut_for_chain``) and the ``manual``
planner (``cloud_only`` for cut -1) prices the split with the shared cost model. The plan is on
the raw graph, the one L2S's features are computed on: an optimised graph fuses batch-norm and
activations into the convolution before them, which can move the cut.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from edgesplit.plan import EdgeCloudSetting, EdgeSetPlanner, Plan, PlanningProblem, get_planner
from edgesplit.train.chain import capturable
from edgesplit.train.split import as_chain, graph_cut_for_chain

__all__ = ["chain_cut_plan"]


def chain_cut_plan(model: nn.Module, example_inputs: Any, setting: EdgeCloudSetting,
                   chain_cut: int) -> Plan:
    """The plan that runs chain elements 0..``chain_cut`` of ``model`` on the edge and the rest
    on the cloud (-1: everything on the cloud), in L2S's cut convention."""
    problem = PlanningProblem(capturable(as_chain(model)), setting, example_inputs)
    graph = problem.graph_of("raw")
    cut = graph_cut_for_chain(graph, chain_cut)
    if cut < 0:
        planner = get_planner("cloud_only")
    else:
        planner = get_planner("manual", split_after=[graph.layers[cut].name])
    assert isinstance(planner, EdgeSetPlanner)  # both plan one edge set on one graph
    planner.graph_kind = "raw"  # the graph the cut was mapped on (see the module's docstring)
    return planner.plan(problem)
