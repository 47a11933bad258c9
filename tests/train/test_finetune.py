"""Fine-tuning a pretrained network (issue 38, 3), on a small fixture in Fashion-MNIST's format:
the prefix stays as pretrained, the result is cached by recipe (the second call trains nothing
and gives the same weights), the exported .pt2 computes what the module does, and the measured
accuracy is the whole network's on every test image."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.data.images import load_images
from edgesplit.errors import ConfigError
from edgesplit.models import create_model
from edgesplit.train.finetune import (
    bootstrap_interval,
    default_recipe,
    export_finetuned,
    finetune,
    predictions,
)
from helpers import fake_fashion_mnist


@pytest.fixture
def fixture_data(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPLIT_FASHION_MNIST",
                       str(fake_fashion_mnist(tmp_path / "fmnist", train=64, test=40)))
    monkeypatch.setenv("EDGESPLIT_CACHE_DIR", str(tmp_path / "cache"))


def test_finetune_freezes_the_prefix_caches_and_exports(fixture_data, tmp_path):
    recipe = default_recipe("mobilenet_v2", image_size=32, epochs=1, batch_size=16,
                            holdout=16)
    first = finetune(recipe)
    assert not first.cached and first.test_images == 40 and len(first.history) == 1
    pretrained = create_model("mobilenet_v2", (1, 3, 32, 32), pretrained=True,
                              num_classes=10).module
    ours, theirs = first.module.layers(), pretrained.layers()
    for a, b in zip(ours[:recipe.frozen], theirs[:recipe.frozen], strict=True):
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(p, q), name  # the frozen prefix is the checkpoint's
    assert any(not torch.equal(p, q) for p, q in zip(
        ours[-1].state_dict().values(), theirs[-1].state_dict().values(), strict=True))

    test = load_images(recipe.data_spec, "test")
    correct = (predictions(first.module, test) == test.labels).numpy()
    assert first.test_accuracy == pytest.approx(100 * correct.mean())

    again = finetune(recipe)
    assert again.cached and again.test_accuracy == first.test_accuracy
    for p, q in zip(first.module.state_dict().values(), again.module.state_dict().values(),
                    strict=True):
        assert torch.equal(p, q)
    # the same network, not only the same tensors: a module built differently (batch-norm
    # eps) took the same weights and classified at chance
    assert torch.equal(predictions(again.module, test), predictions(first.module, test))
    x = test.first(4)
    assert torch.equal(again.module.eval()(x), first.module.eval()(x))

    path = export_finetuned(first, tmp_path / "net.pt2")
    program = torch.export.load(str(path)).module()
    x = test.first(1)
    assert torch.allclose(program(x), first.module.eval()(x), atol=1e-5)


def test_bootstrap_interval_brackets_the_mean():
    correct = np.array([1.0] * 90 + [0.0] * 10)
    lo, hi = bootstrap_interval(correct)
    assert lo < 90.0 < hi and hi - lo < 15


def test_recipes_refuse_bad_settings():
    with pytest.raises(ConfigError, match="multiple of 32"):
        default_recipe("mobilenet_v2", image_size=100)
    with pytest.raises(ConfigError, match="no fine-tuning recipe"):
        default_recipe("resnet18")
    with pytest.raises(ConfigError, match="positive epochs"):
        default_recipe("efficientnet_lite0", epochs=0)


def test_the_cli_reports_and_writes_the_program(fixture_data, tmp_path):
    out = tmp_path / "ft.pt2"
    result = CliRunner().invoke(app, ["finetune", "efficientnet_lite0", "--image-size", "32",
                                      "--epochs", "1", "--holdout", "16", "--out", str(out),
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["test_images"] == 40 and doc["data_spec"].startswith("fashion-mnist:size=32")
    assert doc["validation_spec"].endswith(",split=train,range=-16:")
    assert out.is_file()
    too_many = CliRunner().invoke(app, ["finetune", "mobilenet_v2", "--image-size", "32",
                                        "--holdout", "64"])
    assert too_many.exit_code != 0 and "leaves none of the 64 training images" in \
        too_many.output


def test_the_holdout_is_the_validation_slice_and_is_never_trained_on(fixture_data):
    """The recipe's validation spec is the last ``holdout`` training images; training sees the
    others only (so its features count 48 of the 64)."""
    from edgesplit.train import finetune as module

    recipe = default_recipe("mobilenet_v2", image_size=32, epochs=1, batch_size=16,
                            holdout=16)
    assert default_recipe("mobilenet_v2").holdout == 5000
    validation = load_images(recipe.validation_spec)
    train = load_images(recipe.data_spec, "train")
    assert len(validation) == 16 and torch.equal(validation.labels, train.labels[48:])
    module._LAST_FEATURES.clear()
    finetune(recipe, use_cache=False)
    (feats, labels), = module._LAST_FEATURES.values()
    assert len(feats) == 48 and torch.equal(labels.sort().values,
                                            train.labels[:48].sort().values)


def test_plan_measures_a_finetuned_program_on_a_streamed_image_set(fixture_data, tmp_path):
    """A fine-tuned .pt2 (batch dimension dynamic) planned with --eval-data naming an image set
    with options: the held-out images are streamed through the transform, evaluated in batches
    (the program is specialised at each batch with the same layers), and the float reference
    equals the network's own accuracy on those images."""
    recipe = default_recipe("mobilenet_v2", image_size=32, epochs=1, batch_size=16,
                            holdout=16)
    result = finetune(recipe)
    path = export_finetuned(result, tmp_path / "ft.pt2")
    out = tmp_path / "plan.json"
    run = CliRunner().invoke(app, ["plan", str(path), "--edge", "eyeriss", "--cloud", "tpu",
                                   "--link", "autosplit-3mbps", "--method", "u8",
                                   "--eval-data", recipe.data_spec, "--calibration-samples",
                                   "8", "--out", str(out)])
    assert run.exit_code == 0, run.output
    quality = json.loads(out.read_text())["quality"]
    held = load_images(recipe.data_spec, "test").subset(slice(8, None))
    expected = (predictions(result.module, held) == held.labels).float().mean() * 100
    assert quality["samples"] == 32 and quality["reference"] == pytest.approx(float(expected))
