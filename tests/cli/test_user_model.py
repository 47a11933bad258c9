"""A new user's own model and data (issue 55, item 4): a model in a `.py` file through inspect,
plan and AdaptiveNet; each mistake one line saying what to do; AdaptiveNet refusing a model it
can add no branch to before training; the class count taken from the model, not the labels;
a cosine score never labelled as accuracy."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.graph import capture, is_code_ref, is_model_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest

NETS = textwrap.dedent('''
    import torch
    from torch import nn


    class Residual(nn.Module):
        """Three shape-keeping residual blocks: something AdaptiveNet can skip and shrink."""

        def __init__(self, classes=10):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                              nn.Conv2d(16, 8, 3, padding=1)) for _ in range(3))
            self.head = nn.Linear(8, classes)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            for block in self.blocks:
                x = torch.relu(x + block(x))
            return self.head(x.mean((2, 3)))


    class Plain(nn.Module):
        """One convolution and a classifier: no block to skip or shrink."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, 2, 1)
            self.head = nn.Linear(8, 10)

        def forward(self, x):
            return self.head(torch.relu(self.conv(x)).mean((2, 3)))


    class Needs(nn.Module):
        def __init__(self, width, depth=2):
            super().__init__()


    def make_model():
        return Residual(classes=4)


    def not_a_model():
        return 3
