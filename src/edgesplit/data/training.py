"""Labelled data to train on and a held-out part to measure on: what a search (NAS) needs.

``load_labelled(spec)`` takes

- ``digits``: the real scikit-learn digits (1x32x32, 10 classes), split exactly as everywhere
  else in edgesplit: the first 1,197 samples train, the 600 of the ``digits`` evaluation set
  are held out;
- ``multiview-shapes`` (options: ``multiview-shapes:views=12,per_class=60,seed=1,
  elevation_deg=30``): rendered solids, one sample (V, 1, H, W) per object with H = W =
  ``image_size``, generated on first use and cached (:mod:`edgesplit.data.multiview`);
- a folder of images with one sub-folder per class (``cats/001.png``, ``dogs/xyz.jpg``), read
  with Pillow (no torchvision), resized to one size and scaled to [-1, 1];
- an ``.npz`` or ``.pt`` file of ``inputs`` and ``labels`` (as :func:`load_eval_data` reads
  them: never unpickled).

Folders, files and rendered sets are split into train and held-out parts per class
(stratified) by a seeded permutation, so a split is reproducible and every class is on both
sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from edgesplit.data import EvalData, load_eval_data
from edgesplit.data.images import IMAGE_SUFFIXES, fashion_mnist, image_files, is_gray
from edgesplit.errors import ConfigError, option

__all__ = ["IMAGE_SUFFIXES", "LabelledData", "load_fashion_mnist", "load_image_folder",
           "load_labelled", "stratified_split"]

@dataclass(frozen=True)
class LabelledData:
    """A train part and a held-out part of one labelled data set."""

    name: str
    train: EvalData
    test: EvalData
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        for part in (self.train, self.test):
            if part.labels is None:
                raise ConfigError(f"{self.name}: training data needs labels")
            if len(part.inputs) != 1:
                raise ConfigError(f"{self.name}: training data needs exactly one input tensor "
                                  f"(images); got {len(part.inputs)}")
        if self.train.inputs[0].shape[1:] != self.test.inputs[0].shape[1:]:
            raise ConfigError(f"{self.name}: train and held-out samples differ in shape")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample, e.g. (1, 32, 32)."""
        return tuple(int(s) for s in self.train.inputs[0].shape[1:])


