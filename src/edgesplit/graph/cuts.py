"""Which tensors cross a cut: for an edge part (a down-set of layers), and for every prefix of
the topological order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgesplit.graph.ir import INPUT, OUTPUT, TensorInfo

if TYPE_CHECKING:
    from edgesplit.graph.ir import LayerGraph

__all__ = ["Cut", "crossing_tensors", "topological_cuts"]


@dataclass(frozen=True)
class Cut:
    """The cut after layer ``index`` of the topological order (-1: before the first layer, i.e.
    the raw input crosses)."""

    index: int
    after: str | None
    tensors: tuple[TensorInfo, ...]

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tensors)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "after": self.after,
            "tensors": [t.name for t in self.tensors],
            "shapes": [list(t.shape) for t in self.tensors],
            "elements": self.elements,
            "bytes": self.bytes,
        }


def crossing_tensors(graph: LayerGraph, edge_layers: Iterable[str], *,
                     include_outputs: bool = True) -> list[TensorInfo]:
    """Tensors produced on the edge (or the raw input) and read by some layer off the edge.

    ``edge_layers`` must be a down-set. A tensor read by several cloud layers crosses once. With
    ``include_outputs`` the model's outputs computed on the edge count as crossing (the result
    must reach the cloud side); without, they stay on the edge.
    """
    edge = graph.check_down_set(edge_layers)
    crossing = []
    for tensor in graph.tensors.values():
        if tensor.producer != INPUT and tensor.producer not in edge:
            continue
        for consumer in tensor.consumers:
            off_edge = consumer not in edge if consumer != OUTPUT else include_outputs
            if off_edge:
                crossing.append(tensor)
                break
    return crossing


def topological_cuts(graph: LayerGraph) -> list[Cut]:
    """The cut after every position of the topological order, -1 (input) to the last layer.

    One sweep: a tensor is live across position i when its producer is at or before i and some
    consumer (or the model output) is after i.
    """
    n = len(graph.layers)
    born: list[list[TensorInfo]] = [[] for _ in range(n + 1)]  # slot 0: the input (-1)
    dies: list[list[str]] = [[] for _ in range(n + 1)]
    for tensor in graph.tensors.values():
        start = -1 if tensor.producer == INPUT else graph.index_of(tensor.producer)
        last = max((n if c == OUTPUT else graph.index_of(c)) for c in tensor.consumers) \
            if tensor.consumers else start
        if last <= start:
            continue
        born[start + 1].append(tensor)
        if last < n:
            dies[last + 1].append(tensor.name)
    live: dict[str, TensorInfo] = {}
    cuts = []
    for i in range(-1, n):
        for name in dies[i + 1]:
            live.pop(name, None)
        for tensor in born[i + 1]:
            live[tensor.name] = tensor
        after = graph.layers[i].name if i >= 0 else None
        cuts.append(Cut(i, after, tuple(live.values())))
    return cuts
