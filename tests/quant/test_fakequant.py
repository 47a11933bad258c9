"""Fake-quant of an edge part and AUTO-SPLIT's distortion tables."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from edgesplit.graph import capture
from edgesplit.quant.fakequant import (
    calibrate,
    distortion_table,
    fake_quant_program,
    fake_quantize,
    quantize_weight,
)
from helpers import captured


@pytest.mark.parametrize("bits", [2, 4, 6, 8])
def test_fake_quantize_error_is_half_a_step(bits):
    x = torch.linspace(-3, 5, 1001)
    y = fake_quantize(x, bits, -3.0, 5.0)
    step = 8.0 / ((1 << bits) - 1)
    assert (y - x).abs().max() <= step / 2 + 1e-6
    assert len(torch.unique(y)) <= 1 << bits
    assert torch.equal(fake_quantize(x, 32, -3.0, 5.0), x)


def test_weights_are_quantized_per_output_channel():
    w = torch.randn(16, 8, 3, 3) * torch.logspace(-2, 2, 16).reshape(-1, 1, 1, 1)
    q = quantize_weight(w, 4)
    for c in range(16):
        assert len(torch.unique(q[c])) <= 16
        step = (w[c].max() - w[c].min()) / 15
        assert (q[c] - w[c]).abs().max() <= step / 2 + 1e-6


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[0.0, 1.0, 2.0, 3.0]]))

    def forward(self, x):
        return self.fc(x)


def test_distortion_by_hand():
    graph = capture(Tiny(), torch.ones(1, 4))
    table = distortion_table(graph, calibrate(graph, [(torch.ones(1, 4),)]), bits=(1, 2, 8))
    # 2 bits: grid 0,1,2,3 holds the weights exactly; 1 bit: {0, 3} -> errors 0,1,1,0
    assert table.weight["fc"][2] == pytest.approx(0.0, abs=1e-12)
    assert table.weight["fc"][1] == pytest.approx(0.5)
    assert table.activation["fc"][8] == pytest.approx(0.0, abs=1e-12)  # a constant output


@pytest.fixture(scope="module")
def resnet18_calibrated():
    graph = captured("resnet18")
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(1, 3, 224, 224, generator=gen),) for _ in range(2)]
    return graph, calibrate(graph, batches), batches


def test_fake_quant_edge_part_tracks_bits(resnet18_calibrated):
    graph, cal, batches = resnet18_calibrated
    x = batches[0][0]
    with torch.no_grad():
        reference = graph.program(x)
        edge = graph.ancestors_closure(["resnet.encoder.stages.1.layers.1.add"])
        errors = {}
        for bits in (2, 4, 8):
            program = fake_quant_program(graph, {n: (bits, bits) for n in edge}, cal)
            errors[bits] = float((program(x) - reference).pow(2).mean())
        untouched = fake_quant_program(graph, {}, cal)(x)
    assert torch.equal(untouched, reference)
    assert errors[8] < errors[4] < errors[2]
    cosine = torch.nn.functional.cosine_similarity(
        fake_quant_program(graph, {n: (8, 8) for n in edge}, cal)(x), reference).item()
    assert cosine > 0.99
    assert graph.program(x).shape == reference.shape  # the original program is unchanged
    torch.testing.assert_close(graph.program(x), reference)


def test_distortion_falls_with_bits(resnet18_calibrated):
    graph, cal, _ = resnet18_calibrated
    table = distortion_table(graph, cal, bits=(2, 4, 6, 8, 16))
    for layer in graph.layers:
        w = [table.weight[layer.name][b] for b in table.bits]
        a = [table.activation[layer.name][b] for b in table.bits]
        assert all(x >= y - 1e-12 for x, y in itertools.pairwise(w)), layer.name
        assert all(x >= y - 1e-12 for x, y in itertools.pairwise(a)), layer.name
    assert table.weight["classifier.1"][2] > 0


@pytest.mark.parametrize("model", ["digits_cnn", "bert_mini"])
def test_switchable_program_equals_a_fresh_fake_quant_copy(model):
    """The meter's one-copy program gives exactly fake_quant_program's numbers for any mix of
    widths, and switching back to float restores the float outputs."""
    import random

    from edgesplit.quant import QuantizableProgram

    graph = captured(model)
    cal = calibrate(graph, [graph.example_inputs])
    switchable = QuantizableProgram(graph, cal)
    rng = random.Random(0)
    for _ in range(3):
        bits = {l.name: (rng.choice((2, 4, 8, 16, 32)), rng.choice((2, 4, 8, 16, 32)))
                for l in graph.layers if rng.random() < 0.6}
        with torch.no_grad():
            expected = fake_quant_program(graph, bits, cal)(*graph.example_inputs)
            got = switchable.configure(bits)(*graph.example_inputs)
        assert torch.equal(got, expected)
    with torch.no_grad():
        assert torch.equal(switchable.configure({})(*graph.example_inputs),
                           graph.program(*graph.example_inputs))
