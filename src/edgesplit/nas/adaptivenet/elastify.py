"""Elastification (AdaptiveNet section 4.1): a captured pretrained model becomes a supernet.

The basic blocks (:mod:`.blocks`) keep their pretrained weights, frozen. Two kinds of branch
are added, seeded from the pretrained weights so distillation starts close:

- **merged** ``B_i^(j)`` replaces blocks i..i+j: a copy of the largest of those blocks whose
  input shape is block i's and output shape block i+j's (in a ResNet stage, the downsampling
  block replaces itself and the identity-shaped blocks after it; in a transformer, one layer
  replaces two). Spans with no such block get no merged branch.
- **shrunk** ``B_i^(-k)``: a copy of block i with its internal channels pruned to ``keep_k``
  (:mod:`.prune`), so its input and output shapes are unchanged.

Every path through the branches is then a valid network, and the all-original path is the
pretrained model. A model with neither kind of branch (a chain of single layers, each changing
the shape) is refused here, before any training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from edgesplit.errors import ConfigError, GraphError, option
from edgesplit.graph.ir import LayerGraph
from edgesplit.graph.partition import extract_partition
from edgesplit.nas.adaptivenet.blocks import Block, BlockSplit, find_blocks
from edgesplit.nas.adaptivenet.branch import BlockModule, free_batch, own_weights
from edgesplit.nas.adaptivenet.prune import prune_channels
from edgesplit.nas.adaptivenet.space import Branch, ElasticSpace, branch_name
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet, SideInputs

__all__ = ["ElasticConfig", "branch_macs", "elastify"]


@dataclass(frozen=True)
class ElasticConfig:
    """How to elastify: block granularity (``gamma``, ``min_fraction``: see
    :func:`~.blocks.find_blocks`), the most blocks a merged branch removes (``merge``; 0: none)
    and the channel fractions shrunk branches keep (``shrink``, largest first; empty: none).
    The paper's small-model setting is merge 2 with shrink 0.5 and 0.25."""

    gamma: float = 0.25
    min_fraction: float = 0.002
    merge: int = 2
    shrink: tuple[float, ...] = field(default=(0.5, 0.25))

    def __post_init__(self) -> None:
        if not isinstance(self.merge, int) or self.merge < 0:
            raise ConfigError(f"{option('merge', self.merge)} must be a whole number >= 0 "
                              "(the most blocks one merged branch removes)")
        shrink = tuple(float(k) for k in self.shrink)
        if any(not 0 < k < 1 for k in shrink) or list(shrink) != sorted(shrink, reverse=True) \
                or len(set(shrink)) != len(shrink):
            raise ConfigError(f"{option('shrink', ','.join(map(str, self.shrink)))} must be "
                              "distinct fractions in (0, 1), largest first, e.g. 0.5,0.25")
        object.__setattr__(self, "shrink", shrink)
        if not 0 <= self.min_fraction < self.gamma <= 1:
            raise ConfigError(f"need 0 <= {option('min_fraction', self.min_fraction)} < "
                              f"{option('gamma', self.gamma)} <= 1")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shrink"] = list(self.shrink)
        return data


def _original(graph: LayerGraph, block: Block, batch: int) -> BlockModule:
    part = extract_partition(graph, block.layers)
    if part.outputs != (block.output,):
        raise GraphError(f"block {block.index} of {graph.model} hands on {part.outputs}, "
                         f"not only its main tensor {block.output!r}")
    gm = own_weights(part.module, trainable=False)
    free_batch(gm, batch)
    return BlockModule(gm, part.inputs, block.input)


def _side(graph: LayerGraph, split: BlockSplit, batch: int) -> SideInputs:
    if not split.side_layers:
        return SideInputs(graph.inputs, None, (), ())
    part = extract_partition(graph, split.side_layers)
    gm = own_weights(part.module, trainable=False)
    free_batch(gm, batch)
    return SideInputs(graph.inputs, gm, part.inputs, part.outputs)


def _merged(split: BlockSplit, originals: Sequence[BlockModule], merge: int
            ) -> list[tuple[Branch, BlockModule]]:
    blocks = split.blocks
    found = []
    for i in range(len(blocks)):
        for j in range(1, merge + 1):
            if i + j >= len(blocks):
                break
            donors = [k for k in range(i, i + j + 1)
                      if blocks[k].in_shape == blocks[i].in_shape
                      and blocks[k].out_shape == blocks[i + j].out_shape]
            if not donors:
                continue
            donor = max(donors, key=lambda k: (blocks[k].params, -k))
            branch = Branch(branch_name(i, j), i, i + j + 1, j, donor)
            found.append((branch, originals[donor].copy(trainable=True)))
    return found


def _shrunk(originals: Sequence[BlockModule], shrink: Sequence[float]
            ) -> list[tuple[Branch, BlockModule]]:
    found = []
    for i, block in enumerate(originals):
        for level, keep in enumerate(shrink, start=1):
            module = block.copy(trainable=True)
            if prune_channels(module.gm, keep) == 0:
                break  # nothing inside this block to prune
            found.append((Branch(branch_name(i, -level), i, i + 1, -level, i, keep), module))
    return found


