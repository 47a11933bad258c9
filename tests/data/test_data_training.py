"""Labelled training data for searches: digits' fixed split, image folders, npz files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from edgesplit.data import load_dataset
from edgesplit.data.training import load_image_folder, load_labelled, stratified_split
from edgesplit.errors import ConfigError


def test_digits_split_is_the_evaluation_split():
    data = load_labelled("digits")
    held_out = load_dataset("digits")
    assert data.sample_shape == (1, 32, 32) and data.num_classes == 10
    assert len(data.train) == 1197 and len(data.test) == 600
    torch.testing.assert_close(data.test.inputs[0], held_out.inputs[0])


def _folder(root, sizes=((8, 8), (12, 10))):
    colors = {"red": (255, 0, 0), "blue": (0, 0, 255)}
    for name, rgb in colors.items():
        (root / name).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", sizes[i % len(sizes)], rgb).save(root / name / f"{i}.png")
    return root


def test_image_folder_reads_resizes_and_labels_by_sorted_folder(tmp_path):
    data, classes = load_image_folder(_folder(tmp_path / "imgs"), image_size=8)
    assert classes == ("blue", "red")
    assert data.inputs[0].shape == (8, 3, 8, 8)
    assert data.labels.tolist() == [0] * 4 + [1] * 4
    blue = data.inputs[0][0]
    assert blue[2].min() == 1.0 and blue[0].max() == -1.0  # [-1, 1]; channel order RGB


def test_folder_split_is_stratified_and_reproducible(tmp_path):
    root = _folder(tmp_path / "imgs")
    a = load_labelled(str(root), holdout=0.25, seed=3, image_size=8, grayscale=True)
    b = load_labelled(str(root), holdout=0.25, seed=3, image_size=8, grayscale=True)
    assert a.sample_shape == (1, 8, 8) and a.classes == ("blue", "red")
    assert sorted(a.test.labels.tolist()) == [0, 1]
    torch.testing.assert_close(a.train.inputs[0], b.train.inputs[0])


def test_bad_folders_and_files_say_what_to_do(tmp_path):
    (tmp_path / "one" / "only").mkdir(parents=True)
    Image.new("L", (4, 4)).save(tmp_path / "one" / "only" / "a.png")
    with pytest.raises(ConfigError, match="at least two classes"):
        load_labelled(str(tmp_path / "one"))
    root = _folder(tmp_path / "imgs")
    (root / "red" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(ConfigError, match=r"cannot read image .*broken\.png"):
        load_labelled(str(root))
    np.savez(tmp_path / "x.npz", inputs=np.zeros((4, 1, 2, 2), np.float32))
    with pytest.raises(ConfigError, match="needs 'labels'"):
        load_labelled(str(tmp_path / "x.npz"))
    with pytest.raises(ConfigError, match="unknown training data 'nope'"):
        load_labelled("nope")


def test_npz_labels_split(tmp_path):
    labels = np.array([0, 1] * 10)
    np.savez(tmp_path / "d.npz", inputs=np.random.rand(20, 1, 4, 4).astype(np.float32),
             labels=labels)
    data = load_labelled(str(tmp_path / "d.npz"), holdout=0.2)
    assert len(data.train) == 16 and len(data.test) == 4 and data.num_classes == 2


def test_stratified_split_rejects_singleton_classes():
    with pytest.raises(ConfigError, match="at least two"):
        stratified_split(torch.tensor([0, 0, 1]), 0.5, 0)
