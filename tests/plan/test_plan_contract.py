"""The contract every registered planner keeps, on random DAG models and random settings or
topologies: its plan's predicted total is a recomputation from the plan's own parts, and the
runtime loads it (chain plans) or refuses it naming a chain method (mesh plans)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dag_models import SpecDAG, dag_specs, example_input
from edgesplit.errors import ConfigError
from edgesplit.hardware import AnalyticalCompute, Device, Link, chain, get_device, mesh
from edgesplit.plan import (
    PLANNERS,
    EdgeCloudSetting,
    Plan,
    PlanningProblem,
    get_planner,
    recompute_total,
)
from edgesplit.runtime.program import PlanProgram

PLANNER_NAMES = PLANNERS.names()
CONTRACT = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def _device(name: str, gops: float) -> Device:
    return Device(name=name, kind="npu", compute=AnalyticalCompute(
        peak_gops={32: gops}, memory_bandwidth_gb_per_s=100.0))


links = st.builds(lambda mbps, rtt: Link(name="l", bandwidth_mbps=mbps, rtt_ms=rtt),
                  st.sampled_from([1.0, 10.0, 1000.0]), st.sampled_from([0.0, 2.0, 30.0]))
gops = st.sampled_from([0.5, 5.0, 50.0])


@st.composite
def edge_cloud_settings(draw) -> EdgeCloudSetting:
    return EdgeCloudSetting(edge=get_device(draw(st.sampled_from(["eyeriss", "jetson-nano"]))),
                            cloud=get_device(draw(st.sampled_from(["tpu", "v100-server"]))),
                            link=draw(links), result_at=draw(st.sampled_from(["edge", "cloud"])),
                            input_bits=draw(st.sampled_from([8, 32])))


@st.composite
def chains(draw):
    m = draw(st.integers(2, 4))
    return chain("c", [_device(f"d{i}", draw(gops)) for i in range(m)],
                 [draw(links) for _ in range(m - 1)])


@st.composite
def meshes(draw):
    return mesh("m", [_device("ue", draw(gops))], [draw(links)], _device("root", draw(gops)),
                [_device(f"b{i}", draw(gops)) for i in range(draw(st.integers(2, 3)))],
                draw(links), _device("agg", draw(gops)), draw(links))


NETWORKS = {"edge_cloud": edge_cloud_settings(), "chain": chains(), "mesh": meshes()}


def _options(name: str, problem: PlanningProblem, data) -> dict:
    """What a planner needs besides the problem (the manual split's layer, the manual chain
    assignment's layer counts per device)."""
    if name == "chain_manual":
        n, m = len(problem.graph.layers), len(problem.setting.devices)
        cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=m - 1, max_size=m - 1)))
        bounds = [0, *cuts, n]
        return {"layers_per_device": [b - a for a, b in itertools.pairwise(bounds)]}
    if name != "manual":
        return {}
    layers = [layer.name for layer in problem.graph.layers]
    return {"split_after": [data.draw(st.sampled_from(layers))]}


def check_contract(plan: Plan, problem: PlanningProblem) -> None:
    assert recompute_total(plan) == pytest.approx(plan.predicted.total_ms, rel=1e-9, abs=1e-9)
    latency = sum(t.latency_ms for t in plan.transfers)
    if not plan.parallel_devices:  # the whole plan is the critical path
        assert plan.predicted.total_ms == pytest.approx(
            sum(plan.predicted.compute_ms.values()) + plan.predicted.transfer_ms
            + plan.predicted.rtt_ms + plan.predicted.serialize_ms, rel=1e-9, abs=1e-9)
        assert plan.predicted.rtt_ms == pytest.approx(latency)
    for t in plan.transfers:  # each direction that carries data pays half the link's RTT
        link = next(pl.link for pl in plan.links if {pl.src, pl.dst} == {t.src, t.dst})
        assert t.latency_ms == (link.rtt_ms / 2 if t.tensors else 0.0)
    graph = problem.graph_of(plan.model.graph)
    if plan.runnable:
        program = PlanProgram.load(plan, graph)
        assert [s.name for s in program.steps] == [d.name for d in plan.devices]
        exact = plan.method != "cloud16" and not any(t.bits for t in plan.transfers) and all(
            layer.w_bits is None and layer.a_bits is None for layer in plan.layers)
        if exact:  # a float plan run hop by hop computes what the model computes
            outputs, _ = program.run_local()
            for got, want in zip(outputs, program.unsplit(), strict=True):
                assert torch.allclose(got, want, atol=1e-5)
    else:
        with pytest.raises(ConfigError, match="best_chain"):
            PlanProgram.load(plan, graph)


@pytest.mark.parametrize("name", PLANNER_NAMES)
@CONTRACT
@given(spec=dag_specs(max_nodes=6), data=st.data())
def test_every_planner_keeps_the_plan_contract(name, spec, data):
    cls = PLANNERS.get(name)
    kind = data.draw(st.sampled_from(cls.problems))
    problem = PlanningProblem(SpecDAG(spec), data.draw(NETWORKS[kind]),
                              example_inputs=example_input())
    assert problem.kind in (kind, "chain")  # a drawn mesh is never a chain, but be plain
    plan = get_planner(name, **_options(name, problem, data)).plan(problem)
    assert plan.method == name
    check_contract(plan, problem)


def test_mesh_plans_run_and_the_chain_method_still_gives_a_chain():
    """Issue 39: a mesh plan of the planner's shape runs (it was a prediction only)."""
    from mesh_models import TwoHeads, _mesh

    problem = PlanningProblem(TwoHeads(), _mesh(2.0, 1.0, rtt_ms=0.0),
                              example_inputs=torch.randn(1, 3, 16, 16))
    plan = get_planner("multisplit").plan(problem)
    assert plan.parallel_devices and plan.runnable
    check_contract(plan, problem)
    chain_plan = get_planner("best_chain").plan(problem)
    assert chain_plan.runnable
    check_contract(chain_plan, problem)


def test_planners_refuse_problems_they_do_not_plan_and_unknown_options():
    problem = PlanningProblem(SpecDAG([("conv", 0, 0)]), chain("c", [_device("a", 1.0),
                                                                    _device("b", 1.0)],
                                                               [Link(name="l", bandwidth_mbps=1)]),
                              example_inputs=example_input())
    with pytest.raises(ConfigError, match=r"methods for it: .*multisplit"):
        get_planner("qdmp").plan(problem)
    with pytest.raises(ConfigError, match="takes no option"):
        get_planner("qdmp", bits=[4])
