"""Split training (L2S protocol) and the L2S context features of partition points."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.graph import capture
from edgesplit.train import (
    FEATURE_NAMES,
    SplitTrainer,
    as_chain,
    feature_matrix,
    graph_cut_for_chain,
    partition_features,
)

BATCH = 4


def _chain() -> nn.Sequential:
    """Small CNN with batch-norm (train-mode statistics matter) and a parameter-free tail."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3),
    )


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, 1, 8, 8, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen)


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3),
}


def _reference(model: nn.Module, factory, batches) -> nn.Module:
    """Plain unsplit training of a copy of ``model``."""
    model = copy.deepcopy(model).train()
    opt = factory(list(model.parameters()))
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=1e-6, msg=key)


# ---- (a) one split step == one unsplit step, every cut --------------------------------------
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_split_step_matches_unsplit_step_at_every_cut(opt_name: str) -> None:
    base, batch = _chain(), _batch()
    expected = _reference(base, OPTIMIZERS[opt_name], [batch])
    for cut in range(-1, len(base)):
        model = copy.deepcopy(base)
        trainer = SplitTrainer(model, cut, nn.functional.cross_entropy, OPTIMIZERS[opt_name])
        trainer.step(*batch)
        _assert_same_state(model, expected)  # weights and batch-norm running statistics


def test_from_parts_and_separate_server_optimizer() -> None:
    base, batch = _chain(), _batch()
    model = copy.deepcopy(base)
    sgd = OPTIMIZERS["sgd"]
    trainer = SplitTrainer.from_parts(model[:3], model[3:], nn.functional.cross_entropy, sgd, sgd)
    assert trainer.cut == 2 and len(trainer.front) == 3 and len(trainer.back) == 5
    trainer.step(*batch)
    _assert_same_state(model, _reference(base, sgd, [batch]))


# ---- (b) moving the cut keeps weights (and optimizer state) ---------------------------------
def test_move_cut_keeps_weights_and_reports_sync_bytes() -> None:
    model = _chain()
    trainer = SplitTrainer(model, 2, nn.functional.cross_entropy, OPTIMIZERS["adam"])
    trainer.step(*_batch())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = trainer.move_cut(5)  # layers 3, 4, 5 (pool, flatten, linear) go to the device
    assert report.moved == (3, 4, 5) and report.to_device
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    linear = model[5]
    assert report.weight_bytes == 4 * (linear.weight.numel() + linear.bias.numel())
    assert report.buffer_bytes == 0
    # Adam keeps exp_avg and exp_avg_sq (float32, one each per element) plus a step scalar
    assert report.optimizer_state_bytes == 2 * report.weight_bytes + 2 * 4
    assert [id(m) for m in trainer.front] == [id(m) for m in model[:6]]

    back = trainer.move_cut(0)  # conv stays; batch-norm .. linear go back to the server
    assert back.moved == (1, 2, 3, 4, 5) and not back.to_device
    bn = model[1]
    assert back.weight_bytes == 4 * (bn.weight.numel() + bn.bias.numel()
                                     + linear.weight.numel() + linear.bias.numel())
    assert back.buffer_bytes == sum(b.numel() * b.element_size() for b in bn.buffers())


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_training_across_cut_moves_equals_unsplit_training(opt_name: str) -> None:
    """Optimizer state moves with the layers, so moving the cut between rounds changes
    nothing about the trained model."""
    base = _chain()
    batches = [_batch(s) for s in range(4)]
    model = copy.deepcopy(base)
    trainer = SplitTrainer(model, 1, nn.functional.cross_entropy, OPTIMIZERS[opt_name])
    for cut, batch in zip((1, 5, -1, 7), batches, strict=True):
        trainer.move_cut(cut)
        trainer.step(*batch)
    _assert_same_state(model, _reference(base, OPTIMIZERS[opt_name], batches))


# ---- (c) bytes per round --------------------------------------------------------------------
def test_bytes_up_and_down_per_step() -> None:
    x, y = _batch()
    model = _chain()
    sizes = []  # activation elements after each chain element
    h = x
    for layer in model.eval():
        h = layer(h)
        sizes.append(h.numel())
    for cut in range(-1, len(model)):
        stats = SplitTrainer(copy.deepcopy(model), cut, nn.functional.cross_entropy,
                             OPTIMIZERS["sgd"]).step(x, y)
        if cut == len(model) - 1:  # pure on-device training
            assert (stats.bytes_up, stats.bytes_down) == (0, 0)
            continue
        activation = x.numel() if cut == -1 else sizes[cut]
        assert stats.bytes_up == 4 * activation + 8 * BATCH  # float32 activation + int64 labels
        # at p = 0 the device has nothing to train, so no gradient comes back
        assert stats.bytes_down == (0 if cut == -1 else 4 * activation)
        assert np.isfinite(stats.loss)


