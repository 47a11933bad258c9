"""Compute emulation and link shaping for LLM stages: each stage runs its real blocks and is
slowed by the cost model's ratio of its device's time to this machine's (never paced to the
plan's prediction, which the measurement could then not disagree with), and each send waits
the plan's link time. Checks compare the sleep with the compute measured in the same step, or
use a fake clock; none asserts how long anything took."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import AnalyticalCompute, Device, Link, chain
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.generate.report import generation_report
from edgesplit.llm.stage.emulation import (
    IDLE_CAP_S,
    StagePacer,
    dilated,
    idle_between_steps,
    measured_reference,
    phase_of,
    predicted_reference,
    slowdown_factors,
    stage_links,
)
from edgesplit.models.causal_lm import create_causal_lm
from edgesplit.plan.model import Plan
from helpers import server_for

PROMPT = [5, 0, 17, 42, 99, 3]
NEW = 4

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest


def _slow(name: str, gops: float) -> Device:
    """A device far slower than this machine (llama_tiny's 3 blocks take ~20 ms on it), so
    each step sleeps several times its real compute."""
    return Device(name=name, kind="mcu", compute=AnalyticalCompute(
        peak_gops={32: gops}, memory_bandwidth_gb_per_s=0.25, default_efficiency=1.0,
        layer_overhead_ms=0.6))


def _plan(link: Link) -> Plan:
    topology = chain("slow", [_slow("slow-a", 0.2), _slow("slow-b", 0.4)], [link])
    return plan_llm_at("llama_tiny", topology, (0, 3, 6),
                       LLMWorkload(prompt_tokens=len(PROMPT), new_tokens=NEW, max_context=16))


LAN = Link(name="lan", bandwidth_mbps=200.0, rtt_ms=4.0, medium="wired")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return _plan(LAN)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return create_causal_lm("llama_tiny")


def _generate(plan: Plan, model: torch.nn.Module, *, emulate: bool, shape: bool = True,
              requests: dict[str, list[float]] | None = None,
              factors: dict[str, dict[str, float]] | None = None):
    """A generation over a served second stage; ``requests`` collects, per device, the
    seconds each pacer asked to sleep, ``factors`` the factors it slows by."""
    server = server_for(plan, "slow-b", model=model, data_port=None, emulate=emulate,
                        shape=shape)
    try:
        with LLMClient(plan, server.loopback_channel(), model=model, emulate=emulate,
                       shape=shape) as client:
            if requests is not None:
                for pacer in (client.pacer, server.handler.pacer):
                    assert pacer is not None
                    if factors is not None:
                        factors[pacer.device] = pacer.factors
                    asked = requests.setdefault(pacer.device, [])
                    pacer._sleep = lambda s, asked=asked: (asked.append(s), time.sleep(s))
            tokens = list(client.generate(PROMPT, NEW))
            return tokens, generation_report(plan, PROMPT, tokens, session=client.session,
                                             data_plane=client.data_plane)
    finally:
        server.stop(grace_s=1.0)


def test_factors_price_the_same_blocks_on_both_devices(plan):
    """Priced on its own device a stage's factor is 1 (the plan's prices are reproduced);
    against a device twice as slow in every respect it is 1/2 in both phases."""
    for i in range(len(plan.llm.stages)):
        device = plan.devices[i].device
        own = predicted_reference(plan, i, device)
        assert slowdown_factors(plan, i, own) == pytest.approx(
            {"prefill": 1.0, "decode": 1.0}, rel=1e-9)
        slower = device.model_copy(update={"compute": device.compute.model_copy(update={
            "peak_gops": {32: device.compute.peak_gops[32] / 2},
            "memory_bandwidth_gb_per_s": device.compute.memory_bandwidth_gb_per_s / 2,
            "layer_overhead_ms": device.compute.layer_overhead_ms * 2})})
        assert slowdown_factors(plan, i, predicted_reference(plan, i, slower)) == \
            pytest.approx({"prefill": 0.5, "decode": 0.5}, rel=1e-6)
    assert phase_of(0) == "prefill" and phase_of(7) == "decode"
    assert stage_links(plan, 0) == (None, LAN) and stage_links(plan, 1) == (LAN, None)


def test_the_reference_is_the_stages_own_blocks_timed_here(plan, model):
    """Measured, the reference is positive for both phases of a stage with blocks, and a
    factor is the plan's time over it; a relay measures nothing and keeps factor 1."""
    from edgesplit.llm.stage.compute import LLMStageModel

    stage = LLMStageModel(plan, 1, model)
    reference = measured_reference(stage, plan, repeats=1)
    assert min(reference.values()) > 0
    factors = slowdown_factors(plan, 1, reference)
    assert factors["decode"] == pytest.approx(plan.llm.stages[1].decode_ms
                                              / reference["decode"])


def test_the_idle_before_a_step_is_the_rest_of_the_planned_step_dilated_and_capped(plan):
    """A stage idles while the other stages and the links work: the plan's step time less its
    own, D times slower under dilation, and never more than the cap (past which a longer idle
    slows a step no further)."""
    llm = plan.llm
    stage = llm.stages[1]
    own = idle_between_steps(plan, 1)
    assert own["decode"] == pytest.approx(min(IDLE_CAP_S, (llm.tpot_ms - stage.decode_ms) / 1e3))
    assert own["prefill"] == pytest.approx(
        min(IDLE_CAP_S, (llm.ttft_ms - stage.prefill_ms) / 1e3))
    tiny = idle_between_steps(plan, 1, dilation=1e-6)
    assert 0 <= tiny["decode"] < own["decode"] or own["decode"] == 0
    assert idle_between_steps(plan, 1, dilation=1e6) == {"prefill": IDLE_CAP_S,
                                                         "decode": IDLE_CAP_S}


