"""Quantized precisions end to end: planned (weights priced at their stored size, activations,
KV cache and wire float32), served stage by stage in-process (``open_stage`` picks the ONNX
Runtime stage by the plan's precision) and driven by LLMClient, against one
:class:`~edgesplit.llm.stage.onnx_stage.OnnxStage` over every layer computing the same tokens
in one process; and the bad input, each refused in one line.

Models: a tiny random Llama GGUF of Q4_0 linears and a Q8_0 embedding and head
(``write_tiny_gguf``; untied, since the tied one repeats its prompt's last token), run as
stored (``gguf``), and a tiny transformers Llama folder quantized to Q8_0 as each stage
reads it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("onnxruntime")

from edgesplit.errors import ConfigError
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, describe_causal_lm, plan_llm_at
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.model.gguf import LLAMA_TENSORS, GGUFModel
from edgesplit.llm.stage.compute import LLMStageModel, open_stage
from edgesplit.llm.stage.kv_sessions import LLMSessions
from edgesplit.llm.stage.onnx_stage import OnnxStage
from edgesplit.plan.model import Plan
from helpers import perturbed, server_for
from tiny_gguf import TINY, write_tiny_gguf

PROMPT, NEW, MAX_CONTEXT = 6, 8, 32
LAYERS = int(TINY["layers"])
PRECISIONS = "float32, float16, bfloat16, q8_0, q4_0, q4_1, gguf"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder for the module's models, and the checkpoint cache there (a GGUF is
    dequantised into it once, for its config)."""
    where = tmp_path_factory.mktemp("quantized")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGESPLIT_CACHE_DIR", str(where / "cache"))
        yield where


@pytest.fixture(scope="module")
def gguf_path(folder):
    return write_tiny_gguf(folder / "tiny-q4_0.gguf", "Q4_0", tied=False)


