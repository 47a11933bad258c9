"""`edgesplit train-split`: a real two-process run (the CLI starts `edgesplit serve-training`)
on the digits, with the emulated bandwidth dropping mid-run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xdist_group("train_split")

DROP_AT = 38  # half-way through one epoch of 75 rounds of 16
# Which cut L2S prefers depends on measured delays, i.e. on this machine's speed relative to
# the emulated link, so this end-to-end run asserts only what holds on any machine; that L2S
# moves the cut when the bandwidth drops is tested with injected delays in
# tests/train/test_train_remote.py
# (test_l2s_moves_the_cut_when_the_bandwidth_drops_with_injected_delays).


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgesplit.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_real_run_with_a_bandwidth_drop_trains_like_unsplit(tmp_path):
    plot = tmp_path / "run.png"
    done = _cli("train-split", "--epochs", "1", "--batch-size", "16", "--device-slowdown", "40",
                "--bandwidth-mbps", "1000", "--drop-at", str(DROP_AT), "--drop-to", "20",
                "--horizon", "15", "--privacy-kl", "0.2", "--json", "--plot", str(plot))
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    rounds = doc["rounds"]
    assert rounds["rounds"] == 75 == len(rounds["partitions"]) == len(rounds["delays_ms"])
    assert set(rounds["partitions"]) <= set(doc["cuts"])
    assert doc["cuts"][0] == doc["privacy"]["chain_point"] - 1  # nothing before P^c is sent
    # FWS keeps split training equal to unsplit training (same machine, same run)
    assert abs(doc["accuracy"] - doc["baseline_accuracy"]) <= 2.0
    assert rounds["bandwidth_mbps"][DROP_AT - 2:DROP_AT] == [1000.0, 20.0]
    assert all(a["round"] <= rounds["rounds"] for a in doc["adaptations"])
    assert all(d > 0 for d in rounds["delays_ms"]) and plot.stat().st_size > 10_000


def test_train_split_user_errors_are_one_line():
    fixed = _cli("train-split", "--policy", "fixed", "--epochs", "1")
    assert fixed.returncode == 2 and "--cut" in fixed.stderr and "Traceback" not in fixed.stderr
    nowhere = _cli("train-split", "--server", "127.0.0.1:9", "--epochs", "1", timeout=120)
    assert nowhere.returncode == 2 and "Traceback" not in nowhere.stderr
    assert "127.0.0.1:9" in nowhere.stderr
