"""Capture of real models: exact counts from the papers, BN folding, naming, files, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgesplit.errors import CaptureError, ConfigError, UnknownNameError
from edgesplit.graph import capture, load_program, parse_shape
from edgesplit.models import create_model
from helpers import captured


class ConvBNReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU()
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = self.act(self.bn(self.conv(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _randomise_bn(module: nn.Module) -> nn.Module:
    gen = torch.Generator().manual_seed(3)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=gen))
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen))
    return module.eval()


def test_tiny_model_layers_and_hand_computed_costs():
    graph = capture(ConvBNReLU(), torch.randn(1, 3, 8, 8))
    assert [(l.name, l.kind) for l in graph.layers] == [
        ("conv", "conv2d+batch_norm+relu"), ("adaptive_avg_pool2d", "adaptive_avg_pool2d"),
        ("fc", "linear")]
    conv, pool, fc = graph.layers
    assert conv.macs == 4 * 8 * 8 * 3 * 3 * 3
    assert conv.params == 4 * 27 + 4  # folded BN leaves a bias per output channel
    assert conv.param_bytes == conv.params * 4
    assert fc.macs == 5 * 4 and fc.params == 25
    assert graph.tensors[conv.outputs[0]].shape == (1, 4, 8, 8)
    assert graph.tensors[conv.outputs[0]].bytes == 256 * 4
    assert pool.inputs == conv.outputs


def test_raw_graph_keeps_one_layer_per_operator():
    graph = capture(ConvBNReLU(), torch.randn(1, 3, 8, 8), optimize=False)
    assert [l.op for l in graph.layers] == ["conv2d", "batch_norm", "relu",
                                            "adaptive_avg_pool2d", "linear"]
    assert [l.name for l in graph.layers][:3] == ["conv", "bn", "act"]


@pytest.mark.parametrize("factory", [ConvBNReLU, lambda: create_model("resnet18").module,
                                     lambda: create_model("mnasnet").module])
def test_bn_folding_leaves_outputs_unchanged(factory):
    module = _randomise_bn(factory())
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    graph = capture(module, x)
    assert not any(l.op == "batch_norm" for l in graph.layers)
    with torch.no_grad():
        expected = module(x)
        got = graph.program(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_resnet50_matches_autosplit_table10(resnet50):
    cuts = {c.index: c for c in resnet50.single_tensor_cuts()}
    assert cuts[-1].elements == 150_528  # the input image
    assert cuts[len(resnet50) - 1].elements == 1_000  # the logits
    stage4 = [c for c in cuts.values()
              if c.after and c.after.startswith("resnet.encoder.stages.3.")]
    assert [(c.after.rsplit(".", 2)[-2], c.elements, c.tensors[0].shape) for c in stage4] == [
        (str(i), 100_352, (1, 2048, 7, 7)) for i in range(3)]
    assert abs(resnet50.total_macs - 4.1e9) / 4.1e9 < 0.01
    assert sum(l.op == "conv2d" for l in resnet50.layers) == 53


def test_resnet50_names_follow_module_paths(resnet50):
    names = [l.name for l in resnet50.layers]
    assert names[0] == "resnet.embedder.embedder.convolution"
    assert "resnet.encoder.stages.3.layers.0.layer.2.convolution" in names
    assert "resnet.encoder.stages.3.layers.0.shortcut.convolution" in names
    assert names[-1] == "classifier.1"
    assert len(set(names)) == len(names)


def test_torchvision_style_names_on_our_definitions():
    graph = captured("resnext50")
    layer = graph.layer("layer4.0.conv3")
    assert layer.kind == "conv2d+batch_norm"
    add = graph.layer("layer4.0.add")
    assert add.kind == "add+relu" and graph.tensors[add.outputs[0]].elements == 100_352


@pytest.mark.parametrize("name, macs, tolerance", [
    ("vgg16", 15.5e9, 0.01), ("mobilenet_v2", 300e6, 0.02), ("resnet18", 1.82e9, 0.01),
    ("alexnet", 0.714e9, 0.01), ("googlenet", 1.5e9, 0.01), ("resnext50", 4.26e9, 0.01)])
def test_published_mac_counts(name, macs, tolerance):
    assert abs(captured(name).total_macs - macs) / macs < tolerance


def test_transformer_capture_counts_attention():
    graph = captured("bert_mini")
    assert sum(l.op == "sdpa" for l in graph.layers) == 4
    seq, hidden, layers = 128, 256, 4
    # per layer: QKV + output projections 4*H*H, FFN 8*H*H per token, attention 2*L*L*H
    expected = layers * (seq * 12 * hidden * hidden + 2 * seq * seq * hidden)
    assert graph.total_macs == expected
    assert graph.tensors["input_ids"].dtype == "int64"


def test_saved_program_round_trip(tmp_path):
    module, x = ConvBNReLU().eval(), torch.randn(1, 3, 8, 8)
    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(module, (x,)), str(path))
    from_file = capture(path)
    from_module = capture(module, x)
    assert [l.kind for l in from_file.layers] == [l.kind for l in from_module.layers]
    assert from_file.model == "tiny"
    assert from_file.total_macs == from_module.total_macs


def test_errors_are_one_clear_line(tmp_path):
    with pytest.raises(UnknownNameError, match=r"unknown model 'resnet5'.*Did you mean resnet50"):
        capture("resnet5")
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip archive")
    with pytest.raises(CaptureError, match=r"cannot read .*bad\.pt2"):
        load_program(bad)
    with pytest.raises(CaptureError, match="does not exist"):
        capture(tmp_path / "missing.pt2")
    with pytest.raises(CaptureError, match=r"input shape\(s\) \(1, 1, 32, 32\)"):
        capture("resnet18", input_shape=(1, 1, 32, 32))
    with pytest.raises(CaptureError, match="needs example inputs"):
        capture(ConvBNReLU())
    with pytest.raises(ConfigError, match="comma-separated"):
        parse_shape("1,3,a")


def test_data_dependent_control_flow_says_what_failed():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(CaptureError, match=r"torch\.export could not capture Branchy"):
        capture(Branchy(), torch.randn(2, 2))


def test_layer_nodes_map_back_to_the_program(resnet50):
    fx_names = {n.name for n in resnet50.program.graph.nodes}
    covered = [n for l in resnet50.layers for n in l.nodes]
    assert len(covered) == len(set(covered)) and set(covered) <= fx_names
    ops = [n for n in resnet50.program.graph.nodes if n.op == "call_function"]
    assert set(covered) == {n.name for n in ops}


def test_any_down_set_executes_as_its_own_partition():
    """The layer -> FX node mapping is enough to run an edge part and a cloud part separately
    (torch.fx's split_module does the mechanics) with the same result as the whole program."""
    from torch.fx.passes.split_module import split_module

    graph = captured("resnet18")
    x = graph.example_inputs
    with torch.no_grad():
        expected = graph.program(*x)
    for after in ("resnet.embedder.pooler", "resnet.encoder.stages.1.layers.0.add",
                  "resnet.encoder.stages.2.layers.0.shortcut.convolution"):
        edge = set(graph.ancestors_closure([after]))

        def side(node, edge=edge) -> int:  # split_module calls it here, in this iteration
            return 0 if node.meta["edgesplit_layer"] in edge else 1

        parts = split_module(graph.program, graph.program, side)
        with torch.no_grad():
            (got,) = parts(*x)  # split_module returns the flat output tuple
        torch.testing.assert_close(got, expected)
        sent = next(n for n in parts.submod_0.graph.nodes if n.op == "output").args[0]
        sent = sent if isinstance(sent, (tuple, list)) else (sent,)
        assert len(sent) == len(graph.crossing_tensors(edge))  # split_module renames nodes


def test_folded_weights_keep_their_module_names():
    graph = captured("resnet18")
    assert graph.layers[0].param_names == (
        "model.resnet.embedder.embedder.convolution.weight",
        "model.resnet.embedder.embedder.convolution.bias")
    assert graph.total_params == sum(
        p.numel() for p in graph.program.parameters()) + sum(
        b.numel() for b in graph.program.buffers())
