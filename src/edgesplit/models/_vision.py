"""Classic vision models that Hugging Face transformers does not ship, defined here in PyTorch.

The ImageNet models follow torchvision's definitions (torchvision is not a dependency):
attribute names match torchvision's so that module paths (``features.0``, ``classifier.6``,
``layer4.0.downsample.0``, ``inception3a.branch1.conv``) read like the ones in papers that cut
those models, and parameter counts equal torchvision's. YOLOv3-tiny follows Darknet's
``yolov3-tiny.cfg``; ResNet-1202 follows He et al. 2016 (CIFAR-10, option-A shortcuts) with
the attribute names of akamaster/pytorch_resnet_cifar10.

Every forward is export-friendly: control flow depends only on construction-time constants,
activations are not in place, and the output is a plain tensor (a tuple for YOLOv3-tiny).
Weights are random (PyTorch's default initialisation, except a damped residual BN scale in
ResNet-1202); nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.models import register_model

__all__: list[str] = []

_IMAGENET = (1, 3, 224, 224)


# --------------------------------------------------------------------------------------------
# AlexNet and VGG (torchvision.models.alexnet / vgg)
# --------------------------------------------------------------------------------------------


class AlexNet(nn.Module):
    """AlexNet as in torchvision (Krizhevsky 2014, "One weird trick", single-tower variant)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


# "M" is a 2x2 max pool; numbers are 3x3 conv widths (torchvision's configuration "D").
_VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)


def _vgg_features(cfg: Sequence[int | str]) -> nn.Sequential:
    layers: list[nn.Module] = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            assert isinstance(v, int)
            layers += [nn.Conv2d(in_channels, v, kernel_size=3, padding=1), nn.ReLU()]
            in_channels = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """VGG without batch norm as in torchvision (Simonyan & Zisserman 2015)."""

    def __init__(
        self, features: nn.Sequential, num_classes: int = 1000, dropout: float = 0.5
    ) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


# --------------------------------------------------------------------------------------------
# GoogLeNet (torchvision.models.googlenet, aux_logits=False, transform_input=False)
# --------------------------------------------------------------------------------------------


