"""What a latency model needs to know about one layer: its work at given bit-widths."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgesplit.graph import Layer, LayerGraph

__all__ = ["LayerWork"]


@dataclass(frozen=True)
class LayerWork:
    """MACs, FLOPs and bytes moved by one call of a layer.

    ``weight_bytes``/``input_bytes``/``output_bytes`` are at the requested bit-widths (weights at
    ``w_bits``, activations at ``a_bits``; None keeps each tensor's own dtype)."""

    name: str
    op_class: str
    macs: int
    flops: int
    params: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    bits: int = 32  # precision the arithmetic needs: the wider of weights and activations

    @property
    def bytes_moved(self) -> int:
        return self.weight_bytes + self.input_bytes + self.output_bytes

    @property
    def bytes_touched(self) -> int:
        """The bytes a call really streams: ``bytes_moved``, except that an embedding gathers
        one row per output element instead of reading its whole table (a 30k-word table is
        tens of MB, of which a sentence reads a few KB)."""
        if self.op_class == "embedding":
            return min(self.weight_bytes, self.output_bytes) + self.input_bytes + self.output_bytes
        return self.bytes_moved

    @classmethod
    def of(cls, graph: LayerGraph, layer: Layer | str, *, w_bits: int | None = None,
           a_bits: int | None = None) -> LayerWork:
        layer = graph.layer(layer) if isinstance(layer, str) else layer

        def size(names: tuple[str, ...]) -> int:
            tensors = [graph.tensors[t] for t in names]
            if a_bits is None:
                return sum(t.bytes for t in tensors)
            return sum(t.bytes_at(a_bits) for t in tensors)

        weights = layer.param_bytes if w_bits is None else math.ceil(layer.params * w_bits / 8)
        bits = max(w_bits or 32, a_bits or 32)
        return cls(layer.name, layer.op_class, layer.macs, layer.flops, layer.params, weights,
                   size(layer.inputs), size(layer.outputs), bits)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
