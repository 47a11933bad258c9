"""JMSNAS end to end, as ``edgesplit nas jmsnas`` and the benchmark run it: latency tables for
every device of the topology, the placement, both stages, and the result folder with its Plan.

Tables come from files the user measured (``--table DEVICE=FILE``: refused if built for another
space or device) or are built on the spot: measured for ``this-machine``, estimated from the
device model for presets (:func:`~edgesplit.nas.latency.build_latency_table`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.data.training import LabelledData
from edgesplit.errors import ConfigError
from edgesplit.hardware import Topology
from edgesplit.nas.chain_latency import ChainLatency, ChainPlacement, chain_devices
from edgesplit.nas.jmsnas import JMSNAS
from edgesplit.nas.latency import LatencyTable, build_latency_table
from edgesplit.nas.result import SearchResult, save_search_result
from edgesplit.nas.space import SearchSpace

__all__ = ["JMSNASRun", "latency_tables", "parse_table_options", "run_jmsnas"]

Progress = Callable[[str, int, int], None]


@dataclass
class JMSNASRun:
    search: JMSNAS
    latency: ChainLatency
    tables: dict[str, LatencyTable]
    result: SearchResult | None

    def summary(self) -> dict[str, Any]:
        doc = self.search.summary()
        doc["version"] = 1
        doc["space"] = self.latency.space.name
        doc["topology"] = self.latency.topology.name
        doc["tables"] = {d: {"method": t.method, "fixed_ms": t.fixed_ms}
                         for d, t in self.tables.items()}
        if self.result is not None:
            doc["folder"] = str(self.result.folder)
            doc["plan"] = self.result.summary["plan"]
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


def run_jmsnas(space: SearchSpace, topology: Topology, data: LabelledData, *,
               budget_ms: float, tables: Mapping[str, LatencyTable] | None = None,
               table_files: Mapping[str, Path] | None = None,
               placement: list[int] | None = None, out: str | Path | None = None,
               progress: Progress | None = None, **params: Any) -> JMSNASRun:
    """Search, derive, retrain and (with ``out``) write the result folder and its Plan.

    ``placement``: units per device along the chain (JMSNAS's |D^m|); default: the exact DP
    on the expected latency with every op equally likely, or on the fastest ops if that
    placement cannot meet the budget. ``params`` go to :class:`JMSNAS`."""
    chain_devices(topology)  # a mesh is refused before any table is built
    found = dict(tables) if tables is not None else latency_tables(space, topology,
                                                                   table_files,
                                                                   progress=progress)
    if placement is not None:
        latency = ChainLatency(space, topology, found,
                               ChainPlacement.from_counts(topology.chain_order(), placement))
    else:
        latency = ChainLatency.best_placement(space, topology, found)
        if latency.fastest()[0] > budget_ms:
            latency = ChainLatency.best_placement(space, topology, found, fastest=True)
    search = JMSNAS(latency_budget_ms=budget_ms, progress=progress, **params)
    search.fit(data, space, latency).retrain()
    run = JMSNASRun(search, latency, found, None)
    if out is not None:
        run.result = save_search_result(out, search.model_, topology, summary=run.summary())
    return run
