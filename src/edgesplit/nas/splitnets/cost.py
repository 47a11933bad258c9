"""What a SplitNets architecture costs on a sensors + aggregator system, without capturing
it: the layers its :class:`~edgesplit.nas.splitnets.supernet.SplitNet` captures into, with
the MACs, FLOPs, parameters and tensor sizes the LayerGraph would give them, priced by the
devices' own estimators (T_sen + T_comm + T_agg, eq. 1) and the sensor's peak memory of
weights + activations (appendix G) computed as :func:`edgesplit.graph.memory.peak_memory`
does. An evolutionary search asks this hundreds of times; capturing every candidate would
take a second each. ``tests/nas/test_nas_splitnets.py`` checks it against the captured graph
(every layer's work, the memory and the plan's predicted latency), and the search's final
networks are captured and planned for real.

Mirrored conventions (see :mod:`edgesplit.graph.ops`): a convolution's batch-norm is folded
(its parameters gain a bias), its FLOPs are 2 x MACs + one per output element for the bias
+ one more for a fused ReLU6; an add, View-Fuse's stack and a reshape count one FLOP per
output element, pooling one per input element, a linear layer 2 x MACs + its bias.

Pricing (a :class:`SplitPricing` composed into :class:`SplitHardware`). The default,
:data:`FLOAT32`, is edgesplit's own convention: float32 weights and activations (4 bytes an
element, so sizes, the sensor memory and the sent feature are 4x the paper's), each layer
priced by its device's estimator (roofline with memory traffic), and a crossing priced as the
plan prices it (link share + half the RTT + encode/decode). :data:`PAPER`
(``--paper-convention``) is SplitNets' Table 4/6 convention: 8-bit weights and activations
(1 byte an element) and T = OP / Comp, an OP being a MAC (only layers with MACs cost time),
T_comm the feature's bytes over the sensor's share of the link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from edgesplit.errors import ConfigError
from edgesplit.hardware import (
    AnalyticalCompute,
    Device,
    Link,
    Topology,
    estimator_for,
    serialize_ms,
)
from edgesplit.hardware.work import LayerWork
from edgesplit.nas.splitnets.space import SplitArch, SplitSpace

__all__ = ["FLOAT32", "PAPER", "PRICINGS", "BaselineCost", "EstimatorPricing", "OpsPricing",
           "SplitCost", "SplitHardware", "SplitPricing", "plain_layers", "split_layers"]

FLOAT_BYTES = 4


class SplitPricing(Protocol):
    """How the cost model prices an architecture: bytes per weight or activation element,
    one layer's time on a device, and one sensor's feature crossing the link."""

    @property
    def name(self) -> str: ...

    @property
    def element_bytes(self) -> int: ...

    def layer_ms(self, work: LayerWork, device: Device) -> float: ...

    def comm_ms(self, link: Link, senders: int, src: Device, dst: Device, nbytes: int
                ) -> float: ...


@dataclass(frozen=True)
class EstimatorPricing:
    """edgesplit's convention: the devices' own estimators and the plan's crossing price."""

    name: str = "float32"
    element_bytes: int = FLOAT_BYTES

    def layer_ms(self, work: LayerWork, device: Device) -> float:
        return estimator_for(device).layer_ms(work, device)

    def comm_ms(self, link: Link, senders: int, src: Device, dst: Device, nbytes: int
                ) -> float:
        # the link share, half the RTT, and the encode on src and decode on dst, as the
        # plan prices every crossing tensor
        return (link.transfer_ms(nbytes, senders=senders) + link.rtt_ms / 2
                + serialize_ms(src, dst, nbytes))


