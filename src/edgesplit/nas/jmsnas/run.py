"""JMSNAS end to end, as ``edgesplit nas jmsnas`` and the benchmark run it: latency tables for
every device of the topology, the placement, both stages, and the result folder with its Plan.

Tables come from files the user measured (``--table DEVICE=FILE``: refused if built for another
space or device) or are built on the spot: measured for ``this-machine``, estimated from the
device model for presets (:func:`~edgesplit.nas.jmsnas.latency.build_latency_table`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.data.training import LabelledData
from edgesplit.errors import ConfigError, option
from edgesplit.hardware import Topology
from edgesplit.nas.jmsnas.chain_latency import ChainLatency, ChainPlacement, chain_devices
from edgesplit.nas.jmsnas.latency import LatencyTable, build_latency_table
from edgesplit.nas.jmsnas.mesh_latency import MeshLatency
from edgesplit.nas.jmsnas.result import SearchResult, save_search_result
from edgesplit.nas.jmsnas.search import JMSNAS, LatencyModel
from edgesplit.nas.jmsnas.space import SearchSpace
from edgesplit.plan.mesh import mesh_shape

__all__ = ["JMSNASRun", "latency_tables", "parse_table_options", "run_jmsnas"]

Progress = Callable[[str, int, int], None]


@dataclass
class JMSNASRun:
    search: JMSNAS
    latency: LatencyModel
    tables: dict[str, LatencyTable]
    result: SearchResult | None

    def summary(self) -> dict[str, Any]:
        doc = self.search.summary()
        doc["version"] = 1
        doc["space"] = self.latency.space.name
        doc["topology"] = self.latency.topology.name
        if isinstance(self.latency, MeshLatency):
            doc["space"] = self.latency.base.name
            doc["layout"] = self.latency.layout.to_dict()
        doc["tables"] = {d: {"method": t.method, "fixed_ms": t.fixed_ms}
                         for d, t in self.tables.items()}
        if self.result is not None:
            doc["folder"] = str(self.result.folder)
            for key in ("plan", "plans", "kept"):
                doc[key] = self.result.summary[key]
            if "runnable_plan" in self.result.summary:
                doc["runnable_plan"] = self.result.summary["runnable_plan"]
        return doc


def parse_table_options(options: list[str]) -> dict[str, Path]:
    """``["ue=ue.json", ...]`` as device -> path."""
    found: dict[str, Path] = {}
    for item in options:
        device, sep, path = item.partition("=")
        if not sep or not device or not path:
            raise ConfigError(f"table {item!r}: write DEVICE=FILE, e.g. ue=ue-table.json")
        found[device] = Path(path)
    return found


def latency_tables(space: SearchSpace, topology: Topology, files: Mapping[str, Path] | None = None,
                   *, progress: Progress | None = None) -> dict[str, LatencyTable]:
    """One table per device of ``topology``: loaded from ``files`` where given (checked
    against the space and the device), built otherwise."""
    names = [d.name for d in topology.devices]
    unknown = sorted(set(files or {}) - set(names))
    if unknown:
        raise ConfigError(f"latency tables given for {', '.join(unknown)}, which topology "
                          f"{topology.name!r} does not have; its devices: {', '.join(names)}")
    tables = {}
    for i, name in enumerate(names):
        device = topology.device(name)
        path = (files or {}).get(name)
        tables[name] = (LatencyTable.load(path, space=space, device=device) if path is not None
                        else build_latency_table(space, device))
        if progress:
            progress("latency tables", i + 1, len(names))
    return tables


def _check_shape(topology: Topology, placement: list[int] | None,
                 section: tuple[int, int] | None) -> None:
    if topology.is_chain:
        chain_devices(topology)
        if section is not None:
            raise ConfigError(f"a branch section applies to a mesh; {topology.name!r} is a "
                              "chain (give a placement instead, or nothing)")
        return
    mesh_shape(topology)  # a ConfigError naming the supported mesh shape
    if placement is not None:
        raise ConfigError(f"a placement of units along a chain does not apply to the mesh "
                          f"{topology.name!r}; give a branch section instead, or nothing")


def _latency_model(space: SearchSpace, topology: Topology, tables: Mapping[str, LatencyTable],
                   budget_ms: float, placement: list[int] | None,
                   section: tuple[int, int] | None) -> LatencyModel:
    if not topology.is_chain:
        mesh = MeshLatency.best(space, topology, tables, section=section)
        if mesh.fastest()[0] > budget_ms:
            mesh = MeshLatency.best(space, topology, tables, section=section, fastest=True)
        return mesh
    if placement is not None:
        return ChainLatency(space, topology, tables,
                            ChainPlacement.from_counts(topology.chain_order(), placement))
    chain = ChainLatency.best_placement(space, topology, tables)
    if chain.fastest()[0] > budget_ms:
        chain = ChainLatency.best_placement(space, topology, tables, fastest=True)
    return chain


def run_jmsnas(space: SearchSpace, topology: Topology, data: LabelledData, *,
               budget_ms: float, tables: Mapping[str, LatencyTable] | None = None,
               table_files: Mapping[str, Path] | None = None,
               placement: list[int] | None = None, section: tuple[int, int] | None = None,
               out: str | Path | None = None, progress: Progress | None = None,
               **params: Any) -> JMSNASRun:
    """Search, derive, retrain and (with ``out``) write the result folder and its Plan.

    On a chain, ``placement``: units per device along it (JMSNAS's |D^m|). On a mesh,
    ``section``: the layers ``(fork, join)`` copied onto the branch devices. Default for
    both: the least expected latency with every op equally likely, or at the fastest ops if
    that cannot meet the budget. ``params`` go to :class:`JMSNAS`."""
    _check_shape(topology, placement, section)  # before any table is built
    if not budget_ms > 0:
        raise ConfigError(f"{option('budget_ms', budget_ms, flag='--latency-budget-ms')} must "
                          "be positive")
    if data.sample_shape != tuple(space.input_shape):  # JMSNAS.fit checks it after the tables
        raise ConfigError(f"the data's samples are {data.sample_shape}; space {space.name!r} "
                          f"takes {tuple(space.input_shape)}")
    found = dict(tables) if tables is not None else latency_tables(space, topology,
                                                                   table_files,
                                                                   progress=progress)
    latency = _latency_model(space, topology, found, budget_ms, placement, section)
    search = JMSNAS(latency_budget_ms=budget_ms, progress=progress, **params)
    search.fit(data, latency.space, latency).retrain()
    run = JMSNASRun(search, latency, found, None)
    if out is not None:
        own = latency.placement if isinstance(latency, ChainLatency) else None
        run.result = save_search_result(out, search.model_, topology, summary=run.summary(),
                                        placement=own)
    return run
