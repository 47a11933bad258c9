"""The plain network of one architecture (:class:`ArchNet`) and the stem and head it shares
with the supernet.

An ArchNet has no mixed ops and no identity layers: it is what gets exported, captured into a
LayerGraph, split and deployed. Its searchable layers sit in ``layers``, a ModuleDict keyed by
the layer's index *in the space*, so a skipped layer leaves a gap (``layers.0``, ``layers.2``)
and a captured layer named ``layers.3.depthwise`` always belongs to searchable layer 3.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.nas.jmsnas.space import Arch, SearchSpace

__all__ = ["ArchNet", "ChainFrame", "init_weights"]


class ChainFrame(nn.Module):
    """Stem and head of a space, around searchable layers that subclasses provide.

    Flat attributes (``stem``, ``stem_bn``, ``head``, ``head_bn``, ``pool``, ``classifier``) give
    captured layers short names and let the supernet and an ArchNet share state-dict keys for
    everything outside ``layers``, which is how :meth:`Supernet.extract` copies them.
    """

    def __init__(self, space: SearchSpace) -> None:
        super().__init__()
        self.space = space
        c = space.stem
        self.stem = nn.Conv2d(space.input_shape[0], c.out_channels, c.kernel, c.stride,
                              c.kernel // 2, bias=False)
        self.stem_bn = nn.BatchNorm2d(c.out_channels)
        width = space.out_channels
        self.head: nn.Conv2d | None = None
        self.head_bn: nn.BatchNorm2d | None = None
        if space.head.channels:
            self.head = nn.Conv2d(width, space.head.channels, 1, bias=False)
            self.head_bn = nn.BatchNorm2d(space.head.channels)
            width = space.head.channels
        self.pool = nn.AdaptiveAvgPool2d(1)  # a module, so the captured layer is named "pool"
        self.classifier = nn.Linear(width, space.num_classes)

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu6(self.stem_bn(self.stem(x)))

    def forward_layers(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        if self.head is not None and self.head_bn is not None:
            x = F.relu6(self.head_bn(self.head(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_layers(self.forward_stem(x)))


def init_weights(module: nn.Module) -> None:
    """MobileNetV2's initialisation (torchvision): what the searched networks are compared to."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)


class ArchNet(ChainFrame):
    """The standalone network of ``arch`` in ``space``, freshly initialised.

    ``Supernet.extract`` returns one with the supernet's weights; ``load_network`` one with
    saved weights. ``arch`` is validated against ``space``.
    """

    def __init__(self, space: SearchSpace, arch: Arch) -> None:
        super().__init__(space)
        self.arch = space.validate(arch)
        self.layers = nn.ModuleDict({
            str(i): op.build(space.in_channels(i), layer.out_channels, layer.stride)
            for i, (op, layer) in enumerate(zip(arch.ops, space.layers, strict=True))
            if not op.is_identity})
        init_weights(self)

    def forward_layers(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x

    @classmethod
    def from_state_dict(cls, space: SearchSpace, arch: Arch,
                        state: Mapping[str, torch.Tensor]) -> ArchNet:
        """The network of ``arch`` holding copies of ``state`` (every key must match).

        Built on the meta device first: no throw-away initialisation, and no draw from the
        global random generator, so extracting a network mid-training does not change what
        the training samples next.
        """
        with torch.device("meta"):
            net = cls(space, arch)
        device = next(iter(state.values())).device if state else torch.device("cpu")
        net = net.to_empty(device=device)
        net.load_state_dict(state, strict=True)
        return net