@dataclass(frozen=True)
class OpsPricing:
    """SplitNets' Table 4/6 convention: T = OP / Comp with an OP a MAC and Comp the device's
    peak at ``bits`` (edgesplit's peaks count 2 ops a MAC), ``bits``-bit elements, and
    T_comm = bytes / bandwidth share (no RTT, no serialisation)."""

    name: str = "paper"
    element_bytes: int = 1
    bits: int = 8

    def layer_ms(self, work: LayerWork, device: Device) -> float:
        compute = device.compute
        if not isinstance(compute, AnalyticalCompute):
            raise ConfigError(f"device {device.name!r} has a measured compute model; the "
                              "paper convention (OP / Comp) needs a peak: use the default "
                              "pricing or an analytical device")
        peak_ops = compute.peak_gops[compute.compute_bits(self.bits)] * 1e9
        return 2 * work.macs / peak_ops * 1e3

    def comm_ms(self, link: Link, senders: int, src: Device, dst: Device, nbytes: int
                ) -> float:
        return link.transfer_ms(nbytes, senders=senders)


FLOAT32 = EstimatorPricing()
PAPER = OpsPricing()
PRICINGS: dict[str, SplitPricing] = {p.name: p for p in (FLOAT32, PAPER)}


@dataclass
class _Layer:
    name: str
    op_class: str
    macs: int
    flops: int
    params: int
    inputs: tuple[str, ...]
    output: str


