"""The data an elastified model trains, searches and is measured on.

Three parts with no sample in two of them: ``train`` (distillation and tuning, on the cloud),
``search`` (the edge data ``D_edge`` the device scores candidates on) and ``test`` (held out,
for the reported accuracy), as the paper divides its validation set. A part is a
:class:`TensorPart` (small sets, held in memory) or a :class:`StreamedPart` (a registered image
set such as Fashion-MNIST: uint8 images transformed one batch at a time, so 55,000 images at
3x96x96 never exist as one 6 GB float tensor).

Targets depend on what the model's output means (the ``task``):

- ``labels``: class ids from a labelled set, scored by top-1 accuracy;
- ``agreement``: the pretrained model's own top-1 class is the target, so accuracy is
  agreement with it;
- ``cosine``: the pretrained model's output (the sentence encoder's embedding, or the logits of
  a classifier no labelled set fits) is the target, scored by cosine similarity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from edgesplit.data import EvalData
from edgesplit.data.images import (
    StreamingImages,
    image_selection,
    is_image_set_spec,
    load_images,
)
from edgesplit.errors import ConfigError, option
from edgesplit.nas.core.evaluate import top1

__all__ = ["DEFAULT_SEARCH_SIZE", "HOLDOUT", "METRICS", "SCORES", "TASKS", "ElasticData", "Part",
           "StreamedPart", "TensorPart", "batches", "cosine", "fit_images", "load_elastic_data",
           "top1"]

TASKS = ("labels", "agreement", "cosine")
Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]
# An image set's last HOLDOUT training images are never trained on (as the fine-tuning
# recipe keeps them out), so the search part comes from them; the paper's D_edge is small.
HOLDOUT = 5000
DEFAULT_SEARCH_SIZE = 1000


def cosine(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample cosine similarity to the target embedding."""
    return F.cosine_similarity(outputs.flatten(1), targets.flatten(1), dim=1)


METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "labels": top1, "agreement": top1, "cosine": cosine}
# what each task's score is, for tables and JSON: cosine similarity is no accuracy
SCORES = {"labels": "top-1 accuracy", "agreement": "top-1 agreement with the pretrained model",
          "cosine": "cosine similarity to the pretrained outputs"}


class Part(Protocol):
    """Samples with their targets, read in batches."""

    def __len__(self) -> int: ...

    def batches(self, batch_size: int, *, rng: np.random.Generator | None = None
                ) -> Iterator[Batch]:
        """Batches of ``batch_size`` (the last may be smaller), shuffled by ``rng``."""
        ...

    def example(self, n: int) -> tuple[torch.Tensor, ...]:
        """The first ``n`` samples' inputs."""
        ...


@dataclass(frozen=True)
class TensorPart:
    """A part held in memory: the inputs (one tensor per model input) and the targets."""

    inputs: tuple[torch.Tensor, ...]
    targets: torch.Tensor

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def batches(self, batch_size: int, *, rng: np.random.Generator | None = None
                ) -> Iterator[Batch]:
        count = len(self)
        order = torch.from_numpy(rng.permutation(count)) if rng is not None \
            else torch.arange(count)
        for i in range(0, count, batch_size):
            index = order[i:i + batch_size]
            yield tuple(x[index] for x in self.inputs), self.targets[index]

    def example(self, n: int) -> tuple[torch.Tensor, ...]:
        return tuple(x[:n] for x in self.inputs)


@dataclass(frozen=True)
class StreamedPart:
    """A part of a streamed image set: its labels are the targets, and each batch is
    collated from uint8 samples and transformed only when it is asked for."""

    images: StreamingImages

    def __len__(self) -> int:
        return len(self.images)

    def batches(self, batch_size: int, *, rng: np.random.Generator | None = None
                ) -> Iterator[Batch]:
        count = len(self.images)
        order = rng.permutation(count) if rng is not None else np.arange(count)
        for i in range(0, count, batch_size):
            images, labels = self.images.collate(
                [self.images[int(j)] for j in order[i:i + batch_size]])
            yield (images,), labels

    def example(self, n: int) -> tuple[torch.Tensor, ...]:
        return self.images.example(n)


