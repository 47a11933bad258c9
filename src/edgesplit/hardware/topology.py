"""Topologies: devices joined by directed links, data flowing from the source (a UE, a sensor)
towards the sink (the cloud, an aggregator). Helpers build the shapes the papers use: a chain
(JMSNAS Fig. 2a), a chain with a broadcasting root and parallel branches joined by an aggregator
(JMSNAS Fig. 2b, eq. 2), and a star of sensors on a shared bus (SplitNets)."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edgesplit.hardware.device import Device
from edgesplit.hardware.link import Link

__all__ = ["Topology", "TopologyLink", "chain", "mesh", "star"]


class TopologyLink(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    src: str
    dst: str
    link: Link


class Topology(BaseModel):
    """Devices and the links between them; a directed acyclic graph."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    devices: tuple[Device, ...] = Field(min_length=1)
    links: tuple[TopologyLink, ...] = ()
    description: str = ""
    source: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        names = [d.name for d in self.devices]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"device names must be unique; repeated: {', '.join(dupes)} (give "
                             "each copy its own name, e.g. mbs1, mbs2)")
        for link in self.links:
            for end in (link.src, link.dst):
                if end not in names:
                    raise ValueError(f"link {link.src}->{link.dst} names unknown device {end!r}; "
                                     f"devices: {', '.join(names)}")
        graph = self.graph()
        if not nx.is_directed_acyclic_graph(graph):
            raise ValueError("links must not form a cycle: data flows from source to sink")
        if len(names) > 1 and not nx.is_weakly_connected(graph):
            raise ValueError("every device must be linked to the others")
        return self

    def graph(self) -> nx.DiGraph[str]:
        """Devices as nodes (``device`` attribute), links as edges (``link`` attribute)."""
        g: nx.DiGraph[str] = nx.DiGraph()
        for device in self.devices:
            g.add_node(device.name, device=device)
        for tl in self.links:
            g.add_edge(tl.src, tl.dst, link=tl.link)
        return g

    def device(self, name: str) -> Device:
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(name)

    def link(self, src: str, dst: str) -> Link:
        for tl in self.links:
            if (tl.src, tl.dst) == (src, dst):
                return tl.link
        raise KeyError((src, dst))

    @property
    def is_chain(self) -> bool:
        g = self.graph()
        return all(g.in_degree(n) <= 1 and g.out_degree(n) <= 1 for n in g)

    def chain_order(self) -> list[str]:
        """Device names from source to sink; raises ValueError if this is not a chain."""
        if not self.is_chain:
            raise ValueError(f"topology {self.name!r} is not a chain")
        return list(nx.topological_sort(self.graph()))


def chain(name: str, devices: Sequence[Device], links: Sequence[Link], **kw: str) -> Topology:
    """devices[0] -> devices[1] -> ... with links[i] between devices[i] and devices[i+1]."""
    if len(links) != len(devices) - 1:
        raise ValueError(f"a chain of {len(devices)} devices needs {len(devices) - 1} links, "
                         f"got {len(links)}")
    tls = [TopologyLink(src=a.name, dst=b.name, link=link)
           for a, b, link in zip(devices[:-1], devices[1:], links, strict=True)]
    return Topology(name=name, devices=tuple(devices), links=tuple(tls), **kw)


def mesh(name: str, prefix: Sequence[Device], prefix_links: Sequence[Link], root: Device,
         branches: Sequence[Device], branch_link: Link, aggregator: Device, join_link: Link,
         **kw: str) -> Topology:
    """JMSNAS Fig. 2(b): a chain ``prefix`` ending at ``root``, which broadcasts to every device
    of ``branches``; each branch sends to ``aggregator``. ``prefix_links`` join consecutive
    prefix devices and the last prefix device to the root."""
    chain_devices = [*prefix, root]
    if len(prefix_links) != len(chain_devices) - 1:
        raise ValueError("prefix_links must join consecutive prefix devices and the root")
    tls = [TopologyLink(src=a.name, dst=b.name, link=link)
           for a, b, link in zip(chain_devices[:-1], chain_devices[1:], prefix_links, strict=True)]
    tls += [TopologyLink(src=root.name, dst=b.name, link=branch_link) for b in branches]
    tls += [TopologyLink(src=b.name, dst=aggregator.name, link=join_link) for b in branches]
    return Topology(name=name, devices=(*chain_devices, *branches, aggregator), links=tuple(tls),
                    **kw)


def star(name: str, sensors: Sequence[Device], aggregator: Device, link: Link, **kw: str
         ) -> Topology:
    """Many sensors sending to one aggregator over ``link`` (shared if ``link.shared``)."""
    tls = [TopologyLink(src=s.name, dst=aggregator.name, link=link) for s in sensors]
    return Topology(name=name, devices=(*sensors, aggregator), links=tuple(tls), **kw)
