"""``--torch-device``: the name checked before any work, the CPU path unchanged, and on a
machine with CUDA (skipped elsewhere) a split whose later part computes on the GPU against the
same split on the CPU, an LLM stage on the GPU against single-process ``generate``, and a
profile on the GPU.

Tolerances on the GPU: cuDNN convolutions run in TF32 by default (torch's
``allow_tf32``), about 1e-3 relative; float32 matrix products stay float32."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from edgesplit.errors import EdgesplitError
from edgesplit.graph import capture
from edgesplit.hardware import chain, get_device, get_link, get_topology
from edgesplit.hardware.accelerator import AcceleratorError, accelerators, torch_device
from edgesplit.hardware.profile import profile_graph
from edgesplit.plan.multisplit import ChainCosts, chain_plan, evaluate_boundaries
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.backends import get_backend
from helpers import listening, perturbed, server_for

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
no_cuda = pytest.mark.skipif(CUDA, reason="this machine has CUDA")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# ---- the name, checked first ------------------------------------------------------------------
def test_cpu_and_none_are_the_cpu():
    assert torch_device(None) == torch_device("cpu") == torch.device("cpu")
    assert accelerators()[0] == "cpu"


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "tpu", ""])
def test_a_name_that_is_no_device_says_what_is(spec):
    with pytest.raises(AcceleratorError, match="cpu, cuda"):
        torch_device(spec)


def test_a_cuda_index_past_the_last_names_the_available():
    with pytest.raises(AcceleratorError, match="available: cpu"):
        torch_device("cuda:64")


@no_cuda
def test_cuda_without_cuda_is_one_clear_error():
    with pytest.raises(AcceleratorError, match=r"no CUDA device|CPU-only build"):
        torch_device("cuda")


@no_cuda
def test_the_cli_refuses_a_missing_gpu_in_one_line_before_loading(tmp_path):
    # the plan file does not even exist: the device is checked before the model is touched
    for argv in (["profile", "digits_cnn", "--torch-device", "cuda"],
                 ["llm", "serve", str(tmp_path / "none.json"), "-d", "x",
                  "--torch-device", "cuda:1"]):
        done = subprocess.run([sys.executable, "-m", "edgesplit.cli", *argv], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode != 0
        assert "Traceback" not in done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "--torch-device" in lines[0], done.stderr


def test_onnxruntime_on_an_accelerator_needs_its_provider():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has the CUDA provider")
    with pytest.raises(AcceleratorError, match="onnxruntime-gpu"):
        get_backend("onnxruntime", torch.device("mps"))


# ---- a vision split ---------------------------------------------------------------------------
def _split(model: str = "digits_cnn"):
    graph = capture(model)
    devices = [get_device("raspberry-pi-4").model_copy(update={"name": n}) for n in "ab"]
    topology = chain("ab", devices, [get_link("4g")])
    costs = ChainCosts.build(graph, topology)
    plan = chain_plan(costs, evaluate_boundaries(costs, [0, 3, len(graph.layers)]), topology,
                      method="manual", source=model)
    return plan, graph


def _hop(edge: PlanProgram, cloud: PlanProgram, x: torch.Tensor) -> torch.Tensor:
    """The edge's step on ``edge``, its sends through the wire format, the cloud's step on
    ``cloud``: what a client and a server of two processes compute."""
    first, last = edge.steps[0], cloud.steps[1]
    values = first.compute(edge.input_values([x]))
    sent = {t: cloud.decode(t, b) for t, b in edge.encode(first, values, first.sends).items()}
    out = last.compute(sent)
    return out[cloud.outputs[0]]


def test_the_cpu_device_runs_as_before():
    plan, graph = _split()
    program = PlanProgram.load(plan, graph, torch_device="cpu")
    assert program.steps[1].backend.device == torch.device("cpu")
    got, _ = program.run_local()
    assert torch.equal(got[0], PlanProgram.load(plan, graph).run_local()[0][0])


@needs_cuda
@pytest.mark.parametrize("backend", ["torch", "torchscript"])
def test_a_split_whose_cloud_part_runs_on_the_gpu_equals_the_cpu(backend):
    plan, _ = _split("resnet18")
    on_cpu = PlanProgram.load(plan, backend=backend)
    on_gpu = PlanProgram.load(plan, backend=backend, torch_device="cuda")
    assert next(on_gpu.steps[1].partition.module.parameters()).is_cuda
    assert not next(on_gpu.graph.program.parameters()).is_cuda  # the reference stays put
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(on_cpu.graph.example_inputs[0].shape, generator=g)
        ref = _hop(on_cpu, on_cpu, x)
        got = _hop(on_cpu, on_gpu, x)
        assert got.device.type == "cpu"
        assert _rel(got, ref) < 1e-2
        assert got.argmax(-1).equal(ref.argmax(-1))


@needs_cuda
def test_a_served_gpu_stage_answers_a_cpu_client():
    from edgesplit.runtime.client import ChainClient

    plan, _ = _split("resnet18")
    on_cpu = PlanProgram.load(plan)
    with (listening(PlanProgram.load(plan, torch_device="cuda"), "b", shape=False) as (_, address),
          ChainClient(on_cpu, address, shape=False) as client):
        got = client.request().outputs[0]
    assert _rel(got, on_cpu.unsplit()[0]) < 1e-2


@needs_cuda
def test_a_profile_on_the_gpu_times_every_layer():
    graph = capture("resnet18")
    prof = profile_graph(graph, warmup=2, repeats=5, device=torch.device("cuda"))
    assert prof["machine"]["torch_device"].startswith("cuda")
    assert prof["machine"]["accelerator"]
    assert prof["whole_model"]["onnx_ms"] is None  # ONNX Runtime is timed on the CPU only
    assert all(row["eager_ms"]["median"] > 0 for row in prof["layers"])
    assert not next(graph.program.parameters()).is_cuda  # the caller's graph is untouched


# ---- an LLM stage -----------------------------------------------------------------------------
def _llm_plan():
    from edgesplit.llm import LLMWorkload, plan_llm_at

    full = get_topology("home-wifi")
    topology = chain("test", full.devices[:2], [full.links[0].link])
    return plan_llm_at("llama_tiny", topology, (0, 3, 6),
                       LLMWorkload(prompt_tokens=8, new_tokens=10, max_context=32),
                       method="test")


def _perturbed_llama():
    from edgesplit.models.causal_lm import create_causal_lm

    return perturbed(create_causal_lm("llama_tiny"))


def _llm_tokens(device: str | None) -> tuple[list[int], list[int]]:
    """Greedy tokens of a 2-stage split whose second stage computes on ``device``, and
    single-process generate's on the CPU."""
    from edgesplit.llm.generate.client import LLMClient

    plan, model = _llm_plan(), _perturbed_llama()
    prompt = torch.randint(0, model.config.vocab_size, (1, 8),
                           generator=torch.Generator().manual_seed(0))
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10,
                         min_new_tokens=10, do_sample=False, pad_token_id=0)
    # the server's own copy: it moves its modules to its device, and the client's share some
    with (server_for(plan, plan.devices[1].name, model=copy.deepcopy(model),
                     data_port=None, torch_device=device) as server,
          LLMClient(plan, server.loopback_channel(), model=model) as client):
        got = [t.token for t in client.generate(prompt[0].tolist(), 10)]
    return got, out[0, 8:].tolist()


def test_an_llm_stage_on_the_cpu_device_equals_generate():
    got, expected = _llm_tokens("cpu")
    assert got == expected


@needs_cuda
def test_an_llm_stage_on_the_gpu_equals_generate():
    got, expected = _llm_tokens("cuda")
    assert got == expected


def test_errors_are_edgesplit_errors():
    assert issubclass(AcceleratorError, EdgesplitError)


def test_a_backend_kind_registered_without_a_device_still_runs_on_the_cpu():
    """Backends registered before --torch-device took no argument: they still work."""
    from edgesplit.runtime.backends import BACKENDS, TorchBackend

    class Legacy(TorchBackend):
        name = "legacy-test"

        def __init__(self) -> None:  # no device parameter
            super().__init__()

    BACKENDS.register("legacy-test", Legacy)
    try:
        plan, graph = _split()
        program = PlanProgram.load(plan, graph, backend="legacy-test")
        assert torch.equal(program.run_local()[0][0], program.unsplit()[0])
    finally:
        BACKENDS._entries.pop("legacy-test", None)
