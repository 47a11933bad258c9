"""A searched network's folder: it reloads, its plan over a topology loads in the runtime, and
the plan run over the loopback transport, hop by hop, computes what the unsplit network does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgesplit.hardware import get_topology
from edgesplit.nas.jmsnas import Supernet, get_space, load_network
from edgesplit.nas.jmsnas.result import save_search_result
from edgesplit.nas.jmsnas.sampler import random_arch
from edgesplit.plan import load_plan
from edgesplit.runtime.program import PlanProgram
from edgesplit.runtime.transport import ChainClient, PartitionServer

SPACE = get_space("digits-mbconv")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    torch.manual_seed(0)
    supernet = Supernet(SPACE, weights="shared").eval()
    arch = random_arch(SPACE, np.random.default_rng(3))
    net = supernet.extract(arch).eval()
    folder = tmp_path_factory.mktemp("jmsnas")
    res = save_search_result(folder, net, get_topology("jmsnas-chain"),
                             summary={"arch": arch.to_dict()})
    return net, res


def test_folder_holds_network_program_plan_and_summary(result):
    net, res = result
    names = {p.name for p in res.folder.iterdir()}
    assert {"arch.json", "weights.safetensors", "model.pt2", "plan.json", "search.json"} <= names
    x = torch.randn(2, 1, 32, 32)
    torch.testing.assert_close(load_network(res.folder)(x), net(x))
    doc = json.loads((res.folder / "search.json").read_text())
    assert doc["plan"]["method"] == "multisplit" and doc["plan"]["runnable"]
    assert load_plan(res.folder / "plan.json").predicted.total_ms == pytest.approx(
        doc["plan"]["predicted_ms"])


def test_the_plan_runs_split_and_equals_the_unsplit_network(result):
    net, res = result
    program = PlanProgram.load(load_plan(res.folder / "plan.json"))
    x = torch.randn(1, 1, 32, 32)
    outputs, _ = program.run_local([x])
    torch.testing.assert_close(outputs[0], net(x), rtol=1e-4, atol=1e-5)
    # the same over the loopback transport: every device after the first serves its part
    devices = [step.name for step in program.steps]
    channel = None
    for device in reversed(devices[1:]):
        channel = PartitionServer(program, device, next_address=channel,
                                  shape=False).loopback_channel()
    with ChainClient(program, channel, shape=False, timeout_s=30) as client:
        got = client.request([x]).outputs
    torch.testing.assert_close(got[0], net(x), rtol=1e-4, atol=1e-5)
