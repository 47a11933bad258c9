"""Driving a split-training run (L2S, paper 002): the round loop that lets a policy pick
each round's cut and feeds it the measured delays, the device-side profile of d_p^m, reproducible
epochs, evaluation, and :func:`train_split`, the whole real run behind ``edgesplit
train-split`` (server process, privacy domain, features, the L2S policy, accuracy against
unsplit training).
"""

from __future__ import annotations

import copy
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import IO, TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError, RemoteError, option
from edgesplit.runtime.options import CallOptions
from edgesplit.train.remote import (
    DEFAULT_MAX_BATCH,
    Emulation,
    RemoteSplitTrainer,
    RoundStats,
    SyncResult,
    TrainOptions,
)
from edgesplit.train.split import as_chain, seeded_forward
from edgesplit.train.trainable import DIGITS_MODEL, TrainModelSpec
from edgesplit.transport import TOKEN_ENV

if TYPE_CHECKING:
    from types import TracebackType

    from rich.progress import Progress

    from edgesplit.transport import LoopbackChannel

__all__ = [
    "RUN_POLICIES",
    "FixedCutPolicy",
    "SplitData",
    "TrainSplitConfig",
    "TrainingLog",
    "epoch_batches",
    "evaluate",
    "load_split_data",
    "model_for_data",
    "profile_device_ms",
    "run_split_training",
    "train_split",
    "train_unsplit",
]


def profile_device_ms(chain: nn.Module | Sequence[nn.Module], x: torch.Tensor,
                      y: torch.Tensor, cuts: Sequence[int], repeats: int = 3,
                      slowdown: float = 1.0) -> list[float]:
    """Measured device training time per cut (front forward + backward + SGD update, median of
    ``repeats`` after a warm-up) x ``slowdown``: L2S's known d_p^m. Runs on a copy."""
    layers = copy.deepcopy(as_chain(chain) if isinstance(chain, nn.Module) else list(chain))
    n, result = len(layers), []
    for cut in cuts:
        if not -1 <= cut <= n - 1:
            raise ConfigError(f"cut {cut} is not valid for a chain of {n} elements")
        front = nn.Sequential(*layers[:cut + 1]).train()
        params = [p for p in front.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=1e-4) if params else None
        times = []
        for _ in range(max(repeats, 1) + 1):
            t0 = time.perf_counter()
            if cut >= 0:
                out = front(x)
                start = F.cross_entropy(out, y) if cut == n - 1 else out
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
                if start.requires_grad:
                    start.backward(None if cut == n - 1 else torch.ones_like(out) / out.numel())
                if opt is not None:
                    opt.step()
            times.append((time.perf_counter() - t0) * 1e3)
        result.append(statistics.median(times[1:]) * slowdown)
    return result


class FixedCutPolicy:
    """A policy that always picks the same arm (for tests and fixed-cut runs)."""

    def __init__(self, arm: int) -> None:
        self.arm = arm

    def select(self, t: int) -> int:
        return self.arm

    def update(self, arm: int, edge_delay_ms: float) -> None:
        pass


@dataclass
class TrainingLog:
    """Per-round measurements of a split-training run."""

    delays_ms: list[float] = field(default_factory=list)  # device + edge + sync
    partitions: list[int] = field(default_factory=list)   # the cut of each round
    edge_ms: list[float] = field(default_factory=list)
    device_ms: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    sync_ms: list[float] = field(default_factory=list)
    sync_bytes: list[int] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    bandwidth_mbps: list[float | None] = field(default_factory=list)
    synced: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0

    def append(self, s: RoundStats, mbps: float | None) -> None:
        for name, value in (("delays_ms", s.total_ms), ("partitions", s.cut),
                            ("edge_ms", s.edge_ms), ("device_ms", s.device_ms),
                            ("server_ms", s.server_ms), ("sync_ms", s.sync_ms),
                            ("sync_bytes", s.sync_bytes), ("bytes_up", s.bytes_up),
                            ("bytes_down", s.bytes_down), ("loss", s.loss),
                            ("bandwidth_mbps", mbps), ("synced", list(s.synced))):
            getattr(self, name).append(value)

    def add_sync(self, result: SyncResult) -> None:
        """Charge a sync the driver made after the last round to that round."""
        if self.delays_ms and result.indices:
            self.delays_ms[-1] += result.sync_ms
            self.sync_ms[-1] += result.sync_ms
            self.sync_bytes[-1] += result.total_bytes
            self.synced[-1].extend(result.indices)

    def to_json(self) -> dict:
        return {**asdict(self), "rounds": len(self.delays_ms)}


