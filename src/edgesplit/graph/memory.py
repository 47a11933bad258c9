"""Peak memory of running an edge part: weights plus the activation working set.

The schedule is the graph's topological order restricted to the edge layers (AUTO-SPLIT eq. 3
and Fig. 4; SplitNets PeakMem). While layer k runs, live activations are its inputs and outputs
and every tensor produced earlier that a later edge layer still reads, or that must be sent off
the edge (kept until the edge part finishes and its outputs are transmitted). A raw input that no edge layer reads
is held only until it is sent, before the first edge layer runs (so an empty edge part still
needs room for the input). Weights are the union of the attributes the edge layers read, so
tied weights count once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from edgesplit.graph.ir import INPUT, OUTPUT

if TYPE_CHECKING:
    from edgesplit.graph.ir import LayerGraph

__all__ = ["MemoryReport", "peak_memory"]


@dataclass(frozen=True)
class MemoryReport:
    weight_bytes: int
    activation_bytes: int  # peak of the working set
    peak_layer: str | None  # the layer running when the working set peaks
    live_at_peak: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"weight_bytes": self.weight_bytes, "activation_bytes": self.activation_bytes,
                "total_bytes": self.total_bytes, "peak_layer": self.peak_layer,
                "live_at_peak": list(self.live_at_peak)}


def peak_memory(graph: "LayerGraph", edge_layers: Iterable[str], *,
                tensor_bytes: Mapping[str, int] | None = None,
                attribute_bytes: Mapping[str, int] | None = None) -> MemoryReport:
    """Peak memory of executing ``edge_layers`` (a down-set) in topological order.

    ``tensor_bytes`` / ``attribute_bytes`` override sizes by name (e.g. quantized activations or
    weights); anything not named keeps its size at its own dtype.
    """
    edge = graph.check_down_set(edge_layers)
    schedule = [layer for layer in graph.layers if layer.name in edge]
    step = {layer.name: k for k, layer in enumerate(schedule)}
    last_step = len(schedule) - 1
    size = dict(tensor_bytes or {})

    deltas = [0] * (len(schedule) + 1)
    sent_first = 0
    intervals: dict[str, tuple[int, int]] = {}
    for tensor in graph.tensors.values():
        if tensor.producer != INPUT and tensor.producer not in edge:
            continue
        readers = [step[c] for c in tensor.consumers if c in step]
        leaves = any(c == OUTPUT or c not in step for c in tensor.consumers)
        if not readers and not leaves:
            continue
        start = 0 if tensor.producer == INPUT else step[tensor.producer]
        end = last_step if leaves else max(readers)
        nbytes = size.get(tensor.name, tensor.bytes)
        if tensor.producer == INPUT and not readers:
            sent_first += nbytes  # held only until sent, before the first edge layer runs
            continue
        deltas[start] += nbytes
        deltas[end + 1] -= nbytes
        intervals[tensor.name] = (start, end)

    peak, peak_step, running = sent_first, None, 0
    for k in range(len(schedule)):
        running += deltas[k]
        if running > peak:
            peak, peak_step = running, k
    live = tuple(t for t, (s, e) in intervals.items() if peak_step is not None and s <= peak_step <= e)

    weights = dict(graph.attribute_bytes)
    weights.update(attribute_bytes or {})
    used = {p for layer in schedule for p in layer.param_names}
    return MemoryReport(
        weight_bytes=sum(weights.get(p, 0) for p in used),
        activation_bytes=peak,
        peak_layer=schedule[peak_step].name if peak_step is not None else None,
        live_at_peak=live,
    )
