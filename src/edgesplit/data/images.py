"""Image data sets at scale: uint8 storage, transforms on the fly, batches from a DataLoader.

A data set of real size never exists as one float tensor here: Fashion-MNIST's 60,000 images
are 47 MB as uint8 but 6.6 GB as float at 3x96x96, the resolution a pretrained ImageNet network
wants. So a :class:`StreamingImages` pairs

- a *source* that returns one image at a time as uint8 (C, H, W): :class:`ArrayImages` (IDX
  files such as Fashion-MNIST's, read once into a uint8 array) or :class:`FolderImages` (one
  sub-folder per class, decoded with Pillow when the sample is asked for);
- an :class:`ImageTransform` applied to each *batch* after collation: resize, channels,
  normalisation, in float only for the batch in hand.

``StreamingImages.loader()`` is a ``torch.utils.data.DataLoader`` for training;
``StreamingImages.batches()`` yields the fixed-size, padded batches that evaluation of
shape-specialised captured programs needs (as :meth:`EvalData.batches` does).

Data set specs with options read like ``fashion-mnist:size=96,channels=3,norm=imagenet``
(:func:`parse_image_options`).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from edgesplit.data import EvalData, register_dataset
from edgesplit.errors import ConfigError

__all__ = [
    "FASHION_MNIST_CLASSES",
    "IMAGENET_NORM",
    "IMAGE_SETS",
    "IMAGE_SUFFIXES",
    "ArrayImages",
    "EvalSet",
    "FolderImages",
    "ImageSource",
    "ImageTransform",
    "StreamingImages",
    "fashion_mnist",
    "fashion_mnist_dir",
    "image_files",
    "image_selection",
    "imagenet_input",
    "is_gray",
    "is_image_set_spec",
    "load_images",
    "parse_image_options",
    "read_idx",
]

# torchvision's ImageNet normalisation (the packaged pretrained networks' inputs).
Norm = tuple[tuple[float, ...], tuple[float, ...]]  # (mean, std) per channel
IMAGENET_NORM: Norm = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# Every other built-in set scales to [-1, 1].
_SYMMETRIC_NORM: Norm = ((0.5,), (0.5,))
_NORMS = {"imagenet": IMAGENET_NORM, "symmetric": _SYMMETRIC_NORM}

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")
_FASHION_MNIST_DEFAULT = "/usr/share/datasets/fashion-mnist"
_FASHION_MNIST_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                        "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
FASHION_MNIST_INSTALL = ("install it with `apt-get install dataset-fashion-mnist` (as root; "
                         "`make install` does it where it can), or set EDGESPLIT_FASHION_MNIST "
                         "to a folder holding its four IDX .gz files")


# --------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageTransform:
    """uint8 batches (N, C, H, W) to normalised float batches.

    ``size``: (H, W) to resize to (bilinear, antialiased), None to keep; ``channels``: 3 from
    one-channel images repeats the gray channel (what a pretrained RGB network gets for a gray
    data set), 1 from three takes the luminance; None keeps them. ``mean``/``std`` are per
    channel on the [0, 1] scale (one value applies to every channel)."""

    size: tuple[int, int] | None = None
    channels: int | None = None
    mean: tuple[float, ...] = _SYMMETRIC_NORM[0]
    std: tuple[float, ...] = _SYMMETRIC_NORM[1]

    def __post_init__(self) -> None:
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise ConfigError(f"image size must be two positive numbers, not {self.size}")
        if self.channels not in (None, 1, 3):
            raise ConfigError(f"images have 1 or 3 channels, not {self.channels}")
        if len(self.mean) != len(self.std) or any(s <= 0 for s in self.std):
            raise ConfigError("normalisation needs as many positive std values as means")

    def sample_shape(self, source_shape: Sequence[int]) -> tuple[int, int, int]:
        """The (C, H, W) a sample of ``source_shape`` (C, H, W) becomes."""
        c, h, w = (int(s) for s in source_shape)
        out_c = self.channels or c
        if len(self.mean) not in (1, out_c):
            raise ConfigError(f"normalisation has {len(self.mean)} means for {out_c}-channel "
                              "images")
        return (out_c, *(self.size or (h, w)))

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        x = batch.to(torch.float32).div_(255.0)
        if self.channels == 3 and x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        elif self.channels == 1 and x.shape[1] == 3:
            x = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
        if self.size is not None and tuple(x.shape[-2:]) != tuple(self.size):
            x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False,
                              antialias=True)
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        return ((x - mean) / std).contiguous()


def parse_image_options(spec: str, text: str) -> ImageTransform:
    """``size=96,channels=3,norm=imagenet`` (every key optional) as a transform; ``spec`` is
    the whole data set spec, for messages."""
    size: tuple[int, int] | None = None
    channels: int | None = None
    norm = _SYMMETRIC_NORM
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError
            if key == "size":
                h, _, w = value.partition("x")
                size = (int(h), int(w or h))
            elif key == "channels":
                channels = int(value)
            elif key == "norm":
                if value not in _NORMS:
                    raise ConfigError(f"{spec}: norm={value!r}; take one of {', '.join(_NORMS)}")
                norm = _NORMS[value]
            else:
                raise ConfigError(f"{spec}: unknown option {key!r}; image data sets take "
                                  "size=H[xW], channels=1|3, norm=imagenet|symmetric, "
                                  "split=train|test, range=A:B")
        except ValueError:
            raise ConfigError(f"{spec}: cannot read option {item!r}; write e.g. "
                              "size=96,channels=3,norm=imagenet") from None
    return ImageTransform(size=size, channels=channels, mean=norm[0], std=norm[1])


# --------------------------------------------------------------------------------------------
# Sources: one uint8 image at a time
# --------------------------------------------------------------------------------------------

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def image_files(root: Path) -> dict[str, list[Path]]:
    """Image files per class sub-folder of ``root``, classes and files sorted by name."""
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    found = {c.name: sorted(f for f in c.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
             for c in classes}
    found = {name: files for name, files in found.items() if files}
    if len(found) < 2:
        raise ConfigError(f"image folder {str(root)!r} needs one sub-folder per class with "
                          f"images in it ({', '.join(IMAGE_SUFFIXES)}), at least two classes; "
                          f"found {len(found)}")
    return found


def is_gray(path: Path) -> bool:
    """Whether the image file holds one channel (read from its header, not decoded)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            return opened.mode in ("1", "L", "LA", "I", "I;16", "F")
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise ConfigError(f"cannot read image {str(path)!r}: {exc}; remove it or replace it "
                          "with a readable image") from None