def epoch_batches(images: torch.Tensor, labels: torch.Tensor, batch_size: int, seed: int = 0
                  ) -> Callable[[int], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Batches for epoch e, shuffled by a generator seeded with ``seed + e`` (reproducible:
    a split and an unsplit run see the same batches)."""
    def batches(epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed + epoch))
        return [(images[i], labels[i]) for i in order.split(batch_size)]
    return batches


def run_split_training(trainer: RemoteSplitTrainer, batches, policy, cuts: Sequence[int], *,
                       epochs: int = 1, rounds_per_epoch: int | None = None,
                       bandwidth_schedule: Callable[[int], float] | None = None,
                       progress: bool = False) -> TrainingLog:
    """Train for ``epochs`` over ``batches`` (an iterable of (x, y), re-iterated each epoch,
    or a callable epoch -> iterable), the ``policy`` choosing each round's cut among ``cuts``.

    Round t = 1, 2, ...: set the bandwidth (``bandwidth_schedule(t)``), ``arm =
    policy.select(t)``, train, ``policy.update(arm, edge_ms)``, ``policy.observe(t, total_ms)``
    if it has one; a true ``policy.sync_due`` afterwards makes the trainer sync before the
    next round (charged to round t).
    """
    if not cuts:
        raise ConfigError("cuts must list at least one partition point")
    if epochs > 1 and not callable(batches) and iter(batches) is batches:
        raise ConfigError("batches is a one-shot iterator: pass a list or a callable "
                          "epoch -> batches to train more than one epoch")
    log_ = TrainingLog()
    total = None
    if rounds_per_epoch is not None:
        total = rounds_per_epoch * epochs
    elif hasattr(batches, "__len__"):
        total = len(batches) * epochs
    start, t = time.perf_counter(), 0
    with _progress(progress, total) as advance:
        for epoch in range(epochs):
            source = batches(epoch) if callable(batches) else batches
            for k, (x, y) in enumerate(source):
                if rounds_per_epoch is not None and k >= rounds_per_epoch:
                    break
                t += 1
                stats = _one_round(trainer, policy, cuts, t, x, y, bandwidth_schedule)
                log_.append(stats, trainer.bandwidth_mbps)
                if getattr(policy, "sync_due", False):
                    log_.add_sync(trainer.sync_now(_next_cut(policy, cuts)))
                advance(f"epoch {epoch + 1}/{epochs} cut {stats.cut} loss {stats.loss:.3f}")
    log_.wall_s = time.perf_counter() - start
    return log_


def _next_cut(policy, cuts: Sequence[int]) -> int | None:
    """The cut a policy that just settled will train at (L2S's regular mode), if any."""
    arm = getattr(policy, "next_partition", None)
    return None if arm is None else cuts[arm]


def _one_round(trainer: RemoteSplitTrainer, policy, cuts: Sequence[int], t: int,
               x: torch.Tensor, y: torch.Tensor,
               bandwidth_schedule: Callable[[int], float] | None) -> RoundStats:
    if bandwidth_schedule is not None:
        trainer.set_bandwidth_mbps(bandwidth_schedule(t))
    arm = policy.select(t)
    if not 0 <= arm < len(cuts):
        raise ConfigError(f"policy chose arm {arm}, but there are {len(cuts)} cuts")
    stats = trainer.step(x, y, cuts[arm])
    observe_device = getattr(policy, "observe_device", None)
    if callable(observe_device):  # the device measures its own part of every round
        observe_device(arm, stats.device_ms)
    policy.update(arm, stats.edge_ms)
    observe = getattr(policy, "observe", None)
    if callable(observe):
        observe(t, stats.total_ms)
    return stats


class _progress:
    """A rich progress bar on stderr when enabled; otherwise a no-op ``advance``."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.enabled, self.total = enabled, total
        self._bar: Progress | None = None

    def __enter__(self) -> Callable[[str], None]:
        if not self.enabled:
            return lambda _text: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(),
                       MofNCompleteColumn(), console=Console(stderr=True), transient=True)
        self._bar = bar
        bar.__enter__()
        task = bar.add_task("split training", total=self.total)
        return lambda text: bar.update(task, advance=1, description=text)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch: int = 256) -> float:
    """Top-1 accuracy in percent, in eval mode (batch-norm on its running statistics)."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            correct += int((model(images[i:i + batch]).argmax(1) == labels[i:i + batch]).sum())
    return 100.0 * correct / max(len(labels), 1)


# ---- the whole real run ------------------------------------------------------------------
RUN_VERSION = 1
RUN_POLICIES = ("l2s", "fixed")


@dataclass(frozen=True)
class TrainSplitConfig:
    """A real split-training run (``edgesplit train-split``). Bandwidths are emulated by the
    device's link shaper; ``device_slowdown`` makes the device that much slower than the
    server (both share this machine), as an end device is next to an edge GPU."""

    # a model spec (see TrainModelSpec): digits_cnn, or any built-in whose chain can be
    # formed, e.g. mobilenet_v2:pretrained (ImageNet backbone, fresh classifier); its input
    # and class count come from the data
    model: str = DIGITS_MODEL
    # "digits" (sklearn's, 1,197 to train, 600 to test) or an image set spec such as
    # fashion-mnist:size=32,channels=3,norm=imagenet (its train split streamed for training,
    # its test split for the accuracy)
    data: str = "digits"
    # train on the first N training images only (None: all); the test set stays whole
    train_limit: int | None = None
    # 8 epochs at lr 0.01: unsplit training reaches 97.8-99.2 % for seeds 0-2; at 4 epochs
    # and lr 0.05 it was anywhere from 80 % to 98 % depending on the seed and thread count
    epochs: int = 8
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    seed: int = 0
    bandwidth_mbps: float = 400.0
    rtt_ms: float = 2.0
    drop_at: int | None = None
    drop_to: float | None = None
    restore_at: int | None = None
    device_slowdown: float = 20.0
    policy: str = "l2s"
    cut: int | None = None  # the fixed policy's cut (chain elements on the device - 1)
    # Weight sync: "fws" at every change (L2S-FWS: exact, and the digits CNN's 0.5 MB of
    # weights cost less than one round's activations) or "periodic" (every sync_every rounds
    # and at mode changes: for large models, at an accuracy cost on short runs; see
    # docs/systems/l2s.md)
    sync: str = "fws"
    privacy_kl: float | None = 1.0  # P^c from the KL analysis (None: every cut allowed)
    # P^c given directly: at least this many chain elements stay on the device (overrides
    # privacy_kl)
    privacy_split: int | None = None
    sync_every: int = 100
    horizon: int = 30
    n_th: int = 10
    drift_threshold: float = 0.25  # r_th: measured delays on a shared machine are noisy
    random_reentry: float = 0.0
    baseline: bool = True  # also train unsplit on the same batches, for the accuracy check

    def __post_init__(self) -> None:
        if self.policy not in RUN_POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}: choose one of "
                              f"{', '.join(RUN_POLICIES)}")
        if self.sync not in ("fws", "periodic"):
            raise ConfigError(f"unknown sync {self.sync!r}: choose fws or periodic")
        if self.policy == "fixed" and self.cut is None:
            raise ConfigError(f"the fixed policy needs {option('cut')} (chain elements on the "
                              "device - 1)")
        if self.epochs < 1 or self.batch_size < 1 or self.device_slowdown < 1:
            raise ConfigError("need epochs >= 1, batch size >= 1 and device slowdown >= 1")
        if self.privacy_split is not None and self.privacy_split < 0:
            raise ConfigError(f"{option('privacy_split', self.privacy_split)}: give the number "
                              "of chain elements that stay on the device, 0 or more")
        if self.train_limit is not None and self.train_limit < 1:
            raise ConfigError(f"{option('train_limit', self.train_limit)}: give 1 or more "
                              "training images (or leave it out for all)")
        TrainModelSpec.parse(self.model)  # a bad spec fails here, before any data is read
        if self.data != "digits":
            from edgesplit.data.images import image_selection, is_image_set_spec

            if not is_image_set_spec(self.data):
                raise ConfigError(f"{option('data', self.data)} is unknown: use digits or an "
                                  "image set such as fashion-mnist:size=32,channels=3,"
                                  "norm=imagenet")
            if image_selection(self.data):  # it would pick the training and the test images
                raise ConfigError(f"{option('data', self.data)}: split training trains on the "
                                  "train split and measures on the test split; drop split=/"
                                  f"range= and give {option('train_limit')} for fewer "
                                  "training images")
        from edgesplit.train.simulator import BandwidthTrace

        BandwidthTrace(self.bandwidth_mbps, self.rtt_ms, self.drop_at, self.drop_to,
                       self.restore_at)  # validates the schedule

    def trace(self):
        from edgesplit.train.simulator import BandwidthTrace

        return BandwidthTrace(self.bandwidth_mbps, self.rtt_ms, self.drop_at, self.drop_to,
                              self.restore_at)

    def training(self) -> TrainOptions:
        """How the device trains and syncs in this run."""
        return TrainOptions(lr=self.lr, seed=self.seed, momentum=self.momentum,
                            sync=self.sync, sync_every=self.sync_every)

    def emulation(self) -> Emulation:
        """What the device emulates in this run (the link at its first bandwidth)."""
        return Emulation(link_mbps=self.bandwidth_mbps, rtt_ms=self.rtt_ms,
                         device_slowdown=self.device_slowdown)


