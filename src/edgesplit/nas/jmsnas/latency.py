"""Latency tables: what each candidate op costs at each layer of a search space on one device.

A hardware-aware search reads a table in its inner loop instead of running or estimating
networks: an architecture costs ``overhead + stem + its ops + head``
(:meth:`LatencyTable.arch_ms`), and JMSNAS's expected latency under path probabilities is the
dot product of :meth:`LatencyTable.layer_vector` with them, plus :attr:`LatencyTable.fixed_ms`.

Two ways to fill one (:func:`build_latency_table`):

- **measured**, for the device ``this-machine``: each distinct (op, channels, stride, input
  size) is captured, BN folded and fused, and cut into the whole-graph partition that
  edgesplit's torch runtime deploys, then timed *in context*
  (:class:`~edgesplit.nas.core.timing.InContextTimer`): every round runs chains stem -> one op
  per layer -> head, the op at each layer drawn from a fresh permutation, and times each call
  where it sits in the chain. Timing an op alone in a loop keeps its weights and activations
  hot; on a 2-core Xeon that predicted whole networks about 18 % too fast, in context the
  parts summed to within about 2 % of the whole. Eager ``ArchNet`` modules are not
  timed: they run batch-norm as separate kernels, about 10-15 % slower than the folded program
  a deployment runs. What the parts still miss (separate partition calls against one
  whole-network program) is measured on a few calibration networks, interleaved with the op
  timings so that both see the same machine, and stored as ``overhead_seconds``: explicit,
  never folded into the ops.
- **estimated**, for any other device: each op captured at its input shape and priced layer by
  layer with the device's default estimator (:func:`~edgesplit.hardware.estimator_for`).

A table is a :class:`~edgesplit.nas.core.table.SecondsTable`: entries in seconds (JMSNAS's
budgets are in ms, so the methods above convert), a versioned JSON file (version 2; version 1,
in milliseconds, is read by converting it) naming the space and device it was built for, each
with a fingerprint; :meth:`LatencyTable.load` refuses a table of another space or device, so a
shipped table is never silently applied to the wrong network or hardware.
:func:`validate_latency_table` reports a measured table's error on whole random networks.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.graph import LayerGraph, capture
from edgesplit.graph.partition import extract_partition
from edgesplit.hardware import (
    Device,
    LayerWork,
    MeasuredCompute,
    estimator_for,
    get_device,
    resolve_device,
)
from edgesplit.hardware.timing import (
    check_counts,
    machine_identity,
    median_ms,
    time_block,
    timing_conditions,
)
from edgesplit.nas.core.ops import OpSpec
from edgesplit.nas.core.sampling import draw_distinct
from edgesplit.nas.core.table import UNIT, SecondsTable
from edgesplit.nas.core.timing import BURST, InContextTimer
from edgesplit.nas.jmsnas.network import ArchNet, ChainFrame, init_weights
from edgesplit.nas.jmsnas.sampler import random_arch
from edgesplit.nas.jmsnas.space import Arch, SearchSpace

__all__ = [
    "LATENCY_TABLE_VERSION",
    "THIS_MACHINE",
    "LatencyTable",
    "build_latency_table",
    "device_fingerprint",
    "space_fingerprint",
    "validate_latency_table",
]

THIS_MACHINE = "this-machine"
_MEASURED = "measured"
_ESTIMATED = "estimated: "

TableProgress = Callable[[str, int, int], None]  # (stage, done, total), as hardware.profile


# -- fingerprints --------------------------------------------------------------------------


def _sha256(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def space_fingerprint(space: SearchSpace) -> str:
    """sha256 of the space's canonical JSON: any change to a layer, op list or shape changes it."""
    return _sha256(space.to_dict())


def _is_this_machine(device: Device | str) -> bool:
    return (device.name if isinstance(device, Device) else str(device)) == THIS_MACHINE


