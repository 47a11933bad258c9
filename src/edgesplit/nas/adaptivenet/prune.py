"""Structured pruning of a block's FX graph: the shrunk blocks of AdaptiveNet (section 4.1).

A *channel group* is a convolution or linear layer whose output channels reach exactly one
consumer convolution or linear layer through channel-wise operators only (activations, dropout,
depthwise convolutions, which keep channel ``c`` in channel ``c``). Removing output channel
``c`` of the producer, channel ``c`` of every depthwise layer on the way and input channel
``c`` of the consumer leaves the block's input and output shapes as they were. Channels with
the smallest L1 weight norm go first (the usual magnitude criterion).

torch-pruning finds such groups on ``nn.Module`` layers (``nn.Conv2d``...); a captured program
calls ``aten.conv2d`` / ``aten.linear`` on plain tensors, which it does not see, so this works
on the graph instead (docs/design/handwritten.md notes where we hand-wrote instead of using
a library).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule, Node

__all__ = ["ChannelGroup", "channel_groups", "prune_channels"]

_aten = torch.ops.aten
_CONV = _aten.conv2d.default
_LINEAR = _aten.linear.default
_CHANNELWISE = {
    _aten.relu.default, _aten.relu_.default, _aten.hardtanh.default, _aten.hardtanh_.default,
    _aten.gelu.default, _aten.silu.default, _aten.sigmoid.default, _aten.hardswish.default,
    _aten.dropout.default, _aten.clone.default, _aten.tanh.default,
}


@dataclass(frozen=True)
class ChannelGroup:
    """Producer node, the depthwise convolutions on the way, and the consumer node."""

    producer: str
    through: tuple[str, ...]
    consumer: str
    channels: int


def _groups(node: Node) -> int:
    return int(node.args[6]) if len(node.args) > 6 else 1  # type: ignore[arg-type]


def _weight(gm: GraphModule, node: Node) -> torch.Tensor | None:
    arg = node.args[1]
    if not isinstance(arg, Node) or arg.op != "get_attr" or len(arg.users) != 1:
        return None
    value = getattr(gm, str(arg.target))
    return value if isinstance(value, torch.Tensor) else None


def _depthwise(gm: GraphModule, node: Node, channels: int) -> bool:
    weight = _weight(gm, node)
    return (weight is not None and _groups(node) == channels == weight.shape[0]
            and weight.shape[1] == 1)


def _follow(gm: GraphModule, producer: Node, channels: int) -> ChannelGroup | None:
    through: list[str] = []
    node = producer
    while True:
        if len(node.users) != 1:
            return None
        (user,) = node.users
        if user.op != "call_function" or user.args[0] is not node:
            return None
        if user.target in _CHANNELWISE and user.all_input_nodes == [node]:
            node = user
        elif user.target is _CONV and producer.target is _CONV \
                and _depthwise(gm, user, channels):
            through.append(user.name)
            node = user
        elif user.target in (_CONV, _LINEAR) and _weight(gm, user) is not None \
                and (user.target is _LINEAR or _groups(user) == 1):
            return ChannelGroup(producer.name, tuple(through), user.name, channels)
        else:
            return None


def channel_groups(gm: GraphModule) -> list[ChannelGroup]:
    """Every prunable channel group of ``gm`` (see the module docstring)."""
    groups = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (_CONV, _LINEAR):
            continue
        if node.target is _CONV and _groups(node) != 1:
            continue
        weight = _weight(gm, node)
        if weight is None or weight.shape[0] < 2:
            continue
        group = _follow(gm, node, weight.shape[0])
        if group is not None:
            groups.append(group)
    return groups


def _replace(gm: GraphModule, node: Node, index: int, value: torch.Tensor) -> None:
    arg = node.args[index]
    if not isinstance(arg, Node):
        return
    name = str(arg.target)
    old = getattr(gm, name)
    delattr(gm, name)
    if isinstance(old, nn.Parameter):
        gm.register_parameter(name, nn.Parameter(value.contiguous()))
    else:
        gm.register_buffer(name, value.contiguous())


def _slice(gm: GraphModule, node: Node, index: int, keep: torch.Tensor, dim: int) -> None:
    arg = node.args[index] if len(node.args) > index else None
    if isinstance(arg, Node):
        _replace(gm, node, index, getattr(gm, str(arg.target)).detach().index_select(dim, keep))


def prune_channels(gm: GraphModule, keep: float) -> int:
    """Keep ``keep`` of each channel group's channels (at least one), in place; returns how many
    groups were pruned (0: the block has nothing to shrink)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    groups = channel_groups(gm)
    for group in groups:
        producer = nodes[group.producer]
        weight = _weight(gm, producer)
        assert weight is not None
        count = max(1, round(group.channels * keep))
        norms = weight.detach().reshape(weight.shape[0], -1).abs().sum(1)
        chosen = torch.topk(norms, count).indices.sort().values
        _slice(gm, producer, 1, chosen, 0)
        _slice(gm, producer, 2, chosen, 0)
        for name in group.through:
            dw = nodes[name]
            _slice(gm, dw, 1, chosen, 0)
            _slice(gm, dw, 2, chosen, 0)
            dw.args = (*dw.args[:6], count, *dw.args[7:])
        _slice(gm, nodes[group.consumer], 1, chosen, 1)
    gm.recompile()
    return len(groups)