''')

SHAPE = "1,3,16,16"


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _ok(*args: str) -> dict:
    result = _cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _error(*args: str) -> str:
    """The one line a user mistake prints (exit 2, no traceback)."""
    result = _cli(*args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture
def nets(tmp_path, monkeypatch):
    """my_nets.py in a fresh folder that is also the current one."""
    (tmp_path / "my_nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_code_reference_is_neither_a_built_in_nor_a_model_file():
    assert is_code_ref("my_net.py:MyNet") and is_code_ref("nets/my_net.py:make_model")
    assert is_code_ref("package.module:Name") and not is_code_ref("resnet18")
    assert not is_code_ref("model.pt2") and not is_code_ref("a:b:c")
    assert not is_model_file("nets/my_net.py:MyNet") and is_model_file("nets/model.pt2")


def test_inspect_a_class_and_a_factory_from_a_file(nets):
    doc = _ok("inspect", "my_nets.py:Residual", "--input-shape", SHAPE)
    assert doc["model"] == "Residual"
    assert doc["cuts"][0]["elements"] == 3 * 16 * 16 and doc["cuts"][-1]["elements"] == 10
    factory = _ok("inspect", "my_nets.py:make_model", "--input-shape", SHAPE)
    assert factory["cuts"][-1]["elements"] == 4  # make_model's Residual(classes=4)


def test_a_module_path_imports_from_the_current_folder(nets):
    pkg = nets / "zoo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets_a.py").write_text(NETS)
    doc = _ok("inspect", "zoo.nets_a:Plain", "--input-shape", SHAPE, "--cuts-only")
    assert doc["model"] == "Plain"


def test_the_capture_is_the_models_own_output(nets):
    graph = capture("my_nets.py:Residual", input_shape=(2, 3, 16, 16))
    x = torch.randn(2, 3, 16, 16)
    import sys

    module = next(m for name, m in sys.modules.items()
                  if name.startswith("edgesplit_user_my_nets"))
    torch.manual_seed(0)
    reference = module.Residual().eval()
    assert graph.program is not None
    assert torch.allclose(graph.program(x), reference(x), atol=1e-5)


def test_plan_a_model_from_a_file_and_run_the_plan(nets, monkeypatch):
    doc = _ok("plan", "my_nets.py:Residual", "--input-shape", SHAPE, "--method",
              "neurosurgeon", "--out", "plan.json")
    assert doc["chosen"] == "neurosurgeon"
    saved = json.loads((nets / "plan.json").read_text())
    assert saved["model"]["source"] == "./my_nets.py:Residual"  # beside the plan file
    from edgesplit.plan import load_plan
    from edgesplit.runtime import PlanProgram

    with pytest.raises(ConfigError, match="the plan's model is Python code"):
        PlanProgram.load(load_plan(nets / "plan.json"))  # serving a plan never runs code unasked
    program = PlanProgram.load(load_plan(nets / "plan.json"), trust_model_file=True)
    assert program is not None  # captured again from the file
    elsewhere = nets / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the code is found beside the plan, from any folder
    assert PlanProgram.load(load_plan(nets / "plan.json"), trust_model_file=True) is not None


@pytest.mark.parametrize("args, says", [
    (["my_nets.py:Residual"], "give it with --input-shape"),
    (["missing.py:Net", "--input-shape", SHAPE], "model file 'missing.py' does not exist"),
    (["my_nets.py:Nope", "--input-shape", SHAPE],
     "my_nets.py has no 'Nope' (it defines Residual, Plain, Needs, make_model, not_a_model)"),
    (["my_nets.py:Needs", "--input-shape", SHAPE],
     "my_nets.py:Needs needs arguments (width) and edgesplit calls it with none"),
    (["my_nets.py:not_a_model", "--input-shape", SHAPE], "returned a int, not a torch.nn.Module"),
    (["my_nets.py:Residual", "--input-shape", "1,5,16,16"],
     "fails on an input of shape 1,5,16,16: RuntimeError"),
    (["nowhere.mod:Net", "--input-shape", SHAPE], "cannot import 'nowhere.mod'"),
])
def test_each_mistake_is_one_line_saying_what_to_do(nets, args, says):
    assert says in _error("inspect", *args)


def test_a_file_that_fails_to_import_is_one_line(nets):
    (nets / "broken.py").write_text("import torch\nraise ValueError('no weights here')\n")
    line = _error("inspect", "broken.py:Net", "--input-shape", SHAPE)
    assert "importing" in line and "ValueError: no weights here" in line
    assert "python" in line  # how to see the traceback


def test_plan_wants_the_input_shape_too(nets):
    assert "--input-shape" in _error("plan", "my_nets.py:Residual")


def _labelled(path, labels, shape=(3, 16, 16), seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((len(labels), *shape)).astype(np.float32)
    np.savez(path, inputs=inputs, labels=np.asarray(labels))
    return str(path)


TINY = ["--distill-epochs", "1", "--tune-epochs", "1", "--batch-size", "16", "--merge", "1",
        "--shrink", "0.5"]


def test_elastify_a_model_from_a_file_on_data_missing_classes(nets):
    """A 10-class model whose data holds two classes: the class count is the model's."""
    data = _labelled(nets / "two.npz", [1, 5] * 16)
    doc = _ok("nas", "adaptivenet", "elastify", "my_nets.py:Residual", "--input-shape", SHAPE,
              "--data", data, "--out", "sn", *TINY)
    assert doc["branches"]["merged"] + doc["branches"]["shrunk"] > 0
    assert doc["training"]["task"] == "labels"
    assert doc["training"]["score"] == "top-1 accuracy"
    saved = json.loads((nets / "sn" / "supernet.json").read_text())
    # the file made absolute: the supernet loads again from another folder
    assert saved["source"]["model"] == f"{nets / 'my_nets.py'}:Residual"
    from edgesplit.nas.adaptivenet import load_supernet

    supernet, _ = load_supernet(nets / "sn")
    assert supernet.space.num_blocks == doc["blocks"]


def test_labels_the_model_cannot_output_are_refused(nets):
    data = _labelled(nets / "big.npz", [1, 12] * 16)
    line = _error("nas", "adaptivenet", "elastify", "my_nets.py:Residual", "--input-shape",
                  SHAPE, "--data", data, "--out", "sn", *TINY)
    assert "labels must be class ids 0..9 (the model has 10 outputs" in line


def test_a_cosine_score_is_not_called_accuracy(nets):
    data = _labelled(nets / "two.npz", [0, 1] * 16)
    result = _cli("nas", "adaptivenet", "elastify", "my_nets.py:Residual", "--input-shape",
                  SHAPE, "--data", data, "--out", "sn", "--task", "cosine", *TINY)
    assert result.exit_code == 0, result.output
    assert "Latency-range cosine similarity" in result.output
    assert "accuracy" not in result.output.split("Latency-range")[1].split("\n")[0]
    doc = json.loads((nets / "sn" / "supernet.json").read_text())
    assert doc["training"]["score"] == "cosine similarity to the pretrained outputs"


def test_search_columns_name_the_score():
    from edgesplit.report.adaptivenet_tables import search_table

    row = {"arch": ["b0"], "latency_s": 0.001, "accuracy": 0.9}
    doc = {"evaluation": {"branch_calls": 1, "subnets": 1, "batches": 1, "peak_cached": 1},
           "latency_model": "table", "model": "m", "budget_ms": 1.0, "delta_ms": 0.1,
           "evaluated": 1, "search_seconds": 0.1, "pool": [row], "metric": "cosine",
           "best": {**row, "test_accuracy": 0.8, "relative_macs": 1.0},
           "original": {"arch": ["b0"], "latency_ms": 1.0, "test_accuracy": 0.8}}
    columns = [c.header for c in search_table(doc).columns]
    assert "search cos" in columns and "held-out cos" in columns
    assert not any("acc" in str(c) for c in columns)
    doc["metric"] = "labels"
    assert "search acc" in [c.header for c in search_table(doc).columns]


def test_a_model_with_nothing_to_elastify_is_refused_before_training(nets, monkeypatch):
    from edgesplit.nas.adaptivenet import run

    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the model was checked")

    monkeypatch.setattr(run, "supernet_data", no_data)
    line = _error("nas", "adaptivenet", "elastify", "my_nets.py:Plain", "--input-shape", SHAPE,
                  "--data", "unused.npz", "--out", "sn")
    assert "AdaptiveNet finds nothing to elastify in Plain: cut into 2 blocks" in line
    assert "residual" in line and "no merged branch can skip one" in line
    assert not (nets / "sn").exists()


def test_no_branch_options_are_named():
    from edgesplit.nas.adaptivenet import build_supernet
    from edgesplit.nas.adaptivenet.elastify import ElasticConfig

    with pytest.raises(ConfigError, match="merge=0 and no shrink fractions add no branch"):
        build_supernet("digits_cnn", config=ElasticConfig(merge=0, shrink=()))


def test_load_labelled_takes_the_class_count_from_the_model(tmp_path):
    from edgesplit.data.training import load_labelled

    spec = _labelled(tmp_path / "d.npz", [1, 5] * 8, shape=(1, 8, 8))
    with pytest.raises(ConfigError, match="every class present"):
        load_labelled(spec)  # no model: the count comes from the labels, which skip ids
    assert load_labelled(spec, num_classes=10).num_classes == 10
    with pytest.raises(ConfigError, match=r"class ids 0\.\.3 \(the model has 4 outputs"):
        load_labelled(spec, num_classes=4)
