"""Peak memory of running an edge part: weights plus the activation working set.

The schedule is the graph's topological order restricted to the edge layers (AUTO-SPLIT eq. 3
and Fig. 4; SplitNets PeakMem). While layer k runs, live activations are its inputs and outputs
and every tensor produced earlier that a later edge layer still reads, or that must be sent off
the edge (kept until the edge part finishes and its outputs are transmitted). A raw input that
no edge layer reads is held only until it is sent, before the first edge layer runs (so an
empty edge part still needs room for the input). Weights are the union of the attributes the
edge layers read, so tied weights count once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgesplit.graph.ir import INPUT, OUTPUT

if TYPE_CHECKING:
    from edgesplit.graph.ir import LayerGraph

__all__ = ["MemoryReport", "live_bytes", "peak_memory", "prefix_peak_memory"]


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


def peak_memory(graph: LayerGraph, edge_layers: Iterable[str], *,
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
    live = tuple(t for t, (s, e) in intervals.items()
                 if peak_step is not None and s <= peak_step <= e)

    weights = dict(graph.attribute_bytes)
    weights.update(attribute_bytes or {})
    used = {p for layer in schedule for p in layer.param_names}
    return MemoryReport(
        weight_bytes=sum(weights.get(p, 0) for p in used),
        activation_bytes=peak,
        peak_layer=schedule[peak_step].name if peak_step is not None else None,
        live_at_peak=live,
    )


def prefix_peak_memory(graph: LayerGraph) -> list[int]:
    """``peak_memory(graph, first k layers).total_bytes`` for every k = 0..n, in one sweep.

    For a prefix, a tensor read after the prefix is held to its end, so at any step j inside
    the prefix a computed tensor is live exactly when it is live in the whole model: the
    activation peak of a prefix is a running maximum. Raw inputs are the exception: they are
    resident from step 0 once some prefix layer reads them, and held alone until sent before
    that."""
    n = len(graph.layers)
    spans = _lifetimes(graph)
    inputs = [(first, last, nbytes) for producer, first, last, nbytes in spans
              if producer is None]
    live = _running([(start, last, nbytes) for start, _, last, nbytes in spans
                     if start is not None], n)
    result = [sum(b for _, _, b in inputs)]  # empty edge part: the inputs, until sent
    seen: set[str] = set()
    weights = best = 0
    for k, layer in enumerate(graph.layers):
        for name in layer.param_names:
            if name not in seen:
                seen.add(name)
                weights += graph.attribute_bytes.get(name, 0)
        newly_read = [(last, b) for first, last, b in inputs if first == k]
        for last, nbytes in newly_read:  # resident from step 0 up to its last read
            for j in range(last + 1):
                live[j] += nbytes
        best = max(live[: k + 1]) if newly_read else max(best, live[k])
        unread = sum(b for first, _, b in inputs if first > k)
        result.append(weights + max(best, unread))
    return result


def _lifetimes(graph: LayerGraph) -> list[tuple[int | None, int, int, int]]:
    """(producer step or None for a raw input, first reader, last step live, bytes) of every
    tensor someone reads, over the whole topological order (model outputs: to the end)."""
    n = len(graph.layers)
    index = {layer.name: i for i, layer in enumerate(graph.layers)}
    out = []
    for tensor in graph.tensors.values():
        readers = [n if c == OUTPUT else index[c] for c in tensor.consumers]
        if not readers:
            continue
        start = None if tensor.producer == INPUT else index[tensor.producer]
        out.append((start, min(readers), min(max(readers), n - 1), tensor.bytes))
    return out


def _running(intervals: Iterable[tuple[int, int, int]], n: int) -> list[int]:
    """Bytes live at each of ``n`` steps, from (first step, last step, bytes) intervals."""
    deltas = [0] * (n + 1)
    for start, last, nbytes in intervals:
        deltas[start] += nbytes
        deltas[last + 1] -= nbytes
    live, running = [], 0
    for k in range(n):
        running += deltas[k]
        live.append(running)
    return live


def live_bytes(graph: LayerGraph) -> list[int]:
    """Activation bytes live while each layer runs when the whole model runs in topological
    order on one device: every tensor from its producer's step (raw inputs from step 0) to its
    last reader (model outputs to the end). A device running layers [a, b) of the order holds
    at most ``max(live_bytes[a:b])`` (the multi-split planners' memory check)."""
    return _running([(start or 0, last, nbytes)
                     for start, _, last, nbytes in _lifetimes(graph)], len(graph.layers))
