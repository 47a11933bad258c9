"""SplitNets (paper 004): the split-aware initialisation, the five-subnet sampler, View-Fuse's
interlaced order, the cost model against the captured LayerGraph (work, memory, the plan's
prediction), the search's refusal of an infeasible memory limit, and extracted networks that
equal the supernet and run from their plan."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from edgesplit.data import EvalData
from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.graph import capture
from edgesplit.graph.memory import peak_memory
from edgesplit.hardware import get_topology
from edgesplit.hardware.work import LayerWork
from edgesplit.nas.core.evolution import Breeder, EvolutionSearch
from edgesplit.nas.splitnets import (
    PhaseSpec,
    SplitArch,
    SplitBreeder,
    SplitHardware,
    SplitNetsSearch,
    SplitSpace,
    SplitSupernet,
    crossover_split,
    init_std,
    interlace,
    load_supernet,
    mutate_split,
    random_split_arch,
    recalibrate,
    save_supernet,
    split_layers,
    training_subnets,
)
from edgesplit.nas.splitnets.result import save_splitnet, view_inputs
from edgesplit.nas.splitnets.train import subnet_accuracy

TINY = SplitSpace("tiny-split", 1, 5, (8, 12), (4, 6),
                  (PhaseSpec((6, 8), (1, 3), (1, 2), (0, 1), (2, 3)),
                   PhaseSpec((10, 12), (3, 4), (1, 2), (1, 2), (2, 4))), (16, 24))


def _inputs(space: SplitSpace, batch: int, size: int = 12, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, space.views, 1, size, size) if space.multi_view else (batch, 1, size, size)
    return torch.randn(shape, generator=gen)


# ---- Table 3 --------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "channels"), [
    ("fan-in", 256), ("fan-out", 8), ("xavier", 132), ("split-aware", math.sqrt(256 * 8))])
def test_init_std_follows_table_3(mode, channels):
    assert init_std(mode, 3, 256, 8) == pytest.approx(math.sqrt(2 / (9 * channels)))


def test_splitting_modules_are_drawn_with_the_geometric_mean():
    space = SplitSpace("wide", 1, 2, (8,), (4,), (PhaseSpec((256,), (1,), (1,), (0,), (8,)),),
                       (4,))
    torch.manual_seed(0)
    for mode in ("split-aware", "fan-in"):
        net = SplitSupernet(space, init=mode)
        w = net.module("reduce", 0).weight  # 256 -> 8, 1x1: 2048 draws
        assert w.std().item() == pytest.approx(init_std(mode, 1, 256, 8), rel=0.05)
    with pytest.raises(ConfigError, match="split-aware"):
        SplitSupernet(space, init="kaiming")


# ---- appendix D -----------------------------------------------------------------------------
def test_the_five_subnet_sampler_and_the_sandwich_baseline():
    rng = np.random.default_rng(0)
    five = dict(training_subnets(TINY, "five", rng))
    assert list(five) == ["max-zero-hot", "max-all-hot", "min-zero-hot", "min-all-hot",
                          "random-one-hot"]
    assert five["max-zero-hot"] == TINY.largest() and five["min-all-hot"] == TINY.smallest([0, 1])
    assert five["max-all-hot"].splits == (0, 1) and five["min-zero-hot"].splits == ()
    assert len(five["random-one-hot"].splits) == 1
    sandwich = dict(training_subnets(TINY, "sandwich", rng))
    assert [len(a.splits) for a in sandwich.values()] == [0, 1, 0, 1, 1]
    assert sandwich["max-one-hot"].with_splits(()) == TINY.largest()
    multi = dict(training_subnets(TINY.with_views(3), "five", rng))  # fuses exactly once
    assert list(multi) == ["max-one-hot", "min-one-hot", "random-one-hot"]
    assert all(len(a.splits) == 1 for a in multi.values())
    with pytest.raises(ConfigError, match="sandwich"):
        training_subnets(TINY, "bignas", rng)


def test_random_mutated_and_crossed_architectures_stay_in_the_space():
    rng = np.random.default_rng(1)
    archs = [random_split_arch(TINY, rng) for _ in range(40)]
    for a, b in itertools.pairwise(archs):
        for child in (mutate_split(TINY, a, rng, 0.5), crossover_split(TINY, a, b, rng)):
            TINY.validate(child, deployable=True)
    assert len(set(archs)) > 30  # hashable and varied
    assert SplitArch.from_dict(archs[0].to_dict()) == archs[0]
    assert SplitSpace.from_dict(TINY.to_dict()) == TINY


# ---- appendix B -----------------------------------------------------------------------------
def test_interlaced_concatenation_puts_channel_i_from_view_i_mod_v():
    views = [torch.full((1, 4, 2, 2), float(v)) + torch.arange(4.0).view(1, 4, 1, 1) / 10
             for v in range(3)]
    fused = interlace(views)
    assert fused.shape == (1, 12, 2, 2)
    for i in range(12):
        assert fused[0, i, 0, 0].item() == pytest.approx(i % 3 + (i // 3) / 10)
    # a narrower d keeps the rule: the first V*d channels are d channels of every view
    assert torch.equal(interlace([v[:, :2] for v in views]), fused[:, :6])


# ---- the supernet and its networks ----------------------------------------------------------
@pytest.mark.parametrize("views", [1, 3])
def test_extracted_networks_equal_the_supernet(views):
    space = TINY.with_views(views)
    torch.manual_seed(0)
    net = SplitSupernet(space)
    x = _inputs(space, 8)
    rng = np.random.default_rng(views)
    for arch in [space.largest([0]), space.smallest([1]), random_split_arch(space, rng)]:
        recalibrate(net, arch, [x])
        with torch.no_grad():
            ref = net(x, arch)
            out = net.extract(arch)(*view_inputs(x, views, arch.resolution))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_single_view_training_shapes_run_with_zero_one_and_all_modules():
    net = SplitSupernet(TINY)
    x = _inputs(TINY, 4)
    for arch in (TINY.largest(), TINY.largest([1]), TINY.smallest([0, 1])):
        assert net(x, arch).shape == (4, TINY.num_classes)
    with pytest.raises(ConfigError, match="exactly one"):
        net.extract(TINY.largest([0, 1]))


# ---- the cost model against the captured graph -----------------------------------------------
def _branches(graph):
    """Layer -> the model inputs it is computed from."""
    roots: dict[str, frozenset] = {}
    for layer in graph.layers:
        found = set()
        for t in layer.inputs:
            found |= {t} if t in graph.inputs else roots.get(graph.tensors[t].producer, set())
        roots[layer.name] = frozenset(found)
    return roots


@pytest.mark.parametrize("views", [1, 2])
def test_cost_model_equals_the_layergraph_layer_for_layer(views):
    space = TINY.with_views(views)
    net = SplitSupernet(space)
    rng = np.random.default_rng(7)
    for arch in [space.largest([1]), space.smallest([0])] + \
            [random_split_arch(space, rng) for _ in range(3)]:
        r = arch.resolution
        graph = capture(net.extract(arch), tuple(torch.zeros(1, 1, r, r) for _ in range(views)))
        roots = _branches(graph)
        sensor = [l for l in graph.layers if l.name.startswith("sensor.")
                  and roots[l.name] == {graph.inputs[0]}]
        rest = [l for l in graph.layers if not l.name.startswith("sensor.")]
        mine_s, mine_a, _, _ = split_layers(space, arch)

        def key(w):
            return (w.op_class, w.macs, w.flops, w.params, w.weight_bytes, w.input_bytes,
                    w.output_bytes)

        assert [key(w) for w in mine_s.works()] == [key(LayerWork.of(graph, l)) for l in sensor]
        assert [key(w) for w in mine_a.works()] == [key(LayerWork.of(graph, l)) for l in rest]
        # the hard constraint, recomputed by the LayerGraph's own memory analysis
        hardware = SplitHardware.from_topology(get_topology("hmd-star"), views)
        cost = hardware.cost(space, arch)
        memory = peak_memory(graph, [l.name for l in sensor])
        assert (cost.sensor_weight_bytes, cost.sensor_activation_bytes) == \
            (memory.weight_bytes, memory.activation_bytes)


def test_hardware_comes_from_a_star_topology():
    hw = SplitHardware.from_topology(get_topology("hmd-star"), 4)
    assert hw.sensors == ("sensor0", "sensor1", "sensor2", "sensor3")
    assert hw.aggregator_name == "aggregator" and hw.senders == 4
    assert hw.memory_limit_bytes == 2 * 1024 * 1024  # Mem_sen
    with pytest.raises(ConfigError, match="5 views"):
        SplitHardware.from_topology(get_topology("hmd-star"), 5)
    with pytest.raises(ConfigError, match="not a star"):
        SplitHardware.from_topology(get_topology("jmsnas-chain"), 1)


# ---- stage 2 --------------------------------------------------------------------------------
def _data(space: SplitSpace, n: int, seed: int) -> EvalData:
    torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % space.num_classes
    return EvalData("toy", (_inputs(space, n, seed=seed),), labels, "random")


def test_search_refuses_an_infeasible_memory_limit_and_names_the_closest():
    net = SplitSupernet(TINY)
    hardware = SplitHardware.from_topology(get_topology("hmd-star"), 1,
                                           memory_limit_bytes=1024)
    smallest = min(hardware.cost(TINY, TINY.smallest([s])).sensor_memory_bytes for s in (0, 1))
    search = SplitNetsSearch(hardware, population=6, generations=50)
    with pytest.raises(InfeasibleError, match="closest") as info:
        search.fit(net, _data(TINY, 20, 1), _data(TINY, 20, 2))
    arch, over = info.value.closest
    assert over == hardware.cost(TINY, arch).sensor_memory_bytes - 1024
    assert over >= smallest - 1024


def test_evolution_search_keeps_the_feasible_front():
    net = SplitSupernet(TINY)
    hardware = SplitHardware.from_topology(get_topology("hmd-star"), 1)
    limit = sorted(hardware.cost(TINY, random_split_arch(TINY, np.random.default_rng(s)))
                   .sensor_memory_bytes for s in range(20))[10]
    hardware = SplitHardware.from_topology(get_topology("hmd-star"), 1,
                                           memory_limit_bytes=limit)
    search = SplitNetsSearch(hardware, population=6, generations=2, seed=3).fit(
        net, _data(TINY, 20, 1), _data(TINY, 20, 2))
    history = search.search_.history_
    assert all(c.metrics["sensor_memory_bytes"] <= limit for c in history)
    assert search.search_.rejected_ > 0
    front = search.front_
    assert front and all(a.metrics["latency_ms"] < b.metrics["latency_ms"] and
                         a.metrics["accuracy"] < b.metrics["accuracy"]
                         for a, b in itertools.pairwise(front))
    for c in history:  # nothing evaluated beats the front on both
        assert not any(c.metrics["accuracy"] > f.metrics["accuracy"] and
                       c.metrics["latency_ms"] < f.metrics["latency_ms"] for f in front)
    assert isinstance(SplitBreeder(TINY), Breeder)  # what EvolutionSearch breeds with


def test_evolution_with_a_violation_amount_on_a_plain_space():
    from edgesplit.nas.jmsnas import get_space

    space = get_space("digits-mbconv")
    with pytest.raises(InfeasibleError, match="is 5 over the limit"):
        EvolutionSearch(population=4, generations=1, max_attempts=2,
                        constraint=lambda arch: 5.0).fit(space, lambda arch: 0.0)


# ---- result folders -------------------------------------------------------------------------
@pytest.mark.parametrize("views", [1, 3])
def test_result_folder_plan_runs_and_predicts_the_searched_latency(tmp_path, views):
    from edgesplit.plan import load_plan
    from edgesplit.runtime.program import PlanProgram

    space = TINY.with_views(views)
    torch.manual_seed(0)
    net = SplitSupernet(space)
    arch = space.largest([1])
    hardware = SplitHardware.from_topology(get_topology("hmd-star"), views)
    data = _data(space, 24, 5)
    result = save_splitnet(tmp_path, net, arch, hardware, get_topology("hmd-star"),
                           calibration=data, test=data)
    doc = result.summary
    assert doc["sensor_memory"]["total_bytes"] == doc["cost"]["sensor_memory_bytes"]
    assert doc["plan"]["predicted_ms"] == pytest.approx(doc["cost"]["total_ms"], rel=1e-9)
    assert doc["test_accuracy"] == pytest.approx(subnet_accuracy(net, arch, data, [data.inputs[0]]))
    plan = load_plan(tmp_path / "plan.json")
    assert plan.runnable
    assert [d.name for d in plan.devices] == [*hardware.sensors[:views], "aggregator"]
    program = PlanProgram.load(plan)
    xs = view_inputs(data.inputs[0][:1], views, arch.resolution)
    outputs, _ = program.run_local(list(xs))
    torch.testing.assert_close(outputs[0], result.net(*xs), rtol=1e-5, atol=1e-5)
    if views > 1:  # V sensor servers and the fusing aggregator, over the transport
        from edgesplit.runtime.star import StarClient
        from helpers import server_for

        sink = server_for(program, "aggregator", shape=False).loopback_channel()
        channels = {s: server_for(program, s, next_address=sink, shape=False)
                    .loopback_channel() for s in hardware.sensors[:views]}
        with StarClient(program, channels, timeout_s=30) as client:
            reply = client.request(list(xs))
        torch.testing.assert_close(reply.outputs[0], result.net(*xs), rtol=1e-5, atol=1e-5)


def test_supernet_checkpoint_round_trip_and_refusals(tmp_path):
    for views in (1, 2):
        space = TINY.with_views(views)
        net = SplitSupernet(space).eval()
        save_supernet(tmp_path / str(views), net, {"data": "toy"})
        back, doc = load_supernet(tmp_path / str(views))
        x = _inputs(space, 2)
        arch = space.largest([0])
        torch.testing.assert_close(back(x, arch), net(x, arch))
        assert doc["training"] == {"data": "toy"}
    with pytest.raises(ConfigError, match="no trained supernet"):
        load_supernet(tmp_path / "nothing")
    (tmp_path / "1" / "supernet.json").write_text("{")
    with pytest.raises(ConfigError, match="not readable JSON"):
        load_supernet(tmp_path / "1")


def test_plain_network_cuts_equal_the_layergraph():
    """The baselines' cost (a plain network cut at block boundaries) is the captured graph's."""
    net = SplitSupernet(TINY)
    arch = random_split_arch(TINY, np.random.default_rng(4)).with_splits(())
    r = arch.resolution
    graph = capture(net.extract_plain(arch), (torch.zeros(1, 1, r, r),))
    from edgesplit.nas.splitnets.cost import plain_layers

    part, cuts, _ = plain_layers(TINY, arch)
    assert [(w.op_class, w.macs, w.flops, w.params, w.input_bytes, w.output_bytes)
            for w in part.works()] == \
        [(w.op_class, w.macs, w.flops, w.params, w.input_bytes, w.output_bytes)
         for w in (LayerWork.of(graph, l) for l in graph.layers)]
    hardware = SplitHardware.from_topology(get_topology("hmd-star"), 1)
    costs = hardware.plain_costs(TINY, arch)
    assert [c.cut for c in costs] == [0, *cuts]
    for c in costs[1:]:
        memory = peak_memory(graph, [l.name for l in graph.layers[:c.cut]])
        assert c.cost.sensor_memory_bytes == memory.total_bytes
    whole = hardware.all_on_aggregator(TINY, arch.with_splits([0]))
    assert whole.sensor_ms == 0 and whole.feature_bytes == 4 * r * r


# ---- pricing conventions --------------------------------------------------------------------
@pytest.mark.parametrize("views", [1, 2])
def test_paper_convention_prices_8_bit_sizes_and_op_over_comp(views):
    """SplitNets' Table 4/6 convention: every size is a quarter of float32's, each side's time
    its MACs over its device's MAC rate, T_comm the 8-bit feature over the link share."""
    from edgesplit.nas.splitnets import PAPER

    space = TINY.with_views(views)
    topology = get_topology("hmd-star")
    float32 = SplitHardware.from_topology(topology, views)
    paper = SplitHardware.from_topology(topology, views, pricing=PAPER)
    rng = np.random.default_rng(3)
    for arch in [space.largest([1]), space.smallest([0]), random_split_arch(space, rng)]:
        a, b = float32.cost(space, arch), paper.cost(space, arch)
        assert (4 * b.sensor_weight_bytes, 4 * b.sensor_activation_bytes,
                4 * b.feature_bytes) == (a.sensor_weight_bytes, a.sensor_activation_bytes,
                                         a.feature_bytes)
        assert (b.sensor_macs, b.aggregator_macs) == (a.sensor_macs, a.aggregator_macs)
        # Comp in MACs per second: the preset's peak counts two ops a MAC
        mac_rate_sen = paper.sensor.compute.peak_gops[8] * 1e9 / 2
        mac_rate_agg = paper.aggregator.compute.peak_gops[8] * 1e9 / 2
        assert b.sensor_ms == pytest.approx(1e3 * b.sensor_macs / mac_rate_sen)
        assert b.aggregator_ms == pytest.approx(1e3 * b.aggregator_macs / mac_rate_agg)
        link = paper.link
        share = views if link.shared else 1
        assert b.comm_ms == pytest.approx(
            1e3 * b.feature_bytes * 8 * share / (link.bandwidth_mbps * 1e6 * (1 - link.loss)))
        # the default differs: float32 sizes and the estimators' roofline + crossing costs
        assert a.total_ms != pytest.approx(b.total_ms)
    assert "paper pricing" in paper.describe() and "pricing" not in float32.describe()


