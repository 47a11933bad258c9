"""JMSNAS's expected completion latency on a chain of devices (paper 000, eq. 1 and IV-B).

The network is a sequence of *units*: the stem, the searchable layers, the head. JMSNAS fixes
which device runs which unit before searching (section III-C: "the parameters D^m, d(m) are
determined for each m"): a :class:`ChainPlacement` gives every unit a device, in chain order.
The completion latency is then

    T = sum over devices m of ( sum_{n in D^m} tau_n^m + eps_{d(m)}^m ),

and with path probabilities ``p_n`` the compute of a searchable layer becomes its expectation
``E[tau_n^m] = sum_i p_{n,i} U_n^m(v_i)`` (``U`` from the device's latency table), so ``E[T]``
is differentiable in the architecture parameters. Every unit's output shape is fixed by the
space whatever op is chosen, so the transfers ``eps`` are constants: bytes / bandwidth plus
half the link's RTT (the cost convention of every Plan, ``docs/cost-model.md``), relayed over
every link between the two devices. The raw input starts on the chain's first device and the
result is needed on its last, as in the chain planners.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import torch

from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.hardware import Link, Topology
from edgesplit.nas.jmsnas.space import Arch, SearchSpace
from edgesplit.nas.jmsnas.supernet import Supernet
from edgesplit.plan.chain_dp import solve_chain

if TYPE_CHECKING:
    from edgesplit.nas.jmsnas.mesh_latency import MeshLatency

__all__ = ["ChainLatency", "ChainPlacement", "LayerLatencies", "chain_devices", "check_budget",
           "unit_names", "unit_output_bytes"]

FLOAT_BYTES = 4  # activations travel as float32 during the search, as the float Plan sends them


class LayerLatencies(Protocol):
    """What the latency model needs of a device's latency table
    (:class:`~edgesplit.nas.jmsnas.latency.LatencyTable`); a table may also carry ``overhead_ms``,
    what a device pays per network it runs a part of beyond its ops (0 if absent)."""

    @property
    def stem_ms(self) -> float: ...

    @property
    def head_ms(self) -> float: ...

    def layer_vector(self, layer: int) -> list[float]:
        """ms of every candidate of ``layer``, in the order of ``space.layers[layer].ops``."""
        ...


def unit_names(space: SearchSpace) -> list[str]:
    return ["stem", *(f"layers.{i}" for i in range(len(space.layers))), "head"]


def unit_output_bytes(space: SearchSpace) -> list[int]:
    """Bytes of the tensor each unit outputs (float32): the stem's and every layer's feature
    map, then the head's logits; the same for every architecture of the space."""
    h, w = space.in_size(0)
    elements = [space.stem.out_channels * h * w]
    for layer in space.layers:
        h, w = (h + layer.stride - 1) // layer.stride, (w + layer.stride - 1) // layer.stride
        elements.append(layer.out_channels * h * w)
    elements.append(space.num_classes)
    return [FLOAT_BYTES * n for n in elements]


@dataclass(frozen=True)
class ChainPlacement:
    """The device (by chain position) of every unit: stem, layers..., head; non-decreasing,
    since data only flows forward along a chain."""

    devices: tuple[str, ...]
    unit_device: tuple[int, ...]

    def __post_init__(self) -> None:
        if any(b < a for a, b in zip(self.unit_device, self.unit_device[1:], strict=False)):
            raise ConfigError(f"a chain placement must move forward along the chain; got "
                              f"{self.unit_device}")
        if not all(0 <= d < len(self.devices) for d in self.unit_device):
            raise ConfigError(f"placement {self.unit_device} names devices outside 0.."
                              f"{len(self.devices) - 1}")

    @classmethod
    def from_counts(cls, devices: Sequence[str], counts: Sequence[int]) -> ChainPlacement:
        """``counts[m]`` units on device m in chain order (JMSNAS's |D^m|), e.g. (3, 4, 3, 0)."""
        if len(counts) != len(devices) or min(counts, default=0) < 0:
            raise ConfigError(f"give one non-negative unit count per device ({len(devices)}: "
                              f"{', '.join(devices)}); got {list(counts)}")
        return cls(tuple(devices), tuple(m for m, n in enumerate(counts) for _ in range(n)))

    def counts(self) -> list[int]:
        return [self.unit_device.count(m) for m in range(len(self.devices))]

    def units_on(self, space: SearchSpace) -> dict[str, list[str]]:
        """Device name -> the units it runs (empty devices relay)."""
        names = unit_names(space)
        return {d: [names[u] for u, m in enumerate(self.unit_device) if m == i]
                for i, d in enumerate(self.devices)}


