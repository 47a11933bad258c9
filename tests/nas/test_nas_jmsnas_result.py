"""A searched network's folder: it reloads; its plan is the faster of the search's own device
assignment and the re-plan, both recorded; and a searched network whose plan spans devices runs
split over real `edgesplit serve` processes and computes what the unsplit network does."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from edgesplit.data import EvalData
from edgesplit.data.training import LabelledData
from edgesplit.hardware import get_topology
from edgesplit.nas.core.ops import OpSpec
from edgesplit.nas.jmsnas import ArchNet, HeadSpec, SearchSpace, StemSpec, load_network
from edgesplit.nas.jmsnas.chain_latency import ChainPlacement
from edgesplit.nas.jmsnas.result import OWN_PLAN_FILE, save_search_result
from edgesplit.nas.jmsnas.run import run_jmsnas
from edgesplit.plan import load_plan
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.program import PlanProgram
from helpers import free_port

TOPOLOGY = get_topology("jmsnas-chain")
DEVICES = tuple(TOPOLOGY.chain_order())  # ue, sbs, mbs, cloud
# stem, two searchable layers (no identity: every unit has graph layers), head: 4 units
SPACE = SearchSpace.from_stages(
    "tiny-chain", (1, 16, 16), 10, stem=StemSpec(8, kernel=3, stride=2),
    stages=[(16, 1, 2), (16, 1, 1)], head=HeadSpec(32),
    candidates=(OpSpec("mbconv", 3, 3, False), OpSpec("mbconv", 3, 6, False)))
# graph layers per unit: stem 1; an mbconv 3 (expand, depthwise, project); head conv, pool,
# classifier 3
UNIT_LAYERS = (1, 3, 3, 3)


def _net(seed: int = 0) -> ArchNet:
    torch.manual_seed(seed)
    return ArchNet(SPACE, SPACE.fixed_arch("largest")).eval()


@pytest.fixture(scope="module")
def relayed(tmp_path_factory):
    """Every unit on its own device: the input and three tensors cross the slow links."""
    net = _net()
    placement = ChainPlacement.from_counts(DEVICES, (1, 1, 1, 1))
    folder = tmp_path_factory.mktemp("relayed")
    return net, save_search_result(folder, net, TOPOLOGY, placement=placement,
                                   summary={"arch": net.arch.to_dict()})


def test_folder_holds_network_program_both_plans_and_summary(relayed):
    net, res = relayed
    names = {p.name for p in res.folder.iterdir()}
    assert {"arch.json", "weights.safetensors", "model.pt2", "plan.json", "plan_own.json",
            "plan_replan.json", "search.json"} <= names
    x = torch.randn(2, *SPACE.input_shape)
    torch.testing.assert_close(load_network(res.folder)(x), net(x))
    doc = json.loads((res.folder / "search.json").read_text())
    assert set(doc["plans"]) == {"own", "replan"}
    assert doc["plans"]["own"]["method"] == "chain_manual"
    assert doc["plans"]["replan"]["method"] == "multisplit"
    assert load_plan(res.folder / "plan.json").predicted.total_ms == pytest.approx(
        doc["plan"]["predicted_ms"])


def test_own_plan_runs_each_unit_where_the_search_placed_it(relayed):
    _, res = relayed
    own = load_plan(res.folder / OWN_PLAN_FILE)
    assert {d.name: len(d.layers) for d in own.devices} == dict(zip(DEVICES, UNIT_LAYERS,
                                                                     strict=True))
    assert own.devices[0].layers == ["stem"]
    assert all(name.startswith("layers.0.") for name in own.devices[1].layers)


def test_the_faster_plan_is_kept_and_a_tie_keeps_the_searchs_own(relayed, tmp_path):
    _, res = relayed
    doc = res.summary
    own, replan = doc["plans"]["own"]["predicted_ms"], doc["plans"]["replan"]["predicted_ms"]
    assert replan < own  # relaying three tensors over 25-200 Mbps links is slower
    assert doc["kept"] == "replan" and res.plan.predicted.total_ms == replan
    # the re-plan's own layer counts, given back as the search's placement: a tie
    counts = list(doc["plans"]["replan"]["devices"].values())
    units, done = [], 0
    for m in range(len(counts)):  # units whose graph layers fill device m's count
        while done < sum(counts[:m + 1]):
            done += UNIT_LAYERS[len(units)]
            units.append(m)
    same = save_search_result(tmp_path, _net(), TOPOLOGY,
                              placement=ChainPlacement(DEVICES, tuple(units)))
    assert same.summary["kept"] == "own"
    assert same.summary["plans"]["own"]["predicted_ms"] == pytest.approx(replan)


# ---- a searched network over real processes ------------------------------------------------
def _serve(plan: Path, device: str, port: int, next_hop: str | None, log: Path
           ) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "edgesplit.cli", "serve", str(plan), "--device", device,
           "--port", str(port), "--no-shape", *(["--next", next_hop] if next_hop else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            env=env)


def _wait_listening(proc: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    while True:
        line = lines.get(timeout=timeout_s)
        assert line is not None, f"server exited with {proc.wait()}: {log.read_text()[-2000:]}"
        if line.startswith("listening on "):
            return


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A real (tiny) search with the stem on the UE, a layer on the SBS and on the MBS, the
    head on the cloud: its own plan spans four devices with layers on each."""
    g = torch.Generator().manual_seed(0)

    def part(n: int) -> EvalData:
        return EvalData("noise", (torch.randn(n, *SPACE.input_shape, generator=g),),
                        torch.arange(n) % 10)

    data = LabelledData("noise", part(40), part(10), tuple(str(i) for i in range(10)))
    folder = tmp_path_factory.mktemp("searched")
    run = run_jmsnas(SPACE, TOPOLOGY, data, budget_ms=1000.0, placement=[1, 1, 1, 1],
                     out=folder, warmup_epochs=1, epochs=1, retrain_epochs=1, batch_size=16)
    return run, folder


def test_a_searched_network_runs_split_over_processes_equal_to_unsplit(searched, tmp_path):
    run, folder = searched
    net = run.search.model_.eval()
    plan = load_plan(folder / OWN_PLAN_FILE)
    assert run.summary()["plans"]["own"]["devices"] == dict(zip(DEVICES, UNIT_LAYERS,
                                                                 strict=True))
    program = PlanProgram.load(plan)
    ports = {d: free_port() for d in DEVICES[1:]}
    procs = []
    try:
        for k, device in enumerate(DEVICES[1:], start=1):  # all start at once: start-up is slow
            nxt = f"127.0.0.1:{ports[DEVICES[k + 1]]}" if k + 1 < len(DEVICES) else None
            log = tmp_path / f"{device}.err"
            procs.append((_serve(folder / OWN_PLAN_FILE, device, ports[device], nxt, log), log))
        for proc, log in procs:
            _wait_listening(proc, log)
        x = torch.randn(1, *SPACE.input_shape, generator=torch.Generator().manual_seed(1))
        with ChainClient(program, f"127.0.0.1:{ports['sbs']}", shape=False, timeout_s=60,
                         retries=20, retry_backoff_s=0.1) as client:
            got = client.request([x])
        assert {"sbs.compute_ms", "mbs.compute_ms", "cloud.compute_ms"} <= set(got.hops_ms)
        with torch.no_grad():
            want = net(x)
        torch.testing.assert_close(got.outputs[0], want, rtol=1e-5, atol=1e-6)
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
