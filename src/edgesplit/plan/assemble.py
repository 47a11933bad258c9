"""The one place a :class:`Plan` is built: a placement of layers on devices becomes devices,
transfers and a prediction under one cost model.

Cost convention (docs/cost-model.md):

- A device's compute is the sum of its layers' latencies on it (``layer_ms``).
- Tensors travel from their producer's device (raw inputs: the device they are born on, by
  default the first device) to every device that reads them (model outputs: the ``result``
  device), relayed over every link of the path in between; each link carries a tensor once per
  direction, whatever its number of readers.
- A shared link (``Link.shared``, a bus) is one medium for every link of that name: the
  transfers carrying data over it in one direction split its bandwidth (SplitNets gives each
  of four sensors 25 % of the bus).
- A transfer (one link, one direction) costs its time on the wire, ``Link.transfer_ms`` of the
  bytes at their wire bits, plus the link's **one-way latency, half its RTT**, when it carries
  anything. An edge-cloud request whose result comes back so pays one full RTT; a pipeline
  pays rtt/2 per hop that carries data.
- Every tensor a transfer carries is also encoded in the wire format on its sender and
  decoded on its receiver (``Transfer.serialize_ms``, priced by
  :func:`edgesplit.hardware.serialize_ms` from each device's codec speed).
- ``total = compute + wire time + latency + serialisation`` over the critical path: devices
  in ``parallel_devices`` run side by side and only the slowest (with its transfers) counts.
  ``Prediction.transfer_ms``, ``rtt_ms`` and ``serialize_ms`` are the critical path's wire
  time, latency and encode/decode, so a plan without parallel devices has
  ``total_ms == sum(compute_ms) + transfer_ms + rtt_ms + serialize_ms``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from edgesplit.errors import ConfigError
from edgesplit.graph import INPUT, OUTPUT, LayerGraph
from edgesplit.hardware import Device, Link, Topology, serialize_ms
from edgesplit.plan.model import (
    ModelRef,
    Plan,
    PlanAlternative,
    PlanDevice,
    PlanLayer,
    PlanLink,
    PlanQuality,
    PlanTensor,
    Prediction,
    Transfer,
)

__all__ = ["Network", "NetworkDevice", "assemble_plan", "one_way_latency_ms"]

Role = Literal["edge", "cloud", "hop"]


def one_way_latency_ms(link: Link, carries: bool) -> float:
    """What a transfer pays on top of its serialisation: half the link's RTT, if it sends."""
    return link.rtt_ms / 2 if carries else 0.0


@dataclass(frozen=True)
class NetworkDevice:
    name: str
    role: Role
    device: Device


@dataclass(frozen=True)
class Network:
    """Devices (the first one holds the raw inputs), the links between them, and the device
    that needs the model's outputs."""

    devices: tuple[NetworkDevice, ...]
    links: tuple[PlanLink, ...]
    result: str

    @classmethod
    def edge_cloud(cls, edge: Device, cloud: Device, link: Link,
                   result_at: str = "edge") -> Network:
        return cls((NetworkDevice("edge", "edge", edge), NetworkDevice("cloud", "cloud", cloud)),
                   (PlanLink(src="edge", dst="cloud", link=link),), result_at)

    @classmethod
    def of_topology(cls, topology: Topology, order: Sequence[str]) -> Network:
        """``order``: the plan's devices, source first and result device last (a chain's hops,
        or a mesh's chain, branches and aggregator)."""
        hops: list[Role] = ["hop"] * (len(order) - 2)
        roles: list[Role] = ["edge", *hops, "cloud"] if len(order) > 1 else ["edge"]
        names = set(order)
        return cls(tuple(NetworkDevice(d, r, topology.device(d))
                         for d, r in zip(order, roles, strict=True)),
                   tuple(PlanLink(src=tl.src, dst=tl.dst, link=tl.link) for tl in topology.links
                         if tl.src in names and tl.dst in names), order[-1])

    def path(self, src: str, dst: str) -> list[tuple[int, bool]]:
        """(link index, forward?) hops from ``src`` to ``dst``: forward links if they reach,
        else allowing links the other way (an edge-cloud result coming back down)."""
        for allow_back in (False, True):
            hops = self._bfs(src, dst, allow_back)
            if hops is not None:
                return hops
        raise ValueError(f"no link path from {src} to {dst}")

    def _bfs(self, src: str, dst: str, allow_back: bool) -> list[tuple[int, bool]] | None:
        came: dict[str, tuple[str, int, bool] | None] = {src: None}
        queue = deque([src])
        while queue:
            here = queue.popleft()
            if here == dst:
                hops: list[tuple[int, bool]] = []
                while (step := came[here]) is not None:
                    here, index, forward = step
                    hops.append((index, forward))
                return hops[::-1]
            for i, pl in enumerate(self.links):
                for a, b, forward in ((pl.src, pl.dst, True), (pl.dst, pl.src, False)):
                    if a == here and b not in came and (forward or allow_back):
                        came[b] = (here, i, forward)
                        queue.append(b)
        return None


