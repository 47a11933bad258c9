"""edgesplit.nas: candidate ops, spaces and architectures, the supernet and what it extracts,
sampling and evolution, and saved networks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from edgesplit.errors import ConfigError, InfeasibleError, UnknownNameError
from edgesplit.graph import capture
from edgesplit.nas import JMSNAS_CANDIDATES, Evaluation, EvolutionSearch, MBConv, OpSpec, legal_ops
from edgesplit.nas.jmsnas import (
    Arch,
    ArchNet,
    HeadSpec,
    LayerSpec,
    MixedOp,
    SearchSpace,
    StemSpec,
    Supernet,
    crossover,
    get_space,
    list_spaces,
    load_network,
    mutate,
    random_arch,
    read_arch,
    save_network,
)

DIGITS = "digits-mbconv"


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return get_space(DIGITS)


def _randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial batch-norm statistics and affine terms, so that a wrong copy shows."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            shape = m.running_mean.shape
            m.running_mean.copy_(torch.randn(shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(shape, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(shape, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(shape, generator=g) * 0.1)
    return module


def _inputs(n: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 32, 32, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# -- ops ---------------------------------------------------------------------------------------

def test_jmsnas_candidates_are_the_13_of_section_iv_a():
    names = [op.name for op in JMSNAS_CANDIDATES]
    assert len(names) == len(set(names)) == 13
    assert names[0] == "identity"
    assert sorted(names[1:]) == sorted(f"mb{k}_e{e}{sc}" for k in (3, 5, 7) for e in (3, 6)
                                       for sc in ("", "_sc"))
    assert {(op.kernel, op.expand, op.shortcut) for op in JMSNAS_CANDIDATES[1:]} == {
        (k, e, sc) for k in (3, 5, 7) for e in (3, 6) for sc in (False, True)}


@pytest.mark.parametrize("op", JMSNAS_CANDIDATES, ids=str)
def test_op_spec_round_trips_by_name_and_dict(op):
    assert OpSpec.parse(op.name) == op
    assert OpSpec.from_dict(json.loads(json.dumps(op.to_dict()))) == op


@pytest.mark.parametrize("bad", ["mb4_e6", "mb3", "conv3x3", "mb3_e0", ""])
def test_bad_op_names_are_config_errors(bad):
    with pytest.raises(ConfigError, match=r"op name|kernel|expand"):
        OpSpec.parse(bad)


@pytest.mark.parametrize("op", JMSNAS_CANDIDATES, ids=str)
def test_every_candidate_keeps_the_shape_where_the_layer_does(op):
    x = torch.randn(2, 16, 8, 8)
    assert op.build(16, 16, 1)(x).shape == x.shape


@pytest.mark.parametrize("op", JMSNAS_CANDIDATES, ids=str)
def test_shape_changing_layers_refuse_identity_and_shortcuts(op):
    x = torch.randn(2, 16, 8, 8)
    if op.is_identity or op.shortcut:
        with pytest.raises(ConfigError, match="choose one of"):
            op.build(16, 24, 2)
    else:
        assert op.build(16, 24, 2)(x).shape == (2, 24, 4, 4)
        assert op.build(16, 24, 1)(x).shape == (2, 24, 8, 8)


def test_legal_ops_at_a_downsampling_layer_are_the_six_plain_mbconvs():
    assert [op.name for op in legal_ops(JMSNAS_CANDIDATES, 16, 16, 2)] == [
        f"mb{k}_e{e}" for k in (3, 5, 7) for e in (3, 6)]
    assert legal_ops(JMSNAS_CANDIDATES, 16, 16, 1) == JMSNAS_CANDIDATES


def test_shortcut_adds_the_input_and_only_then():
    x = torch.randn(2, 8, 6, 6)
    for shortcut in (False, True):
        block = MBConv(8, 8, 3, 6, 1, shortcut).eval()
        nn.init.zeros_(block.project_bn.weight)  # the residual branch now outputs zeros
        torch.testing.assert_close(block(x), x if shortcut else torch.zeros_like(x))
    with pytest.raises(ConfigError, match="shortcut=False"):
        MBConv(8, 16, 3, 6, 1, True)


def test_expand_one_drops_the_expand_convolution():
    assert MBConv(8, 8, 3, 1, 1, False).expand is None
    assert isinstance(MBConv(8, 8, 3, 6, 1, False).expand, nn.Conv2d)


# -- spaces and architectures ------------------------------------------------------------------

def test_digits_space_is_registered_and_mobilenetv2_shaped(space):
    assert DIGITS in list_spaces()
    assert space.input_shape == (1, 32, 32) and space.num_classes == 10
    assert 8 <= len(space.layers) <= 12
    for i, layer in enumerate(space.layers):
        # A stage's first layer changes the shape: the six plain MBConvs only.
        assert len(layer.ops) == (13 if space.skippable(i) else 6)
    assert space.in_size(len(space.layers)) == (4, 4)


def test_unknown_space_names_the_known_ones():
    with pytest.raises(UnknownNameError, match="digits-mbconv"):
        get_space("digits-mbconf")


def test_space_refuses_identity_where_the_shape_changes():
    with pytest.raises(ConfigError, match=r"layer 1 \(8->16 ch, stride 2\) allows identity"):
        SearchSpace("bad", (1, 8, 8), 2, StemSpec(8), (
            LayerSpec(8, 1, JMSNAS_CANDIDATES), LayerSpec(16, 2, JMSNAS_CANDIDATES)))


def test_space_round_trips_through_json(space):
    data = json.loads(json.dumps(space.to_dict()))
    assert SearchSpace.from_dict(data) == space
    with pytest.raises(ConfigError, match="malformed"):
        SearchSpace.from_dict({"name": "x"})


def test_arch_round_trips_through_json(space):
    rng = np.random.default_rng(0)
    for _ in range(20):
        arch = random_arch(space, rng)
        assert Arch.from_json(arch.to_json()) == arch
        assert space.validate(Arch.from_dict(arch.to_dict())) == arch
        assert space.arch_from_indices(space.arch_indices(arch)) == arch
    with pytest.raises(ConfigError, match="malformed"):
        Arch.from_json("{not json")


def test_invalid_arch_names_the_layer_and_the_allowed_ops(space):
    good = space.fixed_arch("mobilenetv2")
    with pytest.raises(ConfigError, match=f"{len(space.layers)} searchable layers"):
        space.validate(Arch(good.ops[:-1]))
    bad = Arch((good.ops[0], OpSpec.parse("identity"), *good.ops[2:]))
    with pytest.raises(ConfigError, match=r"layer 1 .* does not allow identity; allowed: "
                                          r"mb3_e3, mb3_e6, mb5_e3"):
        space.validate(bad)


def test_fixed_archs(space):
    largest, smallest = space.fixed_arch("largest"), space.fixed_arch("smallest")
    reference = space.fixed_arch("mobilenetv2")
    for i in range(len(space.layers)):
        sc = "_sc" if space.skippable(i) else ""
        assert largest.names[i] == f"mb7_e6{sc}"
        assert smallest.names[i] == ("identity" if sc else "mb3_e3")
        assert reference.names[i] == f"mb3_e6{sc}"
    with pytest.raises(ConfigError, match="largest, smallest, mobilenetv2"):
        space.fixed_arch("biggest")  # type: ignore[arg-type]


# -- samplers and evolution --------------------------------------------------------------------

def test_samplers_are_deterministic_for_a_seed(space):
    def draw(seed: int) -> list[Arch]:
        rng = np.random.default_rng(seed)
        a, b = random_arch(space, rng), random_arch(space, rng)
        return [a, b, mutate(space, a, rng, 0.5), crossover(space, a, b, rng)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_mutation_and_crossover_stay_in_the_space(space):
    rng = np.random.default_rng(0)
    a, b = random_arch(space, rng), random_arch(space, rng)
    assert mutate(space, a, rng, 0.0) == a
    changed = mutate(space, a, rng, 1.0)
    assert all(x != y for x, y in zip(changed.ops, a.ops, strict=True))
    for _ in range(10):
        child = space.validate(crossover(space, a, b, rng))
        assert all(c in (x, y) for c, x, y in zip(child.ops, a.ops, b.ops, strict=True))


# -- supernet and extracted networks -----------------------------------------------------------

def _archs(space: SearchSpace, count: int) -> list[Arch]:
    rng = np.random.default_rng(1)
    fixed = [space.fixed_arch(k) for k in ("largest", "smallest", "mobilenetv2")]
    return fixed + [random_arch(space, rng) for _ in range(count)]


@pytest.mark.parametrize("channels_last", [False, True])
def test_extracted_network_equals_the_supernet_path(space, channels_last):
    torch.manual_seed(0)
    supernet = _randomise(Supernet(space, channels_last=channels_last)).eval()
    x = _inputs()
    for arch in _archs(space, 5):
        supernet.set_arch(arch)
        assert supernet.arch == arch
        net = supernet.extract()
        assert not net.training
        assert not any(isinstance(m, MixedOp | nn.Identity) for m in net.modules())
        assert list(net.layers.keys()) == [str(i) for i, op in enumerate(arch.ops)
                                           if not op.is_identity]
        with torch.no_grad():
            torch.testing.assert_close(net(x), supernet(x))


def test_extract_does_not_draw_from_the_global_generator(space):
    supernet = Supernet(space)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    supernet.extract(space.fixed_arch("largest"))
    torch.testing.assert_close(torch.rand(3), expected)


def test_two_gated_paths_expose_the_gate_gradient(space):
    """The seam of JMSNAS's architecture step: one-hot gates on two paths, dL/dg from autograd."""
    torch.manual_seed(0)
    supernet = _randomise(Supernet(space)).eval()
    x = _inputs()
    arch = space.fixed_arch("mobilenetv2")
    supernet.set_arch(arch)
    with torch.no_grad():
        expected = supernet(x)
    mixed = supernet.mixed_ops[2]
    chosen, other = mixed.active[0], (mixed.active[0] + 1) % len(mixed.specs)
    gates = torch.tensor([1.0, 0.0], requires_grad=True)
    mixed.set_paths((chosen, other), gates)
    out = supernet(x)
    torch.testing.assert_close(out, expected)  # a 0 gate leaves its path out of the output
    out.square().sum().backward()
    assert gates.grad is not None and gates.grad.shape == (2,) and gates.grad[1] != 0
    with pytest.raises(ConfigError, match="call set_arch"):
        _ = supernet.arch
    with pytest.raises(ConfigError, match="need gates"):
        mixed.set_paths((0, 1))
    with pytest.raises(ConfigError, match="out of range"):
        mixed.set_paths((len(mixed.specs),))


