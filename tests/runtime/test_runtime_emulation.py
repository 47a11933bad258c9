"""Compute emulation: a partition sleeps until its compute took what the plan predicts for its
device, so a fast machine rehearses slow presets end to end. The presets here are hundreds of
times slower than any CPU, so the sleep dominates and every check compares against the plan's
own prediction (never a fixed time)."""

from __future__ import annotations

import logging

import pytest

from edgesplit.hardware import AnalyticalCompute, Device, Link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, get_planner
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.session import run_requests
from helpers import server_for

SPLIT = "down2.0"


def _slow(name: str, gops: float) -> Device:
    """A device far slower than this machine (digits_cnn takes tens of ms on it)."""
    return Device(name=name, kind="mcu", compute=AnalyticalCompute(
        peak_gops={32: gops}, memory_bandwidth_gb_per_s=0.05, default_efficiency=1.0,
        layer_overhead_ms=1.0))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest


@pytest.fixture(scope="module")
def program() -> PlanProgram:
    # edge about 0.4 s, cloud about 0.2 s: a stall of this loaded machine stays a few per cent
    setting = EdgeCloudSetting(edge=_slow("slow-edge", 0.04), cloud=_slow("slow-cloud", 0.08),
                               link=Link(name="lan", bandwidth_mbps=200.0, rtt_ms=4.0,
                                         medium="wired"))
    plan = get_planner("manual", split_after=[SPLIT]).plan(PlanningProblem("digits_cnn", setting))
    return PlanProgram.load(plan)


def test_emulate_targets_the_plans_per_device_compute(program):
    targets = program.emulate()
    assert targets == pytest.approx(program.plan.predicted.compute_ms)
    assert all(ms > 100 for ms in targets.values())  # the sleep dominates on any CPU


def test_emulated_run_follows_the_plan_within_ten_percent(program):
    program.emulate()
    server = server_for(program, "cloud", shape=True)
    try:
        report = run_requests(program, server.loopback_channel(), requests=3, warmup=1,
                              client_options={"shape": True})
    finally:
        server.stop(grace_s=1.0)
    assert report["errors"] == 0 and report["max_abs_diff"] < 1e-4
    predicted = program.plan.predicted
    measured = report["breakdown_ms"]
    assert measured["total"] == pytest.approx(predicted.total_ms, rel=0.10)
    assert measured["edge"] == pytest.approx(predicted.compute_ms["edge"], rel=0.10)
    assert measured["remote"] == pytest.approx(predicted.compute_ms["cloud"], rel=0.10)
    # both devices slept most of their share, and the report says how much
    slept = report["emulated_ms"]
    assert set(slept) == {"edge", "cloud"}
    for device, ms in slept.items():  # (a sleep overshoots by a little)
        assert 0.5 * predicted.compute_ms[device] < ms < 1.1 * predicted.compute_ms[device]
    assert all(set(r["emulated_ms"]) == {"edge", "cloud"} for r in report["per_request"])


def test_run_local_with_emulation_computes_for_the_predicted_time(program):
    program.emulate()
    _, timings = program.run_local()
    assert timings["compute"] == pytest.approx(sum(program.plan.predicted.compute_ms.values()),
                                               rel=0.10)


def test_a_machine_slower_than_the_preset_warns_once_and_runs_as_is(program, caplog):
    step = program.steps[0]
    saved = step.emulate_ms
    step.emulate_ms, step._warned = 1e-6, False  # any real compute is slower than this
    try:
        with caplog.at_level(logging.WARNING, logger="edgesplit.runtime.program"):
            program.run_local()
            program.run_local()
        assert step.take_emulated_ms() == 0.0
    finally:
        step.emulate_ms = saved
    warnings = [r for r in caplog.records if "emulation cannot speed" in r.getMessage()]
    assert len(warnings) == 1 and "'edge'" in warnings[0].getMessage()


def test_without_emulation_nothing_sleeps_or_is_reported(program):
    fresh = PlanProgram.load(program.plan, program.graph)
    assert all(s.emulate_ms is None for s in fresh.steps)
    fresh.run_local()
    assert fresh.steps[0].emulation_timings() == {}