def device_fingerprint(device: Device | str) -> str:
    """sha256 of what a device's latencies depend on.

    ``this-machine`` (a name or any device so named): :func:`machine_identity`. Other devices:
    name, kind and compute model, not the description or memory, so that editing a comment does
    not orphan a table; a measured compute model is fingerprinted by its profile's content, not
    its path, so that a device file can move."""
    if _is_this_machine(device):
        return _sha256({"device": THIS_MACHINE, **machine_identity()})
    dev = resolve_device(device)
    compute = dev.compute.model_dump(mode="json")
    if isinstance(dev.compute, MeasuredCompute):
        # load_device resolved the path; an unreadable profile fails later, when estimating
        with suppress(OSError):
            compute["profile"] = hashlib.sha256(Path(dev.compute.profile).read_bytes()).hexdigest()
    return _sha256({"name": dev.name, "kind": dev.kind, "compute": compute})


def _device_name(device: Device | str) -> str:
    if _is_this_machine(device):
        return THIS_MACHINE
    return resolve_device(device).name


# -- the table -----------------------------------------------------------------------------


def _rebuild_hint(space: str, device: Device | str) -> str:
    typed, note = _typed(device)
    return (f"rebuild it with `edgesplit nas latency-table {space} --device {typed} -o FILE` "
            f"{note}(build_latency_table in Python)")


def _typed(device: Device | str) -> tuple[str, str]:
    """What a user types for ``--device`` to get ``device`` (what they typed, or a preset's
    name), or, for a device that is neither (a topology's renamed entry), a device file to
    write and a note saying what goes in it."""
    if isinstance(device, str):
        return device, ""
    name = _device_name(device)
    if name == THIS_MACHINE:
        return name, ""
    with suppress(ConfigError):
        if device_fingerprint(get_device(name)) == device_fingerprint(device):
            return name, ""
    return (f"{name}.yaml", f"with {name}.yaml a device file holding topology entry {name!r} "
            "(its fields, or `preset: NAME` and the overrides) ")


