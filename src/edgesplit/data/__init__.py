"""Evaluation data: real inputs (and labels) to measure what quantizing an edge part costs.

A registry in the style of the model registry: ``register_dataset`` / ``load_dataset`` /
``list_datasets``, plus ``load_eval_data(spec)`` which accepts a registered name or a file
(``.pt`` written with ``torch.save`` or ``.npz``) of inputs and optional labels. Every data set
here ships inside an installed package; nothing is downloaded.

Quality measures: with labels, top-1 accuracy (%); without, the mean cosine similarity (%) of
the outputs to the float model's outputs on the same inputs (e.g. sentence embeddings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from edgesplit.errors import ConfigError
from edgesplit.registry import Registry

if TYPE_CHECKING:
    from edgesplit.data.images import StreamingImages

__all__ = [
    "EvalData",
    "dataset_model",
    "list_datasets",
    "load_dataset",
    "load_eval_data",
    "load_eval_set",
    "register_dataset",
]

Metric = Literal["top1", "cosine"]


@dataclass(frozen=True)
class EvalData:
    """Samples along dimension 0 of every input tensor; ``labels`` (N,) class ids or None."""

    name: str
    inputs: tuple[torch.Tensor, ...]
    labels: torch.Tensor | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ConfigError(f"evaluation data {self.name!r} has no input tensors")
        sizes = {int(t.shape[0]) if t.dim() else -1 for t in self.inputs}
        if self.labels is not None:
            sizes.add(int(self.labels.shape[0]) if self.labels.dim() == 1 else -1)
        if len(sizes) != 1 or -1 in sizes or 0 in sizes:
            raise ConfigError(
                f"evaluation data {self.name!r}: every input (and the labels, a 1-d tensor) must "
                f"have the same number of samples along dimension 0; got sizes {sorted(sizes)}")

    @property
    def metric(self) -> Metric:
        return "top1" if self.labels is not None else "cosine"

    def __len__(self) -> int:
        return int(self.inputs[0].shape[0])

    def subset(self, index: slice | torch.Tensor, name: str | None = None) -> EvalData:
        return EvalData(name or self.name, tuple(t[index] for t in self.inputs),
                        None if self.labels is None else self.labels[index], self.description)

    def split(self, calibration: int) -> tuple[EvalData, EvalData]:
        """The first ``calibration`` samples (to calibrate ranges) and the held-out rest."""
        if not 0 < calibration < len(self):
            raise ConfigError(f"cannot take {calibration} calibration samples out of "
                              f"{len(self)}; use fewer, or more evaluation data")
        return (self.subset(slice(0, calibration), f"{self.name}[calibration]"),
                self.subset(slice(calibration, None), f"{self.name}[held-out]"))

    def example(self, n: int = 1) -> tuple[torch.Tensor, ...]:
        """The first ``n`` samples of every input (shapes and dtypes, examples)."""
        return tuple(t[:n] for t in self.inputs)

    def batches(self, batch_size: int) -> Iterator[tuple[tuple[torch.Tensor, ...], int]]:
        """Fixed-size batches (captured programs are shape-specialised): the last one is padded
        by repeating its final sample; each comes with its count of real samples."""
        n = len(self)
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            real = stop - start
            batch = []
            for t in self.inputs:
                chunk = t[start:stop]
                if real < batch_size:
                    pad = chunk[-1:].expand(batch_size - real, *chunk.shape[1:])
                    chunk = torch.cat([chunk, pad])
                batch.append(chunk)
            yield tuple(batch), real


@dataclass(frozen=True)
class _Entry:
    name: str
    loader: Callable[[], EvalData]
    model: str | None  # the built-in model the data set is made for, if there is one
    description: str


_DATASETS: Registry[_Entry] = Registry(
    "data set", label="Built-in data sets", hint="(or pass a .pt / .npz file)",
    loader=lambda: _ensure_loaded())


def register_dataset(name: str, *, model: str | None, description: str
                     ) -> Callable[[Callable[[], EvalData]], Callable[[], EvalData]]:
    """Decorator registering a zero-argument loader under ``name``; ``model`` names the
    built-in model it is made for (None: no built-in model takes it yet)."""

    def deco(loader: Callable[[], EvalData]) -> Callable[[], EvalData]:
        _DATASETS.register(name, _Entry(name, loader, model, description))
        return loader

    return deco


def _ensure_loaded() -> None:
    from edgesplit.data import digits, images, multiview, sentences  # noqa: F401  (register on import)


def list_datasets() -> dict[str, str]:
    """Registered data set names and their descriptions."""
    return {name: entry.description for name, entry in _DATASETS.items()}


def _entry(name: str) -> _Entry:
    return _DATASETS.get(name)


def load_dataset(name: str) -> EvalData:
    """A registered data set."""
    return _entry(name).loader()


def dataset_model(name: str) -> str | None:
    """The built-in model a registered data set is made for (None if there is none)."""
    return _entry(name).model


def _from_arrays(name: str, inputs: object, labels: object) -> EvalData:
    if isinstance(inputs, (list, tuple)):
        tensors = tuple(torch.as_tensor(np.asarray(t)) if not isinstance(t, torch.Tensor) else t
                        for t in inputs)
    elif isinstance(inputs, (torch.Tensor, np.ndarray)):
        tensors = (torch.as_tensor(inputs),)
    else:
        raise ConfigError(f"{name}: 'inputs' must be a tensor or a list of tensors "
                          f"(one per model input), not {type(inputs).__name__}")
    label_tensor = None if labels is None else torch.as_tensor(np.asarray(labels)).long()
    return EvalData(name, tensors, label_tensor, f"loaded from {name}")


def load_eval_set(spec: str) -> EvalData | StreamingImages:
    """As :func:`load_eval_data`, and also an image set with options
    (``fashion-mnist:size=96,channels=3,norm=imagenet``: its test split, streamed, never held
    as one float tensor)."""
    from edgesplit.data.images import is_image_set_spec, load_images

    if ":" in spec and is_image_set_spec(spec):
        return load_images(spec, "test")
    return load_eval_data(spec)


def load_eval_data(spec: str) -> EvalData:
    """A registered data set name, or a file: ``.pt`` holding ``{"inputs": tensor | [tensors],
    "labels": tensor (optional)}``, or ``.npz`` with arrays ``inputs`` (or ``inputs_0``,
    ``inputs_1``, ...) and optionally ``labels``."""
    path = Path(spec)
    if path.suffix not in (".pt", ".pth", ".npz"):
        return load_dataset(spec)
    if not path.is_file():
        raise ConfigError(f"evaluation data file {spec!r} does not exist")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                keys = sorted(k for k in arrays.files if k.startswith("inputs"))
                if not keys:
                    raise ConfigError(f"{spec}: an .npz needs an array named 'inputs' "
                                      f"(or inputs_0, inputs_1, ...); found {arrays.files}")
                inputs = [arrays[k] for k in keys]
                labels = arrays["labels"] if "labels" in arrays.files else None
        else:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(blob, dict) or "inputs" not in blob:
                raise ConfigError(f"{spec}: a .pt evaluation file must hold a dict with key "
                                  "'inputs' (and optionally 'labels')")
            inputs, labels = blob["inputs"], blob.get("labels")
    except ConfigError:
        raise
    except Exception as exc:  # corrupt or foreign file: say which and why
        raise ConfigError(f"cannot read evaluation data {spec!r}: {exc}") from None
    return _from_arrays(str(path), inputs, labels)
