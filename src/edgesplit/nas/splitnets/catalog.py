"""Named SplitNets spaces (the same :class:`~edgesplit.registry.Registry` mechanism as the
other search spaces): ``register_split_space``, ``get_split_space``, ``list_split_spaces``,
``resolve_split_space`` (a name or a JSON/YAML/TOML file of ``SplitSpace.to_dict``).

Built-in (Table 7 scaled to 1x32x32 inputs so that a supernet trains in minutes on a laptop
CPU; three phases of stride 2 take 32x32 to 4x4):

- ``digits-split``: single view, the scikit-learn digits (10 classes);
- ``shapes-split``: four views of the procedurally rendered 3D shapes
  (:mod:`edgesplit.data.multiview`), one per sensor of ``hmd-star``.
"""

from __future__ import annotations

from pathlib import Path

from edgesplit.nas.core.files import resolve_spec
from edgesplit.nas.splitnets.space import PhaseSpec, SplitSpace
from edgesplit.registry import Registry

__all__ = ["DEFAULT_DATA", "data_for", "get_split_space", "list_split_spaces",
           "register_split_space", "resolve_split_space"]

# what each built-in space trains on unless told otherwise (a load_labelled spec)
DEFAULT_DATA = {"digits-split": "digits", "shapes-split": "multiview-shapes"}


def _presets() -> None:
    phases = (PhaseSpec((12, 16), (3, 4, 6), (1, 2), (0, 1), (2, 4)),
              PhaseSpec((24, 32), (3, 4, 6), (1, 2), (0, 1, 2), (4, 8)),
              PhaseSpec((40, 48), (3, 4, 6), (1, 2), (1, 2), (8, 16)))
    register_split_space(SplitSpace(
        "digits-split", 1, 10, (16, 24, 32), (8, 12), phases, (96, 128), views=1,
        description="single view: digits (1x32x32, 10 classes), 3 phases"))
    register_split_space(SplitSpace(
        "shapes-split", 1, 11, (16, 24, 32), (8, 12), phases, (96, 128), views=4,
        description="4 views: rendered 3D shapes (1x32x32 each, 11 classes), 3 phases"))


_SPACES: Registry[SplitSpace] = Registry(
    "SplitNets space", label="Known SplitNets spaces", loader=_presets,
    hint="(or a JSON/YAML/TOML file of SplitSpace.to_dict)")


def register_split_space(space: SplitSpace, *, replace: bool = False) -> SplitSpace:
    """Register ``space`` under its name (a duplicate warns unless ``replace``)."""
    return _SPACES.register(space.name, space, replace=replace)


def get_split_space(name: str) -> SplitSpace:
    """The space registered as ``name``; an unknown name lists the known ones."""
    return _SPACES.get(name)


def list_split_spaces() -> list[str]:
    return _SPACES.names()


def resolve_split_space(spec: str | Path | SplitSpace) -> SplitSpace:
    """A SplitNets space from a registered name, a JSON/YAML/TOML file of
    :meth:`SplitSpace.to_dict`, or a SplitSpace (returned as is)."""
    return resolve_spec(spec, SplitSpace, get_split_space)

def data_for(space: SplitSpace, data: str | None) -> str:
    """``data``, or the built-in space's default data set."""
    if data is not None:
        return data
    if space.name in DEFAULT_DATA:
        return DEFAULT_DATA[space.name]
    from edgesplit.errors import ConfigError, option

    raise ConfigError(f"space {space.name!r} has no default data set; give "
                      f"{option('data', 'SPEC')}")
