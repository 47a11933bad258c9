"""JMSNAS search mechanics: two-path memory, the search loop and its refusals, derivation
within the budget. Accuracy is not asserted (it depends on the machine's arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from edgesplit.data.training import LabelledData, load_labelled
from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.hardware import get_topology
from edgesplit.nas.jmsnas import Supernet, get_space
from edgesplit.nas.jmsnas.binary_gates import binary_gates
from edgesplit.nas.jmsnas.chain_latency import ChainLatency
from edgesplit.nas.jmsnas.search import JMSNAS, derive_within_budget

SPACE = get_space("digits-mbconv")
TOPOLOGY = get_topology("jmsnas-chain")


@dataclass
class MacTable:
    """Latency proportional to MACs: a stand-in for a device's latency table."""

    gmacs_per_ms: float
    stem_ms: float = 0.05
    head_ms: float = 0.05

    def layer_vector(self, i: int) -> list[float]:
        h, w = SPACE.in_size(i)
        layer = SPACE.layers[i]
        return [op.macs(SPACE.in_channels(i), layer.out_channels, layer.stride, h, w)
                / (self.gmacs_per_ms * 1e6) for op in layer.ops]


TABLES = {d: MacTable(g) for d, g in zip(TOPOLOGY.chain_order(), (5, 20, 100, 1000),
                                         strict=True)}


def _saved_bytes(step) -> int:
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return total


def test_two_path_architecture_steps_keep_memory_about_twice_one_path():
    net = Supernet(SPACE).train()
    x, y = torch.randn(16, 1, 32, 32), torch.randint(0, 10, (16,))
    alpha = [torch.zeros(len(l.ops), requires_grad=True) for l in SPACE.layers]
    big = [len(l.ops) - 1 for l in SPACE.layers]  # mb7_e6(_sc): the most memory per path

    def one_path():
        for m, i in zip(net.mixed_ops, big, strict=True):
            m.set_paths((i,))
        F.cross_entropy(net(x), y).backward()

    def two_paths():
        for m, a, i in zip(net.mixed_ops, alpha, big, strict=True):
            pair = (i, i - 1)
            m.set_paths(pair, binary_gates(a, pair))
        F.cross_entropy(net(x), y).backward()

    def all_paths():
        for m, a in zip(net.mixed_ops, alpha, strict=True):
            paths = tuple(range(len(m.specs)))
            m.set_paths(paths, torch.softmax(a, 0))
        F.cross_entropy(net(x), y).backward()

    one, two, every = _saved_bytes(one_path), _saved_bytes(two_paths), _saved_bytes(all_paths)
    assert 1.5 < two / one < 2.3
    assert every / one > 5


def _small_digits() -> LabelledData:
    data = load_labelled("digits")
    return LabelledData("digits", data.train.subset(slice(0, 160)),
                        data.test.subset(slice(0, 80)), data.classes)


def test_search_logs_every_epoch_and_derives_within_the_budget():
    latency = ChainLatency.best_placement(SPACE, TOPOLOGY, TABLES)
    uniform = [torch.full((len(l.ops),), 1 / len(l.ops)) for l in SPACE.layers]
    budget = 0.8 * float(latency(uniform))
    search = JMSNAS(latency_budget_ms=budget, warmup_epochs=1, epochs=1, retrain_epochs=1,
                    batch_size=32).fit(_small_digits(), SPACE, latency)
    assert [h.phase for h in search.history_] == ["warm-up", "search"]
    assert search.history_[0].arch_loss is None and search.history_[1].arch_loss is not None
    assert search.arch_ms_ <= budget
    assert search.arch_ms_ == pytest.approx(latency.of_arch(search.arch_))
    search.retrain()
    assert 0 <= search.accuracy_ <= 100
    doc = search.summary()
    assert doc["arch"] == search.arch_.to_dict() and len(doc["history"]) == 2
    x = torch.randn(2, 1, 32, 32)
    search.supernet_.eval().set_arch(search.arch_)
    torch.testing.assert_close(search.supernet_.extract(search.arch_).eval()(x),
                               search.supernet_(x))


def test_infeasible_budget_and_mismatched_data_are_refused_before_training():
    latency = ChainLatency.best_placement(SPACE, TOPOLOGY, TABLES)
    fastest, _ = latency.fastest()
    with pytest.raises(InfeasibleError, match="fastest"):
        JMSNAS(latency_budget_ms=fastest / 2).fit(_small_digits(), SPACE, latency)
    other = get_space("cifar-mbconv")
    with pytest.raises(ConfigError, match="another search space"):
        JMSNAS(latency_budget_ms=10.0).fit(_small_digits(), other, latency)
    with pytest.raises(ConfigError, match="must be positive"):
        JMSNAS(latency_budget_ms=-1.0).fit(_small_digits(), SPACE, latency)


def test_derivation_keeps_the_argmax_when_it_fits_and_meets_the_budget_otherwise():
    latency = ChainLatency.best_placement(SPACE, TOPOLOGY, TABLES)
    gen = torch.Generator().manual_seed(0)
    alpha = [torch.randn(len(l.ops), generator=gen) * 3 for l in SPACE.layers]
    argmax = SPACE.arch_from_indices([int(a.argmax()) for a in alpha])
    assert derive_within_budget(SPACE, alpha, latency, 1e9) == argmax
    fastest, _ = latency.fastest()
    for budget in (fastest * 1.05, (fastest + latency.of_arch(argmax)) / 2):
        assert latency.of_arch(derive_within_budget(SPACE, alpha, latency, budget)) <= budget


@pytest.mark.parametrize("start_over", [1.5, 0.6])  # E[T] at uniform alpha over / under T_const
def test_architecture_steps_move_expected_latency_toward_the_budget(start_over):
    """The penalty lambda_2 (E[T] - T_const)^2 pulls E[T] to the budget from either side: with
    its sign flipped the steps push E[T] away, and this fails."""
    latency = ChainLatency.best_placement(SPACE, TOPOLOGY, TABLES)
    uniform = [torch.full((len(l.ops),), 1 / len(l.ops)) for l in SPACE.layers]
    start = float(latency(uniform))  # alpha starts at zeros: the uniform mixture
    budget = start / start_over
    # a penalty that outweighs the cross-entropy, so its direction decides alpha's steps
    search = JMSNAS(latency_budget_ms=budget, lambda2=1e3 / budget ** 2, warmup_epochs=0,
                    epochs=2, retrain_epochs=0, batch_size=32, arch_fraction=0.5, arch_lr=0.1)
    search.fit(_small_digits(), SPACE, latency)
    gaps = [abs(h.expected_ms - budget) for h in search.history_]
    assert gaps[0] < abs(start - budget)  # the first architecture steps already close in
    assert gaps[-1] < min(gaps[0], 0.75 * abs(start - budget))
