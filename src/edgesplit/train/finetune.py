"""Fine-tune a pretrained built-in network on a real image data set, within minutes on a CPU.

The recipe (issue 38, item 3), for an ImageNet network on Fashion-MNIST:

- **Resolution 96x96, three channels**: the gray 28x28 images are upsampled and their channel
  repeated, so the pretrained stem sees the input it was trained on (RGB, ImageNet
  normalisation) at a size where the network's stride-32 features are 3x3 rather than 1x1;
  224x224 would cost 5.4x the compute for a 28x28 source.
- **A frozen prefix, its features computed once**: the network's ``layers()`` (stem, blocks,
  head) up to ``frozen`` stay as pretrained, in eval mode; their output for every image is
  computed once per run and the tail trains on those features. The cut is where the features
  are 6x6 at 96x96 input (MobileNetV2 after its 96-channel stage, EfficientNet-Lite0 after its
  112-channel stage): the tail has the most parameters, the prefix most of the compute.
- **The tail trains** with AdamW, a cosine schedule with one warm-up epoch's fifth, label
  smoothing 0.1, batch 128, its batch-norm in train mode; no augmentation (features are fixed);
  3 epochs for MobileNetV2, 2 for EfficientNet-Lite0 (whose tail costs 3x as much), so that one
  run, 55,000 training images, fits in 15 minutes on 2 cores.
- **A validation slice**: the last 5,000 training images are never trained on
  (``holdout``); plans are chosen on them (``validation_spec``), so the test set only reports.

Accuracy is measured on the whole test set with the *whole* fine-tuned network (the prefix run
again, not the cached features), with a bootstrap 95 % interval over the test images. The
result is cached by recipe: the weights as safetensors and what was measured as JSON, under
``$EDGESPLIT_CACHE_DIR/finetuned/``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgesplit.data.cache import cache_dir
from edgesplit.data.images import StreamingImages, load_images
from edgesplit.errors import ConfigError

__all__ = [
    "FineTuneRecipe",
    "FineTuned",
    "bootstrap_interval",
    "cached_result",
    "default_recipe",
    "export_finetuned",
    "finetune",
    "finetuned_model",
]

Progress = Callable[[str, int, int], None]  # (stage, done, total), as the NAS commands

# Per built-in: where its prefix ends in layers() (features 6x6 at 96x96 input), and the
# epochs that keep one run within 15 minutes on 2 cores (measured here, quiet: MobileNetV2
# 4.5 ms/image for the prefix, 1.2 ms/image/epoch for its tail; EfficientNet-Lite0 5.8 and 3.6).
# Both keep the last 5,000 training images out of training: a validation slice on which plans
# are chosen (AUTO-SPLIT's accuracy threshold), so that the test set only reports.
_DEFAULTS = {"mobilenet_v2": {"frozen": 13, "epochs": 3, "holdout": 5000},
             "efficientnet_lite0": {"frozen": 12, "epochs": 2, "holdout": 5000}}
_RECIPE_VERSION = 1  # bump when the training code changes what a recipe produces


@dataclass(frozen=True)
class FineTuneRecipe:
    """Everything that decides the fine-tuned weights (and so the cache key)."""

    model: str
    data: str = "fashion-mnist"
    image_size: int = 96
    frozen: int = 13
    epochs: int = 4
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    seed: int = 0
    train_limit: int | None = None  # use the first N training images (tests, quick looks)
    holdout: int = 0  # the last N training images, never trained on: the validation slice

    def __post_init__(self) -> None:
        for name in ("image_size", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"fine-tuning needs a positive {name}, not "
                                  f"{getattr(self, name)}")
        if self.frozen < 0 or self.lr <= 0 or self.weight_decay < 0 or self.holdout < 0:
            raise ConfigError("fine-tuning needs frozen >= 0, lr > 0, weight_decay >= 0 and "
                              "holdout >= 0")
        if self.image_size % 32:
            raise ConfigError(f"image size {self.image_size} is not a multiple of 32, the "
                              "networks' total stride; take e.g. 96 or 128")

    @property
    def data_spec(self) -> str:
        """The data spec that feeds the fine-tuned network its inputs (``--eval-data``)."""
        return f"{self.data}:size={self.image_size},channels=3,norm=imagenet"

    @property
    def validation_spec(self) -> str | None:
        """The held-out training images (``holdout``) as a data spec: where to choose a plan
        (``--eval-data``) without looking at the test set; None without a holdout."""
        if not self.holdout:
            return None
        return f"{self.data_spec},split=train,range=-{self.holdout}:"

    def key(self) -> str:
        blob = json.dumps({**asdict(self), "version": _RECIPE_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_recipe(model: str, **changes: Any) -> FineTuneRecipe:
    """The recipe for a built-in pretrained network (``mobilenet_v2``, ``efficientnet_lite0``)."""
    if model not in _DEFAULTS:
        raise ConfigError(f"no fine-tuning recipe for {model!r}; take one of "
                          f"{', '.join(sorted(_DEFAULTS))}")
    return FineTuneRecipe(model=model, **{**_DEFAULTS[model], **changes})


@dataclass(frozen=True)
class FineTuned:
    """A fine-tuned network and what was measured on the test set."""

    recipe: FineTuneRecipe
    module: nn.Module
    test_accuracy: float  # %, the whole network on every test image
    interval: tuple[float, float]  # bootstrap 95 % interval of the accuracy
    test_images: int
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: loss, accuracy
    seconds: dict[str, float] = field(default_factory=dict)  # features, training, evaluation
    cached: bool = False

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (1, 3, self.recipe.image_size, self.recipe.image_size)

    def summary(self) -> dict[str, Any]:
        return {"recipe": asdict(self.recipe), "data_spec": self.recipe.data_spec,
                "validation_spec": self.recipe.validation_spec,
                "test_accuracy": self.test_accuracy, "interval": list(self.interval),
                "test_images": self.test_images, "history": self.history,
                "seconds": self.seconds, "cached": self.cached}


def bootstrap_interval(correct: np.ndarray, *, resamples: int = 2000, seed: int = 0
                       ) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval (%) of the mean of 0/1 ``correct``."""
    rng = np.random.default_rng(seed)
    n = len(correct)
    means = np.array([correct[rng.integers(0, n, n)].mean() for _ in range(resamples)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(100 * lo), float(100 * hi)


def _build(recipe: FineTuneRecipe, pretrained: bool = True) -> nn.Module:
    from edgesplit.models import create_model, model_options

    if "pretrained" not in model_options(recipe.model):
        raise ConfigError(f"{recipe.model!r} has no pretrained weights to fine-tune")
    classes = load_images(recipe.data).num_classes
    built = create_model(recipe.model, (1, 3, recipe.image_size, recipe.image_size),
                         num_classes=classes, pretrained=pretrained)
    return built.module


def _chain(module: nn.Module, frozen: int) -> tuple[nn.Sequential, nn.Sequential]:
    layers = getattr(module, "layers", None)
    if layers is None:
        raise ConfigError(f"{type(module).__name__} has no layers() to freeze a prefix of")
    chain = list(layers())
    if not 0 <= frozen < len(chain):
        raise ConfigError(f"cannot freeze {frozen} of the network's {len(chain)} stages; "
                          f"take 0..{len(chain) - 1}")
    return nn.Sequential(*chain[:frozen]), nn.Sequential(*chain[frozen:])


@torch.no_grad()
def _features(prefix: nn.Module, data: StreamingImages, batch: int, stage: str,
              progress: Progress | None) -> tuple[torch.Tensor, torch.Tensor]:
    prefix.eval()
    feats, labels = [], []
    steps = math.ceil(len(data) / batch)
    for done, (images, y) in enumerate(data.loader(batch), 1):
        feats.append(prefix(images))
        labels.append(y)
        if progress:
            progress(stage, done, steps)
    return torch.cat(feats), torch.cat(labels)


# The last prefix's features, kept for the next seed of the same recipe: they do not depend on
# the seed (no augmentation, the prefix frozen), and they are most of a run's compute.
_LAST_FEATURES: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def _prefix_features(recipe: FineTuneRecipe, prefix: nn.Module, train: StreamingImages,
                     progress: Progress | None) -> tuple[torch.Tensor, torch.Tensor]:
    key = (recipe.model, recipe.data_spec, recipe.frozen, recipe.train_limit, recipe.holdout,
           _RECIPE_VERSION)
    if key not in _LAST_FEATURES:
        _LAST_FEATURES.clear()  # one set at a time: 60k images' features are about 1 GB
        _LAST_FEATURES[key] = _features(prefix, train, 250, "features", progress)
    return _LAST_FEATURES[key]


def _train_tail(tail: nn.Module, feats: torch.Tensor, labels: torch.Tensor,
                recipe: FineTuneRecipe, progress: Progress | None) -> list[dict[str, float]]:
    params = [p for p in tail.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps_per_epoch = math.ceil(len(feats) / recipe.batch_size)
    total = recipe.epochs * steps_per_epoch
    warmup = max(1, steps_per_epoch // 5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup)
                                              * 0.5 * (1 + math.cos(math.pi * s / total)))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    gen = torch.Generator().manual_seed(recipe.seed)
    history, step = [], 0
    for epoch in range(recipe.epochs):
        tail.train()
        order = torch.randperm(len(feats), generator=gen)
        loss_sum, correct = 0.0, 0
        for start in range(0, len(feats), recipe.batch_size):
            idx = order[start:start + recipe.batch_size]
            logits = tail(feats[idx])
            loss = loss_fn(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            loss_sum += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == labels[idx]).sum())
            if progress:
                progress(f"epoch {epoch + 1}/{recipe.epochs}", step - epoch * steps_per_epoch,
                         steps_per_epoch)
        history.append({"epoch": epoch + 1, "loss": loss_sum / len(feats),
                        "train_accuracy": 100.0 * correct / len(feats)})
    return history


@torch.no_grad()
def predictions(module: nn.Module, data: StreamingImages, batch: int = 250,
                progress: Progress | None = None, stage: str = "test") -> torch.Tensor:
    """Top-1 class of every sample of ``data`` by ``module`` (in eval mode)."""
    module.eval()
    out, steps = [], math.ceil(len(data) / batch)
    for i, (images, _) in enumerate(data.loader(batch)):
        out.append(module(images).argmax(1))
        if progress:
            progress(stage, i + 1, steps)
    return torch.cat(out)


def _paths(recipe: FineTuneRecipe) -> tuple[Path, Path]:
    stem = cache_dir() / "finetuned" / f"{recipe.model}-{recipe.data}-{recipe.key()}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def cached_result(recipe: FineTuneRecipe) -> FineTuned | None:
    """The cached result of ``recipe``, or None (nothing is trained)."""
    return _load_cached(recipe)


def _load_cached(recipe: FineTuneRecipe) -> FineTuned | None:
    from safetensors.torch import load_file

    weights, meta = _paths(recipe)
    if not (weights.is_file() and meta.is_file()):
        return None
    try:
        info = json.loads(meta.read_text())
        # built as fine-tuning built it: the pretrained variant differs in more than its
        # weights (MobileNetV2 takes torchvision's batch-norm eps, 1e-5 against 1e-3), and
        # the same weights in the other variant classify at chance
        module = _build(recipe, pretrained=True)
        module.load_state_dict(load_file(str(weights)), strict=True)
    except Exception:  # a torn or stale cache entry: train again rather than fail
        return None
    return FineTuned(recipe, module.eval(), info["test_accuracy"], tuple(info["interval"]),
                     info["test_images"], info["history"], info["seconds"], cached=True)


def _store(result: FineTuned) -> None:
    from safetensors.torch import save_file

    weights, meta = _paths(result.recipe)
    try:
        weights.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in result.module.state_dict().items()}
        tmp = weights.with_suffix(".tmp")
        save_file(state, str(tmp))
        tmp.replace(weights)  # weights before metadata: a torn write is never a hit
        meta.write_text(json.dumps(result.summary(), indent=2))
    except OSError:
        pass  # an unwritable cache costs the next run time, not this one its result


def finetune(recipe: FineTuneRecipe, *, progress: Progress | None = None,
             use_cache: bool = True, refresh: bool = False) -> FineTuned:
    """Fine-tune ``recipe.model`` on ``recipe.data``, or return the cached result;
    ``refresh`` trains again and replaces the cached result (a benchmark's fresh run)."""
    if use_cache and not refresh and (hit := _load_cached(recipe)) is not None:
        return hit
    train = load_images(recipe.data_spec, "train")
    test = load_images(recipe.data_spec, "test")
    if recipe.holdout >= len(train):
        raise ConfigError(f"a holdout of {recipe.holdout} leaves none of the {len(train)} "
                          "training images to train on; take a smaller --holdout")
    train = train.subset(slice(0, len(train) - recipe.holdout))
    if recipe.train_limit is not None:
        train = train.subset(slice(0, recipe.train_limit))
    torch.manual_seed(recipe.seed)  # the fresh classifier's initialisation
    module = _build(recipe)
    prefix, tail = _chain(module, recipe.frozen)
    for p in prefix.parameters():
        p.requires_grad_(False)
    t0 = time.perf_counter()
    feats, labels = _prefix_features(recipe, prefix, train, progress)
    t1 = time.perf_counter()
    history = _train_tail(tail, feats, labels, recipe, progress)
    t2 = time.perf_counter()
    for p in module.parameters():
        p.requires_grad_(True)
    predicted = predictions(module, test, progress=progress)
    t3 = time.perf_counter()
    correct = (predicted == test.labels).numpy().astype(np.float64)
    result = FineTuned(recipe, module.eval(), float(100 * correct.mean()),
                       bootstrap_interval(correct), len(test), history,
                       {"features": t1 - t0, "training": t2 - t1, "evaluation": t3 - t2})
    if use_cache:
        _store(result)
    return result


def finetuned_model(model: str, *, seed: int = 0, progress: Progress | None = None,
                    **changes: Any) -> FineTuned:
    """The default recipe's fine-tuned ``model`` for ``seed`` (cached after the first run)."""
    return finetune(replace(default_recipe(model, **changes), seed=seed), progress=progress)


def export_finetuned(result: FineTuned, path: str | Path) -> Path:
    """The fine-tuned network as a ``.pt2`` (``torch.export``, eval mode), with its batch
    dimension dynamic: evaluation runs it at its own batch size."""
    path = Path(path)
    # batch 2, not 1: export specialises a dimension of size 1 and could not make it dynamic
    example = (torch.zeros(2, *result.input_shape[1:]),)
    batch = torch.export.Dim("batch", min=1, max=4096)
    try:
        program = torch.export.export(result.module.eval(), example,
                                      dynamic_shapes=({0: batch},))
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(program, str(path))
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from None
    return path
