"""Compute emulation and link shaping for LLM stages: each stage sleeps until its step took
what the plan predicts for it (prefill or decode), and each send waits the plan's link time.
As in test_runtime_emulation, the devices here are far slower than any CPU, so the sleep
dominates and every check compares against the plan's own prediction (never a fixed time)."""

from __future__ import annotations

import logging

import pytest
import torch

from edgesplit.hardware import AnalyticalCompute, Device, Link, chain
from edgesplit.models.causal_lm import create_causal_lm
from edgesplit.plan import LLMWorkload, plan_llm
from edgesplit.plan.llm_assemble import assemble_llm_plan
from edgesplit.plan.llm_placement import evaluate_placement
from edgesplit.plan.model import Plan
from edgesplit.runtime.llm_client import LLMClient
from edgesplit.runtime.llm_emulation import StagePacer, phase_of, stage_links
from edgesplit.runtime.llm_report import generation_report
from edgesplit.runtime.llm_server import LLMStageServer

PROMPT = [5, 0, 17, 42, 99, 3]
NEW = 4

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest


def _slow(name: str, gops: float) -> Device:
    """A device far slower than this machine (llama_tiny's 3 blocks take ~100 ms on it)."""
    return Device(name=name, kind="mcu", compute=AnalyticalCompute(
        peak_gops={32: gops}, memory_bandwidth_gb_per_s=0.05, default_efficiency=1.0,
        layer_overhead_ms=3.0))


def _plan(link: Link) -> Plan:
    topology = chain("slow", [_slow("slow-a", 0.04), _slow("slow-b", 0.08)], [link])
    costs = plan_llm("llama_tiny", topology, LLMWorkload(prompt_tokens=len(PROMPT),
                                                         new_tokens=NEW, max_context=16)).costs
    return assemble_llm_plan(costs, evaluate_placement(costs, (0, 3, 6)), method="manual")


LAN = Link(name="lan", bandwidth_mbps=200.0, rtt_ms=4.0, medium="wired")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return _plan(LAN)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return create_causal_lm("llama_tiny")


def _generate(plan: Plan, model: torch.nn.Module, *, emulate: bool, shape: bool = True):
    server = LLMStageServer(plan, "slow-b", model=model, data_port=None, emulate=emulate,
                            shape=shape)
    try:
        with LLMClient(plan, server.loopback_channel(), model=model, emulate=emulate,
                       shape=shape) as client:
            tokens = list(client.generate(PROMPT, NEW))
            return tokens, generation_report(plan, PROMPT, tokens, session=client.session,
                                             data_plane=client.data_plane)
    finally:
        server.stop(grace_s=1.0)


def test_pacer_targets_are_the_plans_per_phase(plan):
    for i, stage in enumerate(plan.llm.stages):
        pacer = StagePacer.of(plan, i)
        assert pacer.targets == {"prefill": stage.prefill_ms, "decode": stage.decode_ms}
        assert min(pacer.targets.values()) > 50  # the sleep dominates on any CPU
    assert phase_of(0) == "prefill" and phase_of(7) == "decode"
    assert stage_links(plan, 0) == (None, LAN) and stage_links(plan, 1) == (LAN, None)


def test_emulated_stages_follow_the_plan_within_ten_percent(plan, model):
    plain, _ = _generate(plan, model, emulate=False, shape=False)
    tokens, doc = _generate(plan, model, emulate=True)
    assert [t.token for t in tokens] == [t.token for t in plain]  # emulation only waits
    for stage in doc["stages"]:
        assert stage["prefill_ms"] == pytest.approx(stage["predicted_prefill_ms"], rel=0.10)
        assert stage["decode_ms"] == pytest.approx(stage["predicted_decode_ms"], rel=0.10)
        # each stage slept most of its share, and the report says how much
        for phase in ("prefill", "decode"):
            predicted = stage[f"predicted_{phase}_ms"]
            assert 0.5 * predicted < stage[f"emulated_{phase}_ms"] < 1.1 * predicted
    assert all(set(t.emulated_ms) == {"slow-a", "slow-b"} for t in tokens)
    # the whole step too: both stages' compute plus the shaped link both ways
    assert doc["ttft_ms"] == pytest.approx(plan.llm.ttft_ms, rel=0.10)
    assert doc["tpot_ms"] == pytest.approx(plan.llm.tpot_ms, rel=0.10)


def test_shaped_links_cost_the_round_trip(model):
    """A 200 ms RTT link: every shaped step pays it (half each way); unshaped, nothing
    is reported as emulated and the shapers are off."""
    slow_link = Link(name="far", bandwidth_mbps=100.0, rtt_ms=200.0, medium="wired")
    plan = _plan(slow_link)
    tokens, doc = _generate(plan, model, emulate=False)
    assert all(t.step_ms >= slow_link.rtt_ms for t in tokens)
    assert "emulated_decode_ms" not in doc["stages"][0]
    server = LLMStageServer(plan, "slow-b", model=model, data_port=None, shape=False)
    try:
        assert not server.upstream.enabled and not server.downstream.enabled
        client = LLMClient(plan, server.loopback_channel(), model=model, shape=False)
        assert not client.shaper.enabled
    finally:
        server.stop(grace_s=0)


def test_a_machine_slower_than_the_preset_warns_once_and_runs_as_is(caplog):
    pacer = StagePacer("fast-device", prefill_ms=1e-6, decode_ms=1e-6)
    start = 0.0  # any perf_counter reading is later than this: the step already took longer
    with caplog.at_level(logging.WARNING, logger="edgesplit.runtime.llm_emulation"):
        assert pacer.pace(start, "prefill") == 0.0
        assert pacer.pace(start, "decode") == 0.0
    warnings = [r for r in caplog.records if "emulation cannot speed" in r.getMessage()]
    assert len(warnings) == 1 and "'fast-device'" in warnings[0].getMessage()


def test_generate_emulate_device_on_the_command_line(tmp_path):
    """`llm generate --emulate-device` paces the first stage (here it holds every block)."""
    import json

    from typer.testing import CliRunner

    from edgesplit.cli import app

    topology = chain("slow", [_slow("slow-a", 0.04), _slow("slow-b", 0.08)], [LAN])
    costs = plan_llm("llama_tiny", topology, LLMWorkload(prompt_tokens=len(PROMPT),
                                                         new_tokens=3, max_context=16)).costs
    alone = assemble_llm_plan(costs, evaluate_placement(costs, (0, 6, 6)), method="manual")
    path = tmp_path / "plan.json"
    alone.save(path)
    result = CliRunner().invoke(app, ["llm", "generate", str(path), "--prompt-ids",
                                      ",".join(map(str, PROMPT)), "--emulate-device", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (stage,) = doc["stages"]
    assert stage["prefill_ms"] == pytest.approx(stage["predicted_prefill_ms"], rel=0.10)
    assert stage["decode_ms"] == pytest.approx(stage["predicted_decode_ms"], rel=0.10)
    assert stage["emulated_decode_ms"] > 0
