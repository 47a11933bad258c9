"""The elastified supernet: every branch of an :class:`ElasticSpace` as a module, the side
layers, and the forward pass of any subnet (a path of branches)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from edgesplit.nas.adaptivenet.branch import BlockModule
from edgesplit.nas.adaptivenet.space import ElasticSpace, SubnetArch

__all__ = ["ElasticSupernet", "Subnet", "module_key"]


def module_key(branch: str) -> str:
    """A branch name as a module attribute (``b3+1`` -> ``b3p1``, ``b3-2`` -> ``b3m2``)."""
    return branch.replace("+", "p").replace("-", "m")


class SideInputs(nn.Module):
    """The model inputs by name, plus what the side layers compute from the non-main ones."""

    def __init__(self, input_names: tuple[str, ...], gm: GraphModule | None,
                 reads: tuple[str, ...], gives: tuple[str, ...]) -> None:
        super().__init__()
        self.input_names = input_names
        self.gm = gm
        self.reads = reads
        self.gives = gives

    def forward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        side = dict(zip(self.input_names, inputs, strict=True))
        if self.gm is not None:
            side.update(zip(self.gives, self._side(*(side[n] for n in self.reads)), strict=True))
        return side

    def _side(self, *reads: torch.Tensor) -> list[torch.Tensor]:
        # One sample at a time: constant folding at capture time bakes the example's batch
        # into mask indexing (BERT's mask is gathered with a folded arange(batch)), and these
        # layers cost next to nothing.
        assert self.gm is not None
        if reads[0].shape[0] == 1:
            return list(self.gm(*reads))
        rows = [self.gm(*(r[i:i + 1] for r in reads)) for i in range(reads[0].shape[0])]
        return [torch.cat(parts) for parts in zip(*rows, strict=True)]


class ElasticSupernet(nn.Module):
    """All branches of ``space`` (``branches`` by branch name) over one set of side inputs.

    ``forward(*inputs, arch=None)`` runs a subnet (default: the pretrained path). ``meta``
    records where the supernet came from (model, input shape, elastification options, blocks)
    so a checkpoint can rebuild it.
    """

    def __init__(self, space: ElasticSpace, branches: Mapping[str, BlockModule],
                 side: SideInputs, meta: Mapping[str, Any]) -> None:
        super().__init__()
        self.space = space
        self.side = side
        self.branches = nn.ModuleDict({module_key(n): branches[n] for n in space.by_name})
        self.meta = dict(meta)

    @property
    def main_input(self) -> str:
        return self.side.input_names[0]

    def branch(self, name: str) -> BlockModule:
        module = self.branches[module_key(name)]
        assert isinstance(module, BlockModule)
        return module

    def side_tensors(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.side(*inputs)

    def run(self, x: torch.Tensor, side: Mapping[str, torch.Tensor], path: Sequence[str]
            ) -> torch.Tensor:
        """Run the branches ``path`` (a part of a subnet) from main tensor ``x``."""
        for name in path:
            x = self.branch(name)(x, side)
        return x

    def forward(self, *inputs: torch.Tensor, arch: Sequence[str] | None = None
                ) -> torch.Tensor:
        path = self.space.original if arch is None else self.space.check(arch)
        return self.run(inputs[0], self.side_tensors(*inputs), path)

    def added_parameters(self, arch: Sequence[str] | None = None) -> Iterator[nn.Parameter]:
        """The trainable parameters (of the added branches; of those in ``arch`` if given)."""
        names = self.space.by_name if arch is None else arch
        for name in names:
            yield from self.branch(name).parameters()

    def subnet(self, arch: Sequence[str]) -> Subnet:
        """The plain network of one subnet (shares the supernet's weights)."""
        arch = self.space.check(arch)
        return Subnet(self.side, [self.branch(n) for n in arch], arch)


class Subnet(nn.Module):
    """One path of the supernet as an ordinary module: what is served, exported and planned."""

    def __init__(self, side: SideInputs, blocks: Sequence[BlockModule], arch: SubnetArch
                 ) -> None:
        super().__init__()
        self.side = side
        self.blocks = nn.ModuleList(blocks)
        self.arch = tuple(arch)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        side = self.side(*inputs)
        x = inputs[0]
        for block in self.blocks:
            x = block(x, side)
        return x
