"""Planners: optimality against brute force on random DAGs, the Plan contract, constraints, and
the qualitative results the papers report."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dag_models import SpecDAG, dag_specs, example_input
from edgesplit.errors import InfeasibleError
from edgesplit.graph import capture
from edgesplit.hardware import AnalyticalCompute, Device, Link, get_device, get_link
from edgesplit.plan import (
    CostTable,
    EdgeCloudSetting,
    PlanningProblem,
    best_plan,
    compare_methods,
    get_planner,
    load_plan,
    make_plan,
    recompute_total,
)
from edgesplit.plan.planners import Neurosurgeon, Qdmp

FAST = Device(name="fast", kind="gpu", compute=AnalyticalCompute(
    peak_gops={32: 1000.0}, memory_bandwidth_gb_per_s=100.0))


def _setting(rtt_ms: float = 0.0, **kw) -> EdgeCloudSetting:
    return EdgeCloudSetting(edge=FAST, cloud=FAST.model_copy(update={"name": "cloud"}),
                            link=Link(name="l", bandwidth_mbps=10.0, rtt_ms=rtt_ms), **kw)


def _random_costs(graph, data, setting) -> CostTable:
    draw = lambda: data.draw(st.floats(0.0, 10.0, allow_nan=False))  # noqa: E731
    return CostTable(graph=graph, setting=setting,
                     edge_ms={layer.name: draw() for layer in graph.layers},
                     cloud_ms={layer.name: draw() for layer in graph.layers},
                     up_ms={t: draw() for t in graph.tensors},
                     down_ms={t: draw() for t in graph.outputs})


def _down_sets(graph):
    names = [layer.name for layer in graph.layers]
    for mask in range(2 ** len(names)):
        edge = frozenset(names[i] for i in range(len(names)) if mask >> i & 1)
        if all(p in edge for n in edge for p in graph.predecessors(n)):
            yield edge


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_specs(max_nodes=6), data=st.data(), rtt=st.sampled_from([0.0, 3.0]),
       result_at=st.sampled_from(["edge", "cloud"]))
def test_min_cut_equals_brute_force_over_all_down_sets(spec, data, rtt, result_at):
    graph = capture(SpecDAG(spec), example_input())
    costs = _random_costs(graph, data, _setting(rtt, result_at=result_at))
    best = min(costs.evaluate(e).total_ms for e in _down_sets(graph))
    chosen = Qdmp().choose(costs)
    assert costs.evaluate(chosen).total_ms == pytest.approx(best, rel=1e-6, abs=1e-6)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_specs(max_nodes=7), data=st.data())
def test_neurosurgeon_equals_brute_force_over_prefixes(spec, data):
    graph = capture(SpecDAG(spec), example_input())
    costs = _random_costs(graph, data, _setting(2.0))
    planner = Neurosurgeon()
    layers = graph.layers

    def own_estimate(i: int) -> float:  # by hand: edge prefix + layer i's output + cloud rest
        sent = sum(costs.up_ms[t] for t in (layers[i].outputs if i >= 0 else graph.inputs)) \
            if i < len(layers) - 1 else 0.0
        rtt = costs.setting.link.rtt_ms if i < len(layers) - 1 else 0.0
        return (sum(costs.edge_ms[l.name] for l in layers[: i + 1]) + sent + rtt
                + sum(costs.cloud_ms[l.name] for l in layers[i + 1:]))

    assert planner.chain_costs_ms(costs) == pytest.approx(
        [own_estimate(i) for i in range(-1, len(layers))])
    own_best = min(own_estimate(i) for i in range(-1, len(layers)))
    chosen = planner.choose(costs)
    assert own_estimate(len(chosen) - 1) == pytest.approx(own_best)
    assert chosen == frozenset(l.name for l in graph.layers[: len(chosen)])
    # its plan is charged the true cost, which the DAG optimum never exceeds
    assert costs.evaluate(Qdmp().choose(costs)).total_ms <= costs.evaluate(chosen).total_ms + 1e-6


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_specs(max_nodes=6), data=st.data())
def test_every_plan_total_equals_its_own_per_layer_sum(spec, data):
    graph = capture(SpecDAG(spec), example_input())
    costs = _random_costs(graph, data, _setting(1.5))
    for planner in ("neurosurgeon", "qdmp", "cloud_only", "edge_only"):
        plan = make_plan(costs, get_planner(planner).choose(costs), method=planner, source="x")
        assert recompute_total(plan) == pytest.approx(plan.predicted.total_ms)
        assert plan.predicted.total_ms == pytest.approx(
            sum(plan.predicted.compute_ms.values()) + plan.predicted.transfer_ms
            + plan.predicted.rtt_ms + plan.predicted.serialize_ms)


@pytest.fixture(scope="module")
def nano_v100():
    def make(model: str, link, **kw) -> PlanningProblem:
        link = get_link(link) if isinstance(link, str) else link
        return PlanningProblem(model, EdgeCloudSetting(
            edge=get_device(kw.pop("edge", "jetson-nano")), cloud=get_device("v100-server"),
            link=link, **kw))
    return make


@pytest.mark.parametrize("model", ["vgg16", "alexnet"])
def test_slow_uplink_keeps_vgg_and_alexnet_on_the_edge(nano_v100, model):
    problem = nano_v100(model, "dads-3g")
    _, plan = best_plan(compare_methods(problem))
    assert len(plan.edge_layers) >= 0.8 * len(problem.graph_of(plan.model.graph).layers)


@pytest.mark.parametrize("model", ["vgg16", "alexnet", "resnet50"])
def test_fast_link_sends_everything_to_the_cloud(nano_v100, model):
    gigabit = Link(name="gigabit", bandwidth_mbps=1000.0, rtt_ms=1.0, medium="wired")
    _, plan = best_plan(compare_methods(nano_v100(model, gigabit, edge="raspberry-pi-4")))
    assert plan.edge_layers == []


def test_min_cut_never_worse_than_neurosurgeon_and_strictly_better_somewhere(nano_v100):
    from edgesplit.plan import sweep_link

    sweep = sweep_link(nano_v100("resnet50", "wifi"), ["neurosurgeon", "dads", "qdmp"], points=40)
    gaps = []
    for row in sweep["points"]:
        ns = row["methods"]["neurosurgeon"]["total_ms"]
        assert row["methods"]["dads"]["total_ms"] <= ns + 1e-6  # same raw graph
        assert row["methods"]["qdmp"]["total_ms"] <= ns + 1e-6
        gaps.append(ns - row["methods"]["qdmp"]["total_ms"])
    assert max(gaps) > 1.0  # ms: a skip connection Neurosurgeon's chain view missed


def test_plan_json_round_trip_and_version_check(nano_v100, tmp_path):
    plan = get_planner("qdmp").plan(nano_v100("resnet18", "wifi"))
    path = tmp_path / "plan.json"
    plan.save(path)
    again = load_plan(path)
    assert again == plan and again.version == 1
    data = json.loads(path.read_text())
    data["version"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match="version 7"):
        load_plan(path)
    data["version"] = 1
    data["devices"][0]["layers"].append(data["layers"][-1]["name"])  # placed twice, or on both
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match="exactly one device"):
        load_plan(path)


def test_plan_carries_what_execution_and_rechecking_need(nano_v100):
    problem = nano_v100("resnet18", "wifi")
    plan = get_planner("manual").__class__(["resnet.encoder.stages.1.layers.1.add"]).plan(problem)
    assert plan.edge_layers[-1] == "resnet.encoder.stages.1.layers.1.add"
    assert plan.transfers[0].tensors == ["relu_8"]
    assert plan.transfers[0].bytes == 128 * 28 * 28 * 4
    assert plan.model.input_shapes == [[1, 3, 224, 224]] and plan.model.source == "resnet18"
    assert {layer.name for layer in plan.layers} == {l.name for l in problem.graph.layers}
    assert all(set(layer.latency_ms) == {"edge", "cloud"} for layer in plan.layers)
    assert plan.edge_memory_bytes == problem.graph.peak_memory(plan.edge_layers).total_bytes


def test_privacy_constraint_keeps_front_layers_on_the_edge(nano_v100):
    privacy = "resnet.encoder.stages.0.layers.0.add"
    problem = nano_v100("resnet18", Link(name="fast", bandwidth_mbps=1000, rtt_ms=1),
                        edge="raspberry-pi-4", privacy_layer=privacy)
    plans = compare_methods(problem, ["qdmp", "cloud_only"])
    assert privacy in plans["qdmp"].edge_layers and plans["qdmp"].feasible
    assert not plans["cloud_only"].feasible and "privacy" in plans["cloud_only"].reason
    with pytest.raises(InfeasibleError, match="privacy constraint: layer 'nope'"):
        compare_methods(nano_v100("resnet18", "wifi", privacy_layer="nope"), ["qdmp"])


def test_memory_limit_is_met_or_named(nano_v100):
    problem = nano_v100("vgg16", "dads-3g", edge_memory_bytes=64 * 2**20)
    plans = compare_methods(problem, ["neurosurgeon", "qdmp", "edge_only"])
    assert not plans["edge_only"].feasible and "edge memory" in plans["edge_only"].reason
    assert plans["qdmp"].feasible and plans["qdmp"].edge_memory_bytes <= 64 * 2**20
    tiny = nano_v100("vgg16", "dads-3g", edge_memory_bytes=1000)  # smaller than the input
    with pytest.raises(InfeasibleError, match="edge memory"):
        best_plan(compare_methods(tiny, ["neurosurgeon", "qdmp", "cloud_only", "edge_only"]))


def test_plans_a_saved_program_including_its_raw_graph(tmp_path):
    import torch

    path = tmp_path / "dag.pt2"
    module = SpecDAG([("conv", 0, 0), ("conv", 1, 1), ("add", 1, 2), ("cat", 3, 0)], bn=True)
    torch.export.save(torch.export.export(module.eval(), (example_input(),)), str(path))
    problem = PlanningProblem(str(path), _setting(1.0))
    plans = compare_methods(problem, ["neurosurgeon", "dads", "qdmp"])
    assert plans["dads"].model.graph == "raw" and plans["qdmp"].model.graph == "optimized"
    assert plans["qdmp"].model.source == str(path)
    raw = problem.graph_of("raw")
    assert [layer.name for layer in plans["dads"].layers] == [l.name for l in raw.layers]
    assert sum(l.op == "batch_norm" for l in raw.layers) == 2  # BN kept in the raw graph
    assert not any(l.op == "batch_norm" for l in problem.graph.layers)


@pytest.mark.parametrize("bits, expected", [(8, 150_528), (4, 75_264), (32, 602_112)])
def test_raw_input_crosses_at_input_bits_for_every_method(nano_v100, bits, expected):
    problem = nano_v100("resnet18", "wifi", input_bits=bits)
    for method in ("cloud_only", "cloud16"):
        plan = get_planner(method).plan(problem)
        assert plan.transfers[0].tensors == ["pixel_values"]
        assert plan.transfers[0].bytes == expected
        assert plan.transfers[0].bits == ({} if bits == 32 else {"pixel_values": bits})
        link = problem.setting.link
        assert plan.transfers[0].ms == pytest.approx(link.transfer_ms(expected))


def test_integer_inputs_travel_unchanged(nano_v100):
    problem = nano_v100("bert_mini", "wifi")  # int64 token ids: input_bits does not apply
    plan = get_planner("cloud_only").plan(problem)
    assert plan.transfers[0].bytes == 128 * 8 and plan.transfers[0].bits == {}