@pytest.fixture(scope="module")
def llama_folder(folder):
    """A transformers Llama of two layers whose matrices are whole groups of 32."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=160, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    model = perturbed(AutoModelForCausalLM.from_config(config).eval())
    out = folder / "llama"
    model.save_pretrained(out, safe_serialization=True)
    return out


def _plan(source, boundaries: tuple[int, ...], dtype: str, activations: str = "float"
          ) -> Plan:
    full = get_topology("home-wifi")
    topology = chain("test", full.devices[:2], [full.links[0].link])
    return plan_llm_at(str(source), topology, boundaries,
                       LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW,
                                   max_context=MAX_CONTEXT,
                                   activations=activations),  # type: ignore[arg-type]
                       dtype=dtype, method="test")


@pytest.fixture(scope="module")
def gguf_plan(gguf_path) -> Plan:
    """The GGUF at its own types, split after layer 1: embed + layers 0-1 | layer 2 + head."""
    return _plan(gguf_path, (0, 3, LAYERS + 2), "gguf")


def _one_process(weights, prompt: list[int], new: int = NEW, activations: str = "float"
                 ) -> list[int]:
    """Greedy tokens of one OnnxStage over every layer (embedding and head included)."""
    stage = OnnxStage(weights, 0, weights.shape.num_layers, embed=True, head=True,
                      max_context=MAX_CONTEXT, activations=activations)
    cache, x, position, tokens = stage.new_cache(), np.array([prompt]), 0, []
    for _ in range(new):
        logits = stage.step(x, position, cache)
        position += x.shape[1]
        tokens.append(int(np.argmax(logits[0])))
        x = np.array([[tokens[-1]]])
    return tokens


def _served(plan: Plan, prompt: list[int]) -> list[int]:
    """Greedy tokens of ``plan``: its second stage served in-process, the first in the
    client; each stage loads its own weights from the checkpoint (no model=)."""
    server = server_for(plan, plan.devices[1].name, data_port=None)
    try:
        with LLMClient(plan, server.loopback_channel()) as client:
            return [t.token for t in client.generate(prompt, NEW)]
    finally:
        server.stop(0)


def _one_line(info: pytest.ExceptionInfo) -> str:
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- the split equals one process ---------------------------------------------------------------
def test_a_gguf_split_gives_the_tokens_of_one_stage_over_every_layer(gguf_path, gguf_plan):
    prompt = [3, 17, 99, 5, 42, 7]
    expected = _one_process(GGUFModel(gguf_path), prompt)
    assert len(set(expected)) > 1
    assert _served(gguf_plan, prompt) == expected


def test_a_folder_quantized_as_it_loads_gives_the_tokens_of_one_stage(llama_folder):
    from edgesplit.llm.model.checkpoint import open_checkpoint
    from edgesplit.llm.model.quantize import QuantizedCheckpoint

    plan = _plan(llama_folder, (0, 2, 4), "q8_0")
    assert plan.llm is not None and plan.llm.dtype == "q8_0"
    prompt = [1, 50, 120, 9, 33, 70]
    checkpoint = open_checkpoint(llama_folder)
    assert checkpoint is not None
    expected = _one_process(QuantizedCheckpoint(checkpoint, "Q8_0"), prompt)
    assert len(set(expected)) > 1
    assert _served(plan, prompt) == expected


# ---- pricing ----------------------------------------------------------------------------------
def test_gguf_resolves_to_its_linears_type_and_prices_its_own_tensors(gguf_path, gguf_plan):
    llm = gguf_plan.llm
    assert llm is not None
    assert (llm.dtype, llm.group_size, llm.dtype_bytes) == ("q4_0", 32, 4)
    model = GGUFModel(gguf_path)

    def layer(i: int) -> int:
        return sum(model.tensor(name.format(i=i)).nbytes for name in LLAMA_TENSORS.values())

    embed, head = model.tensor("token_embd.weight"), model.tensor("output.weight")
    assert embed.kind == head.kind == "Q8_0"
    head_bytes = model.tensor("output_norm.weight").nbytes + head.nbytes
    assert [s.weight_bytes for s in llm.stages] == [embed.nbytes + layer(0) + layer(1),
                                                    layer(2) + head_bytes]
    # the hidden state crossing, and the KV cache, are float32
    h, kv = int(TINY["hidden"]), int(TINY["kv_heads"]) * int(TINY["hidden"] // TINY["heads"])
    assert llm.hops[0].decode_bytes == h * 4
    assert llm.blocks[1].kv_bytes_per_token == 2 * kv * 4


def test_a_tied_head_is_priced_as_the_embedding_it_reads(folder):
    path = write_tiny_gguf(folder / "tied.gguf", "Q4_0")
    model = GGUFModel(path)
    lm = describe_causal_lm(path, dtype="gguf")
    norm, embed = (model.tensor(n).nbytes for n in ("output_norm.weight", "token_embd.weight"))
    assert lm.blocks[-1].param_bytes == norm + embed == lm.tied_bytes + norm
    assert lm.stage_param_bytes(0, lm.n) == sum(b.param_bytes for b in lm.blocks) - embed


def test_a_precision_other_than_the_files_is_priced_by_its_blocks(gguf_path):
    """Q8_0 for a Q4_0 file: quantized again as a stage loads, 34 bytes per 32 weights (the
    norms float32)."""
    h, f = int(TINY["hidden"]), int(TINY["ffn"])
    kv = int(TINY["kv_heads"]) * (h // int(TINY["heads"]))
    lm = describe_causal_lm(gguf_path, dtype="q8_0")
    matrices = h * h * 2 + 2 * h * kv + 3 * h * f
    assert lm.blocks[1].param_bytes == matrices // 32 * 34 + 2 * h * 4
    assert lm.blocks[0].param_bytes == int(TINY["vocab"]) * h // 32 * 34
    q4 = describe_causal_lm(gguf_path, dtype="q4_1")
    assert q4.blocks[1].param_bytes == matrices // 32 * 20 + 2 * h * 4


def test_float_plans_are_what_they_were(gguf_path):
    """A float plan records no group size, and its JSON has no group_size."""
    plan = _plan(gguf_path, (0, 3, LAYERS + 2), "float32")
    assert plan.llm is not None and plan.llm.group_size is None
    assert "group_size" not in json.loads(plan.model_dump_json())["llm"]
    assert plan.llm.stages[0].weight_bytes == sum(
        b.param_bytes for b in describe_causal_lm(gguf_path).blocks[:3])


def test_int8_activations_are_planned_and_give_one_int8_stage_s_tokens_over_the_split(
        gguf_path):
    """--activations int8 is the plan's: each stage computes so, and the split gives the
    tokens of one int8 stage over every layer; a float plan's JSON has no such field."""
    full = get_topology("home-wifi")
    plan = plan_llm_at(str(gguf_path), chain("test", full.devices[:2], [full.links[0].link]),
                       (0, 3, LAYERS + 2),
                       LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW,
                                   max_context=MAX_CONTEXT, activations="int8"),
                       dtype="gguf", method="test")
    assert plan.llm is not None and plan.llm.activations == "int8"
    assert json.loads(plan.model_dump_json())["llm"]["activations"] == "int8"
    stage = open_stage(plan, 1)
    assert stage.runner.activations == "int8"  # type: ignore[attr-defined]
    prompt = [3, 17, 99, 5, 42, 7]
    assert _served(plan, prompt) == _one_process(GGUFModel(gguf_path), prompt,
                                                 activations="int8")
    floats = _plan(gguf_path, (0, 3, LAYERS + 2), "gguf")
    assert "activations" not in json.loads(floats.model_dump_json())["llm"]


