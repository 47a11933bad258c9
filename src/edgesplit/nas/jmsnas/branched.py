"""Networks with a parallel section, for JMSNAS over a mesh of devices (paper 000, Fig. 2b).

In a mesh the root device broadcasts one tensor to parallel branch devices, whose results an
aggregator joins (eq. 2). The searched network takes that shape: a :class:`BranchLayout` copies
the searchable layers ``[fork, join)`` of a space once per branch device, each copy with its
own op choices and weights, and the aggregator joins the copies by their mean before the rest
of the network:

    stem -> layers[:fork] -> { layers[fork:join] }  x branches -> mean -> layers[join:] -> head

The section must keep its input's shape layer by layer (stride 1, constant channels), so every
copy reads the fork tensor and outputs its shape. Then the network's searchable *slots* (the
prefix, every copy, the suffix) form an ordinary linear :class:`SearchSpace`
(:func:`branched_space`): samplers, latency vectors, derivation and JSON all work on it
unchanged; only the forward pass routes the copies in parallel, which is all
:class:`BranchedSupernet` and :class:`BranchedArchNet` change. The join is one ``stack`` of
all copies, so a captured network shows one parallel region with a component per copy, which
the mesh planner places on the branch devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from edgesplit.errors import ConfigError
from edgesplit.nas.jmsnas.network import ArchNet
from edgesplit.nas.jmsnas.space import Arch, SearchSpace
from edgesplit.nas.jmsnas.supernet import Supernet

__all__ = ["BranchLayout", "BranchedArchNet", "BranchedSupernet", "branched_space",
           "shape_keeping_sections"]


@dataclass(frozen=True)
class BranchLayout:
    """Layers ``[fork, join)`` of the base space, copied ``branches`` times."""

    fork: int
    join: int
    branches: int

    def __post_init__(self) -> None:
        if not 0 <= self.fork < self.join:
            raise ConfigError(f"branch section [{self.fork}, {self.join}) must hold at least "
                              "one layer")
        if self.branches < 2:
            raise ConfigError(f"branches={self.branches!r}: a parallel section needs at least two")

    def slots(self, layers: int) -> list[int]:
        """The base layer of every searchable slot: prefix, each copy, suffix."""
        section = list(range(self.fork, self.join))
        return [*range(self.fork), *(section * self.branches), *range(self.join, layers)]

    def to_dict(self) -> dict[str, int]:
        return {"fork": self.fork, "join": self.join, "branches": self.branches}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BranchLayout:
        return cls(int(data["fork"]), int(data["join"]), int(data["branches"]))


def shape_keeping_sections(space: SearchSpace) -> list[tuple[int, int]]:
    """Every ``(fork, join)`` whose layers all keep their input's shape."""
    found = []
    for fork in range(len(space.layers)):
        join = fork
        while join < len(space.layers) and space.skippable(join):
            join += 1
            found.append((fork, join))
    return found


def branched_space(space: SearchSpace, layout: BranchLayout) -> SearchSpace:
    """The linear space of ``layout``'s slots (valid because the section keeps its shape)."""
    if layout.join > len(space.layers):
        raise ConfigError(f"branch section [{layout.fork}, {layout.join}) runs past the "
                          f"{len(space.layers)} layers of space {space.name!r}")
    if (layout.fork, layout.join) not in shape_keeping_sections(space):
        options = ", ".join(f"{f}:{j}" for f, j in shape_keeping_sections(space)) or "none"
        raise ConfigError(f"layers {layout.fork}:{layout.join} of space {space.name!r} change "
                          "the shape, so their copies could not all read the fork tensor and "
                          f"be averaged; sections that keep it: {options}")
    layers = tuple(space.layers[i] for i in layout.slots(len(space.layers)))
    name = f"{space.name}[{layout.fork}:{layout.join}x{layout.branches}]"
    return SearchSpace(name, space.input_shape, space.num_classes, space.stem, layers, space.head)


def _route(layers: list[torch.nn.Module | None], layout: BranchLayout,
           x: torch.Tensor) -> torch.Tensor:
    """Run the slots in the layout's shape (``None``: a dropped identity slot)."""
    prefix, width = layout.fork, layout.join - layout.fork
    for layer in layers[:prefix]:
        x = x if layer is None else layer(x)
    outs = []
    for b in range(layout.branches):
        y = x
        for layer in layers[prefix + b * width: prefix + (b + 1) * width]:
            y = y if layer is None else layer(y)
        outs.append(y)
    x = torch.stack(outs).mean(0)  # one join layer reading every copy: one parallel region
    for layer in layers[prefix + layout.branches * width:]:
        x = x if layer is None else layer(x)
    return x


class BranchedSupernet(Supernet):
    """The supernet of ``branched_space(space, layout)``, run with its copies in parallel."""

    def __init__(self, space: SearchSpace, layout: BranchLayout, *, channels_last: bool = True,
                 weights: Literal["separate", "shared"] = "separate") -> None:
        super().__init__(space, channels_last=channels_last, weights=weights)
        self.layout = layout

    def forward_layers(self, x: torch.Tensor) -> torch.Tensor:
        return _route(list(self.layers), self.layout, x)

    def extract(self, arch: Arch | None = None) -> BranchedArchNet:
        plain = super().extract(arch)
        with torch.device("meta"):
            net = BranchedArchNet(self.space, plain.arch, self.layout)
        net = net.to_empty(device=next(iter(plain.state_dict().values())).device)
        net.load_state_dict(plain.state_dict(), strict=True)
        return net.train(self.training)


class BranchedArchNet(ArchNet):
    """The plain network of one architecture of a branched space."""

    def __init__(self, space: SearchSpace, arch: Arch, layout: BranchLayout) -> None:
        super().__init__(space, arch)
        self.layout = layout

    def forward_layers(self, x: torch.Tensor) -> torch.Tensor:
        present = dict(self.layers.items())  # identity slots were dropped
        layers = [present.get(str(i)) for i in range(len(self.space.layers))]
        return _route(layers, self.layout, x)