def test_paper_convention_prices_plain_networks_and_all_on_aggregator():
    from edgesplit.nas.splitnets import PAPER

    arch = random_split_arch(TINY, np.random.default_rng(5)).with_splits(())
    topology = get_topology("hmd-star")
    float32 = SplitHardware.from_topology(topology, 1)
    paper = SplitHardware.from_topology(topology, 1, pricing=PAPER)
    mac_rate_agg = paper.aggregator.compute.peak_gops[8] * 1e9 / 2
    for a, b in zip(float32.plain_costs(TINY, arch), paper.plain_costs(TINY, arch),
                    strict=True):
        assert 4 * b.cost.feature_bytes == a.cost.feature_bytes
        assert 4 * b.cost.sensor_memory_bytes == a.cost.sensor_memory_bytes
        assert b.cost.aggregator_ms == pytest.approx(1e3 * b.cost.aggregator_macs / mac_rate_agg)
    whole = paper.all_on_aggregator(TINY, arch.with_splits([0]))
    assert whole.feature_bytes == arch.resolution ** 2  # one byte a pixel


# ---- an independently trained network (the fair baselines) ---------------------------------
def _labelled(space: SplitSpace, n: int) -> EvalData:
    x = _inputs(space, n)
    return EvalData("noise", (x,), torch.arange(n) % space.num_classes)


