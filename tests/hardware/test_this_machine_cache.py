"""``this-machine`` is measured once per machine and cached under a fingerprint of what the
measurement depends on; asked, or when the cache is unreadable, it is measured again. The
measurement itself is replaced by a counter here (it takes seconds and is covered by
test_hardware)."""

from __future__ import annotations

import pytest
import torch

from edgesplit.hardware import this_machine
from edgesplit.hardware.device import AnalyticalCompute, Device


@pytest.fixture
def measured(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESPLIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EDGESPLIT_REMEASURE", raising=False)
    calls: list[int] = []

    def fake() -> Device:
        calls.append(1)
        return Device(name="this-machine", kind="cpu", compute=AnalyticalCompute(
            peak_gops={32: 10.0 * len(calls)}, memory_bandwidth_gb_per_s=5.0))

    monkeypatch.setattr(this_machine, "_measure", fake)
    this_machine.measure_this_machine.cache_clear()
    yield calls
    this_machine.measure_this_machine.cache_clear()


def _peak() -> float:
    this_machine.measure_this_machine.cache_clear()  # a new process
    return this_machine.measure_this_machine().compute.peak_gops[32]


def test_measured_once_then_read_from_the_cache(measured, tmp_path):
    assert _peak() == 10.0 and len(measured) == 1
    assert _peak() == 10.0 and len(measured) == 1  # read back, not measured
    assert len(list((tmp_path / "hardware").glob("this-machine-*.json"))) == 1


def test_asked_it_measures_again(measured, monkeypatch):
    _peak()
    assert this_machine.remeasure_this_machine().compute.peak_gops[32] == 20.0
    assert _peak() == 20.0 and len(measured) == 2  # the new one is what later reads get
    monkeypatch.setenv("EDGESPLIT_REMEASURE", "1")
    assert _peak() == 30.0


def test_another_thread_count_is_another_machine(measured, monkeypatch):
    _peak()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert _peak() == 20.0  # not the first one's measurement
    finally:
        torch.set_num_threads(threads)
    assert _peak() == 10.0


def test_an_unreadable_cache_is_measured_around(measured, tmp_path):
    _peak()
    (path,) = (tmp_path / "hardware").glob("this-machine-*.json")
    path.write_text("{not json")
    assert _peak() == 20.0
    assert _peak() == 20.0 and len(measured) == 2  # and written again whole
