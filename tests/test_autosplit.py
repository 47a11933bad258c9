"""AUTO-SPLIT's Algorithm 1: potential splits (eq. 6), candidates that respect memory (5b),
selection under the distortion threshold, and Remark 5."""

from __future__ import annotations

import pytest

from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, compare_methods, recompute_total
from edgesplit.plan.autosplit import AutoSplit, potential_splits


@pytest.fixture(scope="module")
def eyeriss_problem():
    def make(model: str, **kw) -> PlanningProblem:
        return PlanningProblem(model, EdgeCloudSetting(
            edge=get_device("eyeriss"), cloud=get_device("tpu"),
            link=get_link("autosplit-3mbps"), **kw))
    return make


def test_potential_splits_follow_eq_6(block_graph):
    from edgesplit.plan import CostTable

    graph = block_graph
    setting = EdgeCloudSetting(edge=get_device("eyeriss"), cloud=get_device("tpu"),
                               link=get_link("autosplit-3mbps"), input_bits=8)
    costs = CostTable.build(graph, setting)
    raw = graph.tensors["x"].bytes_at(8)
    splits = potential_splits(costs, (2, 4, 8))
    cuts = graph.cuts()
    for n in range(len(graph.layers) + 1):
        sent = 0 if n == len(graph.layers) else sum(
            t.bytes_at(8 if t.producer == "input" else 2) for t in cuts[n].tensors)
        assert (n in splits) == (sent <= raw)
    tiny = CostTable.build(graph, EdgeCloudSetting(**{**setting.__dict__,
                                                      "edge_memory_bytes": 1}))
    assert potential_splits(tiny, (2, 4, 8)) == []


def test_candidates_respect_memory_and_threshold(eyeriss_problem):
    limit = 2 * 2**20
    problem = eyeriss_problem("mobilenet_v2", edge_memory_bytes=limit)
    sel = AutoSplit().select(problem)
    best, candidates, threshold = sel.best, sel.candidates, sel.threshold
    assert all(c.memory_bytes <= limit for c in candidates)
    assert best.memory_bytes <= limit and best.distortion <= threshold
    allowed = [c for c in candidates if c.distortion <= threshold]
    assert best.total_ms == min(c.total_ms for c in allowed)


def test_remark_5_never_worse_than_cloud_or_edge_only(eyeriss_problem):
    problem = eyeriss_problem("resnet50")
    candidates = AutoSplit().select(problem).candidates
    best = AutoSplit().select(problem).best
    cloud_only = next(c for c in candidates if c.split == 0)
    assert best.total_ms <= cloud_only.total_ms
    plans = compare_methods(problem, ["edge_only", "autosplit"])
    assert plans["autosplit"].predicted.total_ms <= plans["edge_only"].predicted.total_ms


def test_zero_threshold_leaves_only_exact_candidates(eyeriss_problem):
    sel = AutoSplit(max_distortion=0.0).select(eyeriss_problem("resnet18"))
    best, threshold = sel.best, sel.threshold
    assert threshold == 0.0 and best.distortion == 0.0 and best.split == 0


def test_autosplit_plan_carries_bits_and_rechecks(eyeriss_problem):
    plan = compare_methods(eyeriss_problem("mobilenet_v2"), ["autosplit"])["autosplit"]
    assert plan.feasible and "accuracy not measured" in plan.reason
    edge = set(plan.edge_layers)
    assert all(l.w_bits in (2, 4, 6, 8, 16) and l.a_bits in (2, 4, 6, 8, 16)
               for l in plan.layers if l.name in edge)
    assert all(l.w_bits is None for l in plan.layers if l.name not in edge)
    assert recompute_total(plan) == pytest.approx(plan.predicted.total_ms)
    assert set(plan.transfers[0].bits) == set(plan.transfers[0].tensors)
