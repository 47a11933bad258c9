"""The scikit-learn digits data set (1,797 real 8x8 handwritten digits, UCI), shaped for the
built-in ``digits_cnn``: upsampled to 32x32 like a small camera frame, scaled to [-1, 1].

A fixed permutation splits it: the first 1,197 samples train ``digits_cnn``; the remaining
600, never seen in training, are the ``digits`` evaluation set.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgesplit.data import EvalData, register_dataset

__all__ = ["IMAGE_SIZE", "TRAIN_SAMPLES", "digits_arrays"]

TRAIN_SAMPLES = 1197
IMAGE_SIZE = 32


def digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 images as (N, 1, 32, 32) float32 and labels (N,) int64, in the fixed order."""
    images, labels = _digits_arrays()
    return images.clone(), labels.clone()  # callers may write to theirs


@functools.cache
def _digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    raw, target = _sklearn_digits()
    images = torch.as_tensor(raw, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear",
                           align_corners=False) * 2.0 - 1.0
    labels = torch.as_tensor(target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    return images[order].contiguous(), labels[order].contiguous()


def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's packaged digits (nothing is downloaded), read as ``load_digits`` reads
    them but without importing scikit-learn, which costs a command a second."""
    spec = importlib.util.find_spec("sklearn")
    packaged = (Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
                if spec is not None and spec.origin else None)
    if packaged is None or not packaged.is_file():
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    data = np.loadtxt(packaged, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


@register_dataset("digits", model="digits_cnn",
                  description="scikit-learn handwritten digits: 600 held-out 32x32 images, "
                              "10 classes (top-1 accuracy)")
def digits() -> EvalData:
    images, labels = digits_arrays()
    return EvalData("digits", (images[TRAIN_SAMPLES:],), labels[TRAIN_SAMPLES:],
                    "scikit-learn digits not used to train digits_cnn")