def _domain(config: TrainSplitConfig, spec: TrainModelSpec, chain: Sequence[nn.Module],
            data: SplitData) -> tuple[list[int], dict | None]:
    """The cuts L2S may choose ({P^c, ..., P} as chain cuts) and the privacy analysis."""
    n = len(chain)
    if config.privacy_split is not None:
        if config.privacy_split > n:
            raise ConfigError(f"{option('privacy_split', config.privacy_split)} is more than "
                              f"the {n} chain elements of {spec.name}")
        return list(range(max(config.privacy_split, 1) - 1, n)), {
            "chain_point": config.privacy_split}
    if config.privacy_kl is None:
        return list(range(n)), None
    from edgesplit.train.privacy import analyse_chain_privacy, analyse_privacy

    if spec.name == DIGITS_MODEL:
        privacy = analyse_privacy(spec.name, config.privacy_kl)
    else:
        if not spec.pretrained:
            raise ConfigError(f"the KL privacy analysis of {spec.name} needs a pre-trained "
                              "classifier: add --pretrained, or give --privacy-split N (chain "
                              "elements kept on the device) or --no-privacy")
        # the paper's pre-trained DNN: the model's ImageNet classifier, on the training data
        reference = replace(spec, classes=None).build(config.seed).eval()
        privacy = analyse_chain_privacy(chain, reference, data.examples(200),
                                        config.privacy_kl)
    return list(range(privacy["chain_point"] - 1, n)), privacy


