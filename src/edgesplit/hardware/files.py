"""Load devices, links and topologies from YAML, TOML or JSON files, with one-line errors.

A device file holds one device (the fields of :class:`Device`); a link file one link; a topology
file has ``name``, ``devices`` and ``links``, where a device or a link may be a preset name
instead of a table. A device entry, and a device file, may start from a preset and override
its fields: ``{preset: jetson-nano, name: cam1}``.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import yaml

from edgesplit.errors import ConfigError
from edgesplit.hardware.device import Device
from edgesplit.hardware.link import Link
from edgesplit.hardware.topology import Topology
from edgesplit.validation import build

__all__ = ["load_device", "load_link", "load_topology", "read_config"]


def read_config(path: str | Path) -> dict[str, Any]:
    """Parse a YAML/TOML/JSON file into a mapping; unreadable or malformed files -> ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"file {str(path)!r} does not exist")
    try:
        text = path.read_text()
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError,
            yaml.YAMLError) as exc:
        raise ConfigError(f"cannot parse {str(path)!r}: {_parse_error(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r} must contain a mapping of fields, not "
                          f"{type(data).__name__}")
    return data


def _parse_error(exc: Exception) -> str:
    """One line saying where the file is malformed. JSON's and TOML's messages name the line
    and column on their first line; PyYAML's spread them over several lines, the first often
    only its context ("while parsing a block mapping"), so they are rebuilt from its marks."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark  # 0-based
        where = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        start = exc.context_mark
        if exc.context and start is not None and start.line != mark.line:
            return f"{where} ({exc.context} from line {start.line + 1}, column " \
                   f"{start.column + 1})"
        return f"{where} ({exc.context})" if exc.context else where
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _device_data(data: dict[str, Any], base: Path) -> dict[str, Any]:
    compute = data.get("compute")
    if isinstance(compute, dict) and compute.get("model", "measured") == "measured" \
            and "profile" in compute:
        profile = Path(compute["profile"])
        if not profile.is_absolute():
            data = {**data, "compute": {**compute, "profile": str(base / profile)}}
    return data


def load_device(path: str | Path) -> Device:
    """A device file: the fields of a Device, or, as in a topology, ``preset: NAME`` and the
    fields that differ from it."""
    path = Path(path)
    return build(Device, _resolve_device_entry(read_config(path), path.parent),
                 f"device file {str(path)!r}")


def load_link(path: str | Path) -> Link:
    return build(Link, read_config(path), f"link file {str(path)!r}")


def _resolve_device_entry(entry: Any, base: Path) -> Any:
    from edgesplit.hardware.catalog import get_device

    if isinstance(entry, str):
        return get_device(entry)
    if isinstance(entry, dict) and "preset" in entry:
        rest = {k: v for k, v in entry.items() if k != "preset"}
        # the preset's fields with the entry's on top, validated with the topology (a
        # model_copy(update=...) would skip validation: a "2MiB" string left in memory_bytes)
        preset = get_device(entry["preset"]).model_dump(mode="python")
        return _device_data({**preset, **rest}, base)
    return _device_data(entry, base) if isinstance(entry, dict) else entry


def load_topology(path: str | Path) -> Topology:
    from edgesplit.hardware.catalog import get_link

    path = Path(path)
    data = read_config(path)
    devices = data.get("devices")
    if isinstance(devices, list):
        data["devices"] = [_resolve_device_entry(d, path.parent) for d in devices]
    links = data.get("links")
    if isinstance(links, list):
        data["links"] = [
            {**tl, "link": get_link(tl["link"])} if isinstance(tl, dict)
            and isinstance(tl.get("link"), str) else tl
            for tl in links
        ]
    return build(Topology, data, f"topology file {str(path)!r}")
