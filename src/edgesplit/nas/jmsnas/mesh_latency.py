"""JMSNAS's expected completion latency on a mesh of devices (paper 000, eq. 2 and IV-B).

A mesh is a chain from the source to a root, which broadcasts to parallel branch devices,
whose results one aggregator joins (``plan.mesh.mesh_shape``). The searched network has the
matching shape (:mod:`edgesplit.nas.jmsnas.branched`): the stem and the prefix layers on the chain
(placed by the same DP as a chain, result at the root), one copy of the branch section per
branch device, and the join, the suffix and the head on the aggregator. Then

    T = chain part + max over branch devices b (root -> b + E[copy b on b] + b -> aggregator)
        + aggregator part,

eq. (2) with the root's own compute in the chain part (it is the same inside every term of the
max), ``E[tau] = sum_i p_i U(v_i)`` per slot, and transfers priced as in every Plan
(bytes / bandwidth + rtt/2, relayed hop by hop). Every busy device pays its table's overhead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import Topology
from edgesplit.nas.jmsnas.branched import (
    BranchedSupernet,
    BranchLayout,
    branched_space,
    shape_keeping_sections,
)
from edgesplit.nas.jmsnas.chain_latency import (
    FLOAT_BYTES,
    LayerLatencies,
    _hop_ms,
    _overhead,
    _place,
    _relay_ms,
    check_budget,
    unit_output_bytes,
)
from edgesplit.nas.jmsnas.space import Arch, SearchSpace
from edgesplit.plan.mesh import mesh_shape

__all__ = ["MeshLatency", "MeshPlacement"]


@dataclass(frozen=True)
class MeshPlacement:
    """Where the units go: ``prefix_devices`` for the stem and prefix layers (chain devices),
    copy b on ``branches[b]``, the rest on ``aggregator``."""

    prefix_devices: tuple[str, ...]
    branches: tuple[str, ...]
    aggregator: str
    layout: BranchLayout

    def units_on(self, space: SearchSpace) -> dict[str, list[str]]:
        fork, width = self.layout.fork, self.layout.join - self.layout.fork
        found: dict[str, list[str]] = {}
        names = ["stem", *(f"layers.{i}" for i in range(fork))]
        for device, name in zip(self.prefix_devices, names, strict=True):
            found.setdefault(device, []).append(name)
        for b, device in enumerate(self.branches):
            start = fork + b * width
            found.setdefault(device, []).extend(f"layers.{i}" for i in range(start, start + width))
        rest = range(fork + len(self.branches) * width, len(space.layers))
        found.setdefault(self.aggregator, []).extend([*(f"layers.{i}" for i in rest), "head"])
        return found


class MeshLatency:
    """``E[T]`` of eq. (2) for ``base`` with ``layout`` on a mesh topology, from one latency
    table of the *base* space per device; ``space`` is the branched space the search runs on."""

    def __init__(self, base: SearchSpace, layout: BranchLayout, topology: Topology,
                 tables: Mapping[str, LayerLatencies],
                 prefix_units: Sequence[int] | None = None) -> None:
        shape = mesh_shape(topology)
        if len(shape.branches) != layout.branches:
            raise ConfigError(f"topology {topology.name!r} has {len(shape.branches)} branch "
                              f"devices; the layout copies its section {layout.branches} times")
        missing = [d.name for d in topology.devices if d.name not in tables]
        if missing:
            raise ConfigError(f"no latency table for device(s) {', '.join(missing)} of topology "
                              f"{topology.name!r}")
        self.base, self.layout, self.topology, self.tables = base, layout, topology, tables
        self.space = branched_space(base, layout)
        self.chain = list(shape.chain)
        out_bytes = unit_output_bytes(base)
        self._in_bytes = FLOAT_BYTES * int(np.prod(base.input_shape))
        self._prefix_bytes = out_bytes[: layout.fork + 1]  # stem, layers[:fork]
        if prefix_units is None:
            cost = np.array([[self._prefix_cost(u, d, fastest=False) for d in self.chain]
                             for u in range(layout.fork + 1)])
            prefix_units = _place(topology, self.chain, cost, self._prefix_bytes,
                                  self._in_bytes)
        self.placement = MeshPlacement(tuple(self.chain[m] for m in prefix_units),
                                       tuple(shape.branches), shape.aggregator, layout)
        self._prefix_units = tuple(prefix_units)
        self._build(out_bytes)

    def _prefix_cost(self, unit: int, device: str, fastest: bool) -> float:
        table = self.tables[device]
        if unit == 0:
            return table.stem_ms
        ms = table.layer_vector(unit - 1)
        return min(ms) if fastest else float(np.mean(ms))

    def _build(self, out_bytes: list[int]) -> None:
        p, layout = self.placement, self.layout
        slots = layout.slots(len(self.base.layers))
        devices = ([*p.prefix_devices[1:]]
                   + [b for b in p.branches for _ in range(layout.join - layout.fork)]
                   + [p.aggregator] * (len(slots) - layout.fork
                                       - layout.branches * (layout.join - layout.fork)))
        self.slot_devices = devices
        self.layer_ms = [torch.tensor(self.tables[d].layer_vector(i), dtype=torch.float64)
                         for d, i in zip(devices, slots, strict=True)]
        stops = [0, *self._prefix_units, len(self.chain) - 1]
        sizes = [self._in_bytes, *self._prefix_bytes]
        self.chain_transfer_ms = sum(
            _relay_ms(self.topology, self.chain, a, b, n)
            for a, b, n in zip(stops[:-1], stops[1:], sizes, strict=True) if b > a)
        root = self.chain[-1]
        fork_bytes, join_bytes = out_bytes[layout.fork], out_bytes[layout.join]
        self.branch_transfer_ms = [
            _hop_ms(self.topology.link(root, b), fork_bytes)
            + _hop_ms(self.topology.link(b, p.aggregator), join_bytes) for b in p.branches]
        busy = {*p.prefix_devices, *p.branches, p.aggregator}
        self.overhead_ms = {d: _overhead(self.tables[d]) for d in busy}
        self.chain_fixed_ms = (self.tables[p.prefix_devices[0]].stem_ms
                               + sum(self.overhead_ms[d] for d in set(p.prefix_devices)))
        self.aggregator_fixed_ms = (self.tables[p.aggregator].head_ms
                                    + self.overhead_ms[p.aggregator])

    def make_supernet(self, weights: Literal["separate", "shared"]) -> BranchedSupernet:
        """The supernet the search trains: the copies run in parallel."""
        return BranchedSupernet(self.space, self.layout, weights=weights)

    def __call__(self, probs: Sequence[torch.Tensor]) -> torch.Tensor:
        """E[T] in ms, differentiable in ``probs`` (one tensor per slot)."""
        per_slot = torch.stack([torch.dot(p.to(torch.float64), ms)
                                for p, ms in zip(probs, self.layer_ms, strict=True)])
        fork, width = self.layout.fork, self.layout.join - self.layout.fork
        end = fork + self.layout.branches * width
        copies = torch.stack([
            per_slot[fork + b * width: fork + (b + 1) * width].sum()
            + self.branch_transfer_ms[b] + self.overhead_ms[device]
            for b, device in enumerate(self.placement.branches)])
        return (self.chain_fixed_ms + self.chain_transfer_ms + per_slot[:fork].sum()
                + copies.max() + self.aggregator_fixed_ms + per_slot[end:].sum())

    def of_arch(self, arch: Arch) -> float:
        indices = self.space.arch_indices(arch)
        one_hot = [torch.nn.functional.one_hot(torch.tensor(i), len(ms)).double()
                   for i, ms in zip(indices, self.layer_ms, strict=True)]
        return float(self(one_hot))

    def fastest(self) -> tuple[float, Arch]:
        arch = self.space.arch_from_indices([int(torch.argmin(ms)) for ms in self.layer_ms])
        return self.of_arch(arch), arch

    def breakdown(self, arch: Arch) -> dict[str, float]:
        """Per-device compute (overheads included) and the transfers, in ms; the branches run
        in parallel, so these do not add up to the latency."""
        indices = self.space.arch_indices(arch)
        out = dict.fromkeys([d.name for d in self.topology.devices], 0.0)
        first, last = self.placement.prefix_devices[0], self.placement.aggregator
        out[first] += self.tables[first].stem_ms
        out[last] += self.tables[last].head_ms
        for device, overhead in self.overhead_ms.items():
            out[device] += overhead
        for device, ms, k in zip(self.slot_devices, self.layer_ms, indices, strict=True):
            out[device] += float(ms[k])
        out["transfers"] = self.chain_transfer_ms + sum(self.branch_transfer_ms)
        return out

    def check_budget(self, budget_ms: float) -> None:
        """InfeasibleError naming the fastest achievable latency if ``budget_ms`` is below it."""
        check_budget(self, budget_ms)

    @classmethod
    def best(cls, base: SearchSpace, topology: Topology, tables: Mapping[str, LayerLatencies],
             *, fastest: bool = False, section: tuple[int, int] | None = None) -> MeshLatency:
        """The branch section (every shape-keeping one, or ``section``) and prefix placement
        with the least E[T] when every op is equally likely (``fastest``: at the fastest ops)."""
        branches = len(mesh_shape(topology).branches)
        sections = [section] if section is not None else shape_keeping_sections(base)
        if not sections:
            raise ConfigError(f"space {base.name!r} has no layers that keep their shape, so it "
                              "cannot be copied onto parallel branch devices; plan over a chain")
        options = [cls(base, BranchLayout(f, j, branches), topology, tables) for f, j in sections]

        def score(model: MeshLatency) -> float:
            if fastest:
                return model.fastest()[0]
            return float(model([torch.full((len(ms),), 1 / len(ms)) for ms in model.layer_ms]))

        return min(options, key=score)
