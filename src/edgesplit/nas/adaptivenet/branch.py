"""One block of the supernet as a self-contained module: a copy of the block's FX graph that
owns its weights under flat names.

Original blocks keep the pretrained weights as buffers (frozen: AdaptiveNet never changes the
pretrained model); added blocks hold theirs as parameters, so an optimiser over
``supernet.parameters()`` trains exactly the new branches.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn
from torch.fx import GraphModule

from edgesplit.errors import GraphError
from edgesplit.graph.passes import free_batch

__all__ = ["BlockModule", "free_batch", "own_weights"]  # free_batch: from graph.passes


def own_weights(gm: GraphModule, *, trainable: bool) -> GraphModule:
    """A copy of ``gm`` whose ``get_attr`` weights are its own flat attributes: float tensors
    of more than one element as parameters when ``trainable`` (else buffers), the rest as
    buffers."""
    graph = copy.deepcopy(gm.graph)
    holder = nn.Module()
    names: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        target = str(node.target)
        if target not in names:
            value = _fetch(gm, target).detach().clone()
            flat = f"w{len(names)}"
            learn = trainable and value.is_floating_point() and value.numel() > 1
            if learn:
                holder.register_parameter(flat, nn.Parameter(value))
            else:
                holder.register_buffer(flat, value)
            names[target] = flat
        node.target = names[target]
    return GraphModule(holder, graph, class_name="Block")


def _fetch(gm: GraphModule, target: str) -> torch.Tensor:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise GraphError(f"block weight {target!r} is a {type(value).__name__}, not a tensor")
    return value


class BlockModule(nn.Module):
    """``forward(main, side) -> main``: the block's graph with the main tensor and the side
    tensors it reads (by name) as inputs."""

    def __init__(self, gm: GraphModule, inputs: tuple[str, ...], main: str) -> None:
        super().__init__()
        if main not in inputs:
            raise GraphError(f"the block does not read its main input {main!r}")
        self.gm = gm
        self.inputs = inputs
        self.main = main

    @property
    def side_inputs(self) -> tuple[str, ...]:
        return tuple(name for name in self.inputs if name != self.main)

    def forward(self, x: torch.Tensor, side: Mapping[str, torch.Tensor]) -> torch.Tensor:
        args = [x if name == self.main else side[name] for name in self.inputs]
        (out,) = self.gm(*args)
        return out

    def copy(self, *, trainable: bool) -> BlockModule:
        """A deep copy with its own weights (the seed of a merged or shrunk block)."""
        return BlockModule(own_weights(self.gm, trainable=trainable), self.inputs, self.main)

    @property
    def num_params(self) -> int:
        return sum(t.numel() for t in (*self.gm.parameters(), *self.gm.buffers())
                   if t.is_floating_point() and t.numel() > 1)
