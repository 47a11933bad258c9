"""Stage 1 of SplitNets: train the supernet, every step on the sub-networks of one sampling
strategy (appendix D), and measure a sub-network (batch-norm recalibrated, then accuracy).

:class:`SupernetTrainer` has the scikit-learn shape: options in ``__init__``, ``fit(supernet,
data)`` returns ``self`` with ``history_`` (mean loss per epoch and sub-network kind) and, when
``track`` names sub-networks, their held-out accuracy per epoch (Figs. 11-12's curves).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from edgesplit.data import EvalData
from edgesplit.hardware.accelerator import device_of, torch_device
from edgesplit.nas.core.checks import is_count, is_fraction, is_number, refuse
from edgesplit.nas.core.evaluate import top1_accuracy
from edgesplit.nas.splitnets.sampling import SAMPLERS, training_subnets
from edgesplit.nas.splitnets.space import SplitArch, SplitSpace
from edgesplit.nas.splitnets.supernet import MultiResolution, SplitSupernet, recalibrate

__all__ = ["CALIBRATION_IMAGES", "SupernetTrainer", "TrainProgress", "calibration_batches",
           "calibration_samples", "subnet_accuracy"]

TrainProgress = Callable[[int, int, dict[str, float]], None]  # (epoch, epochs, row)


CALIBRATION_IMAGES = 256  # images a sub-network's batch-norms are re-estimated on


def calibration_samples(data: EvalData, images: int = CALIBRATION_IMAGES) -> torch.Tensor:
    """The first samples of ``data`` holding ``images`` images (a multi-view sample holds
    V): the same for every sub-network, so two evaluations of one architecture agree
    exactly, and the search and the saved network see the same statistics."""
    x = data.inputs[0]
    per_sample = x.shape[1] if x.dim() == 5 else 1
    return x[:max(1, images // per_sample)]


def calibration_batches(data: EvalData, images: int = CALIBRATION_IMAGES) -> list[torch.Tensor]:
    """:func:`calibration_samples` as one batch."""
    return [calibration_samples(data, images)]


@torch.no_grad()
def subnet_accuracy(supernet: SplitSupernet, arch: SplitArch,
                    data: EvalData | tuple[MultiResolution, torch.Tensor],
                    calibration: Sequence[torch.Tensor] | MultiResolution,
                    batch_size: int = 512) -> float:
    """Top-1 accuracy (%) of ``arch`` on labelled ``data`` (or (inputs, labels) already at
    every resolution) after recalibrating its batch-norms on ``calibration``."""
    r = arch.resolution
    calib = [calibration.at(r)] if isinstance(calibration, MultiResolution) else calibration
    recalibrate(supernet, arch, calib)
    if isinstance(data, EvalData):
        assert data.labels is not None
        x, labels = data.inputs[0], data.labels
    else:
        x, labels = data[0].at(r), data[1]
    device = device_of(supernet)
    return top1_accuracy(lambda batch: supernet(batch.to(device), arch), x, labels, batch_size)


@dataclass
class SupernetTrainer:
    """Train a :class:`SplitSupernet`: SGD with Nesterov momentum and cosine decay; each step
    sums the losses of the ``sampler``'s sub-networks (``five`` or ``sandwich``, with
    ``randoms`` random one-module networks: the paper samples 1, BigNAS 2, the default here:
    on the digits with 20 epochs, 1 left 30 random networks at 85.6 % held-out on average
    and 2 at 93.5 %, for 15 % more time per epoch). The first
    (largest) learns from the labels; with ``distill`` (BigNAS's in-place distillation, which
    the sandwich rule comes from) the others learn from its detached soft predictions, which
    trains small and split sub-networks much faster on little data.

    ``track``: (name, architecture) pairs measured on ``data.test`` after every epoch (slow:
    a recalibration each); ``progress(epoch, epochs, row)`` after every epoch.

    ``alone``: train this one architecture by itself instead of the sampler's sub-networks
    (from a fresh supernet, only its slice of the weights is ever updated): an independently
    trained network, with the same recipe and budget as the supernet, for the fair baselines.

    ``torch_device`` (``cpu``, ``cuda[:N]``, ``mps``; default the CPU): where the steps run.
    ``fit`` moves the supernet there and each batch as it is drawn (the data stays in host
    memory), and leaves the supernet on the CPU, so its checkpoint loads anywhere."""

    epochs: int = 20
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-5
    sampler: str = "five"
    randoms: int = 2
    distill: bool = True
    seed: int = 0
    track: Sequence[tuple[str, SplitArch]] = ()
    alone: SplitArch | None = None
    progress: TrainProgress | None = None
    torch_device: str | torch.device | None = None
    history_: list[dict[str, float]] = field(default_factory=list, init=False)

    def validate(self) -> None:
        """Refuse bad options (ConfigError) before any work starts."""
        refuse(self, [
            ("sampler", self.sampler in SAMPLERS, f"one of {', '.join(SAMPLERS)}"),
            ("epochs", is_count(self.epochs, 1), "a whole number >= 1"),
            ("batch_size", is_count(self.batch_size, 1), "a whole number >= 1"),
            ("randoms", is_count(self.randoms), "a whole number >= 0"),
            ("lr", is_number(self.lr), "positive"),
            ("momentum", is_fraction(self.momentum), "between 0 and 1"),
            ("weight_decay", is_number(self.weight_decay, strict=False), "a number >= 0")])

    def fit(self, supernet: SplitSupernet, data: EvalData,
            test: EvalData | None = None) -> SupernetTrainer:
        self.validate()
        if self.alone is not None:
            supernet.space.validate(self.alone)  # a ConfigError naming the choice, not a crash
        device = torch_device(self.torch_device)  # AcceleratorError before any step
        supernet.to(device)
        try:
            return self._fit(supernet, data, test, device)
        finally:
            supernet.cpu().eval()

    def _subnets(self, space: SplitSpace, rng: np.random.Generator
                 ) -> list[tuple[str, SplitArch]]:
        if self.alone is not None:
            return [("alone", self.alone)]
        return training_subnets(space, self.sampler, rng, self.randoms)

    def _fit(self, supernet: SplitSupernet, data: EvalData, test: EvalData | None,
             device: torch.device) -> SupernetTrainer:
        torch.manual_seed(self.seed)
        rng = np.random.default_rng(self.seed)
        gen = torch.Generator().manual_seed(self.seed)
        x_all, y_all = MultiResolution(data.inputs[0]), data.labels
        assert y_all is not None
        steps_per_epoch = math.ceil(len(y_all) / self.batch_size)
        opt = torch.optim.SGD(supernet.parameters(), lr=self.lr, momentum=self.momentum,
                              nesterov=True, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.epochs * steps_per_epoch)
        calibration = calibration_batches(data)
        self.history_ = []
        for epoch in range(self.epochs):
            supernet.train()
            sums: dict[str, float] = {}
            order = torch.randperm(len(y_all), generator=gen)
            for k in range(steps_per_epoch):
                idx = order[k * self.batch_size:(k + 1) * self.batch_size]
                y = y_all[idx].to(device)
                opt.zero_grad()
                teacher = None
                for name, arch in self._subnets(supernet.space, rng):
                    # the teacher's soft labels fit the student at any resolution: one image
                    logits = supernet(x_all.at(arch.resolution)[idx].to(device), arch)
                    if teacher is None or not self.distill:
                        loss = F.cross_entropy(logits, y)
                        teacher = logits.detach().softmax(1)
                    else:
                        loss = F.cross_entropy(logits, teacher)
                    loss.backward()  # gradients of the sub-networks add up
                    sums[name] = sums.get(name, 0.0) + loss.item()
                opt.step()
                sched.step()
            row = {f"loss/{name}": total / steps_per_epoch for name, total in sums.items()}
            if test is not None:
                for name, arch in self.track:
                    row[f"acc/{name}"] = subnet_accuracy(supernet, arch, test, calibration)
            self.history_.append(row)
            if self.progress is not None:
                self.progress(epoch + 1, self.epochs, row)
        return self
