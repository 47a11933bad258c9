"""Cut tensors and peak memory against brute force on small DAGs with skip connections and
concatenations, plus a hand-computed AUTO-SPLIT Fig. 4 style block."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch import nn

from dag_models import InvertedResidual, SpecDAG, dag_specs, example_input
from edgesplit.errors import GraphError
from edgesplit.graph import INPUT, LayerGraph, capture, prefix_peak_memory


# ---- brute force, computed on the FX program directly, not on the LayerGraph's tensor table ----
def _fx_nodes(graph: LayerGraph, layers) -> set[str]:
    return {node for name in layers for node in graph.layer(name).nodes}


def _fx_crossing(graph: LayerGraph, edge: set[str]) -> set[str]:
    """FX values computed on the edge (or model inputs) that some node off the edge reads."""
    inside = _fx_nodes(graph, edge)
    crossing = set()
    for node in graph.program.graph.nodes:
        if (node.op == "placeholder" or node.name in inside) and \
                any(u.op == "output" or u.name not in inside for u in node.users):
            crossing.add(node.name)
    return crossing


def _down_sets(graph: LayerGraph):
    names = [layer.name for layer in graph.layers]
    for mask in range(2 ** len(names)):
        edge = {names[i] for i in range(len(names)) if mask >> i & 1}
        if all(p in edge for n in edge for p in graph.predecessors(n)):
            yield edge


def _brute_peak(graph: LayerGraph, edge: set[str]) -> tuple[int, int]:
    schedule = [layer for layer in graph.layers if layer.name in edge]
    nodes = {n: k for k, layer in enumerate(schedule) for n in layer.nodes}
    fx = {n.name: n for n in graph.program.graph.nodes}
    peak = 0
    for k in range(len(schedule)):
        live = 0
        for name, node in fx.items():
            if node.op not in ("placeholder", "call_function"):
                continue
            if node.op == "call_function" and name not in nodes:
                continue
            start = nodes.get(name, 0)
            readers = [nodes[u.name] for u in node.users
                       if (u.name in nodes and nodes[u.name] != start)
                       or (u.name in nodes and node.op == "placeholder")]
            leaves = any(u.op == "output" or u.name not in nodes for u in node.users)
            if node.op == "placeholder" and not readers:
                continue
            if not readers and not leaves:
                continue  # internal to one layer
            end = len(schedule) - 1 if leaves else max(readers)
            if start <= k <= end:
                val = node.meta["val"]
                live += val.numel() * val.element_size()
        peak = max(peak, live)
    # raw inputs no edge layer reads are held alone, before the first layer, until sent
    unread = [n for n in fx.values() if n.op == "placeholder"
              and not any(u.name in nodes for u in n.users)]
    peak = max(peak, sum(n.meta["val"].numel() * n.meta["val"].element_size() for n in unread))
    weights = {str(n.target) for layer in schedule for name in layer.nodes
               for n in fx[name].all_input_nodes if n.op == "get_attr"}
    return peak, sum(graph.attribute_bytes[w] for w in weights)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_specs(), optimize=...)
def test_crossing_and_peak_memory_match_brute_force(spec, optimize: bool):
    graph = capture(SpecDAG(spec), example_input(), optimize=optimize)
    for edge in _down_sets(graph):
        got = {t.name for t in graph.crossing_tensors(edge)}
        assert got == _fx_crossing(graph, edge)
        report = graph.peak_memory(edge)
        assert (report.activation_bytes, report.weight_bytes) == _brute_peak(graph, edge)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_specs(max_nodes=9))
def test_topological_cuts_match_prefix_brute_force(spec):
    graph = capture(SpecDAG(spec), example_input())
    prefixes = [[layer.name for layer in graph.layers[:k]] for k in range(len(graph) + 1)]
    assert prefix_peak_memory(graph) == [graph.peak_memory(p).total_bytes for p in prefixes]
    cuts = graph.cuts()
    assert [c.index for c in cuts] == list(range(-1, len(graph)))
    for cut in cuts:
        prefix = {layer.name for layer in graph.layers[: cut.index + 1]}
        assert {t.name for t in cut.tensors} == _fx_crossing(graph, prefix)
        assert cut.bytes == sum(t.bytes for t in cut.tensors)


@pytest.fixture(scope="module")
def block() -> LayerGraph:
    return capture(InvertedResidual(), torch.randn(1, 3, 8, 8))


def test_hand_computed_block_layers(block):
    assert [layer.kind for layer in block.layers] == [
        "conv2d", "conv2d+relu", "conv2d+relu", "conv2d", "add"]
    assert [layer.name for layer in block.layers] == ["stem", "expand", "dw", "project", "add"]
    # MACs: out elements x (C_in / groups) x k^2
    assert [layer.macs for layer in block.layers] == [
        4 * 64 * 27, 8 * 64 * 4, 8 * 64 * 9, 4 * 64 * 8, 0]
    assert [layer.params for layer in block.layers] == [112, 40, 80, 36, 0]


def test_hand_computed_peak_memory(block):
    everything = [layer.name for layer in block.layers]
    report = block.peak_memory(everything)
    # While dw runs: stem output (1024 B, kept for the skip) + expand output (2048) + dw (2048).
    assert report.activation_bytes == 1024 + 2048 + 2048
    assert report.peak_layer == "dw"
    assert report.weight_bytes == (112 + 40 + 80 + 36) * 4
    assert report.total_bytes == 5120 + 1072
    head = block.peak_memory(["stem", "expand"])
    assert head.activation_bytes == 1024 + 2048  # both cross, so both stay until sent


def test_skip_connection_crosses_the_cut(block):
    crossing = block.crossing_tensors(["stem", "expand"])
    assert [(t.producer, t.bytes) for t in crossing] == [("stem", 1024), ("expand", 2048)]
    assert [t.name for t in block.crossing_tensors([])] == ["x"]
    assert block.crossing_tensors([])[0].producer == INPUT
    # The full model on the edge: only the result leaves, unless outputs stay local.
    everything = [layer.name for layer in block.layers]
    assert [t.producer for t in block.crossing_tensors(everything)] == ["add"]
    assert block.crossing_tensors(everything, include_outputs=False) == []


def test_single_tensor_cuts_skip_the_inside_of_a_residual_block(block):
    assert [(c.index, c.elements) for c in block.single_tensor_cuts()] == [
        (-1, 192), (0, 256), (4, 256)]


def test_edge_part_must_be_a_down_set(block):
    with pytest.raises(GraphError, match="depend on"):
        block.crossing_tensors(["expand"])
    assert block.ancestors_closure(["dw"]) == ["stem", "expand", "dw"]
    with pytest.raises(GraphError, match=r"no layer named 'dww'.*Did you mean dw"):
        block.peak_memory(["dww"])


def test_bytes_at_bits_packs_densely(block):
    tensor = block.tensors[block.layer("dw").outputs[0]]
    assert tensor.elements == 512
    assert [tensor.bytes_at(b) for b in (1, 2, 4, 6, 8, 16, 32)] == [64, 128, 256, 384, 512,
                                                                     1024, 2048]


def test_quantized_sizes_override_memory(block):
    names = [l.name for l in block.layers]
    sizes = {t: block.tensors[t].bytes_at(8) for l in block.layers for t in l.outputs}
    weights = {a: b // 4 for a, b in block.attribute_bytes.items()}
    report = block.peak_memory(names, tensor_bytes=sizes, attribute_bytes=weights)
    assert report.activation_bytes == (1024 + 2048 + 2048) // 4
    assert report.weight_bytes == 1072 // 4


def test_multi_consumer_tensor_crosses_once():
    class Fan(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (nn.Conv2d(2, 2, 1) for _ in range(3))

        def forward(self, x):
            h = self.a(x)
            return self.b(h) + self.c(h)

    graph = capture(Fan(), torch.randn(1, 2, 4, 4))
    crossing = graph.crossing_tensors(["a"])
    assert len(crossing) == 1 and crossing[0].consumers == ("b", "c")
    for edge in itertools.chain([["a"]], [["a", "b"]]):
        assert sum(t.bytes for t in graph.crossing_tensors(edge)) == 2 * 16 * 4 * (len(edge))


def test_raw_input_read_late_crosses_with_the_cut():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)

        def forward(self, x, y):
            return self.conv(x) + y

    graph = capture(TwoInputs(), (torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)))
    assert graph.inputs == ("x", "y")
    crossing = graph.crossing_tensors(["conv"])
    assert [(t.name, t.producer) for t in crossing] == [("y", INPUT), ("conv2d", "conv")]
    assert graph.crossing_bytes(["conv"]) == 2 * 32 * 4
    # y is never read on the edge: held only until sent, before conv runs
    assert graph.peak_memory(["conv"]).activation_bytes == 2 * 32 * 4
    assert graph.peak_memory([]).activation_bytes == 2 * 128  # both inputs, until sent


def test_prefix_memory_sweep_on_real_models():
    from helpers import captured

    for name in ("resnet18", "bert_mini"):
        graph = captured(name)
        sweep = prefix_peak_memory(graph)
        for k in range(0, len(graph) + 1, 7):
            assert sweep[k] == graph.peak_memory([l.name for l in graph.layers[:k]]).total_bytes