class BasicConv2d(nn.Module):
    """Conv (no bias) + BN (eps 0.001) + ReLU, torchvision's GoogLeNet building block."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class Inception(nn.Module):
    """GoogLeNet inception block as in torchvision.

    branch3 uses a 3x3 conv where the paper has 5x5: torchvision kept that known discrepancy for
    compatibility with its weights, and we keep it so that counts and shapes agree with it.
    """

    def __init__(
        self,
        in_channels: int,
        ch1x1: int,
        ch3x3red: int,
        ch3x3: int,
        ch5x5red: int,
        ch5x5: int,
        pool_proj: int,
    ) -> None:
        super().__init__()
        self.branch1 = BasicConv2d(in_channels, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(
            BasicConv2d(in_channels, ch3x3red, kernel_size=1),
            BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1),
        )
        self.branch3 = nn.Sequential(
            BasicConv2d(in_channels, ch5x5red, kernel_size=1),
            BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1),
        )
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
            BasicConv2d(in_channels, pool_proj, kernel_size=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    """GoogLeNet / Inception v1 as in torchvision (Szegedy et al. 2015), without aux heads."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)

        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)

        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)

        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)

        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        x = self.inception4a(x)
        x = self.inception4b(x)
        x = self.inception4c(x)
        x = self.inception4d(x)
        x = self.maxpool4(self.inception4e(x))
        x = self.inception5b(self.inception5a(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(self.dropout(x))


# --------------------------------------------------------------------------------------------
# MNASNet (torchvision.models.mnasnet1_0)
# --------------------------------------------------------------------------------------------

# Paper/TensorFlow momentum 0.9997 in PyTorch's convention; only matters when training.
_BN_MOMENTUM = 1 - 0.9997


class _InvertedResidual(nn.Module):
    """MNASNet inverted residual: 1x1 expand, depthwise kxk, linear 1x1 project."""

    def __init__(
        self, in_ch: int, out_ch: int, kernel_size: int, stride: int, expansion_factor: int
    ) -> None:
        super().__init__()
        mid_ch = in_ch * expansion_factor
        # Decided at construction so that export sees no branch on tensor values.
        self.apply_residual = in_ch == out_ch and stride == 1
        self.layers = nn.Sequential(
            nn.Conv2d(in_ch, mid_ch, 1, bias=False),
            nn.BatchNorm2d(mid_ch, momentum=_BN_MOMENTUM),
            nn.ReLU(),
            nn.Conv2d(
                mid_ch,
                mid_ch,
                kernel_size,
                padding=kernel_size // 2,
                stride=stride,
                groups=mid_ch,
                bias=False,
            ),
            nn.BatchNorm2d(mid_ch, momentum=_BN_MOMENTUM),
            nn.ReLU(),
            nn.Conv2d(mid_ch, out_ch, 1, bias=False),
            nn.BatchNorm2d(out_ch, momentum=_BN_MOMENTUM),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.apply_residual:
            return self.layers(x) + x
        return self.layers(x)


def _mnas_stack(
    in_ch: int, out_ch: int, kernel_size: int, stride: int, exp_factor: int, repeats: int
) -> nn.Sequential:
    first = _InvertedResidual(in_ch, out_ch, kernel_size, stride, exp_factor)
    rest = [
        _InvertedResidual(out_ch, out_ch, kernel_size, 1, exp_factor) for _ in range(1, repeats)
    ]
    return nn.Sequential(first, *rest)


def _round_to_multiple_of(val: float, divisor: int, round_up_bias: float = 0.9) -> int:
    # torchvision's rounding: never drop more than 10% below the requested width.
    new_val = max(divisor, int(val + divisor / 2) // divisor * divisor)
    return new_val if new_val >= round_up_bias * val else new_val + divisor


class MNASNet(nn.Module):
    """MNASNet-B1 as in torchvision (Tan et al. 2019), width multiplier ``alpha``."""

    def __init__(self, alpha: float = 1.0, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        d = [_round_to_multiple_of(c * alpha, 8) for c in (32, 16, 24, 40, 80, 96, 192, 320)]
        self.layers = nn.Sequential(
            nn.Conv2d(3, d[0], 3, padding=1, stride=2, bias=False),
            nn.BatchNorm2d(d[0], momentum=_BN_MOMENTUM),
            nn.ReLU(),
            # Depthwise separable, no skip.
            nn.Conv2d(d[0], d[0], 3, padding=1, stride=1, groups=d[0], bias=False),
            nn.BatchNorm2d(d[0], momentum=_BN_MOMENTUM),
            nn.ReLU(),
            nn.Conv2d(d[0], d[1], 1, padding=0, stride=1, bias=False),
            nn.BatchNorm2d(d[1], momentum=_BN_MOMENTUM),
            _mnas_stack(d[1], d[2], 3, 2, 3, 3),
            _mnas_stack(d[2], d[3], 5, 2, 3, 3),
            _mnas_stack(d[3], d[4], 5, 2, 6, 3),
            _mnas_stack(d[4], d[5], 3, 1, 6, 2),
            _mnas_stack(d[5], d[6], 5, 2, 6, 4),
            _mnas_stack(d[6], d[7], 3, 1, 6, 1),
            nn.Conv2d(d[7], 1280, 1, padding=0, stride=1, bias=False),
            nn.BatchNorm2d(1280, momentum=_BN_MOMENTUM),
            nn.ReLU(),
        )
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(x)
        x = x.mean([2, 3])  # global average pool, as torchvision does it
        return self.classifier(x)


# --------------------------------------------------------------------------------------------
# ResNet / ResNeXt (torchvision.models.resnet)
# --------------------------------------------------------------------------------------------


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(
        in_planes, out_planes, kernel_size=3, stride=stride, padding=1, groups=groups, bias=False
    )


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity/projection shortcut (torchvision's BasicBlock)."""

    expansion = 1

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
        groups: int = 1,
        base_width: int = 64,
    ) -> None:
        super().__init__()
        if groups != 1 or base_width != 64:
            raise ValueError("BasicBlock only supports groups=1 and base_width=64")
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 / 3x3 (grouped) / 1x1 bottleneck with stride on the 3x3 (torchvision's ResNet v1.5)."""

    expansion = 4

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
        groups: int = 1,
        base_width: int = 64,
    ) -> None:
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = _conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride, groups)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ImageNet ResNet/ResNeXt as in torchvision (He et al. 2016; Xie et al. 2017)."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: Sequence[int],
        num_classes: int = 1000,
        groups: int = 1,
        width_per_group: int = 64,
    ) -> None:
        super().__init__()
        self.inplanes = 64
        self.groups = groups
        self.base_width = width_per_group
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample, self.groups, self.base_width)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(
                block(self.inplanes, planes, groups=self.groups, base_width=self.base_width)
            )
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# --------------------------------------------------------------------------------------------
# CIFAR-10 ResNet with option-A shortcuts (He et al. 2016, section 4.2)
# --------------------------------------------------------------------------------------------


class _PadShortcut(nn.Module):
    """Option-A shortcut: stride-2 subsampling and zero channels, so the shortcut has no weights."""

    def __init__(self, planes: int) -> None:
        super().__init__()
        self.pad = planes // 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad), "constant", 0.0)


class CifarBasicBlock(nn.Module):
    """Two 3x3 convs; the shortcut is identity or option A (akamaster/pytorch_resnet_cifar10)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(
            in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        # An empty Sequential is the identity, as in the reference code.
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = _PadShortcut(planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """CIFAR ResNet-(6n+2): three stages of 16/32/64 channels (He et al. 2016, section 4.2)."""

    def __init__(self, num_blocks: Sequence[int], num_classes: int = 10) -> None:
        super().__init__()
        self.in_planes = 16
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._make_layer(16, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(32, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(64, num_blocks[2], stride=2)
        self.linear = nn.Linear(64, num_classes)
        # With random weights, eval-mode BN is the identity, so 600 residual sums grow the
        # activations to ~5e5 (past float16's range) at gamma=1; gamma=0.5 on each branch's
        # last BN keeps them O(10), like a trained net's small residual gammas.
        for m in self.modules():
            if isinstance(m, CifarBasicBlock):
                nn.init.constant_(m.bn2.weight, 0.5)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(CifarBasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        # Global average pool; the reference's avg_pool2d(out, out.size(3)) would bake the size in.
        out = torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)
        return self.linear(out)


# --------------------------------------------------------------------------------------------
# YOLOv3-tiny (Darknet cfg/yolov3-tiny.cfg)
# --------------------------------------------------------------------------------------------


class _ConvBNLeaky(nn.Module):
    """Darknet ``[convolutional]`` with ``batch_normalize=1`` and ``activation=leaky``."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_ch, out_ch, kernel_size, stride=1, padding=kernel_size // 2, bias=False
        )
        self.bn = nn.BatchNorm2d(out_ch)
        self.act = nn.LeakyReLU(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class YOLOv3Tiny(nn.Module):
    """YOLOv3-tiny (Redmon & Farhadi 2018, Darknet ``yolov3-tiny.cfg``), raw head outputs.

    ``backbone.i`` is Darknet layer ``i`` for i in 0..12. The heads return the raw
    ``3 * (5 + num_classes)`` channel maps at strides 32 and 16; box decoding is left out.
    """

    # Darknet layer 8 (the last 26x26 map at 416 input) feeds the second head via route -1, 8.
    _ROUTE_INDEX = 8

    def __init__(self, num_classes: int = 80, num_anchors: int = 3) -> None:
        super().__init__()
        out_ch = num_anchors * (5 + num_classes)
        self.backbone = nn.Sequential(
            _ConvBNLeaky(3, 16, 3),
            nn.MaxPool2d(2, 2),
            _ConvBNLeaky(16, 32, 3),
            nn.MaxPool2d(2, 2),
            _ConvBNLeaky(32, 64, 3),
            nn.MaxPool2d(2, 2),
            _ConvBNLeaky(64, 128, 3),
            nn.MaxPool2d(2, 2),
            _ConvBNLeaky(128, 256, 3),
            nn.MaxPool2d(2, 2),
            _ConvBNLeaky(256, 512, 3),
            # Darknet's size-2 stride-1 maxpool keeps the 13x13 grid by padding right/bottom.
            nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.MaxPool2d(2, 1)),
            _ConvBNLeaky(512, 1024, 3),
        )
        self.neck = _ConvBNLeaky(1024, 256, 1)  # layer 13, shared by both heads
        self.branch13 = _ConvBNLeaky(256, 512, 3)  # layer 14
        self.head13 = nn.Conv2d(512, out_ch, 1)  # layer 15, linear with bias
        self.reduce = _ConvBNLeaky(256, 128, 1)  # layer 18, after route -4
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")  # layer 19
        self.branch26 = _ConvBNLeaky(128 + 256, 256, 3)  # layer 21, after route -1, 8
        self.head26 = nn.Conv2d(256, out_ch, 1)  # layer 22, linear with bias

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        route = x
        for i, layer in enumerate(self.backbone):
            x = layer(x)
            if i == self._ROUTE_INDEX:
                route = x
        neck = self.neck(x)
        out13 = self.head13(self.branch13(neck))
        up = self.upsample(self.reduce(neck))
        out26 = self.head26(self.branch26(torch.cat([up, route], 1)))
        return out13, out26


# --------------------------------------------------------------------------------------------
# Registry entries
# --------------------------------------------------------------------------------------------


@register_model(
    "alexnet",
    input_shape=_IMAGENET,
    family="vision",
    source="edgesplit",
    description="AlexNet (Krizhevsky 2014), torchvision definition",
)
def alexnet(num_classes: int = 1000) -> nn.Module:
    """torchvision ``alexnet``: 61,100,840 parameters."""
    return AlexNet(num_classes=num_classes)


@register_model(
    "vgg16",
    input_shape=_IMAGENET,
    family="vision",
    source="edgesplit",
    description="VGG-16 without BN (Simonyan & Zisserman 2015), torchvision definition",
)
def vgg16(num_classes: int = 1000) -> nn.Module:
    """torchvision ``vgg16``: 138,357,544 parameters."""
    return VGG(_vgg_features(_VGG16_CFG), num_classes=num_classes)


@register_model(
    "googlenet",
    input_shape=_IMAGENET,
    family="vision",
    source="edgesplit",
    description="GoogLeNet (Szegedy et al. 2015), torchvision definition without aux heads",
)
def googlenet(num_classes: int = 1000) -> nn.Module:
    """torchvision ``googlenet(aux_logits=False)``: 6,624,904 parameters."""
    return GoogLeNet(num_classes=num_classes)


@register_model(
    "mnasnet",
    input_shape=_IMAGENET,
    family="vision",
    source="edgesplit",
    description="MNASNet-B1 1.0 (Tan et al. 2019), torchvision mnasnet1_0 definition",
)
def mnasnet(num_classes: int = 1000) -> nn.Module:
    """torchvision ``mnasnet1_0``: 4,383,312 parameters."""
    return MNASNet(alpha=1.0, num_classes=num_classes)


@register_model(
    "resnext50",
    input_shape=_IMAGENET,
    family="vision",
    source="edgesplit",
    description="ResNeXt-50 32x4d (Xie et al. 2017), torchvision resnext50_32x4d definition",
)
def resnext50(num_classes: int = 1000) -> nn.Module:
    """torchvision ``resnext50_32x4d``: 25,028,904 parameters."""
    return ResNet(Bottleneck, [3, 4, 6, 3], groups=32, width_per_group=4, num_classes=num_classes)


@register_model(
    "yolov3_tiny",
    input_shape=(1, 3, 416, 416),
    family="vision",
    source="edgesplit",
    description="YOLOv3-tiny (Redmon & Farhadi 2018), Darknet yolov3-tiny.cfg, raw heads",
)
def yolov3_tiny(num_classes: int = 80) -> nn.Module:
    """Darknet ``yolov3-tiny.cfg`` with 80 classes: 8,858,734 parameters."""
    return YOLOv3Tiny(num_classes=num_classes)


@register_model(
    "resnet1202",
    input_shape=(1, 3, 32, 32),
    family="vision",
    source="edgesplit",
    description="CIFAR-10 ResNet-1202 (He et al. 2016, sec. 4.2), option-A shortcuts",
)
def resnet1202(num_classes: int = 10) -> nn.Module:
    """CIFAR-10 ResNet-1202 (n=200): about 19.4 M parameters."""
    return CifarResNet([200, 200, 200], num_classes=num_classes)
