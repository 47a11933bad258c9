"""JMSNAS over a mesh (eq. 2): the branched network, its latency model, its result folder."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.graph import capture
from edgesplit.hardware import get_topology
from edgesplit.nas.jmsnas import get_space, load_network, save_network
from edgesplit.nas.jmsnas.branched import (
    BranchedSupernet,
    BranchLayout,
    branched_space,
    shape_keeping_sections,
)
from edgesplit.nas.jmsnas.chain_latency import unit_output_bytes
from edgesplit.nas.jmsnas.mesh_latency import MeshLatency
from edgesplit.nas.jmsnas.result import save_search_result
from edgesplit.nas.jmsnas.sampler import random_arch
from edgesplit.plan import load_plan
from edgesplit.plan.mesh import parallel_regions
from edgesplit.runtime.program import PlanProgram

BASE = get_space("digits-mbconv")
MESH = get_topology("jmsnas-mesh")
LAYOUT = BranchLayout(4, 6, 3)


@dataclass
class FakeTable:
    scale: float
    stem_ms: float = 0.5
    head_ms: float = 0.25
    overhead_ms: float = 0.0

    def layer_vector(self, layer: int) -> list[float]:
        return [self.scale * (layer + 1) * (k + 1) for k in range(len(BASE.layers[layer].ops))]


TABLES = {d.name: FakeTable(scale=1.0 / (i + 1), overhead_ms=0.01 * i)
          for i, d in enumerate(MESH.devices)}


def _hop(a: str, b: str, nbytes: int) -> float:
    link = MESH.link(a, b)
    return nbytes * 8 / (link.bandwidth_mbps * 1e3 * (1 - link.loss)) + link.rtt_ms / 2


def test_sections_and_the_branched_space():
    assert (4, 6) in shape_keeping_sections(BASE) and (1, 2) not in shape_keeping_sections(BASE)
    space = branched_space(BASE, LAYOUT)
    assert LAYOUT.slots(8) == [0, 1, 2, 3, 4, 5, 4, 5, 4, 5, 6, 7]
    assert len(space.layers) == 12
    with pytest.raises(ConfigError, match=r"change the shape.*sections that keep it: 0:1"):
        branched_space(BASE, BranchLayout(1, 3, 3))
    with pytest.raises(ConfigError, match="at least two"):
        BranchLayout(4, 6, 1)


def test_extracted_branched_network_equals_the_supernet_and_captures_one_parallel_region(
        tmp_path):
    space = branched_space(BASE, LAYOUT)
    net = BranchedSupernet(space, LAYOUT, weights="shared").eval()
    x = torch.randn(2, 1, 32, 32)
    rng = np.random.default_rng(0)
    for _ in range(3):
        arch = random_arch(space, rng)
        net.set_arch(arch)
        extracted = net.extract(arch).eval()
        torch.testing.assert_close(extracted(x), net(x))
    arch = space.fixed_arch("largest")
    net.set_arch(arch)
    extracted = net.extract(arch).eval()
    regions = parallel_regions(capture(extracted, x[:1]))
    assert len(regions) == 1 and len(regions[0].components) == 3
    save_network(tmp_path / "net", extracted)
    torch.testing.assert_close(load_network(tmp_path / "net")(x), extracted(x))


def test_expected_latency_is_the_hand_sum_of_eq2():
    model = MeshLatency(BASE, LAYOUT, MESH, TABLES, prefix_units=(0, 0, 0, 1, 1))
    gen = torch.Generator().manual_seed(0)
    space = model.space
    probs = [torch.softmax(torch.randn(len(l.ops), generator=gen), 0) for l in space.layers]
    slots = LAYOUT.slots(8)

    def expected(device: str, k: int) -> float:
        vec = TABLES[device].layer_vector(slots[k])
        return sum(float(p) * u for p, u in zip(probs[k], vec, strict=True))

    sizes = unit_output_bytes(BASE)
    # chain: stem + layers 0, 1 on the UE, layers 2, 3 on the SBS (the root)
    chain = (TABLES["ue"].stem_ms + TABLES["ue"].overhead_ms + TABLES["sbs"].overhead_ms
             + sum(expected("ue", k) for k in (0, 1)) + sum(expected("sbs", k) for k in (2, 3))
             + _hop("ue", "sbs", sizes[2]))
    copies = []
    for b, device in enumerate(("mbs1", "mbs2", "mbs3")):
        compute = sum(expected(device, 4 + 2 * b + j) for j in range(2))
        copies.append(compute + _hop("sbs", device, sizes[4]) + _hop(device, "cloud", sizes[6])
                      + TABLES[device].overhead_ms)
    aggregator = (sum(expected("cloud", k) for k in (10, 11)) + TABLES["cloud"].head_ms
                  + TABLES["cloud"].overhead_ms)
    assert float(model(probs)) == pytest.approx(chain + max(copies) + aggregator, rel=1e-12)
    arch = space.fixed_arch("smallest")
    one_hot = [torch.nn.functional.one_hot(torch.tensor(i), len(l.ops)).double()
               for i, l in zip(space.arch_indices(arch), space.layers, strict=True)]
    assert model.of_arch(arch) == pytest.approx(float(model(one_hot)), rel=1e-12)


def test_best_section_equals_brute_force_and_budgets_are_checked():
    uniform = lambda m: float(m([torch.full((len(ms),), 1 / len(ms)) for ms in m.layer_ms]))  # noqa: E731
    best = MeshLatency.best(BASE, MESH, TABLES)
    brute = min(uniform(MeshLatency(BASE, BranchLayout(f, j, 3), MESH, TABLES))
                for f, j in shape_keeping_sections(BASE))
    assert uniform(best) == pytest.approx(brute)
    fastest, _ = best.fastest()
    best.check_budget(fastest * 1.01)
    with pytest.raises(InfeasibleError, match="the fastest"):
        best.check_budget(fastest / 2)
    with pytest.raises(ConfigError, match="copies its section 2 times"):
        MeshLatency(BASE, BranchLayout(4, 6, 2), MESH, TABLES)


def test_result_folder_of_a_mesh_network_always_holds_a_plan_that_runs(tmp_path):
    space = branched_space(BASE, LAYOUT)
    supernet = BranchedSupernet(space, LAYOUT, weights="shared").eval()
    arch = random_arch(space, np.random.default_rng(1))
    net = supernet.extract(arch).eval()
    result = save_search_result(tmp_path / "mesh", net, MESH)
    # the planner may find a chain through the mesh faster than any parallel plan; when it
    # keeps a parallel (predict-only) plan, the best chain is written beside it
    assert ("runnable_plan" in result.summary) == (not result.summary["plan"]["runnable"])
    runs = result.summary.get("runnable_plan", result.summary["plan"])["file"]
    program = PlanProgram.load(load_plan(tmp_path / "mesh" / runs))
    x = torch.randn(1, 1, 32, 32)
    outputs, _ = program.run_local([x])
    torch.testing.assert_close(outputs[0], net(x), rtol=1e-4, atol=1e-5)