def _nothing_to_learn(config: TrainSplitConfig, privacy: dict | None) -> str:
    """Why L2S has one cut to choose (training on the device), and what to change."""
    sent = (privacy or {}).get("kl_per_cut", [])[:-1]  # the last cut sends nothing
    if config.privacy_split is not None and config.privacy_split > 1:
        return (f"{option('privacy_split', config.privacy_split)} keeps every chain element on "
                "the device, so there is no cut to learn; give a smaller one")
    if not sent:
        return (f"{config.model} forms a chain of one element, so there is no cut to learn; "
                f"train it unsplit, or with {option('policy', 'fixed')}")
    return (f"no cut that sends anything reaches {option('privacy_kl', config.privacy_kl)} "
            f"(their KL divergences are {min(sent):.3g} to {max(sent):.3g}), so only training "
            "on the device is allowed and there is nothing to learn; lower the threshold, give "
            f"{option('privacy_split')}, or train with {option('no_privacy')}")


@dataclass(frozen=True)
class SplitData:
    """The data of a split-training run: per-epoch training batches (reproducible from the
    seed, so a split and an unsplit run see the same ones), one sample's shape, the class
    count, the first training samples (examples) and the test accuracy of a model."""

    name: str
    sample_shape: tuple[int, ...]
    classes: int
    batches: Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]
    examples: Callable[[int], torch.Tensor]
    accuracy: Callable[[nn.Module], float]
    test_samples: int


