"""Models outside the built-in zoo, taken the way a new user would: saved with
``torch.export.save``, planned from the ``.pt2`` (an edge/cloud split in the middle), served
in-process over gRPC, run against the unsplit model, returned in the model's own output
structure, and exported to ONNX (each part run by ONNX Runtime against PyTorch).

The set: a small U-Net with two outputs, a model with two inputs, dict, tuple and nested outputs
(with None, a constant, a returned buffer, int, bool and 0-d tensors, the input returned, the
same tensor twice), and tiny transformers models built from configs with random weights
(Llama, Swin, ConvNeXt, the T5 encoder).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn

from edgesplit.errors import CaptureError
from edgesplit.graph import capture
from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, load_plan
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.session import run_requests
from helpers import listening

TOL = 1e-5


class UNet(nn.Module):
    """Two-level U-Net: a segmentation map and an image-level head (two outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU())
        self.seg = nn.Conv2d(8, 2, 1)
        self.cls = nn.Linear(16, 3)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        d = self.dec(torch.cat([self.up(e2), e1], dim=1))  # the skip crosses a middle cut
        return self.seg(d), self.cls(e2.mean(dim=(2, 3)))


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.img = nn.Linear(8, 16)
        self.txt = nn.Embedding(20, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, image, tokens):
        return self.head(torch.relu(self.img(image)) + self.txt(tokens).mean(1))


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(16, 2)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"logits": self.a(h), "boxes": self.b(h).sigmoid()}


class TupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.a = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.a(h), h  # h is an output and read by a later layer


class NestedOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(16, 2)
        self.register_buffer("anchors", torch.arange(3.0))

    def forward(self, x):
        h = torch.relu(self.body(x))
        logits = self.a(h)
        return {"head": (logits, [self.b(h), None]), "features": {"h": h, "x": x},
                "scale": 2, "anchors": self.anchors, "label": logits.argmax(-1),
                "positive": logits > 0, "energy": logits.logsumexp(-1).mean(), "again": logits}


def _hf(name: str):
    import transformers as T

    if name == "llama":
        config = T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=32, use_cache=False)
        return T.LlamaForCausalLM(config), (torch.randint(0, 64, (1, 8)),)
    if name == "swin":
        config = T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                              num_heads=[2, 2], window_size=4, mlp_ratio=2.0)
        return T.SwinModel(config), (torch.randn(1, 3, 32, 32),)
    if name == "convnext":
        config = T.ConvNextConfig(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1],
                                  patch_size=4, image_size=32)
        return T.ConvNextModel(config), (torch.randn(1, 3, 32, 32),)
    config = T.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                        use_cache=False)
    return T.T5EncoderModel(config), (torch.randint(0, 64, (1, 8)),)


def _model(name: str):
    torch.manual_seed(0)
    local = {"unet": (UNet, (torch.randn(1, 3, 16, 16),)),
             "two_inputs": (TwoInputs, (torch.randn(1, 8), torch.randint(0, 20, (1, 5)))),
             "dict": (DictOut, (torch.randn(1, 8),)), "tuple": (TupleOut, (torch.randn(1, 8),)),
             "nested": (NestedOut, (torch.randn(1, 8),))}
    if name in local:
        cls, x = local[name]
        return cls().eval(), x
    module, x = _hf(name)
    return module.eval(), x


def _save(name: str, tmp_path):
    module, x = _model(name)
    path = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(module, x), str(path))
    with torch.no_grad():
        expected = module(*x)
    return path, x, expected


def _plan_middle_split(path, tmp_path):
    """Edge/cloud split after the middle layer (raw inputs sent at 32 bits: exact)."""
    setting = EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                               link=get_link("4g"), input_bits=32)
    problem = PlanningProblem(str(path), setting)
    layers = problem.graph.layers
    plan = Manual([layers[(len(layers) - 1) // 2].name]).plan(problem)
    assert all(device.layers for device in plan.devices)  # both sides compute
    plan_path = tmp_path / "plan.json"
    plan.save(plan_path)
    return plan_path


def _assert_same_tree(got, want) -> None:
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    assert got_spec == want_spec  # same containers, keys and output class
    for g, w in zip(got_leaves, want_leaves, strict=True):
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, atol=TOL, rtol=TOL)
        else:
            assert g == w


@pytest.mark.parametrize("name", ["unet", "two_inputs", "dict", "tuple", "nested", "llama",
                                  "swin", "convnext", "t5"])
def test_heldout_model_plans_serves_and_exports(name, tmp_path):
    path, x, expected = _save(name, tmp_path)
    program = PlanProgram.load(load_plan(_plan_middle_split(path, tmp_path)))
    assert program.steps[0].sends  # something crosses the link
    _assert_same_tree(program.structured(program.unsplit(x)), expected)

    with listening(program, "cloud", shape=False) as (_, address):
        report = run_requests(program, address, client_options={"shape": False})
        with ChainClient(program, address, shape=False) as client:
            result = client.request(x)
    assert report["errors"] == 0 and report["max_abs_diff"] <= TOL, report["error_messages"]
    assert len(result.outputs) == len(program.outputs)
    _assert_same_tree(program.structured(result.outputs), expected)

    onnx_models = program.export_onnx()
    assert set(onnx_models) == {"edge", "cloud"}
    via_onnx = PlanProgram.load(program.plan, program.graph, backend="onnxruntime")
    outputs, _ = via_onnx.run_local(x)
    for got, want in zip(outputs, program.unsplit(x), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_transformers_pt2_loads_in_a_fresh_process(tmp_path):
    """The saved program names its output class (CausalLMOutputWithPast); a process that never
    imported transformers must still rebuild it."""
    path, _, _ = _save("llama", tmp_path)
    proc = subprocess.run([sys.executable, "-m", "edgesplit.cli", "inspect", str(path), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outputs"]


def test_submodule_named_like_a_graph_module_attribute_says_how_to_fix():
    class WithMeta(nn.Module):  # GraphModule.meta shadows it when torch unlifts the program
        def __init__(self) -> None:
            super().__init__()
            self.meta = nn.Sequential(nn.Linear(4, 4))
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.meta(x))

    with pytest.raises(CaptureError, match=r"named 'meta'.*rename that attribute"):
        capture(WithMeta(), torch.randn(1, 4))
