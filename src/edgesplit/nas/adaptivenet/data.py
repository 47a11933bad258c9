"""The data an elastified model trains, searches and is measured on.

Three parts with no sample in two of them: ``train`` (distillation and tuning, on the cloud),
``search`` (the edge data ``D_edge`` the device scores candidates on) and ``test`` (held out,
for the reported accuracy), as the paper divides its validation set.

Targets depend on what the model's output means (the ``task``):

- ``labels``: class ids from a labelled set, scored by top-1 accuracy;
- ``agreement``: the pretrained model's own top-1 class is the target, so accuracy is
  agreement with it;
- ``cosine``: the pretrained model's output (the sentence encoder's embedding, or the logits of
  a classifier no labelled set fits) is the target, scored by cosine similarity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from edgesplit.data import EvalData
from edgesplit.errors import ConfigError, option

__all__ = ["METRICS", "TASKS", "ElasticData", "batches", "cosine", "fit_images",
           "load_elastic_data", "top1"]

TASKS = ("labels", "agreement", "cosine")
Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]


def top1(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample 1.0 / 0.0: does the arg-max class equal the target class."""
    return (outputs.argmax(-1) == targets).to(torch.float32)


def cosine(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample cosine similarity to the target embedding."""
    return F.cosine_similarity(outputs.flatten(1), targets.flatten(1), dim=1)


METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "labels": top1, "agreement": top1, "cosine": cosine}


@dataclass(frozen=True)
class ElasticData:
    """Inputs and targets of the three parts (see the module docstring)."""

    name: str
    task: str
    train: tuple[tuple[torch.Tensor, ...], torch.Tensor]
    search: tuple[tuple[torch.Tensor, ...], torch.Tensor]
    test: tuple[tuple[torch.Tensor, ...], torch.Tensor]

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")

    @property
    def metric(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return METRICS[self.task]

    def sizes(self) -> dict[str, int]:
        return {part: int(getattr(self, part)[1].shape[0]) for part in ("train", "search",
                                                                          "test")}


def batches(part: tuple[tuple[torch.Tensor, ...], torch.Tensor], batch_size: int, *,
            rng: np.random.Generator | None = None) -> list[Batch]:
    """``part`` in batches of ``batch_size`` (the last may be smaller), shuffled by ``rng``."""
    inputs, targets = part
    count = int(targets.shape[0])
    order = torch.from_numpy(rng.permutation(count)) if rng is not None else torch.arange(count)
    return [(tuple(x[order[i:i + batch_size]] for x in inputs), targets[order[i:i + batch_size]])
            for i in range(0, count, batch_size)]


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
                      seed: int = 0) -> ElasticData:
    """``digits`` (and any labelled spec of :func:`~edgesplit.data.training.load_labelled`) or
    ``sentences``, for a model of ``input_shape`` whose pretrained forward is ``teacher``.

    A labelled set keeps its own split: its train part trains (the pretrained model may have
    seen it), its held-out part is halved into search and test. Sentences are split 60/20/20.
    ``task`` defaults to ``labels`` when the data has labels and the model has one output per
    class, else ``cosine`` (fidelity to the pretrained outputs; ``agreement`` is degenerate
    for a random-weight classifier, which gives most inputs the same class).
    """
    inputs, labels, train_count = _inputs(spec, input_shape)
    with torch.no_grad():
        width = teacher(*(x[:1] for x in inputs)).shape[-1]
    if task is None:
        classes = int(labels.max()) + 1 if labels is not None else -1
        task = "labels" if classes == width else "cosine"
    if task == "labels" and (labels is None or int(labels.max()) >= width):
        raise ConfigError(f"{option('task', task)} needs labelled data with at most {width} "
                          f"classes (the model's outputs); {spec} has "
                          f"{'none' if labels is None else int(labels.max()) + 1}")
    targets = labels if task == "labels" and labels is not None \
        else _teacher_targets(teacher, inputs, task)
    count = int(targets.shape[0])
    if train_count is None:
        train_count = round(count * 0.6)
    order = np.random.default_rng(seed).permutation(count - train_count) + train_count
    half = len(order) // 2

    def part(idx: np.ndarray) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        index = torch.from_numpy(idx)
        return tuple(x[index] for x in inputs), targets[index]

    return ElasticData(spec, task, part(np.arange(train_count)), part(order[:half]),
                       part(order[half:]))


def _inputs(spec: str, input_shape: Sequence[int]
            ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None, int | None]:
    """All inputs, their labels (or None) and how many leading samples are the train part
    (None: no split of its own)."""
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

    labelled = load_labelled(spec)
    train, held = labelled.train, labelled.test
    assert train.labels is not None and held.labels is not None  # LabelledData checks this
    images = torch.cat([train.inputs[0], held.inputs[0]])
    if len(input_shape) != 4 or images.dim() != 4:
        raise ConfigError(f"{spec} holds images; the model takes inputs of shape "
                          f"{list(input_shape)}")
    return ((fit_images(images.float(), input_shape),),
            torch.cat([train.labels, held.labels]), int(train.labels.shape[0]))