def test_extracted_network_captures_and_its_program_reproduces_it(space):
    torch.manual_seed(0)
    supernet = _randomise(Supernet(space)).eval()
    ops = list(space.fixed_arch("mobilenetv2").names)
    ops[2] = "identity"  # a skipped layer leaves a gap in the names
    net = supernet.extract(Arch.from_names(ops))
    graph = capture(net, torch.randn(1, 1, 32, 32))
    names = [l.name for l in graph.layers]
    assert names[:3] == ["stem", "layers.0.expand", "layers.0.depthwise"]
    assert names[-3:] == ["head", "pool", "classifier"]
    assert {"layers.0.add", "layers.3.project"} <= set(names)
    assert not any(n.startswith("layers.2.") for n in names)
    x = _inputs(1)
    with torch.no_grad():
        torch.testing.assert_close(graph.program(x), net(x), rtol=1e-4, atol=1e-4)


def _distance_to(space: SearchSpace, target: Arch):
    def evaluate(arch: Arch) -> float:
        return -float(sum(x != y for x, y in zip(arch.ops, target.ops, strict=True)))
    return evaluate


def test_evolution_finds_a_target_arch_deterministically(space):
    target = random_arch(space, np.random.default_rng(42))
    seen: list[int] = []

    def fit() -> EvolutionSearch:
        return EvolutionSearch(population=24, generations=15, mutation_prob=0.2, seed=0,
                               progress=lambda g, best: seen.append(g)).fit(
            space, _distance_to(space, target))

    search = fit()
    assert search.best_score_ >= -1  # at most one layer off, out of 80 million architectures
    assert search.best_score_ == max(c.score for c in search.history_)
    assert seen == list(range(16))
    archs = [c.arch for c in search.history_]
    assert len(archs) == len(set(archs)) <= 24 * 16  # nothing is evaluated twice
    again = fit()
    assert [(c.arch, c.score) for c in again.history_] == [
        (c.arch, c.score) for c in search.history_]