def _check_added(model: str, split: BlockSplit, branches: Sequence[Branch],
                 config: ElasticConfig) -> None:
    """Refuse a model AdaptiveNet can add no branch to, before any data is read or trained:
    its search space would hold the pretrained model alone."""
    if any(b.level != 0 for b in branches):
        return
    if not config.merge and not config.shrink:
        raise ConfigError(f"{option('merge', 0)} and no {option('shrink')} fractions add no "
                          "branch to train: allow merged or shrunk branches")
    shapes = ", ".join(f"{_dims(b.in_shape)}->{_dims(b.out_shape)}" for b in split.blocks[:6])
    more = ", ..." if len(split.blocks) > 6 else ""
    raise ConfigError(
        f"AdaptiveNet finds nothing to elastify in {model}: cut into {len(split.blocks)} blocks "
        f"({shapes}{more}), none keeps the shape it is given, so no merged branch can skip one, "
        "and none holds two layers in a row whose inner channels a shrunk branch could prune. "
        "It needs a model built of repeated blocks such as residual or inverted-residual ones "
        "(ResNet, MobileNetV2, a transformer encoder), or blocks of several convolutions; "
        "a chain of single layers that each change the shape has no block to skip or shrink")


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape[1:])  # without the batch


def _check_batch(supernet: ElasticSupernet, graph: LayerGraph) -> None:
    """The blocks must give the captured model's output, and a batch of different samples the
    outputs of each sample alone (the freed batch dimension mixes no samples)."""
    example = graph.example_inputs
    if not example or graph.program is None:
        return
    batch = _distinct_batch(example)
    with torch.no_grad():
        together = supernet(*batch)
        alone = [supernet(*(x[i:i + 1] for x in batch)) for i in range(batch[0].shape[0])]
        reference = graph.program(*example)
    ref = reference[0] if isinstance(reference, (tuple, list)) else reference
    if not torch.allclose(alone[0], ref, rtol=1e-4, atol=1e-5):
        raise GraphError(f"the blocks of {graph.model} do not reproduce its output; "
                         "AdaptiveNet cannot elastify this model")
    if not torch.allclose(together, torch.cat(alone), rtol=1e-4, atol=1e-4):
        raise GraphError(f"{graph.model} mixes samples of a batch once cut into blocks (its "
                         "capture baked the batch size into an operator); AdaptiveNet "
                         "elastifies batch-first models")


def _distinct_batch(example: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Three samples: the example, and two variants (floats perturbed, integers rolled along
    the last dimension, so token ids and masks stay valid)."""
    def variants(x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point():
            gen = torch.Generator().manual_seed(1)
            noise = torch.randn(2, *x.shape[1:], generator=gen, dtype=x.dtype)
            return torch.cat([x[:1], x[:1] + noise[:1], x[:1] * 0.5 + noise[1:]])
        shorter = x[:1].clone()
        if x.dim() > 1:
            shorter[..., x.shape[-1] // 2:] = x[:1, ..., -1:]  # pad-like tail
        return torch.cat([x[:1], torch.roll(x[:1], 1, dims=-1), shorter])
    return tuple(variants(x) for x in example)


def branch_macs(supernet: ElasticSupernet, example: Sequence[torch.Tensor]) -> dict[str, int]:
    """Multiply-accumulates of every branch for one sample, counted by torch's FLOP counter on
    the tensor that reaches the branch along the pretrained path (matmul and conv FLOPs / 2)."""
    from torch.utils.flop_counter import FlopCounterMode

    one = tuple(x[:1] for x in example)
    with torch.no_grad():
        side = supernet.side_tensors(*one)
        starts = [one[0]]
        for name in supernet.space.original:
            starts.append(supernet.branch(name)(starts[-1], side))
        macs = {}
        for branch in supernet.space.branches:
            counter = FlopCounterMode(display=False)
            with counter:
                supernet.branch(branch.name)(starts[branch.start], side)
            macs[branch.name] = counter.get_total_flops() // 2
    return macs


def elastify(graph: LayerGraph, config: ElasticConfig | None = None, *,
             source: Any = None) -> ElasticSupernet:
    """The supernet of ``graph`` (a captured pretrained model) under ``config``.

    ``source`` says how to capture the model again (name, input shape...): a checkpoint keeps
    it so the supernet can be rebuilt before its trained weights are loaded.
    """
    config = config or ElasticConfig()
    if graph.program is None:
        raise GraphError("this LayerGraph has no program to elastify (capture it again)")
    batch = graph.tensors[graph.inputs[0]].shape[0]
    split = find_blocks(graph, gamma=config.gamma, min_fraction=config.min_fraction)
    originals = [_original(graph, block, batch) for block in split.blocks]
    pairs = [(Branch(branch_name(i, 0), i, i + 1, 0, i), m) for i, m in enumerate(originals)]
    pairs += _merged(split, originals, config.merge)
    pairs += _shrunk(originals, config.shrink)
    _check_added(graph.model, split, [b for b, _ in pairs], config)
    pairs.sort(key=lambda p: (p[0].start, -p[0].level))
    space = ElasticSpace(len(split.blocks), tuple(b for b, _ in pairs))
    meta = {"model": graph.model, "source": source, "config": config.to_dict(),
            "blocks": [asdict(b) for b in split.blocks], "total_params": split.total_params}
    supernet = ElasticSupernet(space, {b.name: m for b, m in pairs}, _side(graph, split, batch),
                               meta)
    _check_batch(supernet, graph)
    supernet.meta["branch_macs"] = branch_macs(supernet, graph.example_inputs)
    return supernet.eval()