def test_the_reference_times_each_step_after_the_idle(plan, model, monkeypatch):
    """Each timed step of the reference follows a sleep of the phase's idle: the run's
    conditions, not a back-to-back loop's (whose warm caches made small stages look twice as
    fast as they run)."""
    from edgesplit.llm.stage import emulation as llm_emulation
    from edgesplit.llm.stage.compute import LLMStageModel

    slept: list[float] = []
    monkeypatch.setattr(llm_emulation.time, "sleep", slept.append)
    stage = LLMStageModel(plan, 1, model)
    measured_reference(stage, plan, repeats=2, idle={"prefill": 0.03, "decode": 0.07})
    assert slept == [0.03, 0.07] * 3  # one warm-up and two timed, each phase


def test_time_dilation_slows_compute_and_links_alike(plan):
    """Dilated by D, a stage sleeps D x its factor and a link carries 1/D of its bandwidth at
    D x its RTT (so measured / D compares with the plan)."""
    own = predicted_reference(plan, 0, plan.devices[0].device)
    assert StagePacer.of(plan, 0, own, dilation=3.0).factors == pytest.approx(
        {"prefill": 3.0, "decode": 3.0})
    slow = dilated(LAN, 4.0)
    assert (slow.bandwidth_mbps, slow.rtt_ms) == (LAN.bandwidth_mbps / 4, LAN.rtt_ms * 4)
    assert stage_links(plan, 0, 4.0) == (None, slow)


class _FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_pacer_scales_the_measured_compute():
    t = _FakeTime()
    pacer = StagePacer("phone", {"prefill": 3.0, "decode": 5.0}, clock=t.clock, sleep=t.sleep)
    start = t.now
    t.now += 0.010  # 10 ms of real compute
    assert pacer.pace(start, "prefill") == pytest.approx(20.0)
    start = t.now
    t.now += 0.002
    assert pacer.pace(start, "decode") == pytest.approx(8.0)
    assert t.slept == pytest.approx([0.020, 0.008])
    with pytest.raises(ConfigError, match="factors must be > 0"):
        StagePacer("phone", {"prefill": 0.0, "decode": 1.0})


def test_emulated_stages_sleep_their_factor_times_their_compute(plan, model):
    """Each stage asks to sleep (factor - 1) x the compute it measured: checked as what the
    pacers asked against what the report says (a sleep never ends early, and the compute the
    pacer measured is within the step's reported compute), whatever the machine's load."""
    plain, _ = _generate(plan, model, emulate=False, shape=False)
    requests: dict[str, list[float]] = {}
    factors: dict[str, dict[str, float]] = {}
    tokens, _ = _generate(plan, model, emulate=True, requests=requests, factors=factors)
    assert [t.token for t in tokens] == [t.token for t in plain]  # emulation only waits
    assert all(min(f.values()) > 1 for f in factors.values())  # the devices are slower
    for device, asked in requests.items():
        assert len(asked) == NEW  # one sleep a step
        for t, seconds in zip(tokens, asked, strict=True):
            requested_ms, slept = seconds * 1e3, t.emulated_ms[device]
            assert 0 < requested_ms <= slept + 0.05
            measured = requested_ms / (factors[device][t.phase] - 1)
            assert measured <= t.compute_ms[device] - slept + 0.05


def test_shaped_links_cost_the_round_trip(model):
    """A 200 ms RTT link: every shaped step pays it (half each way); unshaped, nothing
    is reported as emulated and the shapers are off."""
    slow_link = Link(name="far", bandwidth_mbps=100.0, rtt_ms=200.0, medium="wired")
    plan = _plan(slow_link)
    tokens, doc = _generate(plan, model, emulate=False)
    assert all(t.step_ms >= slow_link.rtt_ms for t in tokens)
    assert "emulated_decode_ms" not in doc["stages"][0]
    with server_for(plan, "slow-b", model=model, data_port=None, shape=False) as server:
        assert not server.handler.upstream.enabled and not server.handler.downstream.enabled
        client = LLMClient(plan, server.loopback_channel(), model=model, shape=False)
        assert not client.shaper.enabled


def test_a_device_faster_than_this_machine_warns_once_and_runs_as_is(caplog):
    pacer = StagePacer("fast-device", {"prefill": 0.5, "decode": 0.25})
    with caplog.at_level(logging.WARNING, logger="edgesplit.llm.stage.emulation"):
        assert pacer.pace(0.0, "prefill") == 0.0
        assert pacer.pace(0.0, "decode") == 0.0
    warnings = [r for r in caplog.records if "emulation cannot speed" in r.getMessage()]
    assert len(warnings) == 1 and "'fast-device'" in warnings[0].getMessage()


def test_generate_emulate_device_on_the_command_line(tmp_path):
    """`llm generate --emulate-device` slows the first stage (here it holds every block)."""
    import json

    from typer.testing import CliRunner

    from edgesplit.cli import app

    topology = chain("slow", [_slow("slow-a", 0.2), _slow("slow-b", 0.4)], [LAN])
    alone = plan_llm_at("llama_tiny", topology, (0, 6, 6),
                        LLMWorkload(prompt_tokens=len(PROMPT), new_tokens=3, max_context=16))
    path = tmp_path / "plan.json"
    alone.save(path)
    result = CliRunner().invoke(app, ["llm", "generate", str(path), "--prompt-ids",
                                      ",".join(map(str, PROMPT)), "--emulate-device", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (stage,) = doc["stages"]
    # the device is far slower than this machine, so both phases sleep; the amounts are
    # checked against the pacer's requests above: here, that the flag paces
    assert stage["emulated_prefill_ms"] > 0 and stage["emulated_decode_ms"] > 0