def test_by_default_quantized_weights_compute_mixed_and_float_weights_float(gguf_path):
    """``auto`` (the default) is resolved as the plan is made: mixed for quantized weights,
    and the split gives one mixed stage's tokens; float32 weights keep float (no field)."""
    plan = _plan(gguf_path, (0, 3, LAYERS + 2), "gguf", activations="auto")
    assert plan.llm is not None and plan.llm.activations == "mixed"
    prompt = [3, 17, 99, 5, 42, 7]
    assert _served(plan, prompt) == _one_process(GGUFModel(gguf_path), prompt,
                                                 activations="mixed")
    floats = _plan(gguf_path, (0, 3, LAYERS + 2), "float32", activations="auto")
    assert floats.llm is not None and floats.llm.activations == "float"
    assert "activations" not in json.loads(floats.model_dump_json())["llm"]


def test_int8_activations_need_quantized_weights(gguf_path):
    with pytest.raises(ConfigError, match="int8 activations need quantized weights") as info:
        plan_llm_at(str(gguf_path), get_topology("home-wifi"), (0, 2, 5, 5),
                    LLMWorkload(prompt_tokens=4, new_tokens=4, activations="int8"),
                    dtype="float32")
    _one_line(info)


def test_an_unknown_activations_setting_is_refused_naming_every_one():
    with pytest.raises(ConfigError, match="choose float, int8, mixed") as info:
        LLMWorkload(activations="int4")  # type: ignore[arg-type]
    _one_line(info)


def test_a_quantized_plan_round_trips_through_its_file(gguf_plan, tmp_path):
    from edgesplit.plan import load_plan

    path = tmp_path / "plan.json"
    gguf_plan.save(path)
    assert load_plan(path).llm == gguf_plan.llm


def test_a_failed_step_rolls_the_preallocated_cache_back(gguf_plan):
    stage = open_stage(gguf_plan, 1)
    sessions = LLMSessions("d", stage.new_cache, max_sessions=1, max_context=MAX_CONTEXT)
    hidden = torch.randn(1, 3, int(TINY["hidden"]))
    with sessions.step("s", 0, 3) as state:
        stage.step(hidden, 0, state.cache)
    with pytest.raises(RuntimeError), sessions.step("s", 3, 1) as state:
        stage.step(hidden[:, :1], 3, state.cache)
        assert state.cache.length == 4
        raise RuntimeError("the rest of the chain failed")
    assert state.cache.length == 3 and sessions.length("s") == 3