class ChainLatency:
    """``E[T]`` of eq. (1) for a space placed on a chain topology, from one latency table per
    device; callable on the path probabilities (one tensor per searchable layer)."""

    def __init__(self, space: SearchSpace, topology: Topology,
                 tables: Mapping[str, LayerLatencies], placement: ChainPlacement) -> None:
        self.space, self.topology, self.placement = space, topology, placement
        self.devices = chain_devices(topology)
        if tuple(self.devices) != placement.devices:
            raise ConfigError(f"the placement is for devices {placement.devices}, the topology "
                              f"{topology.name!r} chains {tuple(self.devices)}")
        if len(placement.unit_device) != len(space.layers) + 2:
            raise ConfigError(f"the placement places {len(placement.unit_device)} units; space "
                              f"{space.name!r} has {len(space.layers) + 2} (stem, layers, head)")
        _check_tables(topology, self.devices, tables)
        self.tables = tables
        units = placement.unit_device
        self.layer_ms = [torch.tensor(tables[self.devices[units[i + 1]]].layer_vector(i),
                                      dtype=torch.float64) for i in range(len(space.layers))]
        self.stem_ms = tables[self.devices[units[0]]].stem_ms
        self.head_ms = tables[self.devices[units[-1]]].head_ms
        self.overhead_ms = {self.devices[m]: _overhead(tables[self.devices[m]])
                            for m in sorted(set(units))}
        self.transfers = _transfers(topology, self.devices, units, unit_output_bytes(space),
                                    _input_bytes(space))

    def make_supernet(self, weights: Literal["separate", "shared"]) -> Supernet:
        """The supernet the search trains on this latency model's space."""
        return Supernet(self.space, weights=weights)

    @property
    def transfer_ms(self) -> float:
        return sum(ms for _, _, ms in self.transfers)

    @property
    def constant_ms(self) -> float:
        """What no op choice changes: stem, head, every busy device's overhead, transfers."""
        return self.stem_ms + self.head_ms + sum(self.overhead_ms.values()) + self.transfer_ms

    def __call__(self, probs: Sequence[torch.Tensor]) -> torch.Tensor:
        """E[T] in ms, differentiable in ``probs`` (each summing to 1 over a layer's ops)."""
        total = torch.tensor(self.constant_ms, dtype=torch.float64)
        for p, ms in zip(probs, self.layer_ms, strict=True):
            total = total + torch.dot(p.to(torch.float64), ms)
        return total

    def of_arch(self, arch: Arch) -> float:
        """T of one architecture (one-hot probabilities)."""
        indices = self.space.arch_indices(arch)
        return self.constant_ms + sum(float(ms[i]) for ms, i in zip(self.layer_ms, indices,
                                                                   strict=True))

    def fastest(self) -> tuple[float, Arch]:
        """The fastest architecture under this placement and its latency (layers are
        independent given the placement, so it is the per-layer fastest op)."""
        arch = self.space.arch_from_indices([int(torch.argmin(ms)) for ms in self.layer_ms])
        return self.of_arch(arch), arch

    def breakdown(self, arch: Arch) -> dict[str, float]:
        """Per-device compute and the transfers of one architecture, in ms."""
        indices = self.space.arch_indices(arch)
        out = {d: 0.0 for d in self.devices}
        units = self.placement.unit_device
        out[self.devices[units[0]]] += self.stem_ms
        out[self.devices[units[-1]]] += self.head_ms
        for device, overhead in self.overhead_ms.items():
            out[device] += overhead
        for i, (ms, k) in enumerate(zip(self.layer_ms, indices, strict=True)):
            out[self.devices[units[i + 1]]] += float(ms[k])
        out["transfers"] = self.transfer_ms
        return out

    @classmethod
    def best_placement(cls, space: SearchSpace, topology: Topology,
                       tables: Mapping[str, LayerLatencies], *, fastest: bool = False
                       ) -> ChainLatency:
        """The placement minimising E[T] with every op equally likely (the search's starting
        point), or with every layer at its fastest op (``fastest=True``); exact (the chain DP)."""
        devices = chain_devices(topology)
        _check_tables(topology, devices, tables)
        cost = np.array([[_unit_ms(tables[d], u, space, fastest) for d in devices]
                         for u in range(len(space.layers) + 2)])
        units = _place(topology, devices, cost, unit_output_bytes(space), _input_bytes(space))
        return cls(space, topology, tables, ChainPlacement(tuple(devices), units))

    def check_budget(self, budget_ms: float) -> None:
        """InfeasibleError naming the fastest achievable latency if ``budget_ms`` is below it."""
        check_budget(self, budget_ms, f" with units placed {self.placement.counts()} on "
                                      f"{', '.join(self.devices)}")