def _birthplaces(graph: LayerGraph, network: Network,
                 input_devices: Mapping[str, str] | None) -> dict[str, str]:
    """Each model input's device: ``input_devices`` where given, else the network's first."""
    given = dict(input_devices or {})
    unknown = sorted(set(given) - set(graph.inputs))
    if unknown:
        raise ConfigError(f"input_devices names {unknown}, which are not inputs of "
                          f"{graph.model}; its inputs are {', '.join(graph.inputs)}")
    names = [d.name for d in network.devices]
    strangers = sorted({d for d in given.values() if d not in names})
    if strangers:
        raise ConfigError(f"input_devices places inputs on {strangers}, which are not devices "
                          f"of the network; its devices are {', '.join(names)}")
    return {x: given.get(x, names[0]) for x in graph.inputs}


def _transfers(graph: LayerGraph, where: Mapping[str, str], network: Network,
               tensor_bits: Mapping[str, int], born: Mapping[str, str]) -> list[Transfer]:
    """One transfer per link in its forward direction (empty ones too, so a chain has one per
    hop) and one per link used backwards, each with the crossing tensors in graph order.
    ``born``: each model input's device."""
    carried: dict[tuple[int, bool], list[str]] = {}
    paths: dict[tuple[str, str], list[tuple[int, bool]]] = {}
    for tensor in graph.tensors.values():
        src = born[tensor.name] if tensor.producer == INPUT else where[tensor.producer]
        readers = {network.result if c == OUTPUT else where[c] for c in tensor.consumers}
        hops = set()
        for dst in readers - {src}:
            if (src, dst) not in paths:
                paths[src, dst] = network.path(src, dst)
            hops.update(paths[src, dst])
        for hop in hops:
            carried.setdefault(hop, []).append(tensor.name)
    order = [(i, True) for i in range(len(network.links))] + \
        [(i, False) for i in range(len(network.links)) if (i, False) in carried]
    senders = _shared_senders(network.links, [hop for hop in order if carried.get(hop)])
    devices = {d.name: d.device for d in network.devices}
    return [_price(graph, network.links[i], forward, carried.get((i, forward), []), tensor_bits,
                   senders.get((i, forward), 1), devices)
            for i, forward in order]


def _shared_senders(links: Sequence[PlanLink], sending: Sequence[tuple[int, bool]]
                   ) -> dict[tuple[int, bool], int]:
    """For each (link index, forward?) in ``sending`` (the transfers that carry data): how
    many of them share its medium, a shared link's name, in that direction (1 if unshared)."""
    def medium(hop: tuple[int, bool]) -> tuple[str, bool] | None:
        link = links[hop[0]].link
        return (link.name, hop[1]) if link.shared else None

    count: dict[tuple[str, bool], int] = {}
    for hop in sending:
        if (key := medium(hop)) is not None:
            count[key] = count.get(key, 0) + 1
    return {hop: count[key] if (key := medium(hop)) is not None else 1 for hop in sending}


def _price(graph: LayerGraph, pl: PlanLink, forward: bool, names: list[str],
           tensor_bits: Mapping[str, int], senders: int,
           devices: Mapping[str, Device]) -> Transfer:
    sizes = {t: (graph.tensors[t].bytes_at(tensor_bits[t]) if t in tensor_bits
                 else graph.tensors[t].bytes) for t in names}
    direction: Literal["up", "down"] = "up" if forward else "down"
    src, dst = (pl.src, pl.dst) if forward else (pl.dst, pl.src)
    return Transfer(src=src, dst=dst,
                    tensors=names,
                    bits={t: tensor_bits[t] for t in names
                          if t in tensor_bits and tensor_bits[t] < 32},
                    bytes=sum(sizes.values()),
                    ms=sum(pl.link.transfer_ms(b, direction=direction, senders=senders)
                           for b in sizes.values()),
                    latency_ms=one_way_latency_ms(pl.link, bool(names)),
                    serialize_ms=sum(serialize_ms(devices[src], devices[dst],
                                                  graph.tensors[t].bytes,
                                                  quantized=tensor_bits.get(t, 32) <= 8)
                                     for t in names))