class ImageSource(Protocol):
    """Random access to labelled uint8 images of one shape (C, H, W)."""

    @property
    def name(self) -> str: ...

    @property
    def classes(self) -> tuple[str, ...]: ...

    @property
    def labels(self) -> np.ndarray: ...  # (N,) int64

    def __len__(self) -> int: ...

    def image(self, index: int) -> np.ndarray: ...

    @property
    def sample_shape(self) -> tuple[int, int, int]: ...


@dataclass(frozen=True)
class ArrayImages:
    """Images held as one uint8 array (N, C, H, W): 28x28 Fashion-MNIST is 47 MB for 60k."""

    name: str
    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4:
            raise ConfigError(f"{self.name}: images must be uint8 (N, C, H, W)")
        if self.labels.shape != (len(self.images),):
            raise ConfigError(f"{self.name}: {len(self.images)} images but "
                              f"{len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.images)

    def image(self, index: int) -> np.ndarray:
        return self.images[index]

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        c, h, w = self.images.shape[1:]
        return int(c), int(h), int(w)


@dataclass(frozen=True)
class FolderImages:
    """One sub-folder per class, decoded when asked for, at ``size`` and as RGB or gray (the
    folder's own colour unless told: colour is never dropped silently)."""

    name: str
    files: tuple[Path, ...]
    labels: np.ndarray
    classes: tuple[str, ...]
    size: tuple[int, int]
    grayscale: bool

    @classmethod
    def open(cls, root: str | Path, *, size: int | tuple[int, int],
             grayscale: bool | None = None) -> FolderImages:
        path = Path(root)
        if not path.is_dir():
            raise ConfigError(f"image folder {str(root)!r} does not exist")
        by_class = image_files(path)
        files = [f for paths in by_class.values() for f in paths]
        labels = np.concatenate([np.full(len(p), i, np.int64)
                                 for i, p in enumerate(by_class.values())])
        if grayscale is None:
            grayscale = all(is_gray(f) for f in files)
        hw = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        return cls(path.name, tuple(files), labels, tuple(by_class), hw, grayscale)

    def __len__(self) -> int:
        return len(self.files)

    def image(self, index: int) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError

        path = self.files[index]
        try:
            with Image.open(path) as opened:
                image = opened.convert("L" if self.grayscale else "RGB")
            if image.size != (self.size[1], self.size[0]):
                image = image.resize((self.size[1], self.size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise ConfigError(f"cannot read image {str(path)!r}: {exc}; remove it or replace "
                              "it with a readable image") from None
        return pixels[None] if self.grayscale else pixels.transpose(2, 0, 1)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (1 if self.grayscale else 3, *self.size)


# --------------------------------------------------------------------------------------------
# IDX files and Fashion-MNIST
# --------------------------------------------------------------------------------------------


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """A gzipped IDX file of unsigned bytes (LeCun's MNIST format) with ``ndim`` dimensions,
    checked against its header: a truncated or foreign file is one ConfigError."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    header = 4 + 4 * ndim
    if len(raw) < header or raw[:3] != b"\x00\x00\x08" or raw[3] != ndim:
        raise ConfigError(f"{path} is not an IDX file of {ndim}-d unsigned bytes")
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != header + int(np.prod(dims)):
        raise ConfigError(f"{path} is truncated or corrupt: its header says {dims}, "
                          f"{int(np.prod(dims))} bytes, it holds {len(raw) - header}")
    # a copy: frombuffer is read-only, and torch warns on every sample taken from it
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims).copy()


def fashion_mnist_dir() -> Path:
    """Where Fashion-MNIST's IDX files are: $EDGESPLIT_FASHION_MNIST, else Debian's
    ``dataset-fashion-mnist`` location."""
    return Path(os.environ.get("EDGESPLIT_FASHION_MNIST") or _FASHION_MNIST_DEFAULT)


def fashion_mnist(split: Literal["train", "test"]) -> ArrayImages:
    """Fashion-MNIST (Xiao et al. 2017) as published: 60,000 train or 10,000 test 28x28 gray
    images of 10 clothing classes, uint8 (N, 1, 28, 28)."""
    root = fashion_mnist_dir()
    images_file, labels_file = (root / f for f in _FASHION_MNIST_FILES[split])
    for f in (images_file, labels_file):
        if not f.is_file():
            raise ConfigError(f"Fashion-MNIST is not installed ({f} is missing): "
                              f"{FASHION_MNIST_INSTALL}")
    images = read_idx(images_file, 3)
    labels = read_idx(labels_file, 1).astype(np.int64)
    if len(images) != len(labels) or labels.max(initial=0) >= len(FASHION_MNIST_CLASSES):
        raise ConfigError(f"{root}: {split} images and labels do not match; reinstall "
                          "Fashion-MNIST")
    return ArrayImages(f"fashion-mnist[{split}]", images[:, None], labels,
                       FASHION_MNIST_CLASSES)


# --------------------------------------------------------------------------------------------
# A source with its transform
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamingImages(Dataset[tuple[torch.Tensor, int]]):
    """A source, the transform its batches get, and which of its samples are in this set."""

    source: ImageSource
    transform: ImageTransform = field(default_factory=ImageTransform)
    indices: np.ndarray | None = None  # None: every sample, in order

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def classes(self) -> tuple[str, ...]:
        return self.source.classes

    @property
    def num_classes(self) -> int:
        return len(self.source.classes)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return self.transform.sample_shape(self.source.sample_shape)

    @property
    def labels(self) -> torch.Tensor:
        labels = self.source.labels if self.indices is None else self.source.labels[self.indices]
        return torch.from_numpy(np.ascontiguousarray(labels))

    @property
    def metric(self) -> Literal["top1"]:
        return "top1"

    def __len__(self) -> int:
        return len(self.source) if self.indices is None else len(self.indices)

    def _at(self, i: int) -> int:
        return int(i if self.indices is None else self.indices[i])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        j = self._at(i)
        return torch.from_numpy(np.ascontiguousarray(self.source.image(j))), int(
            self.source.labels[j])

    def collate(self, items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack uint8 samples, then transform the batch (one interpolate call per batch)."""
        images = torch.stack([x for x, _ in items])
        return self.transform(images), torch.tensor([y for _, y in items], dtype=torch.int64)

    def loader(self, batch_size: int, *, shuffle: bool = False, seed: int = 0,
               drop_last: bool = False, num_workers: int = 0) -> DataLoader:
        """Batches (images, labels) for training; ``shuffle`` with a seeded generator."""
        gen = torch.Generator().manual_seed(seed) if shuffle else None
        return DataLoader(self, batch_size=batch_size, shuffle=shuffle, generator=gen,
                          drop_last=drop_last, num_workers=num_workers,
                          collate_fn=self.collate)

    def batches(self, batch_size: int) -> Iterator[tuple[tuple[torch.Tensor, ...], int]]:
        """Fixed-size batches for evaluation: the last is padded by repeating its final sample
        (captured programs are shape-specialised), each with its count of real samples."""
        for start in range(0, len(self), batch_size):
            stop = min(start + batch_size, len(self))
            items = [self[i] for i in range(start, stop)]
            items += [items[-1]] * (batch_size - len(items))
            images, _ = self.collate(items)
            yield (images,), stop - start

    def subset(self, index: slice | Sequence[int] | np.ndarray | torch.Tensor,
               name: str | None = None) -> StreamingImages:
        del name  # the source keeps its name; the argument mirrors EvalData.subset
        base = np.arange(len(self))
        picked = base[index] if isinstance(index, slice) else base[np.asarray(index)]
        chosen = picked if self.indices is None else self.indices[picked]
        return replace(self, indices=np.asarray(chosen, dtype=np.int64))

    def split(self, calibration: int) -> tuple[StreamingImages, StreamingImages]:
        """The first ``calibration`` samples and the rest."""
        if not 0 < calibration < len(self):
            raise ConfigError(f"cannot take {calibration} calibration samples out of "
                              f"{len(self)}; use fewer, or more evaluation data")
        return self.subset(slice(0, calibration)), self.subset(slice(calibration, None))

    def with_transform(self, transform: ImageTransform) -> StreamingImages:
        return replace(self, transform=transform)

    def example(self, n: int = 1) -> tuple[torch.Tensor, ...]:
        """The first ``n`` samples as the one-input tuple a model takes (as EvalData's)."""
        return (self.first(n),)

    def first(self, n: int) -> torch.Tensor:
        """The first ``n`` samples as one float batch (examples, calibration)."""
        images, _ = self.collate([self[i] for i in range(min(n, len(self)))])
        return images



# Either kind of evaluation data: held in memory (small sets, user files) or streamed.
EvalSet = EvalData | StreamingImages


# --------------------------------------------------------------------------------------------
# Registered sets and specs
# --------------------------------------------------------------------------------------------

IMAGE_SETS = {"fashion-mnist": fashion_mnist}


def load_images(spec: str, split: Literal["train", "test"] = "test") -> StreamingImages:
    """``fashion-mnist[:size=96,channels=3,norm=imagenet,split=train,range=55000:60000]``: one
    split of a registered image set (``split`` in the spec overrides the argument), or a range
    of its images (``range=A:B``, Python's slice: ``:500`` is the first 500), streamed through
    the transform the other options describe."""
    name, _, options = spec.partition(":")
    if name not in IMAGE_SETS:
        raise ConfigError(f"unknown image data set {name!r}; take one of "
                          f"{', '.join(IMAGE_SETS)}")
    picked, rest = _selection_options(spec, options)
    transform = parse_image_options(spec, ",".join(rest))  # first: a bad option reads nothing
    chosen = picked.get("split", split)
    images = StreamingImages(IMAGE_SETS[name](chosen), transform)
    if "range" not in picked:
        return images
    start, stop = picked["range"]
    part = images.subset(slice(start, stop))
    if not len(part):
        raise ConfigError(f"{spec}: range={start or ''}:{stop or ''} holds no image of the "
                          f"{len(images)} in its {chosen} split")
    return part


def _selection_options(spec: str, text: str) -> tuple[dict[str, Any], list[str]]:
    """``split=`` and ``range=`` (which images) apart from the transform's options."""
    picked: dict[str, Any] = {}
    rest = []
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key == "split":
            if value not in ("train", "test"):
                raise ConfigError(f"{spec}: split={value!r}; take train or test")
            picked["split"] = value
        elif key == "range":
            start, colon, stop = value.partition(":")
            try:
                if not colon:
                    raise ValueError
                bounds = tuple(int(v) if v else None for v in (start, stop))
            except ValueError:
                raise ConfigError(f"{spec}: cannot read range={value!r}; write A:B, e.g. "
                                  "range=:500 (the first 500) or range=55000:60000") from None
            picked["range"] = bounds
        else:
            rest.append(item)
    return picked, rest


def is_image_set_spec(spec: str) -> bool:
    return spec.partition(":")[0] in IMAGE_SETS


def image_selection(spec: str) -> dict[str, Any]:
    """What an image set spec picks: ``{"split": ..., "range": (A, B)}``, the keys it gives
    (none: the whole split a command asks for). Commands that divide a set themselves (train on
    one split, test on the other) refuse a spec that picks."""
    return _selection_options(spec, spec.partition(":")[2])[0]


@register_dataset("fashion-mnist", model=None,
                  description="Fashion-MNIST test set (Xiao et al. 2017): 10,000 28x28 gray "
                              "images, 10 classes (top-1 accuracy); options: "
                              "fashion-mnist:size=96,channels=3,norm=imagenet")
def _fashion_mnist_test() -> EvalData:
    test = load_images("fashion-mnist")
    return EvalData("fashion-mnist", (test.first(len(test)),), test.labels,
                    "Fashion-MNIST's 10,000 test images, scaled to [-1, 1]")


def imagenet_input(image: np.ndarray, size: int = 224) -> torch.Tensor:
    """One RGB photo (H, W, 3) uint8 as an ImageNet network's (1, 3, size, size) input, the
    evaluation transform torchvision's weights were measured with: the shorter side resized to
    ``size * 8 / 7`` (256 for 224), a centre crop, ImageNet normalisation."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ConfigError(f"a photo must be uint8 (H, W, 3), not {image.dtype} {image.shape}")
    x = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None]
    h, w = x.shape[-2:]
    scale = round(size * 8 / 7) / min(h, w)
    resized = (max(size, round(h * scale)), max(size, round(w * scale)))
    x = ImageTransform(size=resized, mean=IMAGENET_NORM[0], std=IMAGENET_NORM[1])(x)
    top, left = (resized[0] - size) // 2, (resized[1] - size) // 2
    return x[..., top:top + size, left:left + size].contiguous()