def test_evolution_keeps_metrics_and_respects_the_constraint(space):
    def evaluate(arch: Arch) -> Evaluation:
        return Evaluation(float(arch.depth), {"depth": arch.depth})

    def shallow(arch: Arch) -> bool:
        return arch.depth <= 5

    search = EvolutionSearch(population=10, generations=3, seed=1, constraint=shallow).fit(
        space, evaluate)
    assert all(shallow(c.arch) for c in search.history_)
    assert search.best_score_ == 5 and search.best_metrics_ == {"depth": 5}


def test_evolution_terminates_when_nothing_is_feasible(space):
    search = EvolutionSearch(population=8, generations=50, constraint=lambda arch: False)
    with pytest.raises(InfeasibleError, match="relax the constraint"):
        search.fit(space, lambda arch: 0.0)


def test_evolution_stops_asking_once_a_tiny_space_is_exhausted():
    tiny = SearchSpace("tiny", (1, 8, 8), 2, StemSpec(4), (
        LayerSpec(4, 1, (OpSpec.parse("identity"), OpSpec.parse("mb3_e3"))),
        LayerSpec(4, 1, (OpSpec.parse("identity"), OpSpec.parse("mb3_e3_sc")))),
        HeadSpec())
    calls: list[Arch] = []
    search = EvolutionSearch(population=10, generations=5, max_attempts=20).fit(
        tiny, lambda arch: calls.append(arch) or float(arch.depth))
    assert len(calls) == len(set(calls)) == tiny.size == 4
    assert search.best_score_ == 2