@dataclass
class _Part:
    """Layers of one side in execution order, and every tensor's size in bytes."""

    layers: list[_Layer] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    count: int = 0
    element_bytes: int = FLOAT_BYTES

    def tensor(self, elements: int) -> str:
        self.count += 1
        name = f"t{self.count}"
        self.sizes[name] = elements * self.element_bytes
        return name

    def conv(self, name: str, x: str, c_in: int, c_out: int, size_out: int, *, kernel: int = 1,
             groups: int = 1, act: bool = True, op_class: str = "conv") -> str:
        out_elements = c_out * size_out * size_out
        macs = out_elements * (c_in // groups) * kernel * kernel
        params = c_out * (c_in // groups) * kernel * kernel + c_out
        y = self.tensor(out_elements)
        flops = 2 * macs + out_elements * (2 if act else 1)
        self.layers.append(_Layer(name, op_class, macs, flops, params, (x,), y))
        return y

    def simple(self, name: str, op_class: str, inputs: tuple[str, ...], elements: int,
               flops: int) -> str:
        y = self.tensor(elements)
        self.layers.append(_Layer(name, op_class, 0, flops, 0, inputs, y))
        return y

    def works(self) -> list[LayerWork]:
        return [LayerWork(layer.name, layer.op_class, layer.macs, layer.flops, layer.params,
                          layer.params * self.element_bytes,
                          sum(self.sizes[t] for t in layer.inputs),
                          self.sizes[layer.output]) for layer in self.layers]

    def peak_activation_bytes(self, inputs: tuple[str, ...], leaving: tuple[str, ...]) -> int:
        """The working set's peak as ``peak_memory`` computes it: a tensor is live from the
        step that makes it (inputs: from the first) to its last reader, or to the end when it
        leaves the part."""
        last = len(self.layers) - 1
        readers: dict[str, int] = {}
        start: dict[str, int] = {t: 0 for t in inputs}
        for k, layer in enumerate(self.layers):
            start[layer.output] = k
            for t in layer.inputs:
                readers[t] = k
        deltas = [0] * (len(self.layers) + 1)
        for t, s in start.items():
            end = last if t in leaving else readers.get(t, s)
            deltas[s] += self.sizes[t]
            deltas[end + 1] -= self.sizes[t]
        peak = running = 0
        for k in range(len(self.layers)):
            running += deltas[k]
            peak = max(peak, running)
        return peak


def _block(part: _Part, name: str, x: str, c_in: int, c_out: int, expand: int, stride: int,
           size_in: int) -> tuple[str, int]:
    """One MBConv (as :class:`edgesplit.nas.core.ops.MBConv` captures): (output, its size)."""
    hidden = c_in * expand
    size_out = (size_in + stride - 1) // stride
    y = x
    if expand != 1:
        y = part.conv(f"{name}.expand", y, c_in, hidden, size_in)
    y = part.conv(f"{name}.depthwise", y, hidden, hidden, size_out, kernel=3, groups=hidden,
                  op_class="dwconv")
    y = part.conv(f"{name}.project", y, hidden, c_out, size_out, act=False)
    if stride == 1 and c_in == c_out:
        elements = c_out * size_out * size_out
        y = part.simple(f"{name}.add", "elementwise", (x, y), elements, elements)
    return y, size_out


def split_layers(space: SplitSpace, arch: SplitArch, element_bytes: int = FLOAT_BYTES
                 ) -> tuple[_Part, _Part, str, str]:
    """(sensor part, aggregator part, the sensor's input tensor, its output) of ``arch``; one
    view's sensor (every sensor runs the same layers); tensors of ``element_bytes`` an
    element."""
    space.validate(arch, deployable=True)
    s = arch.split
    sensor, agg = _Part(element_bytes=element_bytes), _Part(element_bytes=element_bytes)
    r = arch.resolution
    x = sensor.tensor(space.in_channels * r * r)
    y = sensor.conv("stem", x, space.in_channels, arch.stem, r, kernel=3)
    c, size = arch.stem, r
    part = sensor
    for i, p in enumerate(arch.phases):
        stride = space.phases[i].stride
        for j in range(p.blocks):
            if i == s and j == p.before:
                y, part = _join(space, arch, sensor, agg, y, size), agg
            y, size = _block(part, f"p{i}b{j}", y, c, p.width, p.expands[j],
                             stride if j == 0 else 1, size)
            c = p.width
        if i == s and p.after == 0:
            y, part = _join(space, arch, sensor, agg, y, size), agg
    y = agg.conv("head", y, c, arch.head, size)
    y = agg.simple("pool", "pool", (y,), arch.head, arch.head * size * size)
    macs = arch.head * space.num_classes
    z = agg.tensor(space.num_classes)
    agg.layers.append(_Layer("classifier", "matmul", macs, 2 * macs + space.num_classes,
                             arch.head * space.num_classes + space.num_classes, (y,), z))
    return sensor, agg, x, sensor.layers[-1].output


def _join(space: SplitSpace, arch: SplitArch, sensor: _Part, agg: _Part, y: str, size: int
          ) -> str:
    """Conv-Reduce on the sensor, then Conv-Recover (or View-Fuse + its conv) on the
    aggregator; returns the aggregator's tensor."""
    p = arch.phases[arch.split]
    sensor.conv("reduce", y, p.width, p.reduced, size)
    views = space.views
    elements = p.reduced * size * size
    received = tuple(agg.tensor(elements) for _ in range(views))
    if views > 1:
        fused = agg.simple("interlace", "other", received, views * elements, views * elements)
    else:
        fused = received[0]
    return agg.conv("join", fused, p.reduced * views, p.width, size, act=False)


def plain_layers(space: SplitSpace, arch: SplitArch, element_bytes: int = FLOAT_BYTES
                 ) -> tuple[_Part, list[int], str]:
    """One view through ``arch`` without any splitting module (the supernet's "zero hot"
    network): its layers, the layer counts after which a block ends (the cuts a split of a
    plain network may take: after the stem, after every block, before the classifier), and
    its input tensor."""
    part = _Part(element_bytes=element_bytes)
    r = arch.resolution
    x = part.tensor(space.in_channels * r * r)
    y = part.conv("stem", x, space.in_channels, arch.stem, r, kernel=3)
    cuts = [len(part.layers)]
    c, size = arch.stem, r
    for i, p in enumerate(arch.phases):
        for j in range(p.blocks):
            y, size = _block(part, f"p{i}b{j}", y, c, p.width, p.expands[j],
                             space.phases[i].stride if j == 0 else 1, size)
            c = p.width
            cuts.append(len(part.layers))
    y = part.conv("head", y, c, arch.head, size)
    y = part.simple("pool", "pool", (y,), arch.head, arch.head * size * size)
    cuts.append(len(part.layers))
    macs = arch.head * space.num_classes
    part.layers.append(_Layer("classifier", "matmul", macs, 2 * macs + space.num_classes,
                              arch.head * space.num_classes + space.num_classes, (y,),
                              part.tensor(space.num_classes)))
    return part, cuts, x


@dataclass(frozen=True)
class BaselineCost:
    """A plain network cut after ``cut`` layers (0: everything on the aggregator, the raw
    view sent), the sensor running the prefix."""

    cut: int
    layers: int
    cost: SplitCost


@dataclass(frozen=True)
class SplitCost:
    """Eq. 1's latency terms and the sensor's memory for one architecture."""

    sensor_ms: float
    comm_ms: float
    aggregator_ms: float
    sensor_weight_bytes: int
    sensor_activation_bytes: int
    feature_bytes: int  # one view's reduced feature, as sent
    sensor_macs: int
    aggregator_macs: int

    @property
    def total_ms(self) -> float:
        return self.sensor_ms + self.comm_ms + self.aggregator_ms

    @property
    def sensor_memory_bytes(self) -> int:
        return self.sensor_weight_bytes + self.sensor_activation_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"sensor_ms": self.sensor_ms, "comm_ms": self.comm_ms,
                "aggregator_ms": self.aggregator_ms, "total_ms": self.total_ms,
                "sensor_weight_bytes": self.sensor_weight_bytes,
                "sensor_activation_bytes": self.sensor_activation_bytes,
                "sensor_memory_bytes": self.sensor_memory_bytes,
                "feature_bytes": self.feature_bytes, "sensor_macs": self.sensor_macs,
                "aggregator_macs": self.aggregator_macs}


@dataclass(frozen=True)
class SplitHardware:
    """The system a SplitNet runs on: V sensors of one kind, their link to the aggregator
    (``senders`` share it when it is a shared bus), the aggregator, and the sensor memory
    limit of the hard constraint (Mem_sen)."""

    sensors: tuple[str, ...]
    sensor: Device
    aggregator_name: str
    aggregator: Device
    link: Link
    senders: int
    memory_limit_bytes: int | None
    pricing: SplitPricing = FLOAT32

    @classmethod
    def from_topology(cls, topology: Topology, views: int, *,
                      memory_limit_bytes: int | None = None,
                      pricing: SplitPricing = FLOAT32) -> SplitHardware:
        """The first ``views`` sensors of a star ``topology`` (every device but one sends to
        the same aggregator). A shared bus is split between the sensors that send at once,
        the ``views`` (as the plan prices it). The paper gives a lone sensor a quarter of
        the bus anyway (Table 4: 37.5 MB/s); give the topology a 300 Mb/s per-sensor link to
        reproduce that."""
        sinks = {tl.dst for tl in topology.links}
        sources = [d.name for d in topology.devices if d.name not in sinks]
        if len(sinks) != 1 or any(tl.src not in sources for tl in topology.links) or \
                len(topology.links) != len(sources):
            raise ConfigError(f"topology {topology.name!r} is not a star of sensors sending "
                              "to one aggregator (e.g. hmd-star); SplitNets needs one")
        if views > len(sources):
            raise ConfigError(f"the network has {views} views but topology {topology.name!r} "
                              f"has {len(sources)} sensors")
        used = tuple(sources[:views])
        kinds = {topology.device(d).model_dump_json(exclude={"name"}) for d in used}
        if len(kinds) != 1:
            raise ConfigError(f"the sensors {', '.join(used)} of {topology.name!r} differ; "
                              "SplitNets assumes homogeneous sensors (appendix G)")
        links = {tl.link.model_dump_json() for tl in topology.links if tl.src in used}
        if len(links) != 1:
            raise ConfigError(f"the sensors of {topology.name!r} have different links to the "
                              "aggregator; SplitNets assumes one bus")
        (sink,) = sinks
        sensor = topology.device(used[0])
        link = next(tl.link for tl in topology.links if tl.src == used[0])
        limit = memory_limit_bytes if memory_limit_bytes is not None else sensor.memory_bytes
        return cls(used, sensor, sink, topology.device(sink), link, views, limit, pricing)

    def cost(self, space: SplitSpace, arch: SplitArch) -> SplitCost:
        sensor, agg, x, z = split_layers(space, arch, self.pricing.element_bytes)
        t_sen = sum(self.pricing.layer_ms(w, self.sensor) for w in sensor.works())
        t_agg = sum(self.pricing.layer_ms(w, self.aggregator) for w in agg.works())
        feature = sensor.sizes[z]
        comm = self._comm_ms(feature)
        weight_bytes = sum(l.params for l in sensor.layers) * self.pricing.element_bytes
        return SplitCost(t_sen, comm, t_agg, weight_bytes,
                         sensor.peak_activation_bytes((x,), (z,)), feature,
                         sum(l.macs for l in sensor.layers), sum(l.macs for l in agg.layers))

    def _comm_ms(self, feature: int) -> float:
        """One sensor's feature of ``feature`` bytes to the aggregator, as the pricing says."""
        return self.pricing.comm_ms(self.link, self.senders, self.sensor, self.aggregator,
                                    feature)

    def check_memory(self, cost: SplitCost) -> float:
        """How far over Mem_sen the sensor is (bytes; 0 when it fits)."""
        if self.memory_limit_bytes is None:
            return 0.0
        return float(max(0, cost.sensor_memory_bytes - self.memory_limit_bytes))

    def describe(self) -> str:
        limit = (f"{self.memory_limit_bytes / 1024:.0f} KiB" if self.memory_limit_bytes
                 else "unbounded")
        return (f"{len(self.sensors)} x {self.sensor.name} ({limit} each) -> "
                f"{self.aggregator.name} over {self.link.name}"
                f"{f' shared by {self.senders}' if self.link.shared else ''}"
                f"{'' if self.pricing is FLOAT32 else f', {self.pricing.name} pricing'}")


    def plain_costs(self, space: SplitSpace, arch: SplitArch) -> list[BaselineCost]:
        """Every cut of the plain (zero hot) network ``arch`` at a block boundary, with its
        cost: what splitting an existing network without a splitting module gives
        (Neurosurgeon's baseline in Table 4; cut 0 is "all on the aggregator")."""
        part, cuts, x = plain_layers(space, arch, self.pricing.element_bytes)
        works = part.works()
        on_sensor = [self.pricing.layer_ms(w, self.sensor) for w in works]
        on_agg = [self.pricing.layer_ms(w, self.aggregator) for w in works]
        out = []
        for k in [0, *cuts]:
            sent = x if k == 0 else part.layers[k - 1].output
            prefix = _Part(part.layers[:k], part.sizes, element_bytes=part.element_bytes)
            feature = part.sizes[sent]
            comm = self._comm_ms(feature)
            memory = prefix.peak_activation_bytes((x,), (sent,)) if k else feature
            cost = SplitCost(sum(on_sensor[:k]), comm, sum(on_agg[k:]),
                             sum(l.params for l in part.layers[:k]) * part.element_bytes,
                             memory,
                             feature, sum(l.macs for l in part.layers[:k]),
                             sum(l.macs for l in part.layers[k:]))
            out.append(BaselineCost(k, len(part.layers), cost))
        return out

    def all_on_aggregator(self, space: SplitSpace, arch: SplitArch) -> SplitCost:
        """``arch`` (one splitting module) run wholly on the aggregator: every view sent raw,
        the aggregator running the sensor part once per view, then the rest (Table 6's
        "All-on-agg." with the same network)."""
        sensor, agg, x, _ = split_layers(space, arch, self.pricing.element_bytes)
        per_view = sum(self.pricing.layer_ms(w, self.aggregator) for w in sensor.works())
        rest = sum(self.pricing.layer_ms(w, self.aggregator) for w in agg.works())
        feature = sensor.sizes[x]
        comm = self._comm_ms(feature)
        return SplitCost(0.0, comm, per_view * space.views + rest, 0, feature, feature, 0,
                         sum(l.macs for l in sensor.layers) * space.views +
                         sum(l.macs for l in agg.layers))
