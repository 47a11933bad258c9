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

__all__ = ["BlockModule", "free_batch", "own_weights"]


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


_SHAPED = (torch.ops.aten.view.default, torch.ops.aten.reshape.default,
           torch.ops.aten.expand.default, torch.ops.aten._unsafe_view.default)


def free_batch(gm: GraphModule, batch: int) -> int:
    """Let ``gm`` (captured at batch size ``batch``) run at any batch size, in place.

    torch.export bakes the example's batch size into ``view`` / ``reshape`` / ``expand``
    shapes; each shape whose first entry is ``batch`` gets its input's own size 0 instead. The
    caller checks the result against the captured model (a model that moves the batch out of
    dimension 0 before such a reshape is not batch-first, and is refused there). Returns how
    many shapes were rewritten.
    """
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SHAPED or len(node.args) < 2:
            continue
        shape = node.args[1]
        if not isinstance(shape, (list, tuple)) or len(shape) < 2 or shape[0] != batch:
            continue
        with gm.graph.inserting_before(node):
            size = gm.graph.call_function(torch.ops.aten.sym_size.int, (node.args[0], 0))
        node.args = (node.args[0], [size, *shape[1:]], *node.args[2:])
        count += 1
    if count:
        gm.recompile()
    return count


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
