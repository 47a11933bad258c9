"""JMSNAS (paper 000, section IV): differentiable architecture search for a chain of devices.

Stage 1, the search (Fig. 4b), alternates
- **weight steps**: every searchable layer runs one path sampled from ``p = softmax(alpha)``
  (memory 1x) and the weights take an Adam step on cross-entropy + lambda_1 ||theta||^2;
- **architecture steps** (after ``warmup_epochs``): every layer runs two sampled paths behind
  binary gates (memory 2x, not Rx; :mod:`edgesplit.nas.jmsnas.binary_gates`) and ``alpha``
  takes a step on loss (4), cross-entropy + lambda_2 (E[T] - T_const)^2, with Lemma 1's
  gradient for the cross-entropy and autograd's for E[T]
  (:class:`~edgesplit.nas.jmsnas.chain_latency.ChainLatency`, eq. 1 over a chain, or
  :class:`~edgesplit.nas.jmsnas.mesh_latency.MeshLatency`, eq. 2 over a mesh,
  with ``E[tau] = sum_i p_i U(v_i)``).
Weight steps use one part of the training data and architecture steps a held-apart part, so
alpha is chosen on samples the weights did not fit (as ProxylessNAS does).

The derived architecture is the argmax of alpha when it meets T_const; otherwise a probable one
that does, by Lagrangian relaxation: per layer ``argmax_i log p_i - mu U_i`` with the smallest
``mu >= 0`` (bisection) whose architecture meets the budget, so a budget the penalty only
approximately reached is still honoured (the relaxation's answer, not always the exact most
probable feasible architecture).

Stage 2 fixes it and retrains it from the supernet's weights (``retrain``), then measures its
top-1 accuracy on held-out data.

The supernet's candidates share their weights by default (``weights="shared"``,
:mod:`edgesplit.nas.jmsnas.shared`): with one weight set per candidate, as in the paper, uniform
path sampling left the digits supernet at chance for hundreds of steps. ``weights="separate"`` is
the paper's supernet.

Defaults differ from the paper's ImageNet recipe (20 warm-up + 60 epochs, batch 512, Adam
0.002) only in length, to run in minutes on the digits on a CPU. lambda_2 defaults to
1 / T_const^2, so a network twice as slow as the budget adds 1 nat to the loss.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.data import EvalData
from edgesplit.data.training import LabelledData, stratified_split
from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.hardware.accelerator import device_of, torch_device
from edgesplit.nas.core.checks import is_count, is_fraction, is_number, refuse
from edgesplit.nas.core.evaluate import recalibrate_bn as core_recalibrate
from edgesplit.nas.core.evaluate import top1_accuracy
from edgesplit.nas.jmsnas.binary_gates import binary_gates, sample_pair, sample_path
from edgesplit.nas.jmsnas.chain_latency import ChainLatency
from edgesplit.nas.jmsnas.mesh_latency import MeshLatency
from edgesplit.nas.jmsnas.network import ArchNet
from edgesplit.nas.jmsnas.space import Arch, SearchSpace
from edgesplit.nas.jmsnas.supernet import Supernet

LatencyModel = ChainLatency | MeshLatency  # eq. (1) over a chain, eq. (2) over a mesh

__all__ = ["JMSNAS", "EpochLog", "accuracy", "derive_within_budget", "recalibrate_bn",
           "train_network"]

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class EpochLog:
    """One stage-1 epoch: what Fig. 5 plots (accuracy of the current compact network and the
    expected latency) and the losses."""

    epoch: int
    phase: str  # "warm-up" or "search"
    weight_loss: float
    arch_loss: float | None
    expected_ms: float
    arch: str
    arch_ms: float
    accuracy: float  # top-1 % of the derived (argmax) network on the architecture split

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _batches(data: EvalData, size: int, gen: torch.Generator, device: torch.device
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled batches, each copied to ``device`` as it is drawn (the order comes from the
    CPU generator ``gen``: the same batches on every device)."""
    order = torch.randperm(len(data), generator=gen)
    x, y = data.inputs[0], data.labels
    assert y is not None  # LabelledData guarantees labels
    for start in range(0, len(order), size):
        idx = order[start:start + size]
        yield x[idx].to(device), y[idx].to(device)


