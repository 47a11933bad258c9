"""The L2S trace-driven simulator: delay model, the Oracle, bandwidth drops, sync bytes."""

from __future__ import annotations

import pytest

from edgesplit.errors import ConfigError
from edgesplit.hardware import get_device
from edgesplit.train.simulator import (
    BandwidthTrace,
    CutCost,
    FixedPolicy,
    OraclePolicy,
    edge_ms,
    simulate,
    training_costs,
)
from helpers import captured


@pytest.fixture(scope="module")
def costs():
    return training_costs(captured("alexnet"), get_device("raspberry-pi-4"),
                          get_device("gtx1080ti-server"))


def test_costs_cover_every_chain_point_and_pure_on_device(costs):
    graph = captured("alexnet")
    assert costs[-1].split == len(graph.layers) and costs[-1].up_bytes == 0
    assert [c.split for c in costs] == sorted({c.split for c in costs})
    for c in costs[:-1]:
        assert c.up_bytes == c.down_bytes + 8  # activation + one int64 label, gradient back
    device = [c.device_ms for c in costs]
    assert device == sorted(device)  # more layers on the device, more device time


def test_edge_delay_is_transfer_plus_server_plus_rtt():
    cost = CutCost(split=1, after="a", device_ms=1.0, server_ms=2.0, up_bytes=1_000_008,
                   down_bytes=1_000_000)
    assert edge_ms(cost, 8.0, 5.0) == pytest.approx((2_000_008 * 8) / 8_000 + 2.0 + 5.0)
    assert edge_ms(CutCost(9, "z", 4.0, 0.0, 0, 0), 8.0, 5.0) == 0.0


def test_oracle_is_never_worse_than_a_fixed_partition_without_noise(costs):
    trace = BandwidthTrace(60.0, drop_at=50, drop_to=2.0)
    oracle = simulate(costs, trace, OraclePolicy(costs, trace, range(len(costs))), 100, noise=0)
    assert len(set(oracle.partitions)) == 2  # it follows the drop
    for arm in range(len(costs)):
        fixed = simulate(costs, trace, FixedPolicy(arm), 100, noise=0)
        assert all(o <= f + 1e-9 for o, f, s in zip(oracle.delays_ms, fixed.delays_ms,
                                                    oracle.sync_bytes, strict=True) if not s)


def test_weight_sync_is_periodic_or_on_every_change(costs):
    class Alternate:
        sync_due = False

        def select(self, t):
            self.sync_due = t == 6  # e.g. L2S leaving adaptation mode
            return 0 if t % 2 else 3

        def update(self, arm, d):
            return None

    moved = sum(costs[0].layer_param_bytes[costs[0].split:costs[3].split])
    trace = BandwidthTrace(60.0)
    every = simulate(costs, trace, Alternate(), 10, noise=0, sync_every=None)
    assert every.sync_bytes == [0] + [moved] * 9  # FWS: each change moves the layers once
    periodic = simulate(costs, trace, Alternate(), 10, noise=0, sync_every=4)
    # rounds 1-4 trained the layers between the two cuts on both sides: both updates cross
    # (merge) at round 4; again at the requested sync after round 6 and at round 8; rounds
    # 9-10 are not synchronised yet
    assert periodic.sync_bytes == [0, 0, 0, 2 * moved, 0, 2 * moved, 0, 2 * moved, 0, 0]
    assert sum(periodic.delays_ms) > sum(simulate(costs, trace, Alternate(), 10, noise=0,
                                                  sync_every=1000).delays_ms)


def test_no_sync_while_the_partition_stays_put(costs):
    log = simulate(costs, BandwidthTrace(60.0), FixedPolicy(2), 250, noise=0, sync_every=100)
    assert log.sync_bytes == [0] * 250


def test_bad_traces_say_what_is_wrong():
    with pytest.raises(ConfigError, match="positive"):
        BandwidthTrace(0.0)
    with pytest.raises(ConfigError, match="drop_to"):
        BandwidthTrace(10.0, drop_at=5)


def test_simulate_l2s_json_contract(tmp_path):
    import json

    from typer.testing import CliRunner

    from edgesplit.cli import app

    plot = tmp_path / "l2s.png"
    result = CliRunner().invoke(app, ["simulate-l2s", "--model", "alexnet", "--rounds", "60",
                                      "--drop-at", "30", "--drop-to", "5", "--privacy-split",
                                      "3", "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc["policies"]) == {"oracle", "fpt", "pdt", "linucb", "l2s", "l2s_fws"}
    assert doc["privacy_point"] >= 3
    for run in doc["policies"].values():
        assert len(run["delays_ms"]) == len(run["partitions"]) == 60
        assert min(run["partitions"]) >= doc["privacy_point"]
    assert set(doc["policies"]["fpt"]["partitions"]) == {doc["privacy_point"]}
    assert plot.stat().st_size > 10_000


def test_simulate_l2s_privacy_point_from_the_kl_analysis():
    import json

    from typer.testing import CliRunner

    from edgesplit.cli import app

    result = CliRunner().invoke(app, ["simulate-l2s", "--model", "digits_cnn", "--rounds", "80",
                                      "--privacy-kl", "1.0", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["privacy"]["threshold"] == 1.0 and len(doc["privacy"]["kl_per_cut"]) == 10
    assert doc["privacy_point"] == doc["privacy"]["privacy_split"]
    for name in ("linucb", "l2s", "l2s_fws"):
        errors = doc["policies"][name]["prediction_error"]
        assert len(errors) == 80 and all(e is None or e >= 0 for e in errors)
    both = CliRunner().invoke(app, ["simulate-l2s", "--privacy-kl", "1", "--privacy-split", "3"])
    assert both.exit_code == 2 and "not both" in both.output


def test_settling_sync_brings_the_layers_about_to_move_once(costs):
    class Settles:
        next_partition, sync_due = None, False

        def select(self, t):
            self.sync_due = False
            return 0 if self.next_partition is None else 3

        def update(self, arm, d):
            return None

        def observe(self, t, total):
            if t == 3:  # settles on partition 3 after round 3, played at partition 0
                self.next_partition, self.sync_due = 3, True

    moved = sum(costs[0].layer_param_bytes[costs[0].split:costs[3].split])
    log = simulate(costs, BandwidthTrace(60.0), Settles(), 8, noise=0, sync_every=100)
    # only the server trained them (partition 0 keeps them there): sent once, not merged
    assert log.sync_bytes == [0, 0, moved, 0, 0, 0, 0, 0]
