"""Split points named by module path (``model.layers.1``, ``resnet.encoder.stages.1``) as well
as by fused-layer name: one resolution rule on LayerGraph (``resolve_split_point``), used by
the manual planner, ``inspect --split-after`` and the privacy layer; and the fusion rule that
keeps a module cut to the module's output (a Llama block sends the residual stream only)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import GraphError, InfeasibleError
from edgesplit.graph import LayerGraph, capture
from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram

runner = CliRunner()


def _setting(**kwargs) -> EdgeCloudSetting:
    # raw inputs at 32 bits: every hop is exact, so a split run equals the unsplit model
    return EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                            link=get_link("4g"), input_bits=32, **kwargs)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class TwoMatmuls(nn.Module):
    """A leaf module of two layers: its path is also the name of its first layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8, 3))

    def forward(self, x):
        return (x @ self.a) @ self.b


class Stack(nn.Module):
    """Twelve blocks, so ``layers.1`` has siblings ``layers.10`` and ``layers.11``."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(12))
        self.head = TwoMatmuls()

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module")
def stack_file(tmp_path_factory) -> str:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("stack") / "stack.pt2"
    torch.export.save(torch.export.export(Stack().eval(), (torch.randn(2, 8),)), str(path))
    return str(path)


@functools.cache
def _llama() -> LayerGraph:
    return capture("llama_tiny")


def _plan_program(problem: PlanningProblem, name: str) -> PlanProgram:
    return PlanProgram.load(Manual([name]).plan(problem))


def _assert_split_equals_unsplit(program: PlanProgram) -> None:
    outputs, _ = program.run_local()
    for got, want in zip(outputs, program.unsplit(), strict=True):
        assert torch.equal(got, want)


# ---- the resolution rule -------------------------------------------------------------------
def test_module_path_takes_its_layers_and_not_a_sibling_with_a_longer_number(stack_file):
    graph = capture(stack_file)
    block = ["layers.1.fc1", "layers.1.fc2", "layers.1.add"]
    assert graph.resolve_split_point("layers.1") == block
    assert graph.resolve_split_point("layers.10")[0] == "layers.10.fc1"
    edge = graph.split_layers(["layers.1"])
    assert edge == ["layers.0.fc1", "layers.0.fc2", "layers.0.add", *block]
    assert not any(name.startswith(("layers.10", "layers.11")) for name in edge)
    assert [t.name for t in graph.crossing_tensors(edge)] == \
        list(graph.layer("layers.1.add").outputs)
    # a module whose only op fused into another module's layer (the ReLU into fc1) ends there
    assert graph.layer("layers.1.fc1").kind == "linear+relu"
    assert graph.resolve_split_point("layers.1.act") == ["layers.1.fc1"]


def test_a_layer_name_wins_over_the_module_of_the_same_path(stack_file):
    graph = capture(stack_file)
    head = [layer.name for layer in graph.layers if layer.module_path == "head"]
    assert head == ["head", "head.matmul"]
    assert graph.resolve_split_point("head") == ["head"]  # the layer, not the whole module
    assert graph.split_layers(["layers"]) == graph.split_layers(["layers.11"])


def test_unknown_name_is_one_line_suggesting_close_layers_and_modules(stack_file):
    graph = capture(stack_file)
    with pytest.raises(GraphError) as info:
        graph.split_layers(["layer.1"])
    message = str(info.value)
    assert "\n" not in message and "no layer named 'layer.1'" in message
    assert "Did you mean module layers.1, " in message and " or layer layers." in message
    with pytest.raises(GraphError, match=r"Did you mean module layers\.1"):
        Manual(["layer.1"]).plan(PlanningProblem(stack_file, _setting()))


def test_privacy_module_keeps_the_whole_module_on_the_edge(stack_file):
    costs = PlanningProblem(stack_file, _setting(privacy_layer="layers.2")).costs()
    assert costs.forced_edge() == frozenset(costs.graph.split_layers(["layers.2.add"]))
    bad = PlanningProblem(stack_file, _setting(privacy_layer="layers.99")).costs()
    with pytest.raises(InfeasibleError, match=r"privacy constraint: layer 'layers.99'.*module"):
        bad.forced_edge()


# ---- same plans and outputs as the fused-layer name ----------------------------------------
@pytest.mark.parametrize(("model", "shape", "module", "layer"), [
    ("resnet18", (1, 3, 64, 64), "resnet.encoder.stages.1",
     "resnet.encoder.stages.1.layers.1.add"),
    ("llama_tiny", None, "model.layers.1", "model.layers.1.add_1"),
])
def test_module_split_equals_the_layer_split(model, shape, module, layer):
    problem = PlanningProblem(model, _setting(), input_shape=shape)
    by_module, by_layer = _plan_program(problem, module), _plan_program(problem, layer)
    assert by_module.plan.devices[0].layers == by_layer.plan.devices[0].layers
    assert problem.graph.split_layers([module]) == problem.graph.ancestors_closure([layer])
    _assert_split_equals_unsplit(by_module)


# ---- the Llama block cut -------------------------------------------------------------------
def test_llama_block_cut_sends_the_residual_stream_only():
    graph = _llama()
    edge = graph.split_layers(["model.layers.1"])
    crossing = graph.crossing_tensors(edge)
    assert len(crossing) == 1  # not also its square from the next block's RMSNorm (16 KiB)
    assert crossing[0].producer == "model.layers.1.add_1" and crossing[0].shape == (1, 32, 64)
    assert crossing[0].bytes == 8 * 1024
    for i in range(4):  # every block, and the embedding, is a single-tensor cut
        assert len(graph.crossing_tensors(graph.split_layers([f"model.layers.{i}"]))) == 1
        assert graph.modules_ending_at(f"model.layers.{i}.add_1")[-1] == f"model.layers.{i}"
    assert len(graph.crossing_tensors(graph.split_layers(["model.embed_tokens"]))) == 1
    # the RMSNorm is one layer again (reduction with its element-wise prologue and epilogue)
    assert graph.layer("model.layers.2.input_layernorm").kind.startswith("mean+to+pow")


# ---- the command line ----------------------------------------------------------------------
def test_cli_plan_and_inspect_take_a_module_path(tmp_path, stack_file):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", "llama_tiny", "--split-after", "model.layers.1",
                                 "--method", "manual", "--out", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["devices"][0]["layers"][-1] == "model.layers.1.add_1"
    sent = next(t for t in plan["transfers"] if t["src"] == "edge")
    assert sent["tensors"] == ["add_14"] and sent["bytes"] == 8 * 1024  # the result comes back

    result = runner.invoke(app, ["inspect", "llama_tiny", "--json", "--split-after",
                                 "model.layers.1"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["split"]["after"] == ["model.layers.1.add_1"]
    assert len(doc["split"]["crossing"]) == 1 and doc["split"]["crossing_bytes"] == 8 * 1024
    cut = next(c for c in doc["cuts"] if c["after"] == "model.layers.1.add_1")
    assert cut["modules"] == ["model.layers.1"]
    assert doc["layers"][0]["module"] == "model.embed_tokens"

    result = runner.invoke(app, ["inspect", stack_file, "--cuts-only", "--split-after",
                                 "layers.1"])
    assert result.exit_code == 0, result.output
    assert "after module" in result.stdout and "split after layers.1.add" in result.stdout
    result = runner.invoke(app, ["inspect", stack_file, "--split-after", "layer.1"])
    assert result.exit_code == 2 and "Did you mean module layers.1" in result.output
