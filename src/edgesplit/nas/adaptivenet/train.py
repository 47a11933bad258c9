"""Supernet training (AdaptiveNet section 4.2): branch-wise distillation, then tuning.

The pretrained blocks stay frozen (they are buffers: the optimiser never sees them), so the
all-original subnet is the pretrained model before and after training.

- **Distillation** (eq. 1): each step samples a subnet holding at least one added branch,
  runs it, and pulls each added branch's output S_i towards T_i, the pretrained model's
  feature after the last block the branch replaces: ``L = 1/M sum ||T_i - S_i||^2`` over the
  M added branches of the subnet (mean squared error per element).
- **Tuning**: sampled subnets against the targets (cross-entropy on labels; 1 - cosine against
  the pretrained embedding), at a smaller learning rate.
- **Latency-range accuracy**: the training indicator: mean accuracy of random subnets,
  grouped by their cost relative to the pretrained model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from edgesplit.errors import ConfigError
from edgesplit.hardware.accelerator import device_of, torch_device
from edgesplit.nas.adaptivenet.data import Batch, ElasticData, Part, batches
from edgesplit.nas.adaptivenet.space import SubnetArch
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet
from edgesplit.nas.core.checks import is_count, is_number, refuse

__all__ = ["ElasticTrainer", "TrainRecord", "latency_range_accuracy", "relative_macs",
           "sample_added", "subnet_accuracy"]

Progress = Callable[[str, int, int, float], None]  # (phase, step, steps, loss)
Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TrainRecord:
    """One epoch of one phase: mean loss and seconds."""

    phase: str
    epoch: int
    loss: float
    seconds: float


def sample_added(supernet: ElasticSupernet, rng: np.random.Generator, tries: int = 100
                 ) -> SubnetArch:
    """A random subnet with at least one added branch (the original path trains nothing)."""
    original = supernet.space.original
    for _ in range(tries):
        arch = supernet.space.random_arch(rng)
        if arch != original:
            return arch
    raise ConfigError("this supernet has no added branches to train: its model has no block "
                      "to skip (one that keeps its shape, as a residual block does) or to "
                      "shrink (two layers in a row); elastify a model built of such blocks")


def _teacher_features(supernet: ElasticSupernet, x: torch.Tensor,
                      side: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    feats = []
    with torch.no_grad():
        for name in supernet.space.original:
            x = supernet.branch(name)(x, side)
            feats.append(x)
    return feats


def _distill_loss(supernet: ElasticSupernet, inputs: tuple[torch.Tensor, ...],
                  arch: SubnetArch) -> torch.Tensor:
    side = supernet.side_tensors(*inputs)
    teacher = _teacher_features(supernet, inputs[0], side)
    x, losses = inputs[0], []
    for branch in supernet.space.branches_of(arch):
        x = supernet.branch(branch.name)(x, side)
        if branch.level != 0:
            losses.append(F.mse_loss(x, teacher[branch.end - 1]))
    return torch.stack(losses).mean()


def _task_loss(task: str, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if task == "cosine":
        return (1 - F.cosine_similarity(outputs.flatten(1), targets.flatten(1), dim=1)).mean()
    return F.cross_entropy(outputs, targets)


@dataclass(frozen=True)
class _PlacedPart:
    """A part whose batches arrive on ``device`` (one batch at a time: the set stays in host
    memory, only what a step reads is copied)."""

    part: Part
    device: torch.device

    def __len__(self) -> int:
        return len(self.part)

    def batches(self, batch_size: int, *, rng: np.random.Generator | None = None
                ) -> Iterator[Batch]:
        for inputs, targets in self.part.batches(batch_size, rng=rng):
            yield tuple(x.to(self.device) for x in inputs), targets.to(self.device)

    def example(self, n: int) -> tuple[torch.Tensor, ...]:
        return tuple(x.to(self.device) for x in self.part.example(n))


class ElasticTrainer:
    """Distillation then tuning of a supernet's added branches (scikit-learn style: options in
    ``__init__``, ``fit(supernet, data)``, ``history_`` after).

    ``torch_device`` (``cpu``, ``cuda[:N]``, ``mps``; default the CPU): where the steps run.
    ``fit`` moves the supernet there and each batch as it is read, and hands the supernet back
    on the CPU, so what is saved loads on a machine without that device.

    The rates (Adam 3e-3, tuning 1e-3) were measured against a tenth of them on a fine-tuned
    MobileNetV2 (``benchmarks/results/vision_real.md``, three seeds): 3e-4 keeps subnets that
    swap one block closer to the pretrained path, but the subnets a search picks swap many,
    and those were no better (61.1 against 61.2 % at 0.8 of its latency) or worse (45.5
    against 60.1 % at 0.6, 11.8 against 23.4 % at 0.4)."""

    def __init__(self, *, torch_device: str | torch.device | None = None,
                 distill_epochs: int = 10, tune_epochs: int = 10, batch_size: int = 32,
                 lr: float = 3e-3, tune_lr: float = 1e-3, seed: int = 0,
                 progress: Progress | None = None) -> None:
        self.distill_epochs = distill_epochs
        self.tune_epochs = tune_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.tune_lr = tune_lr
        self.seed = seed
        self.progress = progress
        self.torch_device = torch_device

    def _check(self) -> None:
        refuse(self, [
            ("distill_epochs", is_count(self.distill_epochs), "a whole number >= 0"),
            ("tune_epochs", is_count(self.tune_epochs), "a whole number >= 0"),
            ("batch_size", is_count(self.batch_size, 1), "a whole number >= 1"),
            ("lr", is_number(self.lr), "positive"),
            ("tune_lr", is_number(self.tune_lr), "positive")])

    def fit(self, supernet: ElasticSupernet, data: ElasticData) -> ElasticTrainer:
        self._check()
        device = torch_device(self.torch_device)  # AcceleratorError before any step
        data = dataclasses.replace(data, train=_PlacedPart(data.train, device))
        rng = np.random.default_rng(self.seed)
        torch.manual_seed(self.seed)
        self.history_: list[TrainRecord] = []
        params = list(supernet.added_parameters())
        if not params:
            raise ConfigError("this supernet has no added branches to train: elastify "
                              "with merged or shrunk branches a model of residual or "
                              "multi-layer blocks (elastify refuses one without)")
        supernet.to(device).train()
        try:
            opt = torch.optim.Adam(params, lr=self.lr)
            for epoch in range(self.distill_epochs):
                self._epoch("distill", epoch, supernet, data, opt, rng)
            opt = torch.optim.Adam(params, lr=self.tune_lr)
            for epoch in range(self.tune_epochs):
                self._epoch("tune", epoch, supernet, data, opt, rng)
        finally:
            supernet.cpu().eval()
        return self

    def _epoch(self, phase: str, epoch: int, supernet: ElasticSupernet, data: ElasticData,
               opt: torch.optim.Optimizer, rng: np.random.Generator) -> None:
        start, losses = time.perf_counter(), []
        steps = -(-len(data.train) // self.batch_size)
        for step, (inputs, targets) in enumerate(data.train.batches(self.batch_size, rng=rng)):
            arch = sample_added(supernet, rng)
            if phase == "distill":
                loss = _distill_loss(supernet, inputs, arch)
            else:
                loss = _task_loss(data.task, supernet(*inputs, arch=arch), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if self.progress is not None:
                self.progress(phase, epoch * steps + step + 1, steps * self._epochs(phase),
                              losses[-1])
        self.history_.append(TrainRecord(phase, epoch, float(np.mean(losses)),
                                         time.perf_counter() - start))

    def _epochs(self, phase: str) -> int:
        return self.distill_epochs if phase == "distill" else self.tune_epochs


def subnet_accuracy(supernet: ElasticSupernet, arch: Sequence[str],
                    parts: Iterable[tuple[tuple[torch.Tensor, ...], torch.Tensor]],
                    metric: Metric) -> float:
    """Mean per-sample score of subnet ``arch`` over batches ``parts``."""
    total, count, device = 0.0, 0, device_of(supernet)
    with torch.no_grad():
        for inputs, targets in parts:
            inputs = tuple(x.to(device) for x in inputs)
            total += float(metric(supernet(*inputs, arch=arch), targets.to(device)).sum())
            count += int(targets.shape[0])
    return total / max(count, 1)


def relative_macs(supernet: ElasticSupernet, arch: Sequence[str]) -> float:
    """The subnet's multiply-accumulates over the pretrained model's."""
    macs = supernet.meta["branch_macs"]
    original = sum(macs[name] for name in supernet.space.original)
    return sum(macs[name] for name in arch) / max(original, 1)


def latency_range_accuracy(supernet: ElasticSupernet, data: ElasticData, *,
                           samples: int = 24, ranges: int = 4, seed: int = 0,
                           cost: Callable[[Sequence[str]], float] | None = None,
                           batch_size: int = 64) -> list[dict[str, Any]]:
    """The paper's training indicator: ``samples`` random subnets scored on the search part,
    grouped into ``ranges`` equal ranges of ``cost`` (default: relative MACs); one row per
    range with subnets in it: low, high, mean accuracy, count."""
    cost = cost or (lambda arch: relative_macs(supernet, arch))
    rng = np.random.default_rng(seed)
    archs = {supernet.space.random_arch(rng) for _ in range(samples)}
    parts = batches(data.search, batch_size)
    scored = [(cost(a), subnet_accuracy(supernet, a, parts, data.metric)) for a in archs]
    low, high = min(c for c, _ in scored), max(c for c, _ in scored)
    width = (high - low) / ranges or 1.0
    rows = []
    for k in range(ranges):
        lo, hi = low + k * width, low + (k + 1) * width
        inside = [acc for c, acc in scored if lo <= c < hi or (k == ranges - 1 and c == hi)]
        if inside:
            rows.append({"low": lo, "high": hi, "accuracy": float(np.mean(inside)),
                         "count": len(inside)})
    return rows
