"""The registry of named search spaces: ``register_space``, ``get_space``, ``list_spaces``,
and ``resolve_space`` for a name-or-file argument.

Built-in spaces live in :mod:`edgesplit.nas.jmsnas._presets` and are imported on the first lookup.
"""

from __future__ import annotations

from pathlib import Path

from edgesplit.nas.core.files import resolve_spec
from edgesplit.nas.jmsnas.space import SearchSpace
from edgesplit.registry import Registry

__all__ = ["get_space", "list_spaces", "register_space", "resolve_space"]


def _load_presets() -> None:
    from edgesplit.nas.jmsnas import _presets  # noqa: F401  (registers on import)


_SPACES: Registry[SearchSpace] = Registry(
    "search space", label="Known search spaces", loader=_load_presets,
    hint="(or build a SearchSpace and pass it directly)")


def register_space(space: SearchSpace, *, replace: bool = False) -> SearchSpace:
    """Register ``space`` under its name (a duplicate warns unless ``replace``)."""
    return _SPACES.register(space.name, space, replace=replace)


def get_space(name: str) -> SearchSpace:
    """The space registered as ``name``; an unknown name lists the known ones."""
    return _SPACES.get(name)


def list_spaces() -> list[str]:
    """Names of every registered space, sorted."""
    return _SPACES.names()


def resolve_space(spec: str | Path | SearchSpace) -> SearchSpace:
    """A space from a registered name, a JSON/YAML/TOML file of :meth:`SearchSpace.to_dict`, or
    a SearchSpace (returned as is): what a command's SPACE argument accepts, as
    :func:`~edgesplit.hardware.resolve_device` does for devices."""
    return resolve_spec(spec, SearchSpace, get_space)