def _prediction(compute: dict[str, float], transfers: list[Transfer],
                parallel: Sequence[str]) -> Prediction:
    """Serial devices and transfers add up; of the parallel devices the slowest (compute and
    its own transfers) counts."""
    # per part: [compute, wire time, latency, serialisation]
    branch = {d: [compute[d], 0.0, 0.0, 0.0] for d in parallel}
    serial = [sum(ms for d, ms in compute.items() if d not in branch), 0.0, 0.0, 0.0]
    for t in transfers:
        touched = [d for d in (t.src, t.dst) if d in branch]
        part = branch[touched[0]] if touched else serial
        part[1] += t.ms
        part[2] += t.latency_ms
        part[3] += t.serialize_ms
    slowest = max(branch.values(), key=sum, default=[0.0, 0.0, 0.0, 0.0])
    return Prediction(compute_ms=compute, transfer_ms=serial[1] + slowest[1],
                      rtt_ms=serial[2] + slowest[2], serialize_ms=serial[3] + slowest[3],
                      total_ms=sum(serial) + sum(slowest))


def assemble_plan(graph: LayerGraph, placement: Mapping[str, Sequence[str]], network: Network,
                  *, layer_ms: Mapping[str, Mapping[str, float]], method: str, source: str,
                  edge_memory_bytes: int, graph_kind: Literal["optimized", "raw"] = "optimized",
                  tensor_bits: Mapping[str, int] | None = None,
                  layer_bits: Mapping[str, tuple[int | None, int | None]] | None = None,
                  parallel_devices: Sequence[str] = (), feasible: bool = True,
                  reason: str | None = None, quality: PlanQuality | None = None,
                  alternatives: Sequence[PlanAlternative] = (),
                  input_devices: Mapping[str, str] | None = None) -> Plan:
    """The Plan of running ``placement`` (device name -> its layers) over ``network``.

    ``layer_ms[layer][device]``: each layer's latency on every device of the network (at its
    bits, for a quantized layer). ``tensor_bits``: tensors that travel at another width than
    their dtype's (a raw input at ``input_bits``, a quantized activation). ``layer_bits``:
    (weight, activation) widths of layers that run quantized. Memory and feasibility are the
    planner's to judge and pass in. ``input_devices``: model input name -> the device it is
    born on (a sensor's own camera view), priced from there; the others are born on the
    network's first device.

    A *star* plan (SplitNets' multi-view fusion, executable: see :attr:`Plan.shape`) puts
    each input on its own source device, each source's layers reading only its own inputs and
    layers, the rest on one sink, and names the sources in ``parallel_devices``."""
    order = [layer.name for layer in graph.layers]
    where = {n: d for d, names in placement.items() for n in names}
    compute = {d.name: sum(layer_ms[n][d.name] for n in placement.get(d.name, ()))
               for d in network.devices}
    transfers = _transfers(graph, where, network, tensor_bits or {},
                           _birthplaces(graph, network, input_devices))
    bits = layer_bits or {}
    return Plan(
        method=method,
        model=ModelRef(name=graph.model, source=source,
                       input_shapes=[list(x.shape) for x in graph.example_inputs],
                       graph=graph_kind),
        devices=[PlanDevice(name=d.name, role=d.role, device=d.device,
                            layers=[n for n in order if where.get(n) == d.name],
                            compute_ms=compute[d.name]) for d in network.devices],
        links=list(network.links),
        layers=[PlanLayer(name=n, latency_ms={d.name: layer_ms[n][d.name]
                                              for d in network.devices},
                          param_bytes=graph.layer(n).param_bytes,
                          w_bits=bits.get(n, (None, None))[0],
                          a_bits=bits.get(n, (None, None))[1]) for n in order],
        tensors=[PlanTensor(name=t.name, producer=t.producer, consumers=list(t.consumers),
                            shape=list(t.shape), dtype=t.dtype, bytes=t.bytes)
                 for t in graph.tensors.values()],
        transfers=transfers,
        predicted=_prediction(compute, transfers, parallel_devices),
        edge_memory_bytes=edge_memory_bytes,
        parallel_devices=list(parallel_devices),
        feasible=feasible,
        reason=reason,
        quality=quality,
        alternatives=list(alternatives),
    )