def check_budget(model: ChainLatency | MeshLatency, budget_ms: float, where: str = "") -> None:
    """InfeasibleError naming ``model``'s fastest latency if ``budget_ms`` is below it."""
    fastest_ms, arch = model.fastest()
    if budget_ms < fastest_ms:
        raise InfeasibleError(
            f"no architecture of {model.space.name!r} meets {budget_ms:g} ms on "
            f"{model.topology.name!r}: the fastest ({arch}) takes {fastest_ms:.3f} ms{where}; "
            f"raise the budget to at least {math.ceil(fastest_ms * 1000) / 1000:g} ms")


def chain_devices(topology: Topology) -> list[str]:
    """The chain's devices from source to sink; a ConfigError for any other topology."""
    if not topology.is_chain:
        raise ConfigError(f"topology {topology.name!r} is not a chain: the JMSNAS search places "
                          "a chain network on a chain of devices (eq. 1); plan over a chain "
                          "topology such as jmsnas-chain")
    return topology.chain_order()


def _check_tables(topology: Topology, devices: Sequence[str],
                  tables: Mapping[str, LayerLatencies]) -> None:
    missing = [d for d in devices if d not in tables]
    if missing:
        raise ConfigError(f"no latency table for device(s) {', '.join(missing)} of topology "
                          f"{topology.name!r}: build one per device (edgesplit nas "
                          "latency-table SPACE --device DEVICE)")


def _input_bytes(space: SearchSpace) -> int:
    return FLOAT_BYTES * int(np.prod(space.input_shape))


def _overhead(table: LayerLatencies) -> float:
    return float(getattr(table, "overhead_ms", 0.0))


def _unit_ms(table: LayerLatencies, unit: int, space: SearchSpace, fastest: bool) -> float:
    if unit == 0:
        return table.stem_ms
    if unit == len(space.layers) + 1:
        return table.head_ms
    ms = table.layer_vector(unit - 1)
    return min(ms) if fastest else float(np.mean(ms))


def _hop_ms(link: Link, nbytes: int) -> float:
    return link.transfer_ms(nbytes) + link.rtt_ms / 2


def _relay_ms(topology: Topology, devices: Sequence[str], src: int, dst: int,
              nbytes: int) -> float:
    return sum(_hop_ms(topology.link(devices[k], devices[k + 1]), nbytes) for k in range(src, dst))


def _transfers(topology: Topology, devices: Sequence[str], units: Sequence[int],
               out_bytes: Sequence[int], input_bytes: int) -> list[tuple[str, str, float]]:
    """(what, route, ms) of every tensor that crosses devices: the input to the stem's device,
    each unit's output to the next unit's device, the logits to the last device."""
    stops = [0, *units, len(devices) - 1]
    sizes = [input_bytes, *out_bytes]
    names = ["input", "stem", *(f"layers.{i}" for i in range(len(units) - 2)), "head"]
    found = []
    for k in range(len(stops) - 1):
        src, dst = stops[k], stops[k + 1]
        if dst > src:
            found.append((names[k], f"{devices[src]}->{devices[dst]}",
                          _relay_ms(topology, devices, src, dst, sizes[k])))
    return found


def _place(topology: Topology, devices: Sequence[str], cost: np.ndarray,
           out_bytes: Sequence[int], input_bytes: int) -> tuple[int, ...]:
    """The device of every unit (``cost``: [unit, device] ms) that minimises compute plus
    relays: the chain DP over unit ranges, where cut c (the input, then unit c-1's output) is
    what a hop carries. Ties go to the later boundary: the last unit on the lowest device it
    can be, then the unit before, and so on."""
    sizes = [input_bytes, *out_bytes]
    hops = [[_hop_ms(topology.link(a, b), nbytes) for nbytes in sizes]
            for a, b in itertools.pairwise(devices)]
    prefix = np.concatenate([np.zeros((1, cost.shape[1])), np.cumsum(cost, axis=0)]).T
    bounds = solve_chain(prefix, lambda hop, cut: hops[hop][cut], ties="last").boundaries()
    assert bounds is not None, "no range is ruled out, so some placement fits"
    return tuple(m for m, (a, b) in enumerate(itertools.pairwise(bounds)) for _ in range(a, b))
