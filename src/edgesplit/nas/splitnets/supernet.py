"""The split-aware supernet (paper 004, section 3.1, Figs. 3-5) and the plain network of one
architecture in it.

Single view: one set of blocks; a phase whose splitting module is on runs Conv-Reduce (its
width c -> d) on the sensor side and Conv-Recover (d -> c) on the aggregator side, so a block
after the split sees c channels and shares its weights with the same block of networks split
elsewhere (or not at all). Multi-view: the sensor blocks run each view (one set of weights:
the sensors are homogeneous), Conv-Reduce sends d channels per view, View-Fuse concatenates
the V features *interlaced* (appendix B: channel i of the fused tensor comes from view
i mod V whatever d is) and a 1x1 convolution maps the V*d channels to the phase's width; the
aggregator's blocks have their own weights (a block after fusion learns from mixed views,
Fig. 5). Splitting modules (reduce, recover, fuse) are initialised split-aware (Table 3).

:meth:`SplitSupernet.extract` copies one architecture's weights into a :class:`SplitNet`:
``sensor`` (everything up to Conv-Reduce), ``join`` (Conv-Recover, or View-Fuse + its conv)
and ``aggregator``; ``forward(*views)`` is what ``torch.export`` captures and the star runtime
serves.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.hardware.accelerator import device_of
from edgesplit.nas.core.evaluate import recalibrate_bn
from edgesplit.nas.splitnets.dynamic import INIT_MODES, DynamicConvBN, DynamicMBConv
from edgesplit.nas.splitnets.space import SplitArch, SplitSpace

__all__ = ["Interlace", "MultiResolution", "SplitNet", "SplitSupernet", "interlace",
           "recalibrate", "resize_input"]


def interlace(features: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """View-Fuse's concatenation of V (B, d, H, W) features into (B, V*d, H, W) with channel
    c*V + v from view v: one stack and a reshape, no copies per channel."""
    return torch.stack(tuple(features), dim=2).flatten(1, 2)


class Interlace(nn.Module):
    def forward(self, *features: torch.Tensor) -> torch.Tensor:
        return interlace(features)


class _Pool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3))


class SplitNet(nn.Module):
    """One SplitNets architecture as a plain network: ``sensor`` per view, ``join`` (recover
    or fuse) and ``aggregator`` (blocks and head)."""

    def __init__(self, sensor: nn.Module, join: nn.Module, aggregator: nn.Module,
                 views: int) -> None:
        super().__init__()
        self.sensor, self.join, self.aggregator = sensor, join, aggregator
        self.views = views
        self.interlace = Interlace() if views > 1 else None

    def forward(self, *views: torch.Tensor) -> torch.Tensor:
        if len(views) != self.views:
            raise ConfigError(f"this SplitNet takes {self.views} view(s), got {len(views)}")
        if self.interlace is None:
            return self.aggregator(self.join(self.sensor(views[0])))
        fused = self.interlace(*(self.sensor(v) for v in views))
        return self.aggregator(self.join(fused))


class SplitSupernet(nn.Module):
    """Every architecture of ``space`` over one set of elastic weights.

    ``init`` is the initialisation of the splitting modules (``split-aware``, or the Kaiming
    ``fan-in``/``fan-out`` and ``xavier`` of Table 3 to compare against)."""

    def __init__(self, space: SplitSpace, *, init: str = "split-aware") -> None:
        super().__init__()
        if init not in INIT_MODES:
            raise ConfigError(f"unknown initialisation {init!r}; choose one of "
                              f"{', '.join(INIT_MODES)}")
        self.space, self.init = space, init
        self.stem = DynamicConvBN(space.in_channels, space.stem_widths[-1], 3, 1)
        self.blocks = nn.ModuleList()
        self.reduce = nn.ModuleList()
        self.join = nn.ModuleList()
        c_prev = space.stem_widths[-1]
        views = space.views
        for p in space.phases:
            c, e = p.widths[-1], p.expands[-1]
            self.blocks.append(nn.ModuleList(
                DynamicMBConv(c_prev if j == 0 else c, c, e, p.stride if j == 0 else 1)
                for j in range(p.max_blocks)))
            d = p.reduced[-1]
            self.reduce.append(DynamicConvBN(c, d, 1, init=init))
            # recover / fuse: linear like the projection of the block whose output it stands
            # for, so the blocks after a split see the kind of features they see without one
            self.join.append(DynamicConvBN(d * views, c, 1, init=init, act=False))
            c_prev = c
        # multi-view: blocks after fusion learn from mixed views, so they get their own weights
        self.agg_blocks = self.blocks if views == 1 else copy.deepcopy(self.blocks)
        self.head = DynamicConvBN(c_prev, space.head_widths[-1], 1)
        self.classifier = nn.Linear(space.head_widths[-1], space.num_classes)

    # -- training-time forward -----------------------------------------------------------------

    def forward(self, x: torch.Tensor, arch: SplitArch) -> torch.Tensor:
        """Logits of ``arch`` on ``x``: (B, C, H, W) single-view, (B, V, C, H, W) multi-view,
        resized to the architecture's resolution."""
        self.space.validate(arch)
        if self.space.multi_view:
            return self._forward_multi(x, arch)
        x = _resize(x, arch.resolution)
        x = self.stem(x, arch.stem)
        for i, p in enumerate(arch.phases):
            for j in range(p.blocks):
                if j == p.before and i in arch.splits:
                    x = self.join[i](self.reduce[i](x, p.reduced), p.width)
                x = self.block(i, j)(x, p.width, p.expands[j])
            if p.after == 0 and i in arch.splits:
                x = self.join[i](self.reduce[i](x, p.reduced), p.width)
        return self._head(x, arch)

    def _forward_multi(self, x: torch.Tensor, arch: SplitArch) -> torch.Tensor:
        if x.dim() != 5 or x.shape[1] != self.space.views:
            raise ConfigError(f"multi-view input must be (batch, {self.space.views}, C, H, W), "
                              f"got {tuple(x.shape)}")
        b, v = x.shape[:2]
        s = arch.split
        z = _resize(x.flatten(0, 1), arch.resolution)  # every view through the same sensor
        z = self.stem(z, arch.stem)
        for i, p in enumerate(arch.phases[:s + 1]):
            for j in range(p.before if i == s else p.blocks):
                z = self.block(i, j)(z, p.width, p.expands[j])
        p = arch.phases[s]
        z = self.reduce[s](z, p.reduced)
        y = self.join[s](interlace(z.unflatten(0, (b, v)).unbind(1)), p.width)
        for i in range(s, len(arch.phases)):
            q = arch.phases[i]
            for j in range(q.before if i == s else 0, q.blocks):
                y = self.block(i, j, aggregator=True)(y, q.width, q.expands[j])
        return self._head(y, arch)

    def _head(self, x: torch.Tensor, arch: SplitArch) -> torch.Tensor:
        x = self.head(x, arch.head).mean((2, 3))
        return F.linear(x, self.classifier.weight[:, :arch.head], self.classifier.bias)

    # -- one architecture as a plain network ---------------------------------------------------

    def extract(self, arch: SplitArch) -> SplitNet:
        """``arch`` (exactly one splitting module) as a :class:`SplitNet` with copies of its
        weights and batch-norm statistics; in eval mode."""
        space = self.space
        space.validate(arch, deployable=True)
        s, views = arch.split, space.views
        sensor: list[tuple[str, nn.Module]] = [("stem", self.stem.static(space.in_channels,
                                                                         arch.stem))]
        c = arch.stem
        aggregator: list[tuple[str, nn.Module]] = []
        for i, p in enumerate(arch.phases):
            for j in range(p.blocks):
                on_sensor = i < s or (i == s and j < p.before)
                block = self.block(i, j, aggregator=not on_sensor).static(c, p.width,
                                                                          p.expands[j])
                (sensor if on_sensor else aggregator).append((f"p{i}b{j}", block))
                c = p.width
                if on_sensor and i == s and j == p.before - 1:
                    sensor.append(("reduce", self.module("reduce", s).static(p.width,
                                                                             p.reduced)))
        p = arch.phases[s]
        join = self.module("join", s).static(p.reduced * views, p.width)
        aggregator += [("head", self.head.static(c, arch.head)), ("pool", _Pool()),
                       ("classifier", _linear(self.classifier, arch.head))]
        net = SplitNet(nn.Sequential(OrderedDict(sensor)), join,
                       nn.Sequential(OrderedDict(aggregator)), views)
        return net.eval()

    def extract_plain(self, arch: SplitArch) -> nn.Sequential:
        """``arch`` without any splitting module (single view): stem, blocks and head as one
        plain network, what the baselines split without a bottleneck."""
        space = self.space
        if space.multi_view:
            raise ConfigError("a multi-view network fuses its views once: it has no plain "
                              "version without a splitting module")
        space.validate(arch.with_splits(()))
        layers: list[tuple[str, nn.Module]] = [("stem", self.stem.static(space.in_channels,
                                                                         arch.stem))]
        c = arch.stem
        for i, p in enumerate(arch.phases):
            for j in range(p.blocks):
                layers.append((f"p{i}b{j}", self.block(i, j).static(c, p.width, p.expands[j])))
                c = p.width
        layers += [("head", self.head.static(c, arch.head)), ("pool", _Pool()),
                   ("classifier", _linear(self.classifier, arch.head))]
        return nn.Sequential(OrderedDict(layers)).eval()

    def block(self, phase: int, index: int, *, aggregator: bool = False) -> DynamicMBConv:
        """Block ``index`` of ``phase``; ``aggregator``: the one that runs after the split
        (its own weights in a multi-view supernet, the same block otherwise)."""
        blocks = self.agg_blocks if aggregator else self.blocks
        return cast(DynamicMBConv, cast(nn.ModuleList, blocks[phase])[index])

    def module(self, kind: str, phase: int) -> DynamicConvBN:
        """The ``reduce`` or ``join`` (recover / fuse) module of ``phase``."""
        return cast(DynamicConvBN, cast(nn.ModuleList, getattr(self, kind))[phase])

    def batchnorms(self) -> Iterator[nn.BatchNorm2d]:
        return (m for m in self.modules() if isinstance(m, nn.BatchNorm2d))


