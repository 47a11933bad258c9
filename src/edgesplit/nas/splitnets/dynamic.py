"""Elastic layers of the SplitNets supernet (BigNAS / once-for-all style weight slicing) and
the split-aware initialisation of Table 3.

Every layer holds the weights of its widest configuration; a narrower one uses the *first*
channels (``weight[:out, :in]``), so channel c means the same thing in every sub-network.
Batch-norms are sliced the same way and recalibrated per sub-network before it is evaluated
(:func:`~edgesplit.nas.splitnets.supernet.recalibrate`). ``static(...)`` copies a slice into
a plain ``nn.Module`` that ``torch.export`` captures without any slicing left in the graph.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.nas.core.ops import MBConv

__all__ = ["INIT_MODES", "DynamicConvBN", "DynamicMBConv", "InitMode", "init_std",
           "init_weight_"]

InitMode = Literal["split-aware", "fan-in", "fan-out", "xavier"]
INIT_MODES: tuple[str, ...] = get_args(InitMode)


def init_std(mode: str, kernel: int, c_in: int, c_out: int) -> float:
    """Standard deviation of a ReLU conv's weights under ``mode`` (Table 3): Kaiming fan-in
    2/(k^2 c_in), fan-out 2/(k^2 c_out), Xavier's arithmetic mean of the two channel counts,
    or the split-aware geometric mean 2/(k^2 sqrt(c_in c_out))."""
    k2 = kernel * kernel
    channels = {"split-aware": math.sqrt(c_in * c_out), "fan-in": c_in, "fan-out": c_out,
                "xavier": (c_in + c_out) / 2}
    if mode not in channels:
        raise ConfigError(f"unknown initialisation {mode!r}; choose one of "
                          f"{', '.join(INIT_MODES)}")
    return math.sqrt(2.0 / (k2 * channels[mode]))


def init_weight_(weight: torch.Tensor, mode: str, *, groups: int = 1) -> torch.Tensor:
    """Draw a conv weight (out, in/groups, k, k) in place; a depthwise conv's channel counts
    are per group (1 in, 1 out), so every mode agrees on it."""
    c_out, c_in, k, _ = weight.shape  # c_in is already per group
    with torch.no_grad():
        return weight.normal_(0.0, init_std(mode, k, c_in, c_out // groups))


def _bn(x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    """``bn`` on the first ``x.shape[1]`` channels: the sliced running statistics are views,
    so training updates the supernet's buffers in place."""
    c = x.shape[1]
    mean = bn.running_mean[:c] if bn.running_mean is not None else None
    var = bn.running_var[:c] if bn.running_var is not None else None
    training = bn.training or mean is None
    momentum = bn.momentum
    if training and bn.num_batches_tracked is not None and bn.track_running_stats:
        bn.num_batches_tracked.add_(1)
        if momentum is None:  # cumulative average (recalibration)
            momentum = 1.0 / float(bn.num_batches_tracked)
    return F.batch_norm(x, mean, var, bn.weight[:c], bn.bias[:c], training,
                        momentum if momentum is not None else 0.0, bn.eps)


def _static_bn(bn: nn.BatchNorm2d, c: int) -> nn.BatchNorm2d:
    out = nn.BatchNorm2d(c, eps=bn.eps)
    with torch.no_grad():
        out.weight.copy_(bn.weight[:c])
        out.bias.copy_(bn.bias[:c])
        assert bn.running_mean is not None and bn.running_var is not None
        assert out.running_mean is not None and out.running_var is not None
        out.running_mean.copy_(bn.running_mean[:c])
        out.running_var.copy_(bn.running_var[:c])
    return out


class DynamicConvBN(nn.Module):
    """Conv (k x k, ``stride``) + BN (+ ReLU6 with ``act``) over the first ``in``/``out``
    channels."""

    def __init__(self, in_max: int, out_max: int, kernel: int = 1, stride: int = 1, *,
                 init: str = "fan-out", act: bool = True) -> None:
        super().__init__()
        self.kernel, self.stride, self.act = kernel, stride, act
        self.weight = nn.Parameter(torch.empty(out_max, in_max, kernel, kernel))
        init_weight_(self.weight, init)
        self.bn = nn.BatchNorm2d(out_max)

    def forward(self, x: torch.Tensor, out: int) -> torch.Tensor:
        w = self.weight[:out, :x.shape[1]]
        y = _bn(F.conv2d(x, w, stride=self.stride, padding=self.kernel // 2), self.bn)
        return F.relu6(y) if self.act else y

    def static(self, c_in: int, out: int) -> nn.Sequential:
        conv = nn.Conv2d(c_in, out, self.kernel, self.stride, self.kernel // 2, bias=False)
        with torch.no_grad():
            conv.weight.copy_(self.weight[:out, :c_in])
        layers: list[nn.Module] = [conv, _static_bn(self.bn, out)]
        return nn.Sequential(*layers, nn.ReLU6()) if self.act else nn.Sequential(*layers)


class DynamicMBConv(nn.Module):
    """Inverted residual block with elastic input, output and expansion: 1x1 expand (absent at
    expansion 1) + BN + ReLU6, 3x3 depthwise (``stride``) + BN + ReLU6, 1x1 project + BN, plus
    the input when the shape is kept."""

    def __init__(self, in_max: int, out_max: int, expand_max: int, stride: int,
                 kernel: int = 3) -> None:
        super().__init__()
        hidden = in_max * expand_max
        self.stride, self.kernel = stride, kernel
        self.expand_weight = nn.Parameter(torch.empty(hidden, in_max, 1, 1))
        self.depthwise_weight = nn.Parameter(torch.empty(hidden, 1, kernel, kernel))
        self.project_weight = nn.Parameter(torch.empty(out_max, hidden, 1, 1))
        for w in (self.expand_weight, self.depthwise_weight, self.project_weight):
            nn.init.kaiming_normal_(w, mode="fan_out")
        self.expand_bn = nn.BatchNorm2d(hidden)
        self.depthwise_bn = nn.BatchNorm2d(hidden)
        self.project_bn = nn.BatchNorm2d(out_max)

    def shortcut(self, c_in: int, out: int) -> bool:
        return self.stride == 1 and c_in == out

    def forward(self, x: torch.Tensor, out: int, expand: int) -> torch.Tensor:
        c_in = x.shape[1]
        hidden = c_in * expand
        y = x
        if expand != 1:
            y = F.relu6(_bn(F.conv2d(y, self.expand_weight[:hidden, :c_in]), self.expand_bn))
        y = F.conv2d(y, self.depthwise_weight[:hidden], stride=self.stride,
                     padding=self.kernel // 2, groups=hidden)
        y = F.relu6(_bn(y, self.depthwise_bn))
        y = _bn(F.conv2d(y, self.project_weight[:out, :hidden]), self.project_bn)
        return x + y if self.shortcut(c_in, out) else y

    def static(self, c_in: int, out: int, expand: int) -> MBConv:
        block = MBConv(c_in, out, self.kernel, expand, self.stride, self.shortcut(c_in, out))
        hidden = c_in * expand
        with torch.no_grad():
            if block.expand is not None:
                block.expand.weight.copy_(self.expand_weight[:hidden, :c_in])
                block.expand_bn = _static_bn(self.expand_bn, hidden)
            block.depthwise.weight.copy_(self.depthwise_weight[:hidden])
            block.depthwise_bn = _static_bn(self.depthwise_bn, hidden)
            block.project.weight.copy_(self.project_weight[:out, :hidden])
            block.project_bn = _static_bn(self.project_bn, out)
        return block
