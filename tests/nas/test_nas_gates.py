"""JMSNAS's binary gates: Lemma 1 against autograd, the two-path gate's gradient, sampling."""

from __future__ import annotations

import torch

from edgesplit.nas.jmsnas.binary_gates import (
    binary_gates,
    lemma1_gradient,
    sample_pair,
    sample_path,
)


def _loss(mixed: torch.Tensor) -> torch.Tensor:
    # eq. (7): cross-entropy of a sigmoid of the gated output, labels y
    y = torch.tensor([1.0, 0.0, 1.0])
    h = torch.sigmoid(mixed)
    return -(y * torch.log(h) + (1 - y) * torch.log(1 - h)).mean()


def test_lemma1_equals_autograd_through_the_softmax():
    torch.manual_seed(0)
    alpha = torch.randn(5, dtype=torch.float64, requires_grad=True)
    outputs = torch.randn(5, 3, dtype=torch.float64)  # v_j(x) for each of R = 5 paths
    # autograd: L(softmax(alpha)^T v)
    _loss(torch.softmax(alpha, 0) @ outputs).backward()
    # Lemma 1: dL/dg at g = p, then sum_j dL/dg_j p_j (delta_ij - p_i)
    p = torch.softmax(alpha.detach(), 0)
    g = p.clone().requires_grad_(True)
    _loss(g @ outputs).backward()
    torch.testing.assert_close(lemma1_gradient(p, g.grad), alpha.grad)


def test_two_path_gate_gives_the_pair_lemma1_and_the_rest_nothing():
    torch.manual_seed(1)
    alpha = torch.randn(13, requires_grad=True)
    outputs = torch.randn(13, 3)
    active = (4, 9)
    gates = binary_gates(alpha, active, torch.Generator().manual_seed(0))
    assert sorted(gates.tolist()) == [0.0, 1.0]  # one-hot: one path's output goes forward
    mixed = gates[0] * outputs[4] + gates[1] * outputs[9]
    mixed_detached = mixed.detach().requires_grad_(True)
    _loss(mixed_detached).backward()
    dl_dg = torch.stack([torch.dot(mixed_detached.grad, outputs[i]) for i in active])
    _loss(mixed).backward()
    expected = lemma1_gradient(torch.softmax(alpha.detach()[list(active)], 0), dl_dg)
    torch.testing.assert_close(alpha.grad[list(active)], expected)
    others = [i for i in range(13) if i not in active]
    assert torch.count_nonzero(alpha.grad[others]) == 0


def test_sampling_follows_the_probabilities_and_the_seed():
    alpha = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([sample_path(alpha, gen) for _ in range(3000)]),
                            minlength=3) / 3000
    torch.testing.assert_close(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.03, rtol=0)
    pairs = [sample_pair(alpha, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert pairs[0] == pairs[1] and pairs[0][0] != pairs[0][1]
    assert sample_pair(torch.zeros(1)) == (0, 0)
