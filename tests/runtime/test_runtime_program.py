"""A Plan as partitions in one process: exact reassembly, quantized edge parts, ONNX export."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import get_device, get_link, get_topology
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, get_planner
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram


def _setting(**kw) -> EdgeCloudSetting:
    return EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                            link=get_link("4g"), **kw)


@pytest.fixture(scope="module")
def dag_plan():
    """resnet18 cut inside a residual block: the block input (skip) crosses too."""
    problem = PlanningProblem("resnet18", _setting(input_bits=32))
    return Manual(["resnet.encoder.stages.1.layers.0.layer.0.convolution"]).plan(problem)


def test_dag_cut_reassembles_exactly(dag_plan):
    program = PlanProgram.load(dag_plan)
    assert len(program.steps[0].sends) >= 2  # a real DAG cut: several tensors cross
    out, _ = program.run_local()
    assert torch.equal(out[0], program.unsplit()[0])


def test_chain_plan_over_four_devices_reassembles_exactly():
    from edgesplit.graph import capture
    from edgesplit.plan.topology_run import compare_topology_methods

    graph = capture("resnet18")
    _, plans = compare_topology_methods(graph, get_topology("jmsnas-chain"), source="resnet18")
    program = PlanProgram.load(plans["multisplit"], graph)
    assert [s.name for s in program.steps] == ["ue", "sbs", "mbs", "cloud"]
    out, _ = program.run_local()
    assert torch.allclose(out[0], program.unsplit()[0], atol=1e-5)


def test_quantized_plan_quantizes_edge_weights_and_stays_close():
    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("eyeriss"), cloud=get_device("tpu"), link=get_link("autosplit-3mbps")))
    plan = get_planner("u8").plan(problem)
    program = PlanProgram.load(plan)
    part = program.steps[0].partition
    weights = [v for k, v in part.module.named_parameters() if v.dim() >= 2]
    assert weights and all(len(torch.unique(w[0])) <= 256 for w in weights)  # 8-bit grid
    out, _ = program.run_local()
    ref = program.unsplit()[0]
    assert 0 < (out[0] - ref).abs().max() < 0.1 * ref.abs().max()
    assert torch.equal(out[0].argmax(1), ref.argmax(1))


def test_onnx_export_matches_torch(dag_plan, tmp_path):
    import onnxruntime as ort

    program = PlanProgram.load(dag_plan)
    models = program.export_onnx()
    assert set(models) == {"edge", "cloud"}
    values = program.example_values()
    for step in program.steps:
        session = ort.InferenceSession(models[step.name], providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == list(step.partition.inputs)
        got = session.run(None, {t: values[t].numpy() for t in step.partition.inputs})
        want = step.partition.run(values)
        for name, array in zip(step.partition.outputs, got, strict=True):
            np.testing.assert_allclose(array, want[name].numpy(), atol=1e-4, rtol=1e-4)
    onnx_program = PlanProgram.load(dag_plan, backend="onnxruntime")
    assert torch.allclose(onnx_program.run_local()[0][0], program.unsplit()[0], atol=1e-4)
    manifest = program.manifest()
    assert manifest["devices"][0]["sends"] == list(program.steps[0].sends)
    json.dumps(manifest)


def test_plans_that_cannot_run_say_why(dag_plan):
    other = PlanningProblem("resnet34", _setting())
    foreign = get_planner("qdmp").plan(other).model_copy(
        update={"model": dag_plan.model})  # resnet34's layers, resnet18's model
    with pytest.raises(ConfigError, match="do not match"):
        PlanProgram.load(foreign)
    with pytest.raises(ConfigError, match="mesh"):
        PlanProgram.load(dag_plan.model_copy(update={"parallel_devices": ["cloud"]}))
    with pytest.raises(ConfigError, match="backend"):
        PlanProgram.load(dag_plan, backend="tensorrt")
    program = PlanProgram.load(dag_plan)
    with pytest.raises(ConfigError, match="must be"):
        program.run_local([torch.zeros(1, 3, 32, 32)])
    with pytest.raises(ConfigError, match="not in the plan"):
        program.step("phone")