def _from_milliseconds(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 document (milliseconds, no unit) as version 2 (seconds): a table built
    before the latency tables shared one unit is read, not rebuilt."""
    measurement = data.get("measurement")
    if isinstance(measurement, Mapping) and isinstance(measurement.get("calibration"), Mapping):
        calibration = dict(measurement["calibration"])
        for old, new in (("measured_ms", "measured_seconds"),
                         ("sum_of_parts_ms", "sum_of_parts_seconds")):
            if old in calibration:
                calibration[new] = [_ms_to_s(v) for v in calibration.pop(old)]
        measurement = {**measurement, "calibration": calibration}
    fixed = {f"{name}_seconds": _ms_to_s(data[f"{name}_ms"])
             for name in ("stem", "head", "overhead") if f"{name}_ms" in data}
    layers = data.get("layers")
    if isinstance(layers, list):
        layers = [{op: _ms_to_s(ms) for op, ms in row.items()} if isinstance(row, Mapping)
                  else row for row in layers]
    rest = {k: v for k, v in data.items() if k not in ("stem_ms", "head_ms", "overhead_ms")}
    return {**rest, **fixed, "layers": layers, "measurement": measurement,
            "version": LatencyTable.VERSION, "unit": UNIT}


def _ms_to_s(value: Any) -> Any:
    """Milliseconds as seconds; anything not a number is left for the table's checks."""
    return value / 1e3 if isinstance(value, int | float) and not isinstance(value, bool) \
        else value


@dataclass(frozen=True)
class LatencyTable(SecondsTable):
    """Seconds of every candidate op at every searchable layer of one space on one device.

    ``layer_seconds[i]`` maps op name to seconds in the order of ``space.layers[i].ops``;
    identity costs 0 (a deployed network drops it). ``overhead_seconds`` is the part of a whole
    network that its parts do not account for (measured tables; 0 for estimated ones).
    ``measurement`` holds how a measured table was taken (warmup, repeats, threads, torch,
    machine, load averages, calibration); None for estimated tables. Validates itself on
    construction. JMSNAS prices in milliseconds: :meth:`op_ms`, :meth:`layer_vector`,
    :meth:`arch_ms`, :attr:`layers`, :attr:`stem_ms`, :attr:`head_ms`, :attr:`overhead_ms` and
    :attr:`fixed_ms` convert at this edge.
    """

    KIND: ClassVar[str] = "edgesplit-latency-table"
    VERSION: ClassVar[int] = 2
    WHAT: ClassVar[str] = "latency table"
    TITLE: ClassVar[str] = "an edgesplit latency table"
    REBUILD: ClassVar[str] = ("rebuild it with `edgesplit nas latency-table SPACE --device "
                              "DEVICE -o FILE`")
    READS: ClassVar[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {
        1: _from_milliseconds}

    space: str
    space_fingerprint: str
    device: str
    device_fingerprint: str
    method: str
    batch: int
    stem_seconds: float
    head_seconds: float
    layer_seconds: tuple[Mapping[str, float], ...]
    overhead_seconds: float = 0.0
    measurement: Mapping[str, Any] | None = None
    created: str = ""
    build_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.method != _MEASURED and not str(self.method).startswith(_ESTIMATED):
            self.refuse(f"method={self.method!r} must be 'measured' or 'estimated: "
                        "<estimator>'")
        self.check_batch(self.batch)
        for what in ("stem_seconds", "head_seconds"):
            object.__setattr__(self, what, self.seconds(what, getattr(self, what)))
        object.__setattr__(self, "overhead_seconds",
                           self.seconds("overhead_seconds", self.overhead_seconds, least=None))
        if not self.layer_seconds:
            self.refuse("has no layers")
        rows = []
        for i, row in enumerate(self.layer_seconds):
            if not isinstance(row, Mapping) or not row:
                self.refuse(f"layer {i} must map op names to seconds")
            rows.append({str(op): self.seconds(f"layers[{i}][{op!r}]", s)
                         for op, s in row.items()})
        object.__setattr__(self, "layer_seconds", tuple(rows))

    def rebuild(self) -> str:
        return _rebuild_hint(self.space, self.device)

    # -- queries -----------------------------------------------------------------------------

    @property
    def is_measured(self) -> bool:
        return self.method == _MEASURED

    @property
    def fixed_seconds(self) -> float:
        """What every architecture pays: overhead + stem + head."""
        return self.overhead_seconds + self.stem_seconds + self.head_seconds

    def entry_seconds(self, key: tuple[int, OpSpec | str]) -> float:
        """Seconds of op ``key[1]`` at searchable layer ``key[0]``."""
        layer, op = key
        row = self._row(layer)
        name = op.name if isinstance(op, OpSpec) else str(op)
        if name not in row:
            raise ConfigError(f"latency table of space {self.space!r} has no op {name!r} at "
                              f"layer {layer}; it has {', '.join(row)}")
        return row[name]

    @cached_property
    def layers(self) -> tuple[Mapping[str, float], ...]:
        """Per searchable layer, op name -> milliseconds, in the space's order."""
        return tuple({op: s * 1e3 for op, s in row.items()} for row in self.layer_seconds)

    @property
    def stem_ms(self) -> float:
        return self.stem_seconds * 1e3

    @property
    def head_ms(self) -> float:
        return self.head_seconds * 1e3

    @property
    def overhead_ms(self) -> float:
        return self.overhead_seconds * 1e3

    @property
    def fixed_ms(self) -> float:
        """What every architecture pays, in ms: overhead + stem + head."""
        return self.overhead_ms + self.stem_ms + self.head_ms

    def op_ms(self, layer: int, op: OpSpec | str) -> float:
        """Milliseconds of ``op`` at searchable layer ``layer``."""
        self.entry_seconds((layer, op))  # an unknown layer or op is refused in its words
        return self.layers[layer][op.name if isinstance(op, OpSpec) else str(op)]

    def layer_vector(self, layer: int) -> list[float]:
        """Layer ``layer``'s ms in the order of ``space.layers[layer].ops`` (the order of the
        supernet's paths, so it multiplies with their probabilities)."""
        self._row(layer)
        return list(self.layers[layer].values())

    def arch_ms(self, arch: Arch) -> float:
        """Predicted whole-network ms of ``arch``: overhead + stem + chosen ops + head."""
        if len(arch.ops) != len(self.layer_seconds):
            raise ConfigError(f"architecture has {len(arch.ops)} ops but the latency table of "
                              f"space {self.space!r} has {len(self.layer_seconds)} layers")
        return self.total_seconds(enumerate(arch.ops)) * 1e3

    def _row(self, layer: int) -> Mapping[str, float]:
        if not 0 <= layer < len(self.layer_seconds):
            raise ConfigError(f"layer {layer} is out of range: the latency table of space "
                              f"{self.space!r} has layers 0..{len(self.layer_seconds) - 1}")
        return self.layer_seconds[layer]

    # -- compatibility -----------------------------------------------------------------------

    def check(self, *, space: SearchSpace | str | None = None,
              device: Device | str | None = None, source: str = "") -> LatencyTable:
        """This table if it was built for ``space`` and ``device`` (each optional); else a
        ConfigError naming both sides and the command that rebuilds it."""
        what = f"latency table {source!r}" if source else "latency table"
        if space is not None:
            from edgesplit.nas.jmsnas.catalog import resolve_space

            wanted = resolve_space(space)
            fingerprint = space_fingerprint(wanted)
            if fingerprint != self.space_fingerprint:
                changed = (f"space {wanted.name!r} has changed since" if wanted.name == self.space
                           else f"it is for search space {self.space!r}, not {wanted.name!r};")
                raise ConfigError(
                    f"{what} does not fit: {changed} the table was built (space fingerprint "
                    f"{self.space_fingerprint[:12]} in the table, {fingerprint[:12]} now); "
                    + _rebuild_hint(wanted.name, self.device))
        if device is not None:
            name = _device_name(device)
            fingerprint = device_fingerprint(device)
            if fingerprint != self.device_fingerprint:
                if name != self.device:
                    reason = f"it is for device {self.device!r}, not {name!r}"
                elif name == THIS_MACHINE:
                    theirs = (self.measurement or {}).get("machine", {})
                    reason = (f"it was measured on another machine ({_describe(theirs)}; this "
                              f"one is {_describe(machine_identity())})")
                else:
                    reason = f"device {name!r} has changed since the table was built"
                raise ConfigError(
                    f"{what} does not fit: {reason} (device fingerprint "
                    f"{self.device_fingerprint[:12]} in the table, {fingerprint[:12]} now); "
                    + _rebuild_hint(self.space, device))
        return self

    # -- files -------------------------------------------------------------------------------

    def payload(self) -> dict[str, Any]:
        return {
            "space": {"name": self.space, "fingerprint": self.space_fingerprint},
            "device": {"name": self.device, "fingerprint": self.device_fingerprint},
            "method": self.method,
            "batch": self.batch,
            "created": self.created,
            "build_seconds": self.build_seconds,
            "stem_seconds": self.stem_seconds,
            "head_seconds": self.head_seconds,
            "overhead_seconds": self.overhead_seconds,
            "layers": [dict(row) for row in self.layer_seconds],
            "measurement": dict(self.measurement) if self.measurement is not None else None,
        }

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> LatencyTable:
        return cls(
            space=str(data["space"]["name"]), space_fingerprint=str(data["space"]["fingerprint"]),
            device=str(data["device"]["name"]),
            device_fingerprint=str(data["device"]["fingerprint"]),
            method=data["method"], batch=data["batch"], stem_seconds=data["stem_seconds"],
            head_seconds=data["head_seconds"], layer_seconds=tuple(data["layers"]),
            overhead_seconds=data.get("overhead_seconds", 0.0),
            measurement=data.get("measurement"), created=str(data.get("created", "")),
            build_seconds=float(data.get("build_seconds", 0.0)))

    @classmethod
    def load(cls, path: str | Path, *, space: SearchSpace | str | None = None,
             device: Device | str | None = None) -> LatencyTable:
        """Read a table; with ``space``/``device`` also check it was built for them.

        An unreadable or corrupt file, an unknown version, or a table of another space or
        device is a ConfigError naming the file, both sides and the command that rebuilds it."""
        return cls.read(path).check(space=space, device=device, source=str(path))


LATENCY_TABLE_VERSION = LatencyTable.VERSION


def _describe(identity: Mapping[str, Any]) -> str:
    if not identity:
        return "unknown machine"
    return f"{identity.get('processor', '?')}, {identity.get('cpus', '?')} CPUs"


# -- building ------------------------------------------------------------------------------

_Key = tuple[str, int, int, int, int, int]  # op name, in_ch, out_ch, stride, height, width


def _key(space: SearchSpace, index: int, op: OpSpec) -> _Key:
    layer = space.layers[index]
    return (op.name, space.in_channels(index), layer.out_channels, layer.stride,
            *space.in_size(index))


class _Stem(nn.Module):
    """A space's stem on its own (the frame is shared with :class:`_Head`, so both are exactly
    what :class:`ChainFrame` runs)."""

    def __init__(self, frame: ChainFrame) -> None:
        super().__init__()
        self.frame = frame

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frame.forward_stem(x)


class _Head(_Stem):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frame.forward_head(x)


@dataclass
class _Pieces:
    """The modules a table prices, with example inputs; ops built once per distinct shape.
    ``positions[i]`` lists layer i's (op name, shape key) in the space's order; identity's key
    is None (a deployed network drops it, so it costs nothing)."""

    stem: tuple[nn.Module, torch.Tensor]
    head: tuple[nn.Module, torch.Tensor]
    ops: dict[_Key, tuple[nn.Module, torch.Tensor]] = field(default_factory=dict)
    positions: list[list[tuple[str, _Key | None]]] = field(default_factory=list)

    @classmethod
    def of(cls, space: SearchSpace, batch: int) -> _Pieces:
        frame = ChainFrame(space)
        init_weights(frame)
        final = space.in_size(len(space.layers))
        pieces = cls(stem=(_Stem(frame), torch.randn(batch, *space.input_shape)),
                     head=(_Head(frame), torch.randn(batch, space.out_channels, *final)))
        for i, layer in enumerate(space.layers):
            row: list[tuple[str, _Key | None]] = []
            for op in layer.ops:
                key = None if op.is_identity else _key(space, i, op)
                if key is not None and key not in pieces.ops:
                    module = op.build(key[1], key[2], key[3])
                    init_weights(module)
                    pieces.ops[key] = (module, torch.randn(batch, key[1], key[4], key[5]))
                row.append((op.name, key))
            pieces.positions.append(row)
        return pieces

    def items(self) -> list[tuple[str | _Key, tuple[nn.Module, torch.Tensor]]]:
        return [("stem", self.stem), ("head", self.head), *self.ops.items()]


_Call = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def _captured(module: nn.Module, example: torch.Tensor) -> LayerGraph:
    return capture(module.eval(), example, name=type(module).__name__)


def _deployed(graph: LayerGraph) -> _Call:
    """The whole graph as the partition the torch runtime runs (no pytree wrapper)."""
    return extract_partition(graph, [layer.name for layer in graph.layers]).module


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return []


def build_latency_table(space: SearchSpace | str, device: Device | str, *, batch: int = 1,
                        warmup: int = 5, repeats: int = 50, threads: int | None = None,
                        calibration: int = 5, seed: int = 0,
                        progress: TableProgress | None = None) -> LatencyTable:
    """The latency table of ``space`` on ``device`` at batch size ``batch``.

    ``this-machine`` (or any device of that name) is measured as the module docstring says:
    ``warmup`` untimed rounds, then ``repeats`` timed ones in which every op runs at least once
    in a chain with random neighbours, in a burst of which two passes are timed (so at least
    ``2 * repeats`` samples per op; medians kept); ``threads`` torch threads (default: the
    current setting, what a deployment in this process would use); ``calibration`` random
    networks, drawn from a stream of ``seed`` apart from validation's, timed whole in the same
    rounds for ``overhead_seconds`` (0: no overhead term). Other devices are estimated and ignore
    the timing arguments. Ops sharing a shape are built and captured once.
    ``progress(stage, done, total)`` is called as the work advances.
    """
    from edgesplit.nas.jmsnas.catalog import resolve_space

    space = resolve_space(space)
    check_counts(batch=(batch, 1), warmup=(warmup, 0), repeats=(repeats, 1),
                  calibration=(calibration, 0))
    if threads is not None:
        check_counts(threads=(threads, 1))
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # building modules leaves the caller's RNG alone
        torch.manual_seed(seed)
        pieces = _Pieces.of(space, batch)
        if _is_this_machine(device):
            name = THIS_MACHINE
            fields = _measure(space, pieces, warmup=warmup, repeats=repeats,
                              threads=threads or torch.get_num_threads(),
                              calibration=calibration, seed=seed, progress=progress)
        else:
            dev = resolve_device(device)
            name = dev.name
            fields = _estimate(space, batch, pieces, dev, progress)
    return LatencyTable(
        space=space.name, space_fingerprint=space_fingerprint(space), device=name,
        device_fingerprint=device_fingerprint(device), batch=batch,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        build_seconds=round(time.perf_counter() - start, 3), **fields)


def _rows(pieces: _Pieces, cost: Callable[[int, int, _Key], float]
          ) -> tuple[dict[str, float], ...]:
    return tuple({name: (cost(i, j, key) if key is not None else 0.0)
                  for j, (name, key) in enumerate(row)}
                 for i, row in enumerate(pieces.positions))


# What an estimator prices, per (space fingerprint, batch), then per piece: a piece's layers'
# work depends on its shapes only, so the tables of several devices (JMSNAS derives one per
# device of a topology) capture each piece once per process instead of once per device. Only
# the last _WORKS_SPACES spaces are kept, so a process that builds tables for many spaces
# (a sweep, a long-lived notebook) does not keep every one's captured work.
_WORKS_SPACES = 4
_WORKS: OrderedDict[tuple[str, int], dict[str | _Key, tuple[LayerWork, ...]]] = OrderedDict()


def _works(space: SearchSpace, batch: int, key: str | _Key, module: nn.Module,
           example: torch.Tensor) -> tuple[LayerWork, ...]:
    space_key = (space_fingerprint(space), batch)
    pieces = _WORKS.setdefault(space_key, {})
    _WORKS.move_to_end(space_key)
    while len(_WORKS) > _WORKS_SPACES:
        _WORKS.popitem(last=False)
    if key not in pieces:
        graph = _captured(module, example)
        pieces[key] = tuple(LayerWork.of(graph, layer) for layer in graph.layers)
    return pieces[key]


def _estimate(space: SearchSpace, batch: int, pieces: _Pieces, device: Device,
              progress: TableProgress | None) -> dict[str, Any]:
    """Each distinct piece captured once and priced layer by layer by the device's estimator."""
    estimator = estimator_for(device)
    cost: dict[str | _Key, float] = {}
    items = pieces.items()
    for done, (key, (module, example)) in enumerate(items, start=1):
        cost[key] = sum(estimator.layer_ms(work, device)
                        for work in _works(space, batch, key, module, example)) / 1e3
        if progress:
            progress("estimating ops", done, len(items))
    return {"method": f"{_ESTIMATED}{type(estimator).__name__}", "stem_seconds": cost["stem"],
            "head_seconds": cost["head"],
            "layer_seconds": _rows(pieces, lambda i, j, key: cost[key])}


def _distinct_archs(space: SearchSpace, rng: np.random.Generator, count: int,
                    exclude: Collection[tuple[str, ...]] = ()) -> list[Arch]:
    """Up to ``count`` distinct random architectures not in ``exclude`` (a small space may have
    fewer: the draws stop after 50 tries per wanted architecture)."""
    return draw_distinct(lambda: random_arch(space, rng), count, proposals=50 * count,
                         seen=set(exclude), key=lambda arch: arch.names)


def _measure(space: SearchSpace, pieces: _Pieces, *, warmup: int, repeats: int, threads: int,
             calibration: int, seed: int, progress: TableProgress | None) -> dict[str, Any]:
    """Capture every piece and the calibration networks, then time them in context."""
    items = pieces.items()
    archs = _distinct_archs(space, np.random.default_rng([seed, 1]), calibration)
    total = len(items) + len(archs)
    calls: dict[str | _Key, _Call] = {}
    for done, (key, (module, example)) in enumerate(items, start=1):
        calls[key] = _deployed(_captured(module, example))
        if progress:
            progress("capturing ops", done, total)
    x = pieces.stem[1]
    whole = []
    for done, arch in enumerate(archs, start=len(items) + 1):
        whole.append(_deployed(_captured(ArchNet(space, arch), x)))
        if progress:
            progress("capturing calibration networks", done, total)
    before = _load()
    timer = InContextTimer()
    with timing_conditions(threads):
        whole_ns = _in_context(pieces, calls, whole, x, timer, warmup=warmup, repeats=repeats,
                               rng=np.random.default_rng([seed, 2]), progress=progress)
    after = _load()
    stem, head = timer.seconds("stem"), timer.seconds("head")
    rows = _rows(pieces, lambda i, j, key: timer.seconds((i, j)))
    parts = [stem + head + sum(rows[i][op.name] for i, op in enumerate(arch.ops))
             for arch in archs]
    # A network with no timed block (more calibration networks than rounds) is left out.
    measured = [statistics.median(s) / 1e9 if s else None for s in whole_ns]
    residuals = [m - p for m, p in zip(measured, parts, strict=True) if m is not None]
    ops = [timer.count((i, j)) for i, row in enumerate(pieces.positions)
           for j, (_, key) in enumerate(row) if key is not None]
    return {
        "method": _MEASURED, "stem_seconds": stem, "head_seconds": head, "layer_seconds": rows,
        "overhead_seconds": statistics.median(residuals) if residuals else 0.0,
        "measurement": {
            "timing": "in context: chains stem -> one op per layer -> head, ops drawn from a "
                      "fresh permutation per layer each round, each chain run in a burst of "
                      f"{BURST} (first untimed), one calibration network per round in a block "
                      f"of {_BLOCK}; captured, BN-folded partitions as the torch runtime runs "
                      "them; medians",
            "warmup": warmup, "repeats": repeats, "threads": threads,
            "min_samples_per_op": min((n for n in ops if n), default=0),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "machine": machine_identity(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "load_average": {"before": before, "after": after},
            "calibration": {"archs": [list(a.names) for a in archs],
                            "measured_seconds": measured, "sum_of_parts_seconds": parts},
        },
    }


def _in_context(pieces: _Pieces, calls: Mapping[str | _Key, _Call], whole: Sequence[_Call],
                x: torch.Tensor, timer: InContextTimer, *, warmup: int, repeats: int,
                rng: np.random.Generator, progress: TableProgress | None) -> list[list[int]]:
    """The stem (key ``"stem"``), the head (``"head"``) and each (layer, op) (``(i, j)``)
    timed by ``timer`` in chains; returns the nanosecond samples of each whole network.

    A round runs as many chains as the widest layer has ops; layer i's op in chain k is
    ``perm_i[k mod n_i]`` for a fresh permutation ``perm_i``, so every op runs at least once
    per round and meets varying neighbours. Each chain runs in a burst
    (:meth:`InContextTimer.burst`): the steady state of a network serving inference back to
    back, which is what a deployment sees. The whole (calibration) networks run in the same
    rounds, one per round in a block of back-to-back calls, so parts and wholes share the
    machine's conditions."""
    layers = [[calls[key] if key is not None else None for _, key in row]
              for row in pieces.positions]
    widest = max(len(row) for row in layers)
    whole_ns: list[list[int]] = [[] for _ in whole]

    def chain(ops: list[tuple[tuple[int, int], _Call]]) -> None:
        y = timer.call("stem", calls["stem"], x)[0]
        for key, fn in ops:
            y = timer.call(key, fn, y)[0]
        timer.call("head", calls["head"], y)

    rounds = warmup + repeats
    for r in range(rounds):
        perms = [rng.permutation(len(row)) for row in layers]
        for k in range(widest):
            ops = []
            for i, perm in enumerate(perms):
                j = int(perm[k % len(perm)])
                fn = layers[i][j]
                if fn is not None:
                    ops.append(((i, j), fn))
            timer.burst(partial(chain, ops), r >= warmup)
        if whole:  # one calibration network per round, in a block (see time_block)
            n = r % len(whole)
            time_block(partial(whole[n], x), 1, _BLOCK if r >= warmup else 0, whole_ns[n])
        if progress:
            progress("timing ops in context", r + 1, rounds)
    return whole_ns


_BLOCK = 5  # timed calls of a whole network per block in a build round


# -- validation ----------------------------------------------------------------------------

_PASSES = 3


def validate_latency_table(table: LatencyTable, space: SearchSpace | str, *, samples: int = 30,
                           seed: int = 0, warmup: int = 5, repeats: int = 50,
                           progress: TableProgress | None = None) -> dict[str, Any]:
    """The table's error on whole networks: ``samples`` distinct random architectures (none of
    the table's calibration networks) captured and timed whole on this machine with the
    table's batch size and threads. Each network is timed as a deployment runs it, back to
    back in blocks (``warmup`` untimed calls, then its share of ``repeats``), in three passes
    over all networks so that slow drift of the machine spreads over all of them.

    Returns ``archs`` (names, ``predicted_ms``, ``measured_ms``, ``error_pct``), ``mape_pct``,
    ``worst_error_pct`` (signed, largest in size), ``fraction_within_10pct``, and two signs
    of whether the machine was quiet: ``load_average`` before and after (with ``cpus``), and
    ``drift_pct``, how much slower (positive) the table's calibration networks run now than
    when the table was built, timed in the same passes. On a busy machine torch's worker
    threads wait for cores; an error of about the drift's size is the machine's, not the
    table's. Only a table measured here can be checked here: an estimated table is refused."""
    from edgesplit.nas.jmsnas.catalog import resolve_space

    space = resolve_space(space)
    check_counts(samples=(samples, 1), warmup=(warmup, 0), repeats=(repeats, 1))
    if not table.is_measured:
        raise ConfigError(
            f"the latency table of device {table.device!r} was {table.method}, not measured: "
            "validation times whole networks on this machine, so it applies only to a table "
            "measured here (device this-machine); an estimator's error is checked on the "
            "device itself (`edgesplit profile MODEL --validate` there)")
    table.check(space=space, device=THIS_MACHINE)
    info = table.measurement or {}
    held_out = {tuple(a) for a in info.get("calibration", {}).get("archs", [])}
    archs = _distinct_archs(space, np.random.default_rng(seed), samples, held_out)
    if not archs:
        raise ConfigError(f"space {space.name!r} has no architecture besides the table's "
                          "calibration networks to validate on")
    threads = int(info.get("threads") or torch.get_num_threads())
    calibration = info.get("calibration", {})
    references = [(Arch.from_names(a), seconds) for a, seconds in
                  zip(calibration.get("archs", []), calibration.get("measured_seconds", []),
                      strict=False) if seconds]
    calls = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        x = torch.randn(table.batch, *space.input_shape)
        timed = archs + [arch for arch, _ in references]
        for done, arch in enumerate(timed, start=1):
            calls.append(_deployed(_captured(ArchNet(space, arch), x)))
            if progress:
                progress("capturing networks", done, len(timed))
    before = _load()
    per_pass = -(-repeats // _PASSES)
    with timing_conditions(threads):
        samples_ns: list[list[int]] = [[] for _ in calls]
        for p in range(_PASSES):
            for n, (fn, samples_of) in enumerate(zip(calls, samples_ns, strict=True)):
                time_block(partial(fn, x), warmup, per_pass, samples_of)
                if progress:
                    progress("timing networks", p * len(calls) + n + 1, _PASSES * len(calls))
    after = _load()
    drift = [100.0 * (statistics.median(ns) / 1e9 - then) / then
             for (_, then), ns in zip(references, samples_ns[len(archs):], strict=True)]
    rows: list[dict[str, Any]] = []
    errors: list[float] = []
    for arch, ns in zip(archs, samples_ns[:len(archs)], strict=True):
        predicted, measured = table.arch_ms(arch), median_ms(ns)
        errors.append(100.0 * (predicted - measured) / measured)
        rows.append({"arch": list(arch.names), "predicted_ms": predicted,
                     "measured_ms": measured, "error_pct": errors[-1]})
    return {
        "space": table.space, "device": table.device, "method": table.method,
        "batch": table.batch, "threads": threads, "cpus": os.cpu_count(),
        "samples": len(rows), "seed": seed,
        "warmup": warmup, "repeats": repeats,
        "load_average": {"before": before, "after": after},
        "mape_pct": statistics.fmean(abs(e) for e in errors),
        "worst_error_pct": max(errors, key=abs),
        "fraction_within_10pct": sum(abs(e) <= 10.0 for e in errors) / len(errors),
        "drift_pct": statistics.median(drift) if drift else None,
        "archs": rows,
    }
