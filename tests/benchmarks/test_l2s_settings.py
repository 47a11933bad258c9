"""The L2S benchmark's settings: alpha and ridge are chosen on tuning settings disjoint from
the reported ones, and the reported ones include an Oracle that cuts in the middle (L2S Fig. 1),
computed here from the cost model rather than taken from the results file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from edgesplit.hardware import get_device, get_link
from edgesplit.train.l2s import oracle_cut
from edgesplit.train.simulator import BandwidthTrace, training_costs

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_l2s.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_l2s", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_l2s"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_l2s", None)


def test_tuning_and_evaluation_settings_are_disjoint(bench):
    assert bench.TUNING and bench.EVALUATION
    assert not set(bench.TUNING) & set(bench.EVALUATION)
    # stronger: no tuning device is reported, so no device's presets leak into the choice
    assert not {d for d, _, _ in bench.TUNING} & {d for d, _, _ in bench.EVALUATION}
    for device, model, link in bench.TUNING + bench.EVALUATION:
        get_device(device), get_link(link)  # every name is in the catalog
        assert model in bench.MODELS


def test_the_sweep_runs_only_tuning_settings(bench, monkeypatch):
    seen = []
    run = {"delays_ms": [1.0] * (bench.AFTER + 10)}

    def fake_setting(graph, device, mbps, **kw):
        seen.append((graph, device, mbps))
        return [{"policies": {"l2s": run, "oracle": run}}]

    monkeypatch.setattr(bench, "SWEEP", {"alpha": (0.3,), "ridge": (0.03,)})
    monkeypatch.setattr(bench, "_setting", fake_setting)
    rows = bench._sweep({m: m for m in bench.MODELS})
    assert rows[0]["met"] == len(bench.TUNING)
    assert seen == [(m, d, get_link(link).bandwidth_mbps) for d, m, link in bench.TUNING]


def test_an_evaluation_oracle_cuts_in_the_middle(bench):
    graphs: dict = {}
    kinds = []
    for device, model, link in bench.EVALUATION:
        if model not in graphs:
            graphs[model] = bench._graph(model)  # batch 16, 10 classes, as the bench runs it
        graph = graphs[model]
        trace = BandwidthTrace(get_link(link).bandwidth_mbps, bench.RTT_MS)
        cut = oracle_cut(graph, get_device(device), get_device(bench.SERVER), trace,
                         privacy_split=bench.PRIVACY)
        costs = training_costs(graph, get_device(device), get_device(bench.SERVER))
        splits = [c.split for c in costs]
        assert cut.split in splits
        if cut.kind == "interior":
            assert bench.PRIVACY < cut.split < splits[-1]
        kinds.append(cut.kind)
    assert "interior" in kinds
    assert "on-device" in kinds  # the TX2 of the paper stays in the grid


def test_oracle_cut_kinds_follow_the_bandwidth():
    from helpers import captured

    graph = captured("alexnet")
    pi, server = get_device("raspberry-pi-4"), get_device("gtx1080ti-server")
    slow = oracle_cut(graph, pi, server, BandwidthTrace(0.01))
    assert slow.kind == "on-device" and slow.split == len(graph.layers)
    fast = oracle_cut(graph, pi, server, BandwidthTrace(1e6, rtt_ms=0.0), privacy_split=4)
    assert fast.kind == "earliest" and fast.split >= 4
