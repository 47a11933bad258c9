"""Basic blocks of a captured model (AdaptiveNet section 4.1): the smallest replaceable units.

A block is a run of layers of the topological order that reads one tensor of the main path and
hands one on: the cut before and after it carries exactly one tensor that depends on the main
input (the first model input), plus any number of *side* tensors computed from the other inputs
alone (an attention mask and what is derived from it). Side layers run once per batch and every
block may read their tensors, which is what lets transformer encoders split into layers.

Among those cuts we keep the natural ones, without per-model code:

- a residual join (the producing layer reads two tensors of the main path),
- a narrow point (the tensor has no more elements than the neighbouring candidate cuts: the
  bottleneck of an inverted residual block rather than its wide expansion);

then a block with almost no weights (a lone layer norm or pooling) joins its predecessor, and a
block over ``gamma * P0`` parameters is split again at its own candidate cuts where it can be
(the paper's granularity limit). LayerGraph layers are fused already, so a block never splits a
fused layer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from edgesplit.errors import ConfigError, GraphError, option
from edgesplit.graph.ir import LayerGraph

__all__ = ["Block", "BlockSplit", "describe_blocks", "find_blocks"]


@dataclass(frozen=True)
class Block:
    """Layers ``layers`` (topological order) from main tensor ``input`` to main tensor
    ``output``."""

    index: int
    layers: tuple[str, ...]
    input: str
    output: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: int
    macs: int


@dataclass(frozen=True)
class BlockSplit:
    """A model cut into blocks: the blocks in order, and the side layers (off the main path)."""

    blocks: tuple[Block, ...]
    side_layers: tuple[str, ...]
    main_input: str
    output: str
    total_params: int


def _main_layers(graph: LayerGraph, main: str) -> set[str]:
    on_path: set[str] = set()
    for layer in graph.layers:
        if any(t == main or graph.tensors[t].producer in on_path for t in layer.inputs):
            on_path.add(layer.name)
    return on_path


def _candidates(graph: LayerGraph, main: str, on_path: set[str]) -> list[tuple[int, str]]:
    """(cut index, main tensor) for every cut with exactly one main-path tensor live."""
    found = []
    for cut in graph.cuts():
        mains = [t for t in cut.tensors if t.name == main or t.producer in on_path]
        if len(mains) == 1:
            found.append((cut.index, mains[0].name))
    return found


def _natural(graph: LayerGraph, cands: list[tuple[int, str]], on_path: set[str]) -> list[bool]:
    sizes = [graph.tensors[t].elements for _, t in cands]
    keep = []
    for k, (index, _) in enumerate(cands):
        if k in (0, len(cands) - 1):
            keep.append(True)
            continue
        producer = graph.layers[index]
        main_inputs = [t for t in producer.inputs if graph.tensors[t].producer in on_path]
        narrow = sizes[k] <= sizes[k - 1] and sizes[k] <= sizes[k + 1]
        keep.append(len(main_inputs) >= 2 or narrow)
    return keep


def _params(graph: LayerGraph, first: int, last: int, on_path: set[str]) -> int:
    return sum(graph.layers[i].params for i in range(first, last + 1)
               if graph.layers[i].name in on_path)


def find_blocks(graph: LayerGraph, *, gamma: float = 0.25, min_fraction: float = 0.002
                ) -> BlockSplit:
    """Cut ``graph`` into basic blocks (see the module docstring).

    ``gamma`` bounds a block's parameters by ``gamma * P0`` where the block can be split;
    blocks under ``min_fraction * P0`` parameters join the block before them.
    """
    if not 0 < gamma <= 1:
        raise ConfigError(f"{option('gamma', gamma)} must be in (0, 1]: it bounds a block's "
                          "parameters as a fraction of the model's")
    if len(graph.outputs) != 1:
        raise GraphError(f"{graph.model} returns {len(graph.outputs)} tensors; AdaptiveNet "
                         "elastifies models with one output tensor")
    main = graph.inputs[0]
    on_path = _main_layers(graph, main)
    cands = _candidates(graph, main, on_path)
    if not cands or cands[-1][1] != graph.outputs[0]:
        raise GraphError(f"{graph.model}: the output is not on the main path of "
                         f"{main!r}; cannot cut it into blocks")
    keep = _natural(graph, cands, on_path)
    cuts = [c for c, k in zip(cands, keep, strict=True) if k]
    total = graph.total_params
    cuts = _join_small(graph, cuts, on_path, min_fraction * total)
    cuts = _split_large(graph, cuts, cands, on_path, gamma * total, min_fraction * total)
    blocks = [_block(graph, k, cuts[k], cuts[k + 1], on_path) for k in range(len(cuts) - 1)]
    side = tuple(layer.name for layer in graph.layers if layer.name not in on_path)
    return BlockSplit(tuple(blocks), side, main, graph.outputs[0], total)


def _join_small(graph: LayerGraph, cuts: list[tuple[int, str]], on_path: set[str],
                least: float) -> list[tuple[int, str]]:
    """Drop the cut before (for the first block: after) each block lighter than ``least``
    parameters, so it joins its neighbour; the input and output cuts always stay."""
    cuts = list(cuts)
    k = 0
    while k < len(cuts) - 1 and len(cuts) > 2:
        params = _params(graph, cuts[k][0] + 1, cuts[k + 1][0], on_path)
        if params >= least:
            k += 1
        elif k > 0:
            del cuts[k]  # the block joins its predecessor (a post-norm ends its layer)
        else:
            del cuts[k + 1]  # the first block absorbs its successor
    return cuts


def _split_large(graph: LayerGraph, cuts: list[tuple[int, str]],
                 cands: list[tuple[int, str]], on_path: set[str], most: float, least: float
                 ) -> list[tuple[int, str]]:
    """Re-insert candidate cuts inside blocks over ``most`` parameters, greedily, so each piece
    stays under the limit where a cut allows it (and no piece falls under ``least``)."""
    out = [cuts[0]]
    for start, end in itertools.pairwise(cuts):
        if _params(graph, start[0] + 1, end[0], on_path) > most:
            inner = [c for c in cands if start[0] < c[0] < end[0]]
            last = start
            for k, cut in enumerate(inner):
                nxt = inner[k + 1] if k + 1 < len(inner) else end
                over = _params(graph, last[0] + 1, nxt[0], on_path) > most
                if over and min(_params(graph, last[0] + 1, cut[0], on_path),
                                _params(graph, cut[0] + 1, end[0], on_path)) >= least:
                    out.append(cut)
                    last = cut
        out.append(end)
    return out


def _block(graph: LayerGraph, index: int, start: tuple[int, str], end: tuple[int, str],
           on_path: set[str]) -> Block:
    layers = tuple(graph.layers[i].name for i in range(start[0] + 1, end[0] + 1)
                   if graph.layers[i].name in on_path)
    return Block(
        index=index, layers=layers, input=start[1], output=end[1],
        in_shape=graph.tensors[start[1]].shape, out_shape=graph.tensors[end[1]].shape,
        params=_params(graph, start[0] + 1, end[0], on_path),
        macs=sum(graph.layer(name).macs for name in layers),
    )


def describe_blocks(split: BlockSplit) -> Sequence[str]:
    """One line per block (for logs and errors)."""
    return [f"block {b.index}: {len(b.layers)} layers, {b.params} params, "
            f"{list(b.in_shape)} -> {list(b.out_shape)}" for b in split.blocks]

