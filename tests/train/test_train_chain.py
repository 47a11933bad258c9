"""Chains of trainable modules traced from any model (train/chain.py): forward, backward and
split training equal the unsplit model's, with the model's own parameters."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.graph import capture
from edgesplit.models.digits import DigitsCNN
from edgesplit.train import SplitTrainer, as_chain, graph_cut_for_chain, partition_features
from edgesplit.train.chain import capturable, chain_from_trace


class _Funky(nn.Module):
    """Not a chain of children: functions between them, a residual around a child, a
    parameter used outside any child, batch-norm."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.b, self.fc = nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.a(x)))
        h = h + self.b(h)  # two tensors cross here: no cut inside the residual
        return self.fc(h.mean((2, 3)) * self.scale)


class _Wrapper(nn.Module):
    """A wrapper whose only child holds every parameter: the chain is traced inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _Funky()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * 2.0


def _models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    return {"digits_cnn": (DigitsCNN(), torch.randn(4, 1, 32, 32)),
            "funky": (_Funky(), torch.randn(4, 1, 6, 6)),
            "wrapper": (_Wrapper(), torch.randn(4, 1, 6, 6))}


def _run(chain: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for element in chain:
        x = element(x)
    return x


def test_digits_cnn_chain_is_its_children_and_the_flatten() -> None:
    model = DigitsCNN()
    chain = chain_from_trace(model)
    children = dict(model.named_children())
    assert len(chain) == 10
    names = ["stem", "down1", "block1", "down2", "block2", "reduce", "expand", "pool"]
    assert all(c is children[n] for c, n in zip(chain[:8], names, strict=True))
    assert chain[9] is model.fc and not list(chain[8].parameters())  # the flatten


def test_funky_chain_cuts_only_where_one_tensor_crosses() -> None:
    chain = chain_from_trace(_Funky())
    # conv | bn | relu | residual | mean | * scale | fc
    assert len(chain) == 7
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(chain[3](x), x + chain[3].b(x))


def test_a_wrapper_is_traced_into() -> None:
    model = _Wrapper()
    chain = chain_from_trace(model)
    assert len(chain) == 8  # _Funky's seven, then * 2
    assert chain[0] is model.net.a


@pytest.mark.parametrize("name", ["digits_cnn", "funky", "wrapper"])
def test_chain_forward_and_backward_equal_the_model(name: str) -> None:
    model, x = _models()[name]
    reference = copy.deepcopy(model).train()
    chain = chain_from_trace(model.train())
    # the chain calls the model's own parameters and buffers, each once
    chain_params = {id(p) for c in chain for p in c.parameters()}
    assert chain_params == {id(p) for p in model.parameters()}
    out, ref = _run(chain, x), reference(x)
    torch.testing.assert_close(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
    # train-mode batch-norm
    for (n, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=n)


@pytest.mark.parametrize("name", ["funky", "wrapper"])
def test_split_training_equals_unsplit_at_every_cut(name: str) -> None:
    model, x = _models()[name]
    y = torch.tensor([0, 1, 2, 1])
    loss = nn.functional.cross_entropy

    def sgd(ps):
        return torch.optim.SGD(ps, lr=0.1, momentum=0.9)

    reference = copy.deepcopy(model).train()
    ref_opt = sgd(list(reference.parameters()))
    trainer = SplitTrainer(model, 0, loss, sgd)
    for step, cut in enumerate([0, 3, -1, len(trainer.layers) - 1, 2]):
        trainer.move_cut(cut)
        trainer.step(x + step, y)
        ref_opt.zero_grad()
        loss(reference(x + step), y).backward()
        ref_opt.step()
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=n)


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) + y


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if x.sum() > 0 else -x  # data-dependent: fx cannot trace it


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(torch.relu(self.a(x)))  # one weight on both sides of a cut


@pytest.mark.parametrize("model, match", [
    (nn.Linear(2, 2), "no single tensor"),
    (_Twice(), "'a.weight' is used by chain elements 0 and 2"),
    (_TwoInputs(), "one tensor"),
    (_Branchy(), "torch.fx cannot trace"),
])
def test_models_that_cannot_be_chained_raise_config_error(model: nn.Module, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        as_chain(model)


@pytest.mark.parametrize("name", ["funky", "wrapper"])
def test_every_chain_cut_has_l2s_features_on_the_captured_chain(name: str) -> None:
    model, x = _models()[name]
    chain = chain_from_trace(model)
    graph = capture(capturable(copy.deepcopy(chain)).eval(), (x,), optimize=False)
    h = x
    for c, element in enumerate(chain):
        h = element(h)
        cut = graph_cut_for_chain(graph, c)
        if c < len(chain) - 1:  # the graph cut is crossed by exactly this element's output
            assert [t.shape for t in graph.cuts()[cut + 1].tensors] == [tuple(h.shape)]
        assert partition_features(graph, cut).shape == (8,)


@pytest.mark.parametrize("name", ["digits_cnn", "funky"])
def test_each_chain_cut_is_a_plan_whose_edge_holds_the_front(name: str) -> None:
    from edgesplit.hardware import get_device, get_link
    from edgesplit.plan import EdgeCloudSetting, recompute_total
    from edgesplit.train.decision import chain_cut_plan

    model, x = _models()[name]
    setting = EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                               link=get_link("wifi"))
    chain = as_chain(model)
    graph = capture(capturable(copy.deepcopy(chain)).eval(), (x,), optimize=False)
    for c in (-1, 0, 2, len(chain) - 2):
        plan = chain_cut_plan(model, (x,), setting, c)
        edge = next(d for d in plan.devices if d.role == "edge")
        cut = graph_cut_for_chain(graph, c)
        assert edge.layers == [layer.name for layer in graph.layers[:cut + 1]]
        assert plan.predicted.total_ms == pytest.approx(recompute_total(plan))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_traced_model_trains_split_over_grpc_exactly_as_unsplit(momentum: float) -> None:
    from edgesplit.train import RemoteSplitTrainer, TrainOptions, training_server

    def build() -> nn.Module:
        torch.manual_seed(3)
        return _Funky()

    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(8, 1, 6, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen))
               for _ in range(6)]
    server = training_server(build, lr=0.05, momentum=momentum, seed=3, sample_shape=(1, 6, 6))
    address = f"localhost:{server.start()}"
    try:
        training = TrainOptions(lr=0.05, seed=3, momentum=momentum, sync="fws")
        with RemoteSplitTrainer(build(), address, training) as trainer:
            for (x, y), cut in zip(batches, [2, 5, -1, 3, 6, 0], strict=True):
                trainer.step(x, y, cut)
            trained = trainer.final_model()
    finally:
        server.stop(0)
    reference = build().train()
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=momentum)
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        opt.step()
    for (n, a), b in zip(trained.state_dict().items(), reference.state_dict().values(),
                         strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=n)


def test_privacy_split_counts_the_layers_the_first_elements_call() -> None:
    from edgesplit.train.privacy import graph_split_for_chain

    model = _Wrapper()  # every layer's path starts with "net": the children's own paths count
    graph = capture(copy.deepcopy(model).eval(), torch.randn(4, 1, 6, 6), optimize=False)
    splits = [graph_split_for_chain(graph, model, k) for k in range(len(as_chain(model)) + 1)]
    assert splits[:3] == [0, 1, 2]  # nothing; net.a; net.bn
    assert splits == sorted(splits) and splits[-1] == len(graph.layers) - 1  # the * 2 is no module