def _linear(layer: nn.Linear, features: int) -> nn.Linear:
    out = nn.Linear(features, layer.out_features)
    with torch.no_grad():
        out.weight.copy_(layer.weight[:, :features])
        out.bias.copy_(layer.bias)
    return out


def resize_input(x: torch.Tensor, resolution: int) -> torch.Tensor:
    """Samples ((B, C, H, W) or multi-view (B, V, C, H, W)) at ``resolution``, resized
    exactly as the supernet resizes them."""
    if x.dim() == 5:
        return _resize(x.flatten(0, 1), resolution).unflatten(0, tuple(x.shape[:2]))
    return _resize(x, resolution)


class MultiResolution:
    """A fixed set of samples at every resolution asked for, each resized once: a training
    step or an evaluation then indexes ready tensors (resizing a batch on every step costs
    as much as a small sub-network's forward pass)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self._at: dict[int, torch.Tensor] = {}

    def at(self, resolution: int) -> torch.Tensor:
        if resolution not in self._at:
            self._at[resolution] = resize_input(self.x, resolution)
        return self._at[resolution]


def _resize(x: torch.Tensor, resolution: int) -> torch.Tensor:
    if x.shape[-1] == resolution and x.shape[-2] == resolution:
        return x
    return F.interpolate(x, size=(resolution, resolution), mode="bilinear",
                         align_corners=False, antialias=True)


def recalibrate(supernet: SplitSupernet, arch: SplitArch, batches: Iterable[torch.Tensor]
                ) -> None:
    """Batch-norm statistics of ``arch`` from ``batches`` (cumulative averages, as
    once-for-all does before evaluating a sub-network); leaves the supernet in eval mode."""
    device = device_of(supernet)
    recalibrate_bn(supernet, batches, lambda x: supernet(x.to(device), arch),
                   supernet.batchnorms())