@pytest.mark.parametrize("param", [dict(population=0), dict(mutation_prob=1.5),
                                   dict(parents_fraction=0.0), dict(generations=-1)])
def test_evolution_parameters_are_checked_by_fit(space, param):
    search = EvolutionSearch(**param)  # the estimator contract: __init__ only stores
    with pytest.raises(ConfigError, match=next(iter(param))):
        search.fit(space, lambda arch: 0.0)


# -- saved networks ----------------------------------------------------------------------------

def _saved(space: SearchSpace, folder, arch: Arch | None = None) -> ArchNet:
    torch.manual_seed(0)
    supernet = _randomise(Supernet(space)).eval()
    net = supernet.extract(arch or space.fixed_arch("mobilenetv2"))
    save_network(folder, net)
    return net


def test_save_and_load_give_identical_outputs(space, tmp_path):
    net = _saved(space, tmp_path)
    doc = json.loads((tmp_path / "arch.json").read_text())
    assert doc["space"]["name"] == DIGITS and doc["arch"] == net.arch.to_dict()
    loaded = load_network(tmp_path)
    assert not loaded.training and loaded.arch == net.arch
    x = _inputs()
    with torch.no_grad():
        assert torch.equal(loaded(x), net(x))
    assert read_arch(tmp_path) == (space, net.arch)


def test_missing_corrupt_and_mismatched_files_are_config_errors(space, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_network(tmp_path / "nowhere")
    _saved(space, tmp_path)
    weights = (tmp_path / "weights.safetensors").read_bytes()
    (tmp_path / "weights.safetensors").write_bytes(weights[:100])
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        load_network(tmp_path)
    _saved(space, tmp_path / "other", space.fixed_arch("largest"))
    (tmp_path / "weights.safetensors").write_bytes(
        (tmp_path / "other" / "weights.safetensors").read_bytes())
    with pytest.raises(ConfigError, match="does not match the architecture"):
        load_network(tmp_path)
    doc = json.loads((tmp_path / "arch.json").read_text())
    (tmp_path / "arch.json").write_text(json.dumps({**doc, "format": "edgesplit.nas.network/9"}))
    with pytest.raises(ConfigError, match="save the network again"):
        load_network(tmp_path)
    (tmp_path / "arch.json").write_text("{")
    with pytest.raises(ConfigError, match="not readable JSON"):
        load_network(tmp_path)