def load_split_data(spec: str, batch_size: int, seed: int, train_limit: int | None = None
                    ) -> SplitData:
    """``digits`` (sklearn's, in memory) or an image set spec (``fashion-mnist[:options]``,
    streamed: its train split to train on, its test split for the accuracy); ``train_limit``
    keeps the first N training samples, the test samples stay whole."""
    if spec == "digits":
        from edgesplit.data.digits import TRAIN_SAMPLES, digits_arrays

        images, labels = digits_arrays()
        kept = min(TRAIN_SAMPLES, train_limit or TRAIN_SAMPLES)
        x_train, y_train = images[:kept], labels[:kept]
        x_test, y_test = images[TRAIN_SAMPLES:], labels[TRAIN_SAMPLES:]
        return SplitData("digits", tuple(images.shape[1:]), 10,
                         epoch_batches(x_train, y_train, batch_size, seed),
                         lambda n: x_train[:n], lambda m: evaluate(m, x_test, y_test),
                         len(y_test))
    from edgesplit.data.images import load_images

    train, test = load_images(spec, "train"), load_images(spec, "test")
    if train_limit is not None:
        train = train.subset(slice(0, train_limit))
    return SplitData(spec, tuple(train.sample_shape), train.num_classes,
                     lambda epoch: train.loader(batch_size, shuffle=True, seed=seed + epoch),
                     train.first, lambda m: _accuracy(m, test.loader(256)), len(test))


