"""Checkpoints whose config sets a sliding window (Mistral's and Phi-3's ``sliding_window``,
Qwen2's ``use_sliding_window`` from ``max_window_layers`` on): planned only for a context of at
most ``window - 1`` tokens, where the window changes nothing bit for bit
(``CausalLMShape.window_context``), and run without it. A tiny model of each, perturbed random
weights saved by ``save_pretrained``, split in two stages that load their blocks from the
folder, against ``generate`` on the folder as saved: with its window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from edgesplit.errors import ConfigError, cli_options
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm, plan_llm_at
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.model.checkpoint import open_checkpoint
from edgesplit.llm.model.description import describe_causal_lm
from edgesplit.llm.stage.compute import LLMStageModel
from edgesplit.llm.stage.server import head_stage
from edgesplit.models.causal_lm import causal_lm_config
from edgesplit.plan.model import Plan
from helpers import perturbed, server_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WINDOW = 24
LIMIT = WINDOW - 1  # the most tokens a cache may hold: window_context
PROMPT = 8
NEW = LIMIT - PROMPT  # prompt + new tokens: the whole context the window allows
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": ("mistral_tiny", {"sliding_window": WINDOW}),
    "phi3": ("phi3_tiny", {"sliding_window": WINDOW}),
    # layers 2 and 3 slide (layer_types recomputed from max_window_layers): the second
    # stage's of the 2-stage split
    "qwen2": ("qwen2_tiny", {"use_sliding_window": True, "sliding_window": WINDOW,
                             "max_window_layers": 2, "layer_types": None}),
}


def _slides(cache: Any) -> bool:
    return any(getattr(layer, "is_sliding", False) for layer in cache.layers)


def _config(name: str, overrides: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    fields = {**causal_lm_config(name).to_dict(), **overrides}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


@pytest.fixture(scope="module", params=list(CASES))
def folder(request, tmp_path_factory) -> Path:
    """A safetensors folder of the tiny model with its window, weights perturbed (seeded) so
    that greedy decoding does not repeat one token."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = perturbed(AutoModelForCausalLM.from_config(_config(*CASES[request.param])).eval())
    out = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def reference(folder):
    """The folder as transformers loads it: its window on (some cache layer slides)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert _slides(DynamicCache(config=model.config))
    return model


def _plan(folder: Path, max_context: int = LIMIT) -> Plan:
    full = get_topology("home-wifi")
    topology = chain("test", full.devices[:2], [full.links[0].link])
    return plan_llm_at(str(folder), topology, (0, 3, 6),
                       LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW, max_context=max_context),
                       method="test")


def _generate(model, prompt: list[int], new: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                         min_new_tokens=new, do_sample=False, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def _prompt(n: int = PROMPT) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(0)).tolist()


class _Line:
    """The second stage's server (loading from the folder, or given ``model``) and its
    address for a client."""

    def __init__(self, plan: Plan, model: torch.nn.Module | None = None) -> None:
        assert plan.llm is not None and head_stage(plan.llm) == 1
        self.plan, self.model = plan, model
        self.server = server_for(plan, plan.devices[1].name, data_port=None, shape=False,
                                 model=model)

    def client(self, **options) -> LLMClient:
        return LLMClient(self.plan, self.server.loopback_channel(), model=self.model,
                         shape=False, **options)

    def stop(self) -> None:
        self.server.stop(0)


def test_the_window_is_recorded_and_a_context_past_it_refused(folder):
    lm = describe_causal_lm(str(folder))
    assert (lm.shape.window, lm.shape.window_context) == (WINDOW, LIMIT)
    _plan(folder, LIMIT)
    for workload in (LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW, max_context=WINDOW),
                     LLMWorkload(prompt_tokens=PROMPT, new_tokens=WINDOW)):
        with pytest.raises(ConfigError, match=rf"sliding window of .* \({WINDOW} tokens\).* "
                                              rf"plan a max_context \(prompt \+ new tokens\) "
                                              rf"of at most {LIMIT}$") as info:
            plan_llm(str(folder), get_topology("home-wifi"), workload)
        assert "\n" not in str(info.value)
    with cli_options(), pytest.raises(ConfigError, match=r"plan a --max-context \(prompt"):
        plan_llm(str(folder), get_topology("home-wifi"),
                 LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW, max_context=WINDOW))


def test_two_stages_from_the_folder_give_the_tokens_of_generate_with_the_window(
        folder, reference):
    """Each stage loads its blocks from the folder (fingerprint checked) and runs without the
    window; generate runs the saved config, window on, over the whole allowed context."""
    prompt = _prompt()
    expected = _generate(reference, prompt, NEW)
    assert len(set(expected)) > 2  # the perturbed weights do not repeat one token
    plan = _plan(folder)
    assert plan.llm is not None and plan.llm.fingerprint is not None
    line = _Line(plan)
    try:
        with line.client() as client:
            assert [t.token for t in client.generate(prompt, NEW)] == expected
    finally:
        line.stop()
    # each stage's caches are plain (they crop and rewind as any); the checkpoint's own
    # config keeps its window (read again, cached: never changed in place)
    assert not _slides(LLMStageModel(plan, 1).new_cache())
    checkpoint = open_checkpoint(folder)
    assert checkpoint is not None and checkpoint.fingerprint == plan.llm.fingerprint
    assert checkpoint.config().sliding_window == WINDOW


def test_a_rewinding_session_equals_generating_afresh(folder, reference):
    """Two turns of one session on stages given the windowed model itself: the second turn
    keeps part of the first reply and diverges, so every stage rewinds its cache, and its
    tokens equal generate's and a fresh session's."""
    first = _prompt()
    line = _Line(_plan(folder), model=reference)
    try:
        with line.client(session="s") as client:
            reply = [t.token for t in client.generate(first, NEW)]
            assert reply == _generate(reference, first, NEW)
            second = [*first, *reply[:3], 7, 11]
            new = LIMIT - len(second) + 1  # the cache ends full: prompt + new - 1 tokens
            got = list(client.generate(second, new))
            assert got[0].reused == PROMPT + 3 < len(first) + len(reply) - 1  # a rewind
            tokens = [t.token for t in got]
        assert tokens == _generate(reference, second, new)
        with line.client(session="fresh") as client:
            assert [t.token for t in client.generate(second, new)] == tokens
    finally:
        line.stop()


@pytest.mark.parametrize(("fields", "match"), [
    ({"layer_types": ["full_attention"] * 3 + ["chunked_attention"]},
     r"layer_types \['chunked_attention'\] .* not modelled"),
    ({"layer_types": ["sliding_attention"] * 4, "sliding_window": None},
     r"sliding_attention layers but no sliding_window"),
])
def test_qwen_layer_types_it_cannot_run_are_refused_in_one_line(fields, match):
    config = _config("qwen2_tiny", {})
    for key, value in fields.items():  # set after the config's own checks
        setattr(config, key, value)
    with pytest.raises(ConfigError, match=match) as info:
        describe_causal_lm(config)
    assert "\n" not in str(info.value)


def test_a_stage_refuses_a_plan_edited_past_the_window(folder):
    """The planner never makes such a plan; one edited by hand would run the window as full
    attention past where that is exact, and answer wrongly without a word."""
    plan = _plan(folder)
    assert plan.llm is not None
    edited = plan.model_copy(update={"llm": plan.llm.model_copy(update={"max_context": WINDOW})})
    with pytest.raises(ConfigError, match="sliding window"):
        LLMStageModel(edited, 1)