@dataclass(frozen=True)
class ElasticData:
    """The three parts (see the module docstring) and what their targets mean."""

    name: str
    task: str
    train: Part
    search: Part
    test: Part

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")

    @property
    def metric(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return METRICS[self.task]

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "search": len(self.search), "test": len(self.test)}


def batches(part: Part, batch_size: int, *, rng: np.random.Generator | None = None
            ) -> list[Batch]:
    """``part`` in batches held in memory (for data read many times over, such as the search
    part the evaluator scores every candidate on); stream ``part.batches`` otherwise."""
    return list(part.batches(batch_size, rng=rng))


def fit_images(images: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Images (N, C, H, W) brought to a model's (·, C', H', W'): channels repeated or averaged,
    bilinear resize."""
    channels, height, width = (int(s) for s in shape[1:])
    if images.shape[1] != channels:
        images = images.mean(1, keepdim=True).expand(-1, channels, -1, -1)
    if tuple(images.shape[2:]) != (height, width):
        images = F.interpolate(images, size=(height, width), mode="bilinear",
                               align_corners=False)
    return images.contiguous()


def _teacher_targets(teacher: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
                     task: str, batch_size: int = 64) -> torch.Tensor:
    with torch.no_grad():
        outs = [teacher(*(x[i:i + batch_size] for x in inputs))
                for i in range(0, int(inputs[0].shape[0]), batch_size)]
    out = torch.cat(outs)
    return out.argmax(-1) if task == "agreement" else out


def load_elastic_data(spec: str, *, input_shape: Sequence[int],
                      teacher: Callable[..., torch.Tensor], task: str | None = None,
                      seed: int = 0, train_limit: int | None = None,
                      search_size: int | None = None) -> ElasticData:
    """``digits`` (and any labelled spec of :func:`~edgesplit.data.training.load_labelled`),
    ``sentences`` or a registered image set (``fashion-mnist:size=96,channels=3,
    norm=imagenet``), for a model of ``input_shape`` whose pretrained forward is ``teacher``.

    A labelled set keeps its own split: its train part trains (the pretrained model may have
    seen it), its held-out part is halved into search and test. Sentences are split 60/20/20.
    An image set is streamed (:class:`StreamedPart`): train on its train split but the last
    :data:`HOLDOUT` images, search on the first ``search_size`` (default
    :data:`DEFAULT_SEARCH_SIZE`) of those, report on its whole test split. ``train_limit``
    keeps the first images of the train part, ``search_size`` of the search part.
    ``task`` defaults to ``labels`` when the data has labels and the model is a classifier
    (one output per class: its output width is the class count, so the data may lack some
    classes, and a label at or past it is refused), else ``cosine`` (fidelity to the
    pretrained outputs; ``agreement`` is degenerate for a random-weight classifier, which
    gives most inputs the same class).
    """
    for name, value in (("train_limit", train_limit), ("search_size", search_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{option(name, value)} must be a positive number of samples")
    if is_image_set_spec(spec):
        return _streamed(spec, input_shape, teacher, task, train_limit, search_size)
    classes = _class_count(teacher, input_shape) if task in (None, "labels") else None
    inputs, labels, train_count = _inputs(spec, input_shape, classes)
    task = _task(spec, task, labels, teacher, inputs)
    targets = labels if task == "labels" and labels is not None \
        else _teacher_targets(teacher, inputs, task)
    count = int(targets.shape[0])
    if train_count is None:
        train_count = round(count * 0.6)
    order = np.random.default_rng(seed).permutation(count - train_count) + train_count
    half = len(order) // 2

    def part(idx: np.ndarray) -> TensorPart:
        index = torch.from_numpy(idx)
        return TensorPart(tuple(x[index] for x in inputs), targets[index])

    return ElasticData(spec, task, part(np.arange(train_count)[:train_limit]),
                       part(order[:half][:search_size]), part(order[half:]))


def _class_count(teacher: Callable[..., torch.Tensor], input_shape: Sequence[int]
                 ) -> int | None:
    """A classifier's class count: its output width where it gives one row per sample (probed
    on a zero image: labelled data are images); None for other models and inputs."""
    if len(input_shape) != 4:
        return None
    try:
        with torch.no_grad():
            out = teacher(torch.zeros((1, *(int(s) for s in input_shape[1:]))))
    except Exception:  # not an image model: the data's own check says so
        return None
    return int(out.shape[-1]) if out.dim() == 2 else None


def _task(spec: str, task: str | None, labels: torch.Tensor | None,
          teacher: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> str:
    """``task``, or the default for this model and data; labels the model cannot output are
    refused (the class count is the model's)."""
    with torch.no_grad():
        out = teacher(*(x[:1] for x in inputs))
    width = int(out.shape[-1])
    if task is None:
        task = "labels" if labels is not None and out.dim() == 2 else "cosine"
    if task == "labels" and labels is None:
        raise ConfigError(f"{option('task', task)} needs labelled data; {spec} has no labels "
                          f"(use {option('task', 'cosine')})")
    if task == "labels" and labels is not None and int(labels.max()) >= width:
        raise ConfigError(f"{spec} has labels up to {int(labels.max())}, but the model has "
                          f"{width} outputs, one per class: give data labelled with the "
                          f"model's classes (0..{width - 1}), or {option('task', 'cosine')} "
                          "to train towards the model's own outputs")
    return task


def _streamed(spec: str, input_shape: Sequence[int], teacher: Callable[..., torch.Tensor],
              task: str | None, train_limit: int | None, search_size: int | None
              ) -> ElasticData:
    """An image set's three parts, streamed (see :func:`load_elastic_data`)."""
    if image_selection(spec):
        raise ConfigError(f"{spec}: AdaptiveNet divides an image set itself (train on the "
                          f"train split but its last {HOLDOUT:,}, search on those, report on "
                          f"the test split); drop split=/range= and give "
                          f"{option('train_limit')} or {option('search_size')} instead")
    train, test = load_images(spec, "train"), load_images(spec, "test")
    if tuple(train.sample_shape) != tuple(int(s) for s in input_shape[1:]):
        raise ConfigError(f"{spec} gives {list(train.sample_shape)} images; the model takes "
                          f"{list(input_shape[1:])} (set size= and channels= to match)")
    if len(train) <= HOLDOUT:
        raise ConfigError(f"{spec} has {len(train)} training images; AdaptiveNet keeps the "
                          f"last {HOLDOUT:,} out of training and needs more")
    with torch.no_grad():
        width = int(teacher(*train.example(1)).shape[-1])
    if (task or "labels") != "labels" or train.num_classes != width:
        raise ConfigError(f"a streamed image set trains on its labels: the model needs one "
                          f"output per class ({train.num_classes}), it has {width}"
                          + (f", and {option('task', task)} is not labels" if task else "")
                          + "; fine-tune it first (`edgesplit finetune`)")
    kept = len(train) - HOLDOUT
    train_part = train.subset(slice(0, min(kept, train_limit or kept)))
    search = train.subset(slice(kept, kept + (search_size or DEFAULT_SEARCH_SIZE)))
    return ElasticData(spec, "labels", StreamedPart(train_part), StreamedPart(search),
                       StreamedPart(test))


def _inputs(spec: str, input_shape: Sequence[int], classes: int | None
            ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None, int | None]:
    """All inputs, their labels (or None) and how many leading samples are the train part
    (None: no split of its own). ``classes``: the model's class count, which a labelled
    file's labels must stay below (None: read from the labels)."""
    if spec == "sentences":
        from edgesplit.data.sentences import load_sentences

        data: EvalData = load_sentences()
        if tuple(data.inputs[0].shape[1:]) != tuple(input_shape[1:]):
            raise ConfigError(f"sentences are tokenized at length {data.inputs[0].shape[1]}; "
                              f"the model takes {list(input_shape[1:])}")
        order = torch.from_numpy(np.random.default_rng(0).permutation(
            int(data.inputs[0].shape[0])))
        return tuple(x[order] for x in data.inputs), None, None
    from edgesplit.data.training import load_labelled

    labelled = load_labelled(spec, num_classes=classes)
    train, held = labelled.train, labelled.test
    assert train.labels is not None and held.labels is not None  # LabelledData checks this
    images = torch.cat([train.inputs[0], held.inputs[0]])
    if len(input_shape) != 4 or images.dim() != 4:
        raise ConfigError(f"{spec} holds images; the model takes inputs of shape "
                          f"{list(input_shape)}")
    return ((fit_images(images.float(), input_shape),),
            torch.cat([train.labels, held.labels]), int(train.labels.shape[0]))
