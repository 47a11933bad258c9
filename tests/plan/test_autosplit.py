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


# ---- measured accuracy (real data: scikit-learn digits, digits_cnn trained on the rest) ----
@pytest.fixture(scope="module")
def digits_problem():
    from edgesplit.data import load_dataset

    return PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("eyeriss"), cloud=get_device("tpu"), link=get_link("autosplit-3mbps")),
        # 60 calibration + 240 held-out samples keep the test quick; the benchmark uses all
        eval_data=load_dataset("digits").subset(slice(0, 300)), calibration_samples=60,
        eval_batch_size=120)


def _accuracy_by_hand(problem, bits):
    """Top-1 accuracy of the fake-quantized program, batch by batch, no shared code path
    beyond fake_quant_program itself."""
    import torch

    from edgesplit.quant import fake_quant_program

    setup = next(v for k, v in problem.cache.items() if k.startswith("quant"))
    meter = setup.meter
    program = fake_quant_program(meter.graph, bits, meter.calibration)
    data = problem.eval_data.subset(slice(60, None))
    correct = 0
    for start in range(0, len(data), 120):
        x = data.inputs[0][start:start + 120]
        with torch.no_grad():
            correct += int((program(x).argmax(1) == data.labels[start:start + 120]).sum())
    return 100.0 * correct / len(data)


def test_measured_selection_respects_accuracy_and_memory(digits_problem):
    limit = 120_000
    problem = PlanningProblem(digits_problem.model, EdgeCloudSetting(
        **{**digits_problem.setting.__dict__, "edge_memory_bytes": limit}),
        eval_data=digits_problem.eval_data, calibration_samples=60, eval_batch_size=120,
        cache=digits_problem.cache)
    for threshold in (0.0, 0.5, 5.0, 100.0):
        sel = AutoSplit(max_acc_drop=threshold, measure_all=True).select(problem)
        assert sel.measured and sel.threshold == threshold
        assert all(c.drop is not None for c in sel.candidates)
        assert all(c.memory_bytes <= limit for c in sel.candidates)
        allowed = [c for c in sel.candidates if c.drop <= threshold + 1e-9]
        assert sel.best.drop <= threshold + 1e-9
        assert sel.best.total_ms == min(c.total_ms for c in allowed)
    loose = AutoSplit(max_acc_drop=100.0).select(problem)
    assert loose.best.total_ms == min(c.total_ms for c in loose.candidates)


@pytest.mark.parametrize("threshold", [0.0, 0.5, 2.0, 100.0])
def test_measuring_in_latency_order_makes_the_choice_measuring_all_makes(digits_problem,
                                                                         threshold):
    """The lazy selection measures candidates fastest first and stops at the first latency
    that holds one within the threshold: the same plan as measuring every candidate (the
    brute force), from no more measurements, none of them slower than the choice."""
    every = AutoSplit(max_acc_drop=threshold, measure_all=True).select(digits_problem)
    lazy = AutoSplit(max_acc_drop=threshold).select(digits_problem)
    assert (lazy.best.edge, lazy.best.w_bits, lazy.best.a_bits, lazy.best.drop) == \
        (every.best.edge, every.best.w_bits, every.best.a_bits, every.best.drop)
    assert len(lazy.candidates) == len(every.candidates)
    measured = [c for c in lazy.candidates if c.drop is not None]
    assert all(c.total_ms <= lazy.best.total_ms for c in measured)
    assert all(c.drop is None for c in lazy.candidates if c.total_ms > lazy.best.total_ms)
    plan = AutoSplit(max_acc_drop=threshold).plan(digits_problem)
    chosen = next(a for a in plan.alternatives if a.chosen)
    assert (chosen.split, chosen.w_bits, chosen.drop) == \
        (every.best.split, every.best.w_bits, every.best.drop)
    if len(measured) < len(lazy.candidates):
        assert f"{len(measured)} candidates measured, fastest first" in plan.reason


def test_measured_drop_equals_accuracy_computed_by_hand(digits_problem):
    plan = AutoSplit(max_acc_drop=100.0, measure_all=True).plan(digits_problem)
    bits = {l.name: (l.w_bits, l.a_bits) for l in plan.layers if l.w_bits is not None}
    assert bits, "the loosest threshold should quantize the edge part"
    assert plan.quality.samples == 240 and plan.quality.metric == "top1"
    assert plan.quality.value == pytest.approx(_accuracy_by_hand(digits_problem, bits))
    assert plan.quality.reference == pytest.approx(_accuracy_by_hand(digits_problem, {}))
    assert plan.quality.reference > 95.0
    # the Pareto front: no candidate is both faster and more accurate than a front member
    front = [a for a in plan.alternatives if a.pareto]
    for f in front:
        assert not any(a.total_ms < f.total_ms and a.drop < f.drop for a in plan.alternatives)
    assert "accuracy measured" in plan.reason


