"""The edge-cloud cost model every two-device planner optimises and every plan is checked with.

total = edge compute + uplink transfer of every crossing tensor (each once, whatever its number
of cloud readers) + cloud compute + downlink return of results computed on the cloud (when the
result is needed on the edge) + the link's one-way latency (rtt/2) for each direction that
carries anything: a full round trip when a result comes back (the convention of every plan,
:mod:`edgesplit.plan.assemble`, docs/cost-model.md) + the serialisation of every tensor that
crosses (wire-format encode on the sender, decode on the receiver,
:func:`edgesplit.hardware.serialize_ms`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from edgesplit.errors import ConfigError, GraphError, InfeasibleError
from edgesplit.graph import INPUT, LayerGraph, TensorInfo, prefix_peak_memory
from edgesplit.hardware import (
    Device,
    LatencyEstimator,
    LayerWork,
    Link,
    estimator_for,
    serialize_ms,
)
from edgesplit.plan.assemble import one_way_latency_ms

__all__ = ["Breakdown", "CostTable", "EdgeCloudSetting", "wire_size"]


def _is_float(tensor: TensorInfo) -> bool:
    return tensor.dtype.startswith(("float", "bfloat", "torch.float", "torch.bfloat"))


def _quantized(tensor: TensorInfo, input_bits: int) -> bool:
    """Whether ``tensor`` is quantized to cross (priced at the codec's quantized speed)."""
    return tensor.producer == INPUT and _is_float(tensor) and input_bits <= 8


def wire_size(tensor: TensorInfo, input_bits: int) -> int:
    """Bytes ``tensor`` takes on the link: raw floating inputs at ``input_bits``, everything
    else (activations of a float part, integer token ids) as captured."""
    if tensor.producer == INPUT and _is_float(tensor) and input_bits < 32:
        return tensor.bytes_at(input_bits)
    return tensor.bytes


@dataclass(frozen=True)
class EdgeCloudSetting:
    """The two-device problem: devices, the link, and constraints."""

    edge: Device
    cloud: Device
    link: Link
    edge_memory_bytes: int | None = None  # None: the edge device's own memory_bytes
    privacy_layer: str | None = None  # L2S eq. 1: no cut before this layer
    result_at: Literal["edge", "cloud"] = "edge"
    # Raw floating-point model inputs cross the link at this width: 32 (the default) sends the
    # float32 tensor as it is, exactly; a camera frame or sensor sample is 8-bit data to begin
    # with (AUTO-SPLIT's T_0), which 8 prices and rounds to, lossily.
    input_bits: int = 32

    def __post_init__(self) -> None:
        if self.input_bits not in (1, 2, 3, 4, 5, 6, 7, 8, 16, 32):
            raise ConfigError(f"input_bits must be 1-8, 16 or 32, got {self.input_bits}")
        if self.edge_memory_bytes is not None and self.edge_memory_bytes <= 0:
            raise ConfigError(f"edge_memory_bytes must be positive, got {self.edge_memory_bytes}")
        if self.result_at not in ("edge", "cloud"):
            raise ConfigError(f"result_at must be 'edge' or 'cloud', got {self.result_at!r}")

    @property
    def memory_limit_bytes(self) -> int | None:
        return self.edge_memory_bytes if self.edge_memory_bytes is not None \
            else self.edge.memory_bytes


@dataclass(frozen=True)
class Breakdown:
    edge_ms: float
    transfer_ms: float  # uplink of crossing tensors + downlink of results
    cloud_ms: float
    rtt_ms: float
    sent_bytes: int
    crossing: tuple[str, ...]
    serialize_ms: float = 0.0  # encode + decode of the crossing tensors and returned results

    @property
    def total_ms(self) -> float:
        return self.edge_ms + self.transfer_ms + self.cloud_ms + self.rtt_ms + self.serialize_ms


@dataclass
class CostTable:
    """Per-layer latency on each device and per-tensor cost of crossing the link for one graph.

    ``up_ms``/``down_ms`` are what planners minimise: a tensor's link time plus its
    serialisation, which ``up_codec_ms``/``down_codec_ms`` hold apart (for the breakdown)."""

    graph: LayerGraph
    setting: EdgeCloudSetting
    edge_ms: dict[str, float]
    cloud_ms: dict[str, float]
    up_ms: dict[str, float]  # per tensor, uplink: link + encode on the edge + decode on the cloud
    down_ms: dict[str, float] = field(default_factory=dict)  # per output tensor, downlink
    wire_bytes: dict[str, int] = field(default_factory=dict)  # per tensor, as sent uplink
    up_codec_ms: dict[str, float] = field(default_factory=dict)  # the serialisation in up_ms
    down_codec_ms: dict[str, float] = field(default_factory=dict)  # the one in down_ms

    def __post_init__(self) -> None:
        if not self.wire_bytes:
            self.wire_bytes = {t.name: wire_size(t, self.setting.input_bits)
                               for t in self.graph.tensors.values()}

    @classmethod
    def build(cls, graph: LayerGraph, setting: EdgeCloudSetting, *,
              edge_estimator: LatencyEstimator | None = None,
              cloud_estimator: LatencyEstimator | None = None) -> CostTable:
        edge_est = edge_estimator or estimator_for(setting.edge)
        cloud_est = cloud_estimator or estimator_for(setting.cloud)
        works = [LayerWork.of(graph, layer) for layer in graph.layers]
        link = setting.link
        wire = {t.name: wire_size(t, setting.input_bits) for t in graph.tensors.values()}
        up_codec = {t.name: serialize_ms(setting.edge, setting.cloud, t.bytes,
                                         quantized=_quantized(t, setting.input_bits))
                    for t in graph.tensors.values()}
        down_codec = {t: serialize_ms(setting.cloud, setting.edge, graph.tensors[t].bytes)
                      for t in graph.outputs}
        return cls(
            graph=graph,
            setting=setting,
            edge_ms={w.name: edge_est.layer_ms(w, setting.edge) for w in works},
            cloud_ms={w.name: cloud_est.layer_ms(w, setting.cloud) for w in works},
            up_ms={name: link.transfer_ms(size) + up_codec[name] for name, size in wire.items()},
            down_ms={t: link.transfer_ms(graph.tensors[t].bytes, direction="down")
                     + down_codec[t] for t in graph.outputs},
            wire_bytes=wire,
            up_codec_ms=up_codec,
            down_codec_ms=down_codec,
        )

    def wire_bits(self, tensor: str) -> int | None:
        """The width ``tensor`` is sent at when it is not the captured dtype's, else None."""
        info = self.graph.tensors[tensor]
        if info.producer == INPUT and _is_float(info) and self.setting.input_bits < 32:
            return self.setting.input_bits
        return None

    def tensor_bits(self) -> dict[str, int]:
        """Every tensor sent at another width than its dtype's (raw float inputs)."""
        return {t: b for t in self.graph.tensors if (b := self.wire_bits(t)) is not None}

    # ---- evaluation ------------------------------------------------------------------------
    def crossing(self, edge: frozenset[str]) -> list[str]:
        result_on_cloud = self.setting.result_at == "cloud"
        return [t.name for t in self.graph.crossing_tensors(edge, include_outputs=result_on_cloud)]

    def returned(self, edge: frozenset[str]) -> list[str]:
        """Result tensors computed on the cloud that travel back to the edge."""
        if self.setting.result_at != "edge":
            return []
        return [t for t in self.graph.outputs
                if self.graph.tensors[t].producer not in edge
                and self.graph.tensors[t].producer != INPUT]

    def evaluate(self, edge_layers: Iterable[str]) -> Breakdown:
        edge = self.graph.check_down_set(edge_layers)
        crossing = self.crossing(edge)
        returned = self.returned(edge)
        link = self.setting.link
        codec = (sum(self.up_codec_ms.get(t, 0.0) for t in crossing)
                 + sum(self.down_codec_ms.get(t, 0.0) for t in returned))
        return Breakdown(
            edge_ms=sum(self.edge_ms[n] for n in edge),
            transfer_ms=(sum(self.up_ms[t] for t in crossing)
                         + sum(self.down_ms[t] for t in returned)) - codec,
            cloud_ms=sum(ms for n, ms in self.cloud_ms.items() if n not in edge),
            rtt_ms=one_way_latency_ms(link, bool(crossing)) + one_way_latency_ms(link,
                                                                                 bool(returned)),
            sent_bytes=sum(self.wire_bytes[t] for t in crossing),
            crossing=tuple(crossing),
            serialize_ms=codec,
        )

    # ---- constraints -----------------------------------------------------------------------
    def forced_edge(self) -> frozenset[str]:
        """Layers the privacy constraint keeps on the edge (the privacy layer, or every layer
        of the privacy module, and their ancestors); empty without one."""
        name = self.setting.privacy_layer
        if name is None:
            return frozenset()
        try:
            return frozenset(self.graph.split_layers([name]))
        except GraphError as exc:
            raise InfeasibleError(f"privacy constraint: layer {name!r} must name a layer or a "
                                  f"module before the output: {exc}") from None

    def memory_bytes(self, edge: frozenset[str]) -> int:
        return self.graph.peak_memory(edge).total_bytes

    def prefix_violations(self) -> list[str | None]:
        """:meth:`violation` of every prefix of the topological order (k = 0..n layers), in
        one sweep (Neurosurgeon's search space)."""
        forced = self.forced_edge()
        index = {layer.name: i for i, layer in enumerate(self.graph.layers)}
        need = max((index[n] + 1 for n in forced), default=0)
        limit = self.setting.memory_limit_bytes
        out: list[str | None] = []
        for k, memory in enumerate(prefix_peak_memory(self.graph)):
            if k < need:
                out.append(f"privacy constraint: layer {self.setting.privacy_layer!r} and the "
                           "layers before it must run on the edge")
            elif limit is not None and memory > limit:
                out.append(f"edge memory: needs {memory:,} bytes, limit is {limit:,} bytes")
            else:
                out.append(None)
        return out

    def violation(self, edge: frozenset[str]) -> str | None:
        """Why ``edge`` breaks a constraint, or None."""
        missing = self.forced_edge() - edge
        if missing:
            return (f"privacy constraint: layer {self.setting.privacy_layer!r} and the layers "
                    "before it must run on the edge")
        limit = self.setting.memory_limit_bytes
        if limit is not None:
            need = self.memory_bytes(edge)
            if need > limit:
                return f"edge memory: needs {need:,} bytes, limit is {limit:,} bytes"
        return None
