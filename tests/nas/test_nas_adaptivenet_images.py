"""AdaptiveNet on a streamed image set (issue 38, 5): the three parts of Fashion-MNIST kept
apart (train on the train split but its last 5,000, search on those, report on the test
split), batches transformed one at a time, a user's mistakes refused before any training, and
elastify -> search end to end reading the same parts back. A small fake set in Fashion-MNIST's
format stands in for the real one, so this runs anywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.nas.adaptivenet.checkpoint import build_supernet, load_supernet
from edgesplit.nas.adaptivenet.data import HOLDOUT, StreamedPart, load_elastic_data
from edgesplit.nas.adaptivenet.run import trained_data
from helpers import fake_fashion_mnist

SPEC = "fashion-mnist:size=32,channels=1"
TRAIN, TEST = HOLDOUT + 200, 300

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest


@pytest.fixture(scope="module")
def fake_set(tmp_path_factory) -> str:
    root = fake_fashion_mnist(tmp_path_factory.mktemp("fmnist"), train=TRAIN, test=TEST)
    return str(root)


@pytest.fixture
def fmnist(fake_set, monkeypatch) -> None:
    monkeypatch.setenv("EDGESPLIT_FASHION_MNIST", fake_set)


@pytest.fixture(scope="module")
def supernet():
    return build_supernet("digits_cnn")  # (1, 1, 32, 32) in, 10 classes out


def test_parts_are_streamed_disjoint_and_the_whole_test_split(fmnist, supernet):
    data = load_elastic_data(SPEC, input_shape=(1, 1, 32, 32), teacher=supernet,
                             train_limit=64, search_size=48)
    assert data.task == "labels"
    assert all(isinstance(p, StreamedPart) for p in (data.train, data.search, data.test))
    assert data.sizes() == {"train": 64, "search": 48, "test": TEST}
    train, search = data.train.images.indices, data.search.images.indices
    assert train.max() < TRAIN - HOLDOUT <= search.min()  # never searched on what trained
    assert data.test.images.source.name == "fashion-mnist[test]"
    # batches are transformed on the fly, labels are the targets, rng shuffles
    (x,), y = next(data.search.batches(16))
    assert x.dtype == torch.float32 and tuple(x.shape) == (16, 1, 32, 32)
    assert torch.equal(y, data.search.images.labels[:16])
    shuffled = next(t for _, t in data.train.batches(64, rng=np.random.default_rng(0)))
    assert sorted(shuffled.tolist()) == sorted(data.train.images.labels.tolist())
    assert not torch.equal(shuffled, data.train.images.labels)
    # the default search part is 1,000 of the held-out images (here all the fake set has)
    default = load_elastic_data(SPEC, input_shape=(1, 1, 32, 32), teacher=supernet)
    assert default.sizes() == {"train": TRAIN - HOLDOUT, "search": 1000, "test": TEST}


@pytest.mark.parametrize(("spec", "changes", "message"), [
    (SPEC + ",range=:100", {}, "divides an image set itself"),
    (SPEC + ",split=test", {}, "drop split=/range="),
    ("fashion-mnist:size=32,channels=3", {}, "model takes \\[1, 32, 32\\]"),
    (SPEC, {"task": "cosine"}, "trains on its labels"),
    (SPEC, {"train_limit": 0}, "positive number of samples"),
])
def test_mistakes_are_refused_before_training(fmnist, supernet, spec, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_elastic_data(spec, input_shape=(1, 1, 32, 32), teacher=supernet, **changes)


def test_a_model_with_other_outputs_than_classes_is_refused(fmnist):
    class Wide(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)[:, :1000]

    with pytest.raises(ConfigError, match="one output per class \\(10\\), it has 1000"):
        load_elastic_data(SPEC, input_shape=(1, 1, 32, 32), teacher=Wide())


def test_elastify_then_search_read_the_same_parts(fmnist, tmp_path):
    out, found = tmp_path / "supernet", tmp_path / "search"
    runner = CliRunner()
    result = runner.invoke(app, ["nas", "adaptivenet", "elastify", "digits_cnn", "--data", SPEC,
                                 "--train-limit", "96", "--search-size", "64",
                                 "--distill-epochs", "1", "--tune-epochs", "1", "--out", str(out),
                                 "--json"])
    assert result.exit_code == 0, result.output
    supernet, doc = load_supernet(out)
    training = doc["training"]
    assert training["sizes"] == {"train": 96, "search": 64, "test": TEST}
    assert (training["train_limit"], training["search_size"]) == (96, 64)
    again = trained_data(supernet)
    assert again.sizes() == training["sizes"]
    assert np.array_equal(again.search.images.indices, np.arange(TRAIN - HOLDOUT,
                                                                 TRAIN - HOLDOUT + 64))
    result = runner.invoke(app, ["nas", "adaptivenet", "search", str(out), "--population", "4",
                                 "--iterations", "1", "--repeats", "2", "--out", str(found),
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert (found / "model.pt2").is_file() and (found / "pool.json").is_file()