def _accuracy(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Top-1 accuracy in percent over streamed batches, in eval mode."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in batches:
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return 100.0 * correct / max(total, 1)


def model_for_data(model: str, data: SplitData) -> TrainModelSpec:
    """The model spec ``model`` sized for ``data`` (input shape and classes); refused in one
    line when the model cannot take them."""
    return TrainModelSpec.parse(model).for_data(data.sample_shape, data.classes, data.name)


def _features(model: nn.Module, x: torch.Tensor, cuts: Sequence[int]) -> dict[int, object]:
    """x_p of each chain cut from the LayerGraph (Section IV-A), scaled per feature to [0, 1]
    as in the simulator; keyed by arm (index into ``cuts``)."""
    import numpy as np

    from edgesplit.graph import capture
    from edgesplit.train.chain import capturable
    from edgesplit.train.features import partition_features
    from edgesplit.train.split import graph_cut_for_chain

    # captured as the chain itself, each layer's module path starts with its chain index: exact
    # for any chain, also one whose element holds functions and several children
    chain = capturable(copy.deepcopy(as_chain(model)))
    graph = capture(chain.eval(), (x,), optimize=False, name="train-split")
    rows = np.stack([partition_features(graph, graph_cut_for_chain(graph, c)) for c in cuts])
    scale = rows.max(axis=0)
    scale[scale == 0] = 1.0
    return {i: rows[i] / scale for i in range(len(cuts))}


def _make_policy(config: TrainSplitConfig, features, device_ms: list[float]):
    from edgesplit.train.bandit import LinUCBE
    from edgesplit.train.l2s import L2S_ALPHA, L2S_RIDGE
    from edgesplit.train.modes import AdaptiveL2S, ModeConfig

    if config.policy == "fixed":
        return None
    modes = ModeConfig(horizon=config.horizon, n_th=config.n_th, r_th=config.drift_threshold,
                       r_d=config.random_reentry, seed=config.seed)
    return AdaptiveL2S(lambda h: LinUCBE(features, h, L2S_ALPHA, L2S_RIDGE,
                                         device_delays=device_ms,
                                         delay_scale=device_ms[-1]), modes)


def train_unsplit(model: nn.Module, batches: Callable[[int], Iterable], epochs: int, lr: float,
                  momentum: float, seed: int | None = None) -> nn.Module:
    """The reference: the same model, batches and optimizer without a split. With the run's
    ``seed``, round t runs the model as its chain with the random draws split training makes
    (:func:`~edgesplit.train.split.seeded_forward`), so dropout draws the same masks."""
    model.train()
    chain = as_chain(model) if seed is not None else None
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    t = 0
    for epoch in range(epochs):
        for x, y in batches(epoch):
            t += 1
            opt.zero_grad()
            if chain is None or seed is None:
                out = model(x)
            else:
                for module in chain:
                    module.train()
                out = seeded_forward(chain, 0, len(chain), x, seed, t)
            F.cross_entropy(out, y).backward()
            opt.step()
    return model.eval()


def train_split(config: TrainSplitConfig, address: str | LoopbackChannel, *,
                calls: CallOptions | None = None, take_over: bool = False,
                progress: bool = False) -> dict:
    """Train ``config.model`` on ``config.data`` split between this process and the server at
    ``address``, called as ``calls`` say (its token; over TLS trusting ``calls.tls.ca``, if
    given; ``take_over`` ends a session the server has open, see :class:`RemoteSplitTrainer`;
    a server's ``loopback_channel()`` trains in-process); L2S picks each round's cut. The
    server must serve :func:`model_for_data`'s spec with the same seed. Returns the run's JSON
    document."""
    data = load_split_data(config.data, config.batch_size, config.seed, config.train_limit)
    spec = model_for_data(config.model, data)
    model = spec.build(config.seed)
    chain = as_chain(model)
    from edgesplit.train.remote import chain_shapes

    classes = chain_shapes(chain, data.sample_shape).classes
    if classes != data.classes:
        raise ConfigError(f"{spec.name} outputs {classes} classes, {data.name} has "
                          f"{data.classes}; choose a model whose classifier can be resized")
    cuts, privacy = _domain(config, spec, chain, data)
    if config.policy != "fixed" and len(cuts) < 2:
        raise ConfigError(_nothing_to_learn(config, privacy))
    if config.policy == "fixed" and config.cut not in cuts:
        raise ConfigError(f"{option('cut', config.cut)} is outside the allowed cuts {cuts} "
                          "(privacy)")
    x0, y0 = next(iter(data.batches(0)))
    device_ms = profile_device_ms(chain, x0, y0, cuts, slowdown=config.device_slowdown)
    features = _features(model, x0, cuts)
    policy = _make_policy(config, features, device_ms)
    if policy is None:  # fixed: TrainSplitConfig requires its cut, checked against cuts above
        assert config.cut is not None
        policy = FixedCutPolicy(cuts.index(config.cut))
    trace = config.trace()
    with RemoteSplitTrainer(model, address, config.training(), emulation=config.emulation(),
                            calls=calls, take_over=take_over) as trainer:
        run = run_split_training(trainer, data.batches, policy, cuts, epochs=config.epochs,
                                 bandwidth_schedule=trace.at, progress=progress)
        trained = trainer.final_model()
    doc = {"version": RUN_VERSION, "config": asdict(config), "model_spec": str(spec),
           "cuts": cuts, "privacy": privacy,
           "device_ms_profile": device_ms, "rounds": run.to_json(),
           "accuracy": data.accuracy(trained), "test_samples": data.test_samples}
    if isinstance(policy, FixedCutPolicy):
        doc["adaptations"], doc["settled"] = [], []
    else:
        doc["adaptations"] = [{"round": t, "reason": r}
                              for t, r in zip(policy.adaptations, policy.reasons, strict=True)]
        doc["settled"] = [{"round": t, "cut": cuts[arm]} for t, arm in policy.settled]
    if config.baseline:
        reference = train_unsplit(spec.build(config.seed), data.batches, config.epochs,
                                  config.lr, config.momentum, seed=config.seed)
        doc["baseline_accuracy"] = data.accuracy(reference)
    return doc


@contextmanager
def local_training_server(model: str, *, lr: float, momentum: float, seed: int,
                          token: str | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                          timeout_s: float = 60.0) -> Iterator[str]:
    """An ``edgesplit serve-training`` process on a free local port for the duration; yields
    its address. The second process of a real run when no ``--server`` is given.

    Both processes share this machine's cores, so each computes on one thread, and the
    server's OpenMP threads sleep when idle: by default they spin for a while after every
    round, which slowed the device's own compute 5-10x (measured) and made its profiled d_p^m
    wrong. Call :func:`one_core_per_side` in the device process too."""
    cmd = [sys.executable, "-m", "edgesplit.cli", "serve-training", "--model", model,
           "--lr", str(lr), "--momentum", str(momentum), "--seed", str(seed), "--port", "0",
           "--max-batch", str(max_batch)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop(TOKEN_ENV, None)
    if token:  # in the environment: a command line is visible to every user in `ps`
        env[TOKEN_ENV] = token
    with _listening(cmd, env, timeout_s) as (address, _):
        yield address


class _Tail:
    """The last ``keep`` lines of a child's output stream, read by a daemon thread until the
    stream ends: a pipe nobody reads fills (64 KiB on Linux) and then blocks the child on its
    next write, a chatty server in the middle of a round."""

    def __init__(self, stream: IO[str], keep: int = 20) -> None:
        self._lines: deque[str] = deque(maxlen=keep)
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                self._lines.append(line)
        except (OSError, ValueError):  # the stream was closed under us: nothing more to keep
            pass

    def text(self, wait_s: float = 0.0) -> str:
        """The lines kept, after waiting up to ``wait_s`` for the stream to end."""
        self._thread.join(wait_s)
        return "".join(self._lines)


@contextmanager
def _listening(cmd: list[str], env: dict[str, str], timeout_s: float
               ) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Run ``cmd``, a server that prints ``listening on ADDRESS`` as its first line of stdout;
    yield the address and the process, and stop it afterwards. Both its outputs are drained
    all along, their last lines kept for the error when it does not start."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # both are pipes (PIPE above)
    errors = _Tail(stderr)
    try:
        ready = select.select([stdout], [], [], timeout_s)[0]
        line = stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            proc.kill()
            output = (line + errors.text(wait_s=5.0)).strip()[-500:]
            raise RemoteError(f"the local training server did not start: "
                              f"{output or 'no output'}")
        _Tail(stdout)
        yield line.split()[2], proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def one_core_per_side() -> None:
    """The device side of a run whose server shares this machine: compute on one thread."""
    torch.set_num_threads(1)
