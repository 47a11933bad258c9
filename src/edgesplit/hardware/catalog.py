"""Registries of device, link and topology presets (``register_*``, ``get_*``, ``list_*``), and
resolution of a CLI argument that is either a preset name or a path to a YAML/TOML file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgesplit.hardware.device import Device
from edgesplit.hardware.link import Link
from edgesplit.hardware.topology import Topology
from edgesplit.registry import Registry

__all__ = [
    "get_device",
    "get_link",
    "get_topology",
    "list_devices",
    "list_links",
    "list_topologies",
    "register_device",
    "register_link",
    "register_topology",
    "resolve_device",
    "resolve_link",
    "resolve_topology",
]

_DEVICES: Registry[Callable[[], Device]] = Registry(
    "device", label="Presets", loader=lambda: _ensure_loaded(),
    hint="(or pass a path to a YAML/TOML device file; `edgesplit devices` lists presets)")
_LINKS: Registry[Link] = Registry(
    "link", label="Presets", loader=lambda: _ensure_loaded(),
    hint="(or pass a path to a YAML/TOML link file; `edgesplit links` lists presets)")
_TOPOLOGIES: Registry[Callable[[], Topology]] = Registry(
    "topology", label="Presets", loader=lambda: _ensure_loaded(),
    hint="(or pass a path to a YAML/TOML topology file; `edgesplit topologies` lists presets)")


def _ensure_loaded() -> None:
    from edgesplit.hardware import _presets, this_machine  # noqa: F401  (register on import)


def register_device(device: Device | Callable[[], Device], name: str | None = None) -> None:
    """Register a device, or a zero-argument factory (for devices measured on first use)."""
    factory = device if callable(device) and not isinstance(device, Device) else (lambda: device)
    key = name or (device.name if isinstance(device, Device) else None)
    if key is None:
        raise ValueError("a device factory needs a name")
    _DEVICES.register(key, factory)


def get_device(name: str) -> Device:
    return _DEVICES.get(name)()


def list_devices() -> list[str]:
    return _DEVICES.names()


def register_link(link: Link) -> None:
    _LINKS.register(link.name, link)


def get_link(name: str) -> Link:
    return _LINKS.get(name)


def list_links() -> list[str]:
    return _LINKS.names()


def register_topology(name: str, factory: Callable[[], Topology]) -> None:
    _TOPOLOGIES.register(name, factory)


def get_topology(name: str) -> Topology:
    return _TOPOLOGIES.get(name)()


def list_topologies() -> list[str]:
    return _TOPOLOGIES.names()


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
