"""Registries of device, link and topology presets (``register_*``, ``get_*``, ``list_*``), and
resolution of a CLI argument that is either a preset name or a path to a YAML/TOML file."""

from __future__ import annotations

import difflib
import warnings
from pathlib import Path
from typing import Callable

from edgesplit.errors import UnknownNameError
from edgesplit.hardware.device import Device
from edgesplit.hardware.link import Link
from edgesplit.hardware.topology import Topology

__all__ = [
    "register_device", "get_device", "list_devices",
    "register_link", "get_link", "list_links",
    "register_topology", "get_topology", "list_topologies",
    "resolve_device", "resolve_link", "resolve_topology",
]

_DEVICES: dict[str, Callable[[], Device]] = {}
_LINKS: dict[str, Link] = {}
_TOPOLOGIES: dict[str, Callable[[], Topology]] = {}


def _ensure_loaded() -> None:
    from edgesplit.hardware import _presets, this_machine  # noqa: F401  (register on import)


def _unknown(kind: str, name: str, choices: list[str], plural: str) -> UnknownNameError:
    close = difflib.get_close_matches(name, choices, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return UnknownNameError(f"unknown {kind} {name!r}.{hint} Presets: {', '.join(sorted(choices))}"
                            f" (or pass a path to a YAML/TOML {kind} file; `edgesplit {plural}` "
                            "lists presets)")


def _register(table: dict, name: str, value: object, kind: str) -> None:
    if name in table:
        warnings.warn(f"{kind} {name!r} registered twice; the later definition wins", stacklevel=3)
    table[name] = value


def register_device(device: Device | Callable[[], Device], name: str | None = None) -> None:
    """Register a device, or a zero-argument factory (for devices measured on first use)."""
    factory = device if callable(device) and not isinstance(device, Device) else (lambda: device)
    key = name or (device.name if isinstance(device, Device) else None)
    if key is None:
        raise ValueError("a device factory needs a name")
    _register(_DEVICES, key, factory, "device")


def get_device(name: str) -> Device:
    _ensure_loaded()
    if name not in _DEVICES:
        raise _unknown("device", name, list(_DEVICES), "devices")
    return _DEVICES[name]()


def list_devices() -> list[str]:
    _ensure_loaded()
    return sorted(_DEVICES)


def register_link(link: Link) -> None:
    _register(_LINKS, link.name, link, "link")


def get_link(name: str) -> Link:
    _ensure_loaded()
    if name not in _LINKS:
        raise _unknown("link", name, list(_LINKS), "links")
    return _LINKS[name]


def list_links() -> list[str]:
    _ensure_loaded()
    return sorted(_LINKS)


def register_topology(name: str, factory: Callable[[], Topology]) -> None:
    _register(_TOPOLOGIES, name, factory, "topology")


def get_topology(name: str) -> Topology:
    _ensure_loaded()
    if name not in _TOPOLOGIES:
        raise _unknown("topology", name, list(_TOPOLOGIES), "topologies")
    return _TOPOLOGIES[name]()


def list_topologies() -> list[str]:
    _ensure_loaded()
    return sorted(_TOPOLOGIES)


def _is_path(spec: str | Path) -> bool:
    return isinstance(spec, Path) or str(spec).endswith((".yaml", ".yml", ".toml", ".json")) \
        or "/" in str(spec)


def resolve_device(spec: str | Path | Device) -> Device:
    """A Device from a preset name, a file path, or a Device (returned as is)."""
    if isinstance(spec, Device):
        return spec
    if _is_path(spec):
        from edgesplit.hardware.files import load_device

        return load_device(spec)
    return get_device(str(spec))


def resolve_link(spec: str | Path | Link) -> Link:
    if isinstance(spec, Link):
        return spec
    if _is_path(spec):
        from edgesplit.hardware.files import load_link

        return load_link(spec)
    return get_link(str(spec))


def resolve_topology(spec: str | Path | Topology) -> Topology:
    if isinstance(spec, Topology):
        return spec
    if _is_path(spec):
        from edgesplit.hardware.files import load_topology

        return load_topology(spec)
    return get_topology(str(spec))
