"""LLM stage placement (llm/planning/): the DP against brute force on small chains with random
costs, the optimum against its baselines, memory and KV accounting in the plan, clear errors,
and the Plan contract (validated, re-checkable, saved and loaded)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from transformers import LlamaConfig

from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.hardware import AnalyticalCompute, Device, Link, chain, get_topology
from edgesplit.llm import LLMChainCosts, LLMWorkload, describe_causal_lm, plan_llm, plan_llm_at
from edgesplit.llm.planning.costs import SendCost
from edgesplit.llm.planning.placement import (
    best_single_device,
    brute_force_placement,
    equal_split,
    evaluate_placement,
    memory_proportional,
    solve_placement,
)
from edgesplit.plan import load_plan, recompute_total
from edgesplit.plan.model import Plan


def _device(name: str, gops: float, gb_s: float, memory: int | None) -> Device:
    return Device(name=name, kind="cpu", memory_bytes=memory,
                  compute=AnalyticalCompute(peak_gops={32: gops}, memory_bandwidth_gb_per_s=gb_s,
                                            layer_overhead_ms=0.001))


def _lm(layers: int):
    return describe_causal_lm(LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))


def _random_costs(seed: int, devices: int, layers: int, objective: str,
                  new_tokens: int = 8) -> LLMChainCosts:
    """A chain of random devices and links, then random per-block times, sends and memory
    limits on top (so the DP is tested on costs with no structure to lean on)."""
    rng = np.random.default_rng(seed)
    lm = _lm(layers)
    devs = [_device(f"d{i}", float(rng.uniform(1, 100)), float(rng.uniform(1, 50)), None)
            for i in range(devices)]
    links = [Link(name=f"l{i}", bandwidth_mbps=float(rng.uniform(1, 500)),
                  rtt_ms=float(rng.uniform(0, 5))) for i in range(devices - 1)]
    topology = chain("random", devs, links)
    costs = LLMChainCosts.build(lm, topology, LLMWorkload(prompt_tokens=16, new_tokens=new_tokens,
                                                          objective=objective))
    n = lm.n

    def sends() -> list[list[SendCost]]:
        return [[SendCost(8, float(rng.uniform(0, 2)), float(rng.uniform(0, 1)),
                          float(rng.uniform(0, 0.5))) for _ in range(n + 1)]
                for _ in range(devices - 1)]

    total = int(costs.memory_need[0, n])
    limits = [None if rng.random() < 0.25 else int(total * rng.uniform(0.3, 1.2))
              for _ in range(devices)]
    return dataclasses.replace(costs, prefill_ms=rng.uniform(0, 5, (devices, n)),
                               decode_ms=rng.uniform(0, 1, (devices, n)),
                               forward_prefill=sends(), forward_decode=sends(), back=sends(),
                               memory_limits=limits)


CASES = list(itertools.product(range(6), [(1, 3), (2, 2), (3, 3), (4, 2)]))


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize(("seed", "shape"), CASES)
def test_dp_equals_brute_force(seed, shape, objective):
    devices, layers = shape
    costs = _random_costs(seed, devices, layers, objective)
    try:
        expected = brute_force_placement(costs)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_placement(costs)
        return
    found = solve_placement(costs)
    assert found.feasible
    if objective == "latency":
        assert found.request_ms == pytest.approx(expected.request_ms, rel=1e-9)
    else:
        assert found.period_ms == expected.period_ms  # computed the same way: exactly equal
        assert found.request_ms == pytest.approx(expected.request_ms, rel=1e-9)


@pytest.mark.parametrize("new_tokens", [1, 64])
def test_dp_equals_brute_force_for_ttft_and_for_tpot_heavy_requests(new_tokens):
    # N = 1: TTFT alone; N = 64: decode steps dominate
    for seed in range(4):
        costs = _random_costs(100 + seed, 3, 3, "latency", new_tokens=new_tokens)
        try:
            expected = brute_force_placement(costs)
        except InfeasibleError:
            continue
        assert solve_placement(costs).request_ms == pytest.approx(expected.request_ms, rel=1e-9)


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("topology", ["jmsnas-chain", "home-wifi"])
@pytest.mark.parametrize("model", ["llama_1b", "gpt2_small", "qwen2_small"])
def test_never_worse_than_the_baselines(model, topology, objective):
    result = plan_llm(model, get_topology(topology), LLMWorkload(objective=objective),
                      dtype="float16")
    best = result.placements["dp"].key(objective)
    for method in ("single_device", "memory_proportional", "equal_split"):
        other = result.placements[method]
        if other.feasible:
            assert best <= other.key(objective) or np.allclose(best, other.key(objective))


def test_exact_placement_by_hand():
    # Two identical devices over a very slow link: no split pays for itself, and the user's
    # device runs everything. Shrink its memory below the model: all goes to the second,
    # and the first only relays the prompt and the tokens (a device may hold no blocks).
    lm = _lm(2)
    fast = _device("a", 50, 10, None)
    slow_link = Link(name="slow", bandwidth_mbps=0.01, rtt_ms=100)
    topology = chain("two", [fast, fast.model_copy(update={"name": "b"})], [slow_link])
    costs = LLMChainCosts.build(lm, topology, LLMWorkload(prompt_tokens=8, new_tokens=4))
    assert solve_placement(costs).boundaries == (0, lm.n, lm.n)
    small = fast.model_copy(update={"memory_bytes": 10_000})
    topology = chain("two", [small, fast.model_copy(update={"name": "b"})], [slow_link])
    costs = LLMChainCosts.build(lm, topology, LLMWorkload(prompt_tokens=8, new_tokens=4))
    placed = solve_placement(costs)
    assert placed.boundaries == (0, 0, lm.n)
    # the relay sends the prompt's ids forward and gets each token back: 4 tokens, 3 steps
    assert placed.link_prefill_ms[0] == pytest.approx(
        costs.forward_prefill[0][0].ms + costs.back[0][0].ms)
    assert costs.forward_prefill[0][0].bytes == 8 * 8 and costs.back[0][0].bytes == 8


def test_kv_cache_memory_in_the_plan():
    lm = describe_causal_lm("llama_tiny")
    topology = get_topology("jmsnas-chain")
    workload = LLMWorkload(prompt_tokens=10, new_tokens=6, max_context=100, sessions=3)
    result = plan_llm(lm, topology, workload)
    for plan in result.plans.values():
        assert plan.llm is not None
        for stage in plan.llm.stages:
            kv = lm.kv_bytes_per_token(stage.start, stage.end)
            assert stage.kv_cache_bytes == kv * 3 * 100  # sessions x max context
            assert stage.weight_bytes == (lm.stage_param_bytes(stage.start, stage.end)
                                          if stage.blocks else 0)
            assert stage.memory_bytes == (stage.weight_bytes + stage.kv_cache_bytes
                                          + stage.activation_bytes)
    # KV per token of a llama_tiny decoder block: K and V, 2 heads of 16 floats
    assert lm.blocks[1].kv_bytes_per_token == 2 * 2 * 16 * 4


def test_memory_forces_a_split_and_baselines_report_overruns():
    topology = get_topology("home-wifi")
    result = plan_llm("llama3_8b", topology, LLMWorkload(), dtype="float16")
    dp = result.placements["dp"]
    assert dp.feasible and all(b > a for a, b in dp.ranges())  # no device holds it alone
    single = result.plans["single_device"]
    assert not single.feasible and "device memory" in (single.reason or "")


def test_infeasible_names_what_to_change():
    with pytest.raises(InfeasibleError, match=r"dtype.*max_context.*sessions"):
        plan_llm("llama3_8b", get_topology("home-wifi"), LLMWorkload(), dtype="float32")


def test_bad_workloads_and_topologies_are_config_errors():
    with pytest.raises(ConfigError, match="max_context"):
        LLMWorkload(prompt_tokens=100, new_tokens=50, max_context=120)
    with pytest.raises(ConfigError, match="max_context"):  # GPT-2 tiny has 512 positions
        plan_llm("gpt2_tiny", get_topology("jmsnas-chain"), LLMWorkload(max_context=1024))
    with pytest.raises(ConfigError, match="not a chain"):
        plan_llm("llama_tiny", get_topology("jmsnas-mesh"))
    with pytest.raises(ConfigError, match="new_tokens"):
        LLMWorkload(new_tokens=0)


def test_throughput_is_the_slowest_stage():
    result = plan_llm("llama_1b", get_topology("home-wifi"),
                      LLMWorkload(objective="throughput"), dtype="float16")
    p = result.placements["dp"]
    costs = result.costs
    links = [max(costs.forward_decode[m][c].occupancy_ms, costs.back[m][c].occupancy_ms)
             for m, c in enumerate(p.boundaries[1:-1])]
    assert p.period_ms == max(*p.decode_ms, *links)
    assert p.pipeline_tokens_per_s == pytest.approx(1e3 / p.period_ms)
    assert p.pipeline_tokens_per_s >= p.tokens_per_s  # a stream overlaps the stages


def test_baselines_follow_their_rules():
    costs = plan_llm("llama_1b", get_topology("home-wifi"), dtype="float16").costs
    layers = costs.lm.shape.num_layers  # 22 decoder blocks; phone 8, laptop 4, jetson 8 GiB
    counts = [b - a for a, b in memory_proportional(costs).ranges()]
    assert [counts[0] - 1, counts[1], counts[2] - 1] == [9, 4, 9]  # 22 x 8/20, 4/20, 8/20
    counts = [b - a for a, b in equal_split(costs).ranges()]
    assert [counts[0] - 1, counts[1], counts[2] - 1] == [8, 7, 7] and sum(counts) == layers + 2
    single = best_single_device(costs)
    assert sum(1 for a, b in single.ranges() if b > a) == 1


def test_plan_contract_and_round_trip(tmp_path):
    result = plan_llm("gpt2_tiny", get_topology("jmsnas-chain"),
                      LLMWorkload(prompt_tokens=12, new_tokens=5))
    for method, plan in result.plans.items():
        placement = result.placements[method]
        assert plan.predicted.total_ms == pytest.approx(placement.request_ms, rel=1e-9)
        assert recompute_total(plan) == pytest.approx(plan.predicted.total_ms, rel=1e-9)
        assert plan.model.graph == "blocks" and not plan.runnable
        assert [layer.name for layer in plan.layers] == [b.name for b in result.lm.blocks]
    plan = result.plan
    path = tmp_path / "plan.json"
    plan.save(path)
    assert load_plan(path) == plan
    # a stage that skips a block is refused when loading
    data = plan.model_dump(mode="json")
    data["llm"]["stages"][0]["start"] = 1
    with pytest.raises(ValueError, match="stage"):
        Plan.model_validate(data)


def test_a_plan_at_given_boundaries_is_the_plan_of_that_placement():
    """plan_llm_at prices and assembles as plan_llm does: at each method's boundaries it
    gives that method's Plan (all but the reason a baseline carries)."""
    topology, workload = get_topology("jmsnas-chain"), LLMWorkload(prompt_tokens=12, new_tokens=5)
    result = plan_llm("gpt2_tiny", topology, workload)
    for method, placement in result.placements.items():
        plan = plan_llm_at("gpt2_tiny", topology, placement.boundaries, workload, method=method)
        assert plan.model_dump(exclude={"reason"}) == \
            result.plans[method].model_dump(exclude={"reason"})


def test_evaluate_rejects_malformed_boundaries():
    costs = plan_llm("llama_tiny", get_topology("jmsnas-chain")).costs
    with pytest.raises(ValueError, match="boundaries"):
        evaluate_placement(costs, (0, 3, 2, 4, costs.n))


def test_layer_graph_plans_serialise_as_before():
    # the llm section is left out of other plans' JSON: older readers (extra fields are
    # refused) and plan fingerprints see the same document as before it existed
    plan = plan_llm("llama_tiny", get_topology("jmsnas-chain")).plan
    legacy = plan.model_copy(update={"llm": None})
    assert "llm" not in legacy.model_dump() and '"llm"' not in legacy.model_dump_json()
    assert "llm" in plan.model_dump()
