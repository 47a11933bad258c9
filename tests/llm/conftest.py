"""Fixtures the split LLM's tests share."""

from __future__ import annotations

import pytest

from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.plan.model import Plan


@pytest.fixture(scope="session")
def two_stage_plan() -> Plan:
    """llama_tiny split after block.1 (boundaries 0, 3, 6) over home-wifi's phone (the client:
    the embedding and blocks 0-1) and laptop (the served stage: blocks 2-3 and the head), for
    an 8-token prompt, 10 new tokens, a 32-token context and one session. Shared: a test that
    needs it changed makes a copy (``model_copy``, ``model_dump``)."""
    full = get_topology("home-wifi")
    topology = chain("test", full.devices[:2], [full.links[0].link])
    return plan_llm_at("llama_tiny", topology, (0, 3, 6),
                       LLMWorkload(prompt_tokens=8, new_tokens=10, max_context=32),
                       method="test")
