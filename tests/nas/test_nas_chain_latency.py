"""JMSNAS eq. (1) with expected layer latencies: hand sums, placement DP against brute force,
the infeasible budget, and agreement with the shapes an extracted network really sends."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import pytest
import torch

from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.hardware import get_topology
from edgesplit.nas.jmsnas import ArchNet, get_space
from edgesplit.nas.jmsnas.chain_latency import ChainLatency, ChainPlacement, unit_output_bytes

SPACE = get_space("digits-mbconv")
TOPOLOGY = get_topology("jmsnas-chain")
DEVICES = TOPOLOGY.chain_order()


@dataclass
class FakeTable:
    scale: float
    stem_ms: float = 0.5
    head_ms: float = 0.25

    def layer_vector(self, layer: int) -> list[float]:
        return [self.scale * (layer + 1) * (k + 1) for k in range(len(SPACE.layers[layer].ops))]


TABLES = {d: FakeTable(scale=1.0 / (i + 1)) for i, d in enumerate(DEVICES)}


def _hop(a: str, b: str, nbytes: int) -> float:
    link = TOPOLOGY.link(a, b)
    return nbytes * 8 / (link.bandwidth_mbps * 1e3 * (1 - link.loss)) + link.rtt_ms / 2


def test_unit_bytes_match_what_the_network_computes():
    net = ArchNet(SPACE, SPACE.fixed_arch("largest")).eval()
    x = torch.randn(1, *SPACE.input_shape)
    outs = [net.forward_stem(x)]
    for layer in net.layers.values():
        outs.append(layer(outs[-1]))
    outs.append(net.forward_head(outs[-1]))
    assert unit_output_bytes(SPACE) == [4 * o.numel() for o in outs]


def test_expected_latency_is_the_hand_sum_of_eq1():
    counts = (3, 2, 3, 2)  # stem + 2 layers on the UE, 2 on the SBS, 3 on the MBS, 2 + head
    placement = ChainPlacement.from_counts(DEVICES, counts)
    model = ChainLatency(SPACE, TOPOLOGY, TABLES, placement)
    gen = torch.Generator().manual_seed(0)
    probs = [torch.softmax(torch.randn(len(l.ops), generator=gen), 0) for l in SPACE.layers]
    on = placement.unit_device
    compute = TABLES[DEVICES[on[0]]].stem_ms + TABLES[DEVICES[on[-1]]].head_ms
    for n, p in enumerate(probs):
        table = TABLES[DEVICES[on[n + 1]]]
        compute += sum(float(pi) * u for pi, u in zip(p, table.layer_vector(n), strict=True))
    sizes = unit_output_bytes(SPACE)
    # the output of the last unit on each of the first three devices goes one hop on
    ends = [sum(counts[: m + 1]) - 1 for m in range(3)]
    transfers = sum(_hop(DEVICES[m], DEVICES[m + 1], sizes[ends[m]]) for m in range(3))
    assert float(model(probs)) == pytest.approx(compute + transfers, rel=1e-12)
    arch = SPACE.fixed_arch("smallest")
    one_hot = [torch.nn.functional.one_hot(torch.tensor(i), len(l.ops)).double()
               for i, l in zip(SPACE.arch_indices(arch), SPACE.layers, strict=True)]
    assert model.of_arch(arch) == pytest.approx(float(model(one_hot)), rel=1e-12)
    assert sum(model.breakdown(arch).values()) == pytest.approx(model.of_arch(arch), rel=1e-12)


def test_relays_and_result_delivery_are_charged():
    # everything on the UE: only the logits travel, relayed over all three links to the cloud
    model = ChainLatency(SPACE, TOPOLOGY, TABLES, ChainPlacement.from_counts(DEVICES,
                                                                            (10, 0, 0, 0)))
    logits = unit_output_bytes(SPACE)[-1]
    expected = sum(_hop(a, b, logits) for a, b in itertools.pairwise(DEVICES))
    assert model.transfer_ms == pytest.approx(expected, rel=1e-12)


def test_best_placement_equals_brute_force():
    best = ChainLatency.best_placement(SPACE, TOPOLOGY, TABLES)
    uniform = [torch.full((len(l.ops),), 1 / len(l.ops)) for l in SPACE.layers]
    brute = min(
        float(ChainLatency(SPACE, TOPOLOGY, TABLES, ChainPlacement(tuple(DEVICES), units))(
            uniform))
        for units in itertools.combinations_with_replacement(range(4), len(SPACE.layers) + 2))
    assert float(best(uniform)) == pytest.approx(brute, rel=1e-9)


def test_infeasible_budget_names_the_fastest_latency():
    model = ChainLatency.best_placement(SPACE, TOPOLOGY, TABLES, fastest=True)
    fastest_ms, _ = model.fastest()
    model.check_budget(fastest_ms * 1.01)
    with pytest.raises(InfeasibleError, match=r"the fastest .* takes [0-9.]+ ms"):
        model.check_budget(fastest_ms * 0.5)


def test_bad_placements_and_topologies_are_refused():
    with pytest.raises(ConfigError, match="move forward"):
        ChainPlacement(tuple(DEVICES), (1, 0))
    with pytest.raises(ConfigError, match="one non-negative unit count per device"):
        ChainPlacement.from_counts(DEVICES, (1, 2))
    with pytest.raises(ConfigError, match=r"has 10 \(stem, layers, head\)"):
        ChainLatency(SPACE, TOPOLOGY, TABLES, ChainPlacement.from_counts(DEVICES, (1, 1, 1, 1)))
    with pytest.raises(ConfigError, match="not a chain"):
        ChainLatency.best_placement(SPACE, get_topology("jmsnas-mesh"), TABLES)
    with pytest.raises(ConfigError, match="no latency table for device"):
        ChainLatency.best_placement(SPACE, TOPOLOGY, {DEVICES[0]: TABLES[DEVICES[0]]})


def test_every_busy_device_pays_its_overhead_once():
    tables = {d: FakeTable(scale=1.0) for d in DEVICES}
    for i, table in enumerate(tables.values()):
        table.overhead_ms = 0.1 * (i + 1)  # type: ignore[attr-defined]
    placement = ChainPlacement.from_counts(DEVICES, (4, 0, 6, 0))  # the UE and the MBS compute
    model = ChainLatency(SPACE, TOPOLOGY, tables, placement)
    without = ChainLatency(SPACE, TOPOLOGY, {d: FakeTable(scale=1.0) for d in DEVICES},
                           placement)
    arch = SPACE.fixed_arch("largest")
    assert model.of_arch(arch) - without.of_arch(arch) == pytest.approx(0.1 + 0.3)


@pytest.mark.parametrize("kind", ["largest", "mobilenetv2", "smallest"])
def test_fashion_mbconv_on_jmsnas_chain_is_faster_split_than_on_any_one_device(kind):
    """The benchmark's setting: with the preset devices' tables, the search's placement puts
    the stem and early layers on the UE and the rest on the SBS, and every single device
    alone (input relayed to it) is slower for the space's largest, MobileNetV2-style and
    smallest networks."""
    space = get_space("fashion-mbconv")
    tables = _fashion_tables(space)
    split = ChainLatency.best_placement(space, TOPOLOGY, tables)
    ue, sbs, *_ = split.placement.counts()
    assert ue >= 2 and sbs >= 2 and sum(split.placement.counts()) == ue + sbs
    arch = space.fixed_arch(kind)
    units = len(space.layers) + 2
    alone = [ChainLatency(space, TOPOLOGY, tables, ChainPlacement(tuple(DEVICES), (m,) * units))
             .of_arch(arch) for m in range(len(DEVICES))]
    assert split.of_arch(arch) < min(alone)


@functools.cache
def _fashion_tables(space):
    from edgesplit.nas.jmsnas.run import latency_tables

    return latency_tables(space, TOPOLOGY)
