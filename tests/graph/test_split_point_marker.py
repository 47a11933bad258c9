"""Split points marked in the model's code (``x = edgesplit.split_point(x, "name")``, as
torch.distributed.pipelining's ``pipe_split()``): the marker computes nothing, changes no
layer or output, and its name is a split point that ``resolve_split_point``, the manual
planner, ``plan --split-after`` and ``inspect`` accept, cutting so that exactly the marked tensor
is sent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import edgesplit
from edgesplit.cli import app
from edgesplit.errors import CaptureError, ConfigError, GraphError
from edgesplit.graph import capture
from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram

runner = CliRunner()


class Net(nn.Module):
    """conv+BN+ReLU encoder, then flatten and a linear head; ``marked`` puts a named marker on
    the encoder's output (``flatten`` then fuses into the head instead of the encoder)."""

    def __init__(self, marked: bool = True) -> None:
        super().__init__()
        self.marked = marked
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 6 * 6, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        if self.marked:
            y = edgesplit.split_point(y, "after_encoder")
        return self.head(y.flatten(1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return edgesplit.split_point(torch.relu(self.fc(x)), "block_out")


class Shared(nn.Module):
    """One marked block run twice, and an unnamed marker."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(4, 8), Block(), nn.Linear(8, 2)

    def forward(self, x):
        x = edgesplit.split_point(self.stem(x))
        return self.head(self.block(self.block(x)))


def _pair() -> tuple[Net, Net, torch.Tensor]:
    torch.manual_seed(0)
    marked = Net().eval()
    with torch.no_grad():  # a batch-norm that is not the identity, so folding shows
        marked.bn.running_mean.uniform_(-1, 1)
        marked.bn.running_var.uniform_(0.5, 2)
        marked.bn.weight.uniform_(0.5, 2)
    plain = Net(marked=False).eval()
    plain.load_state_dict(marked.state_dict())
    return marked, plain, torch.randn(1, 3, 6, 6)


def _setting() -> EdgeCloudSetting:
    return EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                            link=get_link("4g"), input_bits=32)


# ---- the marker itself ---------------------------------------------------------------------
def test_marker_hands_back_the_same_tensor_and_import_edgesplit_stays_light():
    x = torch.randn(2, 3, requires_grad=True)
    assert edgesplit.split_point(x) is x
    assert edgesplit.split_point is edgesplit.graph.split_point
    (edgesplit.split_point(x * 2, "doubled")).sum().backward()  # autograd passes through
    assert torch.equal(x.grad, torch.full((2, 3), 2.0))
    code = "import sys, edgesplit; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("value", "name"), [((torch.ones(1),), None), (torch.ones(1), "a,b"),
                                             (torch.ones(1), " a"), (torch.ones(1), "")])
def test_marker_refuses_what_is_not_one_tensor_or_a_usable_name(value, name):
    with pytest.raises(ConfigError, match="split_point"):
        edgesplit.split_point(value, name)


# ---- capture: identity, same layers, same outputs ------------------------------------------
def test_marked_model_equals_the_unmarked_model_captured_and_split():
    marked, plain, x = _pair()
    assert torch.equal(marked(x), plain(x))
    graph, reference = capture(marked, x), capture(plain, x)
    assert graph.split_points == {"after_encoder": "relu"}
    # same layers, costs and folding: the marker is no layer and keeps the BN folded
    assert [layer.kind for layer in graph.layers] == [layer.kind for layer in reference.layers] \
        == ["conv2d+batch_norm+relu", "linear"]
    assert [layer.macs for layer in graph.layers] == [layer.macs for layer in reference.layers]
    assert graph.total_params == reference.total_params
    assert not any("split_point" in str(node.target) for node in graph.program.graph.nodes)
    with torch.no_grad():
        assert torch.equal(graph.program(x), reference.program(x))

    problem = PlanningProblem(marked, _setting(), example_inputs=x)
    program = PlanProgram.load(Manual(["after_encoder"]).plan(problem), problem.graph)
    outputs, _ = program.run_local()
    with torch.no_grad():
        assert torch.equal(outputs[0], reference.program(x))


def test_cut_after_the_marker_sends_exactly_the_marked_tensor():
    marked, _, x = _pair()
    problem = PlanningProblem(marked, _setting(), example_inputs=x)
    graph = problem.graph
    assert graph.resolve_split_point("after_encoder") == ["conv"]
    edge = graph.split_layers(["after_encoder"])
    crossing = graph.crossing_tensors(edge, include_outputs=False)
    assert [t.name for t in crossing] == ["relu"]
    assert crossing[0].shape == (1, 8, 6, 6) and crossing[0].bytes == 8 * 6 * 6 * 4
    plan = Manual(["after_encoder"]).plan(problem)
    assert plan.devices[0].layers == ["conv"]
    sent = next(t for t in plan.transfers if t.src == "edge")
    assert sent.tensors == ["relu"] and sent.bytes == 8 * 6 * 6 * 4


def test_a_marker_inside_a_fused_layer_ends_the_layer_there():
    class ConvRelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.relu(edgesplit.split_point(self.conv(x), "pre_act"))

    graph = capture(ConvRelu().eval(), torch.randn(1, 3, 5, 5))
    assert [layer.kind for layer in graph.layers] == ["conv2d", "relu"]
    assert [t.name for t in graph.crossing_tensors(graph.split_layers(["pre_act"]))] == \
        [graph.split_points["pre_act"]] == ["conv2d"]


def test_a_marker_on_a_value_the_inputs_do_not_reach_is_refused():
    class Constant(nn.Module):
        def forward(self, x):
            return x + edgesplit.split_point(torch.ones(3) * 2, "bias")

    with pytest.raises(CaptureError, match=r"split point 'bias' .* does not depend on"):
        capture(Constant(), torch.randn(1, 3))


# ---- names: captured twice, run twice, unknown ---------------------------------------------
def test_marker_in_a_model_captured_twice_and_a_marked_block_run_twice():
    torch.manual_seed(0)
    model, x = Shared().eval(), torch.randn(1, 4)
    first, second, raw = capture(model, x), capture(model, x), capture(model, x, optimize=False)
    assert first.split_points == second.split_points == raw.split_points == {
        "split_point": "linear", "block_out": "relu", "block_out_1": "relu_1"}
    assert first.resolve_split_point("block_out") == ["block.fc"]
    assert first.resolve_split_point("block_out_1") == ["block.fc.linear"]
    for graph in (first, second, raw):
        for name, tensor in graph.split_points.items():
            edge = graph.split_layers([name])
            assert [t.name for t in graph.crossing_tensors(edge)] == [tensor]
    with torch.no_grad():
        assert torch.equal(second.program(x), model(x))


def test_unknown_split_point_names_the_marked_ones():
    torch.manual_seed(0)
    graph = capture(Shared().eval(), torch.randn(1, 4))
    with pytest.raises(GraphError) as info:
        graph.split_layers(["block_ot"])
    message = str(info.value)
    assert "\n" not in message and "no layer named 'block_ot'" in message
    assert "Did you mean split point block_out" in message
    assert message.endswith("Split points marked in the model: split_point, block_out, "
                            "block_out_1.")


# ---- the command line ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def marked_file(tmp_path_factory) -> str:
    marked, _, x = _pair()
    path = tmp_path_factory.mktemp("marked") / "marked.pt2"
    torch.export.save(torch.export.export(marked, (x,)), str(path))
    return str(path)


def test_plan_and_inspect_take_the_marker_name(tmp_path, marked_file):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", marked_file, "--split-after", "after_encoder",
                                 "--method", "manual", "--out", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["devices"][0]["layers"] == ["conv"]
    sent = next(t for t in plan["transfers"] if t["src"] == "edge")
    assert sent["tensors"] == ["relu"] and sent["bytes"] == 8 * 6 * 6 * 4

    result = runner.invoke(app, ["inspect", marked_file, "--json", "--split-after",
                                 "after_encoder"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["split_points"] == [{"name": "after_encoder", "tensor": "relu", "after": "conv",
                                    "crossing": ["relu"], "crossing_bytes": 1152}]
    assert doc["split"]["after"] == ["conv"] and doc["split"]["crossing"] == ["relu"]
    result = runner.invoke(app, ["inspect", marked_file, "--cuts-only"])
    assert result.exit_code == 0 and "split points marked" in result.stdout
    assert "after_encoder" in result.stdout

    result = runner.invoke(app, ["plan", marked_file, "--split-after", "after_encodr",
                                 "--method", "manual"])
    assert result.exit_code == 2
    assert "Split points marked in the model: after_encoder." in result.output