def test_a_network_trained_alone_updates_only_its_own_weights():
    from edgesplit.nas.splitnets.train import SupernetTrainer

    torch.manual_seed(0)
    net = SplitSupernet(TINY)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    arch = TINY.smallest()  # no splitting module, the fewest blocks
    SupernetTrainer(epochs=1, batch_size=8, alone=arch).fit(net, _labelled(TINY, 16))
    after = net.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("stem.") for k in changed)  # its own weights learned
    # what it never runs stayed as initialised: every splitting module, and each phase's
    # blocks beyond its depth
    assert not any(k.startswith(("reduce.", "join.")) for k in changed)
    for i, p in enumerate(arch.phases):
        assert not any(k.startswith(f"blocks.{i}.{j}.") for k in changed
                       for j in range(p.blocks, TINY.phases[i].max_blocks))
    # the same recipe trains the sampler's sub-networks, which do use the splitting modules
    shared = SplitSupernet(TINY)
    fresh = {k: v.clone() for k, v in shared.state_dict().items()}
    SupernetTrainer(epochs=1, batch_size=8).fit(shared, _labelled(TINY, 16))
    assert any(k.startswith("reduce.") and not torch.equal(fresh[k], v)
               for k, v in shared.state_dict().items())


def test_training_alone_refuses_an_architecture_outside_the_space():
    from edgesplit.nas.splitnets.train import SupernetTrainer

    bad = dataclasses.replace(TINY.smallest(), resolution=99)
    with pytest.raises(ConfigError, match="resolution=99"):
        SupernetTrainer(epochs=1, alone=bad).fit(SplitSupernet(TINY), _labelled(TINY, 8))