def test_two_bit_everything_loses_accuracy_and_is_excluded(digits_problem):
    u2 = next(c for c in AutoSplit(max_acc_drop=1.0, measure_all=True).select(
              digits_problem).candidates
              if c.split == len(digits_problem.graph.layers)
              and set(c.w_bits.values()) == {2} and set(c.a_bits.values()) == {2})
    assert u2.drop > 10.0  # 2-bit weights and activations everywhere: a real, large drop
    assert AutoSplit(max_acc_drop=1.0).select(digits_problem).best.drop <= 1.0


def test_remark_5_with_measured_accuracy(digits_problem):
    plans = compare_methods(digits_problem, ["cloud_only", "edge_only", "u8", "autosplit"])
    auto = plans["autosplit"].predicted.total_ms
    assert auto <= plans["cloud_only"].predicted.total_ms
    assert auto <= plans["edge_only"].predicted.total_ms
    if plans["u8"].quality.drop <= 1.0:  # U8 is a candidate whenever it meets the threshold
        assert auto <= plans["u8"].predicted.total_ms + 1e-9


def test_max_acc_drop_needs_data_and_data_must_fit_the_model(eyeriss_problem):
    from edgesplit.data import load_dataset
    from edgesplit.errors import ConfigError

    # Python callers see the keyword; the CLI test sees --eval-data
    with pytest.raises(ConfigError, match="pass eval_data"):
        AutoSplit(max_acc_drop=1.0).plan(eyeriss_problem("resnet18"))
    wrong = PlanningProblem("resnet18", eyeriss_problem("resnet18").setting,
                            eval_data=load_dataset("digits"))
    with pytest.raises(ConfigError, match="takes"):
        AutoSplit().plan(wrong)
    with pytest.raises(ConfigError, match=">= 0"):
        AutoSplit(max_acc_drop=-1)


# ---- the quantized baselines ---------------------------------------------------------------
def test_quantized_baselines_follow_their_definitions(eyeriss_problem):
    from edgesplit.hardware import LayerWork, estimator_for
    from edgesplit.plan.quantized import float_min_cut

    problem = eyeriss_problem("mobilenet_v2")
    costs = problem.costs()
    plans = compare_methods(problem, ["qdmp", "qdmp_e", "qdmp_e_u4", "u8", "cloud16"])
    n = len(costs.graph.layers)
    # U8: everything on the edge at uniform 8 bits
    assert len(plans["u8"].edge_layers) == n
    assert {(l.w_bits, l.a_bits) for l in plans["u8"].layers} == {(8, 8)}
    # CLOUD16: nothing on the edge, every layer's cloud latency at 16 bits
    cloud16 = plans["cloud16"]
    assert cloud16.edge_layers == []
    tpu = estimator_for(problem.setting.cloud)
    expected = sum(tpu.layer_ms(LayerWork.of(costs.graph, l.name, w_bits=16, a_bits=16),
                                problem.setting.cloud) for l in costs.graph.layers)
    assert cloud16.predicted.compute_ms["cloud"] == pytest.approx(expected)
    # QDMP_E: the float min-cut; + U4: the same split at 4 bits, a quarter... of the weights
    split = sorted(float_min_cut(costs))
    assert sorted(plans["qdmp_e"].edge_layers) == split
    assert sorted(plans["qdmp_e_u4"].edge_layers) == split
    assert all(l.w_bits is None for l in plans["qdmp_e"].layers)
    assert {l.w_bits for l in plans["qdmp_e_u4"].layers if l.name in split} == {4}
    assert plans["qdmp_e_u4"].edge_memory_bytes < plans["qdmp_e"].edge_memory_bytes
    for plan in plans.values():
        assert recompute_total(plan) == pytest.approx(plan.predicted.total_ms)


def test_qdmp_e_keeps_its_split_and_becomes_infeasible_where_qdmp_adapts(eyeriss_problem):
    limit = 2 * 2**20
    problem = eyeriss_problem("mobilenet_v2", edge_memory_bytes=limit)
    plans = compare_methods(problem, ["qdmp", "qdmp_e", "autosplit"])
    assert plans["qdmp"].feasible and plans["qdmp"].edge_memory_bytes <= limit
    assert plans["qdmp_e"].edge_memory_bytes > limit and not plans["qdmp_e"].feasible
    assert "edge memory" in plans["qdmp_e"].reason
    assert plans["autosplit"].feasible and plans["autosplit"].edge_memory_bytes <= limit


def test_exactly_one_alternative_is_the_chosen_plan(eyeriss_problem):
    plan = compare_methods(eyeriss_problem("mobilenet_v2"), ["autosplit"])["autosplit"]
    chosen = [a for a in plan.alternatives if a.chosen]
    assert len(chosen) == 1
    assert chosen[0].total_ms == pytest.approx(plan.predicted.total_ms)
    assert chosen[0].split == len(plan.edge_layers)
