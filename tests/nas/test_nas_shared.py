"""The shared-weight mixed op: every candidate slices one weight set, extracted networks equal
the supernet path, and two gated paths still give the architecture parameters a gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgesplit.errors import ConfigError
from edgesplit.graph import capture
from edgesplit.nas import MBConv
from edgesplit.nas.jmsnas import Supernet, get_space
from edgesplit.nas.jmsnas.binary_gates import binary_gates
from edgesplit.nas.jmsnas.sampler import random_arch
from edgesplit.nas.jmsnas.shared import SharedMixedOp

SPACE = get_space("digits-mbconv")


def _trained_a_little(net: Supernet) -> Supernet:
    """A few steps on random paths, so batch-norm statistics and weights are not at init."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    net.train()
    for _ in range(3):
        for m in net.mixed_ops:
            m.set_paths((int(torch.randint(len(m.specs), (1,), generator=gen)),))
        loss = net(torch.randn(8, 1, 32, 32, generator=gen)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


def test_candidates_slice_one_weight_set():
    op = SharedMixedOp(16, 16, 1, [o for o in SPACE.layers[0].ops])
    big = next(i for i, s in enumerate(op.specs) if s.name == "mb7_e6")
    small = next(i for i, s in enumerate(op.specs) if s.name == "mb3_e3")
    full, part = op.candidate_state(big), op.candidate_state(small)
    torch.testing.assert_close(part["expand.weight"], full["expand.weight"][:48])
    torch.testing.assert_close(part["depthwise.weight"], full["depthwise.weight"][:48, :, 2:5, 2:5])
    torch.testing.assert_close(part["project.weight"], full["project.weight"][:, :48])
    plain = MBConv(16, 16, 3, 3, 1, shortcut=False)
    assert set(part) == set(plain.state_dict())


def test_extracted_networks_equal_the_shared_supernet_and_capture():
    net = _trained_a_little(Supernet(SPACE, weights="shared"))
    rng = np.random.default_rng(1)
    x = torch.randn(4, 1, 32, 32)
    for arch in [random_arch(SPACE, rng) for _ in range(4)] + [SPACE.fixed_arch("largest")]:
        net.set_arch(arch)
        extracted = net.extract(arch).eval()
        torch.testing.assert_close(extracted(x), net(x))
    graph = capture(extracted, x[:1])
    torch.testing.assert_close(graph.program(x[:1]), extracted(x[:1]), rtol=1e-4, atol=1e-5)


def test_two_gated_paths_give_the_pair_a_gradient():
    net = Supernet(SPACE, weights="shared").train()
    alpha = [torch.zeros(len(l.ops), requires_grad=True) for l in SPACE.layers]
    for m, a in zip(net.mixed_ops, alpha, strict=True):
        pair = (0, len(m.specs) - 1)
        m.set_paths(pair, binary_gates(a, pair))
    net(torch.randn(4, 1, 32, 32)).sum().backward()
    for a in alpha:
        assert torch.count_nonzero(a.grad) == 2 and a.grad[0] != 0 and a.grad[-1] != 0


def test_unknown_weight_mode_is_refused():
    with pytest.raises(ConfigError, match="choose 'separate'"):
        Supernet(SPACE, weights="tied")  # type: ignore[arg-type]
