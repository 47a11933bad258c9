"""Evaluation data: the packaged digits set, user files, and batching that never drops samples."""

import numpy as np
import pytest
import torch

from edgesplit.data import EvalData, list_datasets, load_dataset, load_eval_data
from edgesplit.errors import ConfigError, UnknownNameError


def test_digits_is_the_held_out_part_of_the_real_data_set():
    data = load_dataset("digits")
    assert len(data) == 600 and data.metric == "top1"
    assert data.inputs[0].shape == (600, 1, 32, 32)
    assert data.inputs[0].min() >= -1 and data.inputs[0].max() <= 1
    assert sorted(set(data.labels.tolist())) == list(range(10))
    assert "digits" in list_datasets() and "sentences" in list_datasets()


def test_batches_pad_the_last_batch_and_count_only_real_samples():
    x = torch.arange(10.0).reshape(10, 1)
    data = EvalData("toy", (x,), torch.zeros(10, dtype=torch.long))
    batches = list(data.batches(4))
    assert [real for _, real in batches] == [4, 4, 2]
    assert all(b[0].shape == (4, 1) for b, _ in batches)
    seen = torch.cat([b[0][:real] for b, real in batches])
    assert torch.equal(seen, x)  # every sample once, in order


def test_split_keeps_every_sample():
    data = load_dataset("digits")
    cal, held = data.split(100)
    assert len(cal) == 100 and len(held) == 500
    with pytest.raises(ConfigError, match="calibration"):
        data.split(600)


def test_files_load_and_bad_files_say_why(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.savez(tmp_path / "d.npz", inputs=x, labels=np.arange(5))
    data = load_eval_data(str(tmp_path / "d.npz"))
    assert len(data) == 5 and data.metric == "top1"
    torch.save({"inputs": [torch.ones(4, 2), torch.zeros(4, 2, dtype=torch.long)]},
               tmp_path / "d.pt")
    data = load_eval_data(str(tmp_path / "d.pt"))
    assert len(data.inputs) == 2 and data.metric == "cosine"
    torch.save({"inputs": torch.ones(4, 2), "labels": torch.zeros(3)}, tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match="same number of samples"):
        load_eval_data(str(tmp_path / "bad.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a tensor file")
    with pytest.raises(ConfigError, match="cannot read"):
        load_eval_data(str(tmp_path / "junk.pt"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_eval_data(str(tmp_path / "missing.npz"))
    with pytest.raises(UnknownNameError, match="digits"):
        load_eval_data("digit")


def test_digits_cnn_is_trained_and_accurate():
    from edgesplit.models import create_model

    built = create_model("digits_cnn")
    data = load_dataset("digits")
    with torch.no_grad():
        pred = built.module(data.inputs[0]).argmax(1)
    accuracy = (pred == data.labels).float().mean().item()
    # held-out samples, never seen in training; the recipe is stable: 99.3-99.5 % over seeds
    # 0-3 on one thread, so 95 % leaves room for any machine's rounding
    assert accuracy > 0.95
    assert torch.equal(built.example_inputs[0], data.inputs[0][:1])