def test_the_cli_plans_a_gguf_at_its_own_precision(gguf_path):
    from typer.testing import CliRunner

    from edgesplit.cli import app

    for flag in ("--precision", "--dtype"):
        result = CliRunner().invoke(app, ["llm", "plan", str(gguf_path), "--topology",
                                          "home-wifi", flag, "gguf", "-p", "4", "-n", "4",
                                          "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert (doc["dtype"], doc["group_size"]) == ("q4_0", 32)


def test_the_cli_plans_a_gguf_of_kernel_types_at_its_own_precision_by_default(gguf_path,
                                                                           llama_folder):
    """Without --precision a GGUF of Q4_0 linears runs as stored; a transformers folder and a
    config-only model stay float32."""
    from typer.testing import CliRunner

    from edgesplit.cli import app
    from edgesplit.llm.model.precision import default_precision

    result = CliRunner().invoke(app, ["llm", "plan", str(gguf_path), "--topology",
                                      "home-wifi", "-p", "4", "-n", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["dtype"] == "q4_0"
    assert default_precision(str(gguf_path)) == "gguf"
    assert default_precision(str(llama_folder)) == "float32"
    assert default_precision("llama_tiny") == "float32"


# ---- bad input, one line each -------------------------------------------------------------------
@pytest.mark.parametrize(("model", "dtype", "message"), [
    ("llama_tiny", "q4_1", "config-only model has random ones"),
    ("llama_tiny", "gguf", "is not a GGUF"),
    ("llama_tiny", "int4", f"choose one of {PRECISIONS}"),
    ("qwen2_tiny", "q8_0", "Llama-layout models without biases"),
])
def test_a_precision_the_source_cannot_run_is_refused(model, dtype, message):
    with pytest.raises(ConfigError) as info:
        describe_causal_lm(model, dtype=dtype)
    assert message in _one_line(info)


def test_gguf_needs_a_gguf_file(llama_folder):
    with pytest.raises(ConfigError, match="is not a GGUF") as info:
        describe_causal_lm(llama_folder, dtype="gguf")
    _one_line(info)


def test_dimensions_off_the_group_are_refused():
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ConfigError, match="hidden size of 48 is not a multiple of the "
                                          "quantization group of 32") as info:
        describe_causal_lm(config, dtype="q4_0")
    _one_line(info)


def _edited(plan: Plan, **llm) -> Plan:
    assert plan.llm is not None
    return plan.model_copy(update={"llm": plan.llm.model_copy(update=llm)})


@pytest.mark.parametrize(("change", "message"), [
    ({"dtype": "q3_k"}, "precision 'q3_k' is not one a stage runs"),
    ({"group_size": 64}, "groups of 64"),
    ({"fingerprint": "0" * 64}, "is not the one the plan was made for"),
])
def test_a_plan_a_stage_cannot_run_is_refused_before_serving(gguf_plan, change, message):
    edited = _edited(gguf_plan, **change)
    for make in (lambda: open_stage(edited, 1),
                 lambda: server_for(edited, edited.devices[1].name, data_port=None)):
        with pytest.raises(ConfigError) as info:
            make()
        assert message in _one_line(info)


def test_a_torch_stage_refuses_quantized_weights(gguf_plan):
    with pytest.raises(ConfigError, match="open_stage") as info:
        LLMStageModel(gguf_plan, 1)
    _one_line(info)


def test_a_quantized_stage_takes_no_model_and_computes_on_the_cpu(gguf_plan):
    with pytest.raises(ConfigError, match="float plans only"):
        open_stage(gguf_plan, 1, model=torch.nn.Linear(1, 1))
    with pytest.raises(ConfigError, match="on the CPU"):
        open_stage(gguf_plan, 1, torch_device="meta")


def test_emulation_times_and_prices_a_quantized_stage(gguf_plan):
    """--emulate-device measures the stage's own blocks here and prices them as planned."""
    from edgesplit.llm.stage.emulation import measured_reference, predicted_reference

    for index in (0, 1):
        measured = measured_reference(open_stage(gguf_plan, index), gguf_plan, repeats=1)
        predicted = predicted_reference(gguf_plan, index)
        assert all(measured[p] > 0 and predicted[p] > 0 for p in ("prefill", "decode"))


def test_a_quantized_stage_process_imports_no_transformers_or_scipy(gguf_plan, tmp_path):
    """A stage server process that opens a quantized stage imports neither transformers nor
    scipy (planning only): 150 and 23 MiB of a stage's resident set (measured)."""
    path = tmp_path / "plan.json"
    gguf_plan.save(path)
    code = ("import sys\n"
            "import edgesplit.llm.stage.server\n"
            "from edgesplit.llm.stage.compute import open_stage\n"
            "from edgesplit.plan import load_plan\n"
            "stage = open_stage(load_plan(sys.argv[1]), 1)\n"
            "assert stage.runner is not None\n"
            "print(sorted({'transformers', 'scipy'} & {m.split('.')[0] for m in sys.modules}))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