def stratified_split(labels: torch.Tensor, holdout: float, seed: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (train, held-out): ``holdout`` of every class held out (at least one sample),
    each class permuted by ``seed``."""
    if not 0 < holdout < 1:
        raise ConfigError(f"{option('holdout', holdout)} must be a fraction between 0 and 1")
    gen = torch.Generator().manual_seed(seed)
    train, test = [], []
    for cls in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == cls).flatten()
        if len(idx) < 2:
            raise ConfigError(f"class {cls} has {len(idx)} sample: every class needs at least "
                              "two, one to train on and one to hold out")
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_test = min(len(idx) - 1, max(1, round(len(idx) * holdout)))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return torch.cat(train).sort().values, torch.cat(test).sort().values


def _read_image(path: Path, size: tuple[int, int], grayscale: bool) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            image = opened.convert("L" if grayscale else "RGB")
        if image.size != (size[1], size[0]):
            image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        pixels = np.asarray(image, dtype=np.float32)
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise ConfigError(f"cannot read image {str(path)!r}: {exc}; remove it or replace it "
                          "with a readable image") from None
    pixels = pixels[None] if grayscale else pixels.transpose(2, 0, 1)
    return pixels / 127.5 - 1.0


def load_image_folder(root: str | Path, *, image_size: int | tuple[int, int] = 32,
                      grayscale: bool | None = False) -> tuple[EvalData, tuple[str, ...]]:
    """Every image under ``root/<class>/``, as (N, C, H, W) floats in [-1, 1] with class ids in
    the sorted order of the class folder names (returned too). ``grayscale``: one channel
    (True), three (False), or as the images are (None: one only if every image is gray, so
    colour is never dropped without being asked)."""
    path = Path(root)
    if not path.is_dir():
        raise ConfigError(f"image folder {str(root)!r} does not exist")
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) < 1:
        raise ConfigError(f"{option('image_size', image_size)} must be a positive size")
    files = image_files(path)
    if grayscale is None:
        grayscale = all(is_gray(f) for paths in files.values() for f in paths)
    images, labels = [], []
    for cls, (_, paths) in enumerate(files.items()):
        for f in paths:
            images.append(_read_image(f, (int(size[0]), int(size[1])), grayscale))
            labels.append(cls)
    data = EvalData(path.name, (torch.from_numpy(np.stack(images)),),
                    torch.tensor(labels, dtype=torch.int64), f"images from {path}")
    return data, tuple(files)


def _digits() -> LabelledData:
    from edgesplit.data.digits import TRAIN_SAMPLES, digits_arrays

    images, labels = digits_arrays()
    train = EvalData("digits[train]", (images[:TRAIN_SAMPLES],), labels[:TRAIN_SAMPLES])
    test = EvalData("digits[held-out]", (images[TRAIN_SAMPLES:],), labels[TRAIN_SAMPLES:])
    return LabelledData("digits", train, test, tuple(str(i) for i in range(10)))


def _multiview(spec: str, image_size: int | tuple[int, int]) -> tuple[EvalData, tuple[str, ...]]:
    from edgesplit.data.multiview import make_multiview_shapes, parse_multiview_spec

    options = parse_multiview_spec(spec)  # first: a bad option is the likelier mistake
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or size[0] != size[1]:
        raise ConfigError(f"{spec} renders square images; pass one size as "
                          f"{option('image_size')}, not {image_size!r}")
    images, labels, classes = make_multiview_shapes(size=size[0], **options)
    views = images.shape[1]
    return EvalData(spec, (torch.from_numpy(images),), torch.from_numpy(labels),
                    f"rendered solids, {views} views of each object"), classes


def load_fashion_mnist(size: int = 28, *, train_samples: int | None = None,
                       test_samples: int | None = None) -> LabelledData:
    """Fashion-MNIST's first ``train_samples`` training images (all 60,000 if None) and first
    ``test_samples`` test images (all 10,000 if None), gray in [-1, 1], resized bilinearly to
    ``size`` x ``size`` (a larger frame than the 28x28 published, for settings where the input's
    size matters)."""
    if not (isinstance(size, int) and size >= 1):
        raise ConfigError(f"{option('size', size)} must be a positive image side in pixels")

    def part(split: Literal["train", "test"], samples: int | None) -> EvalData:
        source = fashion_mnist(split)
        images = torch.from_numpy(source.images[:samples]).float() / 127.5 - 1.0
        if size != images.shape[-1]:
            images = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear",
                                                     align_corners=False)
        labels = torch.from_numpy(source.labels[:samples])
        return EvalData(f"fashion-mnist[{split}]@{size}", (images,), labels)

    classes = fashion_mnist("test").classes
    return LabelledData(f"fashion-mnist@{size}", part("train", train_samples),
                        part("test", test_samples), tuple(classes))


def _file_classes(spec: str, labels: torch.Tensor, num_classes: int | None
                  ) -> tuple[str, ...]:
    """The class names (ids) of a file's ``labels``: ``0..num_classes-1`` when the model says
    how many there are, else the labels' own, which must then leave no id out."""
    present = tuple(str(c) for c in torch.unique(labels).tolist())
    if num_classes is not None:
        if labels.min() < 0 or int(labels.max()) >= num_classes:
            raise ConfigError(f"{spec}: labels must be class ids 0..{num_classes - 1} (the "
                              f"model has {num_classes} outputs, one per class); got "
                              f"{', '.join(present)}: relabel the data to the model's classes")
        return tuple(str(c) for c in range(num_classes))
    if labels.min() < 0 or int(labels.max()) >= len(present):
        raise ConfigError(f"{spec}: labels must be the class ids 0..{len(present) - 1} "
                          f"with every class present (the class count is read from them); "
                          f"got {present}")
    return present


def load_labelled(spec: str, *, holdout: float = 0.25, seed: int = 0,
                  image_size: int | tuple[int, int] = 32, grayscale: bool | None = False,
                  num_classes: int | None = None) -> LabelledData:
    """``digits``, ``multiview-shapes[:options]``, a folder of class sub-folders of images, or
    an ``.npz``/``.pt`` file with ``inputs`` and ``labels``, as a train part and a held-out
    part. ``grayscale`` applies to image folders (None: as the images are).

    ``num_classes``: the class count of the model the data is for (its output width), which
    a file's labels must stay below and need not all use; None reads the count from the
    labels, which must then be 0..C-1 with every class present."""
    from edgesplit.data.multiview import SPEC as MULTIVIEW

    if spec == "digits":
        return _digits()
    path = Path(spec)
    if spec.partition(":")[0] == MULTIVIEW and not path.exists():
        data, classes = _multiview(spec, image_size)
    elif path.is_dir():
        data, classes = load_image_folder(path, image_size=image_size, grayscale=grayscale)
    elif path.suffix in (".npz", ".pt", ".pth"):
        data = load_eval_data(spec)
        if data.labels is None:
            raise ConfigError(f"{spec}: training data needs 'labels' next to 'inputs'")
        classes = _file_classes(spec, data.labels, num_classes)
    else:
        raise ConfigError(f"unknown training data {spec!r}: pass 'digits', "
                          f"'{MULTIVIEW}[:views=N,...]', a folder with one sub-folder of images "
                          "per class, or an .npz / .pt file of inputs and labels")
    labels = data.labels
    if labels is None:  # folders and rendered sets always have labels; this narrows the type
        raise ConfigError(f"{spec}: training data needs labels")
    train_idx, test_idx = stratified_split(labels, holdout, seed)
    return LabelledData(data.name, data.subset(train_idx, f"{data.name}[train]"),
                        data.subset(test_idx, f"{data.name}[held-out]"), classes)