# ---- (d) features ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph():
    return capture(_chain().eval(), torch.randn(BATCH, 1, 8, 8), optimize=False)


def test_feature_shapes_and_monotone_back_macs(graph) -> None:
    feats = feature_matrix(graph)
    assert list(feats) == [c.index for c in graph.single_tensor_cuts()]
    assert all(v.shape == (len(FEATURE_NAMES),) and v.dtype == np.float64 for v in feats.values())
    macs = [v[0] + v[1] + v[2] for v in feats.values()]
    assert all(a >= b for a, b in itertools.pairwise(macs))
    assert macs[0] > macs[-2] > 0
    assert not feats[len(graph.layers) - 1].any()  # p = P: zero context (paper Sec. IV-B)


def test_features_equal_hand_sums(graph) -> None:
    # layers: conv, batch_norm, relu, max_pool(+flatten), linear, relu, linear
    conv_macs = BATCH * 4 * 8 * 8 * 9
    fc_macs = BATCH * (64 * 16 + 16 * 3)
    assert [layer.op_class for layer in graph.layers] == \
        ["conv", "norm", "elementwise", "pool", "matmul", "elementwise", "matmul"]
    x0 = partition_features(graph, -1)
    assert x0[0] == conv_macs and x0[1] == fc_macs
    assert x0[2] == sum(layer.flops for layer in graph.layers[1:4]) + graph.layers[5].flops
    assert x0[3] == 4 * BATCH * 64 + 8 * BATCH and x0[4] == 0  # raw input + labels; no grad
    assert x0[5] == 4 * 9 + 4 and x0[6] == 64 * 16 + 16 + 16 * 3 + 3 and x0[7] == 8  # bn affine
    x3 = partition_features(graph, 3, label_bytes=0, overhead_bytes=10)  # after pool+flatten
    assert x3[0] == 0 and x3[1] == fc_macs and x3[2] == graph.layers[5].flops
    assert x3[3] == x3[4] == 4 * BATCH * 64 + 10
    assert x3[5] == 0 and x3[7] == 0 and x3[6] == x0[6]


def test_chain_cuts_map_onto_graph_cuts(graph) -> None:
    # flatten is fused into the pool layer: chain cuts 3 and 4 are both graph cut 3
    assert [graph_cut_for_chain(graph, c) for c in range(-1, 8)] == [-1, 0, 1, 2, 3, 3, 4, 5, 6]


def test_digits_cnn_is_a_chain() -> None:
    from edgesplit.models.digits import DigitsCNN

    torch.manual_seed(0)
    model = DigitsCNN().eval()
    x = torch.randn(2, 1, 32, 32)
    h = x
    for layer in as_chain(model):
        h = layer(h)
    torch.testing.assert_close(h, model(x))


# ---- (e) bad cuts ---------------------------------------------------------------------------
@pytest.mark.parametrize("cut", [-2, 8, 1.5, True, "3"])
def test_bad_cut_indices_raise_config_error(graph, cut) -> None:
    with pytest.raises(ConfigError):
        SplitTrainer(_chain(), cut, nn.functional.cross_entropy, OPTIMIZERS["sgd"])
    trainer = SplitTrainer(_chain(), 0, nn.functional.cross_entropy, OPTIMIZERS["sgd"])
    with pytest.raises(ConfigError):
        trainer.move_cut(cut)
    if cut not in (8,):  # 8 is out of range for the 8-element chain but not for a 7-layer graph
        with pytest.raises(ConfigError):
            partition_features(graph, cut)


def test_graph_bad_cuts_raise_config_error(graph) -> None:
    with pytest.raises(ConfigError):
        partition_features(graph, len(graph.layers))
    with pytest.raises(ConfigError):
        feature_matrix(graph, [0, -5])
    with pytest.raises(ConfigError):
        as_chain(nn.Linear(2, 2))


class _Skip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


def test_multi_tensor_cut_is_not_a_partition_point() -> None:
    g = capture(_Skip().eval(), torch.randn(2, 4), optimize=False)
    multi = [c.index for c in g.cuts() if len(c.tensors) > 1]
    assert multi
    with pytest.raises(ConfigError):
        partition_features(g, multi[0])
    assert not set(multi) & set(feature_matrix(g))