def accuracy(model: nn.Module, data: EvalData, batch_size: int = 256) -> float:
    """Top-1 accuracy in % of ``model`` (put in eval mode) on labelled ``data``."""
    model.eval()
    assert data.labels is not None
    device = device_of(model)
    return top1_accuracy(lambda x: model(x.to(device)), data.inputs[0], data.labels,
                         batch_size)


def train_network(model: nn.Module, data: EvalData, *, epochs: int, lr: float,
                  weight_decay: float, batch_size: int, seed: int,
                  progress: Progress | None = None) -> list[float]:
    """Plain training (stage 2): Adam with cosine decay, cross-entropy; mean loss per epoch.
    Runs where ``model`` is (:func:`~edgesplit.hardware.accelerator.device_of`)."""
    gen, device = torch.Generator().manual_seed(seed), device_of(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(data) / batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    losses = []
    for epoch in range(epochs):
        model.train()
        total, n = 0.0, 0
        for x, y in _batches(data, batch_size, gen, device):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total, n = total + loss.item() * len(y), n + len(y)
        losses.append(total / n)
        if progress:
            progress("retrain", epoch + 1, epochs)
    return losses


def recalibrate_bn(net: nn.Module, data: EvalData, batch_size: int,
                   batches: int | None = 8) -> nn.Module:
    """``net`` with batch-norm statistics re-estimated on ``batches`` shuffled batches of
    ``data`` (:func:`edgesplit.nas.core.evaluate.recalibrate_bn`); ``batches=None`` uses all of
    ``data``."""
    gen, device = torch.Generator().manual_seed(0), device_of(net)
    inputs = (x for x, _ in _batches(data, batch_size, gen, device))
    return core_recalibrate(net, itertools.islice(inputs, batches))


def derive_within_budget(space: SearchSpace, alpha: list[torch.Tensor], latency: LatencyModel,
                         budget_ms: float) -> Arch:
    """The argmax architecture if it meets ``budget_ms``, else the Lagrangian relaxation's:
    argmax log p - mu U per layer with the smallest feasible mu (bisection)."""
    logp = [torch.log_softmax(a.detach().double(), 0) for a in alpha]

    def pick(mu: float) -> Arch:
        return space.arch_from_indices([int(torch.argmax(lp - mu * ms))
                                        for lp, ms in zip(logp, latency.layer_ms, strict=True)])

    if latency.of_arch(pick(0.0)) <= budget_ms:
        return pick(0.0)
    latency.check_budget(budget_ms)  # the fastest arch (mu -> inf) must fit
    lo, hi = 0.0, 1.0
    while latency.of_arch(pick(hi)) > budget_ms:
        lo, hi = hi, hi * 4
        if hi > 1e12:  # the fastest arch fits, so a large enough mu reaches it
            raise InfeasibleError(f"cannot bring the architecture under {budget_ms:g} ms")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if latency.of_arch(pick(mid)) <= budget_ms else (mid, hi)
    return pick(hi)


class JMSNAS:
    """Stage 1 and 2 of JMSNAS with the scikit-learn shape: parameters stored as given,
    ``fit(data, space, latency)`` searches, ``retrain()`` trains the derived network.

    Learned state: ``supernet_``, ``alpha_`` (per layer), ``arch_``, ``arch_ms_``,
    ``history_`` (one :class:`EpochLog` per epoch); after ``retrain``: ``model_`` (an
    :class:`ArchNet` in eval mode) and ``accuracy_`` (top-1 % on ``data.test``).

    ``torch_device`` (``cpu``, ``cuda[:N]``, ``mps``; default the CPU): where the networks
    train. The supernet and the derived network move there for ``fit`` and ``retrain`` and
    come back to the CPU after, so what is saved loads anywhere; the architecture parameters,
    the gates' sampling and the latency model stay on the CPU (a few numbers per layer).
    """

    def __init__(self, *, latency_budget_ms: float, lambda1: float = 4e-5,
                 lambda2: float | None = None, warmup_epochs: int = 2, epochs: int = 8,
                 batch_size: int = 64, weight_lr: float = 2e-3, arch_lr: float = 3e-2,
                 arch_fraction: float = 0.25, retrain_epochs: int = 10, seed: int = 0,
                 weights: Literal["shared", "separate"] = "shared",
                 progress: Progress | None = None,
                 torch_device: str | torch.device | None = None) -> None:
        self.torch_device = torch_device
        self.latency_budget_ms = latency_budget_ms
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.warmup_epochs = warmup_epochs
        self.epochs = epochs
        self.batch_size = batch_size
        self.weight_lr = weight_lr
        self.arch_lr = arch_lr
        self.arch_fraction = arch_fraction
        self.retrain_epochs = retrain_epochs
        self.seed = seed
        self.weights = weights
        self.progress = progress

    def _check(self) -> None:
        refuse(self, [
            ("latency_budget_ms", is_number(self.latency_budget_ms), "positive"),
            ("warmup_epochs", is_count(self.warmup_epochs), "a whole number >= 0"),
            ("epochs", is_count(self.epochs, 1), "a whole number >= 1"),
            ("retrain_epochs", is_count(self.retrain_epochs), "a whole number >= 0"),
            ("batch_size", is_count(self.batch_size, 1), "a whole number >= 1"),
            ("weight_lr", is_number(self.weight_lr), "positive"),
            ("arch_lr", is_number(self.arch_lr), "positive"),
            ("arch_fraction", is_fraction(self.arch_fraction), "between 0 and 1"),
            ("lambda1", is_number(self.lambda1, strict=False), "a number >= 0"),
            ("lambda2", self.lambda2 is None or is_number(self.lambda2, strict=False),
             "a number >= 0, or None (1 / T_const^2)")])

    @property
    def lambda2_(self) -> float:
        return self.lambda2 if self.lambda2 is not None else 1.0 / self.latency_budget_ms ** 2

    def fit(self, data: LabelledData, space: SearchSpace, latency: LatencyModel) -> JMSNAS:
        self._check()
        self.device_ = torch_device(self.torch_device)  # AcceleratorError before any work
        if latency.space is not space and latency.space.to_dict() != space.to_dict():
            raise ConfigError("the latency model was built for another search space")
        if data.sample_shape != tuple(space.input_shape):
            raise ConfigError(f"the data's samples are {data.sample_shape}; space "
                              f"{space.name!r} takes {tuple(space.input_shape)}")
        latency.check_budget(self.latency_budget_ms)  # before any training: fail fast
        gen = torch.Generator().manual_seed(self.seed)
        labels = data.train.labels
        assert labels is not None  # LabelledData guarantees labels
        w_idx, a_idx = stratified_split(labels, self.arch_fraction, self.seed)
        self.weight_data_ = data.train.subset(w_idx, "weights")
        self.arch_data_ = data.train.subset(a_idx, "architecture")
        with torch.random.fork_rng(devices=[]):  # seeded init; the caller's RNG untouched
            torch.manual_seed(self.seed)
            self.supernet_ = latency.make_supernet(self.weights).to(self.device_)
        self.alpha_ = [torch.zeros(len(layer.ops), requires_grad=True) for layer in space.layers]
        # Adam's weight_decay adds wd * theta to the gradient: the gradient of (wd/2)||theta||^2.
        w_opt = torch.optim.Adam(self.supernet_.parameters(), lr=self.weight_lr,
                                 weight_decay=2 * self.lambda1)
        a_opt = torch.optim.Adam(self.alpha_, lr=self.arch_lr, betas=(0.0, 0.999))
        self.history_: list[EpochLog] = []
        total = self.warmup_epochs + self.epochs
        try:
            for epoch in range(total):
                searching = epoch >= self.warmup_epochs
                w_loss = self._weight_epoch(w_opt, gen)
                a_loss = self._arch_epoch(a_opt, latency, gen) if searching else None
                self.history_.append(self._log(epoch, searching, w_loss, a_loss, latency))
                if self.progress:
                    self.progress("search", epoch + 1, total)
        finally:
            self.supernet_.cpu()
        self.arch_ = derive_within_budget(space, self.alpha_, latency, self.latency_budget_ms)
        self.arch_ms_ = latency.of_arch(self.arch_)
        self.latency_ = latency
        self.data_ = data
        return self

    def _weight_epoch(self, opt: torch.optim.Optimizer, gen: torch.Generator) -> float:
        net = self.supernet_.train()
        total, n = 0.0, 0
        for x, y in _batches(self.weight_data_, self.batch_size, gen, self.device_):
            for mixed, a in zip(net.mixed_ops, self.alpha_, strict=True):
                mixed.set_paths((sample_path(a, gen),))
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item() * len(y), n + len(y)
        return total / n

    def _arch_epoch(self, a_opt: torch.optim.Optimizer, latency: LatencyModel,
                    gen: torch.Generator) -> float:
        net = self.supernet_.train()
        # Architecture steps update alpha only: no weight gradients computed (backward still
        # runs through the activations to reach the gates).
        net.requires_grad_(False)
        try:
            return self._arch_steps(net, a_opt, latency, gen)
        finally:
            net.requires_grad_(True)
            for mixed in net.mixed_ops:
                mixed.set_paths((mixed.active[0],))

    def _arch_steps(self, net: Supernet, a_opt: torch.optim.Optimizer, latency: LatencyModel,
                    gen: torch.Generator) -> float:
        total, n = 0.0, 0
        for x, y in _batches(self.arch_data_, self.batch_size, gen, self.device_):
            for mixed, a in zip(net.mixed_ops, self.alpha_, strict=True):
                pair = sample_pair(a, gen)
                if pair[0] == pair[1]:
                    mixed.set_paths((pair[0],))  # a single-candidate layer: nothing to choose
                else:  # the copy to the device is differentiable: alpha's gradient comes back
                    mixed.set_paths(pair, binary_gates(a, pair, gen).to(self.device_))
            expected = latency([torch.softmax(a, 0) for a in self.alpha_])
            penalty = self.lambda2_ * (expected - self.latency_budget_ms) ** 2
            loss = F.cross_entropy(net(x), y) + penalty.float().to(self.device_)
            a_opt.zero_grad()
            loss.backward()
            a_opt.step()
            total, n = total + loss.item() * len(y), n + len(y)
        return total / n

    def _log(self, epoch: int, searching: bool, w_loss: float, a_loss: float | None,
             latency: LatencyModel) -> EpochLog:
        space = self.supernet_.space
        arch = space.arch_from_indices([int(torch.argmax(a)) for a in self.alpha_])
        self.supernet_.set_arch(arch)
        with torch.no_grad():
            expected = float(latency([torch.softmax(a, 0) for a in self.alpha_]))
        net = recalibrate_bn(self.supernet_.extract(arch), self.weight_data_, self.batch_size)
        return EpochLog(epoch, "search" if searching else "warm-up", w_loss, a_loss, expected,
                        str(arch), latency.of_arch(arch), accuracy(net, self.arch_data_))

    def retrain(self) -> JMSNAS:
        """Stage 2: the derived network, with the supernet's weights as its starting point,
        trained on all training data; ``accuracy_`` is measured on the held-out part."""
        if not hasattr(self, "arch_"):
            raise ConfigError("call fit before retrain")
        self.model_: ArchNet = self.supernet_.extract(self.arch_).to(self.device_)
        try:
            self.retrain_losses_ = train_network(
                self.model_, self.data_.train, epochs=self.retrain_epochs, lr=self.weight_lr,
                weight_decay=2 * self.lambda1, batch_size=self.batch_size, seed=self.seed,
                progress=self.progress)
            # Running statistics lag weights that moved fast in a short recipe: re-estimate
            # them on the training data, as the deployed network will use them.
            recalibrate_bn(self.model_, self.data_.train, self.batch_size, batches=None)
            self.accuracy_ = accuracy(self.model_, self.data_.test)
        finally:
            self.model_.cpu()
        return self

    def summary(self) -> dict[str, Any]:
        """What the CLI and the benchmark report: the arch, its latency and accuracy, history."""
        doc: dict[str, Any] = {
            "latency_budget_ms": self.latency_budget_ms, "lambda1": self.lambda1,
            "lambda2": self.lambda2_, "arch": self.arch_.to_dict(), "arch_ms": self.arch_ms_,
            "placement": self.latency_.placement.units_on(self.supernet_.space),
            "breakdown_ms": self.latency_.breakdown(self.arch_),
            "history": [h.to_dict() for h in self.history_],
        }
        if hasattr(self, "accuracy_"):
            doc["accuracy"] = self.accuracy_
        return doc

