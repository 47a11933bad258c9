"""The SplitNets search space (paper 004, section 3.1 and Table 7) as data, and one
architecture in it.

A :class:`SplitSpace` is a stem, ``phases`` and a head, scaled down from Table 7 to small
inputs. Every phase has one stride-2 (or stride-``stride``) block first and a searched width,
depth *before* and depth *after* its splitting module, per-block expansion ratios and the
reduced channel count ``d`` of its splitting module; the input resolution and the head width
are searched too. ``views`` > 1 makes the space multi-view: V sensors run the same on-sensor
network on their own view and the aggregator fuses the V reduced features (View-Fuse).

A :class:`SplitArch` picks a value for every choice plus the phases whose splitting module is
on (``splits``): a deployable network has exactly one (the search's and the runtime's
networks), while supernet training also samples zero (single-view) or all of them
(appendix D). Both classes are frozen, hashable (the evolution's "seen" set) and round-trip
through plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgesplit.errors import ConfigError

__all__ = ["PhaseArch", "PhaseSpec", "SplitArch", "SplitSpace"]


def _choices(what: str, values: Sequence[int], minimum: int = 1) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ConfigError(f"{what} lists no choices")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise ConfigError(f"{what} choice {v!r} must be an integer >= {minimum}")
    if len(set(values)) != len(values):
        raise ConfigError(f"{what} lists a choice twice: {list(values)}")
    return tuple(sorted(values))


@dataclass(frozen=True)
class PhaseSpec:
    """One phase: its first block's stride and the choices of Table 7's columns."""

    widths: tuple[int, ...]
    expands: tuple[int, ...] = (3, 4, 6)
    depth_before: tuple[int, ...] = (1, 2)
    depth_after: tuple[int, ...] = (0, 1, 2)
    reduced: tuple[int, ...] = (2, 4, 8)
    stride: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", _choices("phase widths", self.widths))
        object.__setattr__(self, "expands", _choices("phase expands", self.expands))
        object.__setattr__(self, "depth_before", _choices("phase depth_before",
                                                          self.depth_before))
        object.__setattr__(self, "depth_after", _choices("phase depth_after", self.depth_after,
                                                         minimum=0))
        object.__setattr__(self, "reduced", _choices("phase reduced", self.reduced))
        if self.stride not in (1, 2) or isinstance(self.stride, bool):
            raise ConfigError(f"phase stride={self.stride!r} must be 1 or 2")

    @property
    def max_blocks(self) -> int:
        return self.depth_before[-1] + self.depth_after[-1]


@dataclass(frozen=True)
class PhaseArch:
    """A phase's choices: width, blocks before and after the split, their expansions (one
    per block, in order) and the splitting module's reduced channels."""

    width: int
    before: int
    after: int
    expands: tuple[int, ...]
    reduced: int

    @property
    def blocks(self) -> int:
        return self.before + self.after


@dataclass(frozen=True)
class SplitArch:
    """One network of a :class:`SplitSpace`; ``splits``: phases whose module is on."""

    resolution: int
    stem: int
    phases: tuple[PhaseArch, ...]
    head: int
    splits: tuple[int, ...] = ()

    @property
    def split(self) -> int:
        """The phase of the one splitting module of a deployable network."""
        if len(self.splits) != 1:
            raise ConfigError(f"this architecture has {len(self.splits)} splitting modules; a "
                              "deployable SplitNet has exactly one")
        return self.splits[0]

    def with_splits(self, splits: Sequence[int]) -> SplitArch:
        return replace(self, splits=tuple(sorted(set(splits))))

    def to_dict(self) -> dict[str, Any]:
        return {"resolution": self.resolution, "stem": self.stem, "head": self.head,
                "splits": list(self.splits),
                "phases": [{"width": p.width, "before": p.before, "after": p.after,
                            "expands": list(p.expands), "reduced": p.reduced}
                           for p in self.phases]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SplitArch:
        try:
            phases = tuple(PhaseArch(int(p["width"]), int(p["before"]), int(p["after"]),
                                     tuple(int(e) for e in p["expands"]), int(p["reduced"]))
                           for p in data["phases"])
            return cls(int(data["resolution"]), int(data["stem"]), phases, int(data["head"]),
                       tuple(int(s) for s in data.get("splits", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"SplitNets architecture data is malformed ({type(exc).__name__}: "
                              f"{exc}); write it with SplitArch.to_dict") from None

    def describe(self) -> str:
        """A short summary: ``r32 stem8 16x1+2e3/4/6 |d4| ...`` (width x before+after)."""
        parts = [f"r{self.resolution}", f"stem{self.stem}"]
        for i, p in enumerate(self.phases):
            e = "/".join(str(x) for x in p.expands)
            mark = f" |d{p.reduced}|" if i in self.splits else ""
            parts.append(f"{p.width}x{p.before}+{p.after}e{e}{mark}")
        parts.append(f"head{self.head}")
        return " ".join(parts)


@dataclass(frozen=True)
class SplitSpace:
    """Input (channels, resolutions), classes, views, stem widths, phases and head widths."""

    name: str
    in_channels: int
    num_classes: int
    resolutions: tuple[int, ...]
    stem_widths: tuple[int, ...]
    phases: tuple[PhaseSpec, ...]
    head_widths: tuple[int, ...]
    views: int = 1
    description: str = field(default="", compare=False)

    def for_data(self, channels: int, num_classes: int) -> SplitSpace:
        """This single-view space for images of ``channels`` channels in ``num_classes``
        classes (named ``<name>@C/K``), or itself when it already takes them: the network is
        built for the data, the data never converted to fit it."""
        if channels == self.in_channels and num_classes == self.num_classes:
            return self
        if self.views != 1:
            raise ConfigError(f"space {self.name!r} takes {self.views} views of "
                              f"{self.in_channels} channel(s) in {self.num_classes} classes; a "
                              "multi-view space is not rebuilt for other data: write one with "
                              "`nas splitnets spaces --json` as a start")
        return replace(self, name=f"{self.name}@{channels}/{num_classes}",
                       in_channels=channels, num_classes=num_classes)

    def __post_init__(self) -> None:
        for what, value in (("in_channels", self.in_channels), ("num_classes", self.num_classes),
                            ("views", self.views)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"space {self.name!r}: {what}={value!r} must be an integer "
                                  ">= 1")
        object.__setattr__(self, "resolutions", _choices("resolutions", self.resolutions))
        object.__setattr__(self, "stem_widths", _choices("stem widths", self.stem_widths))
        object.__setattr__(self, "head_widths", _choices("head widths", self.head_widths))
        object.__setattr__(self, "phases", tuple(self.phases))
        if not self.phases:
            raise ConfigError(f"space {self.name!r} has no phases")
        shrink = 1
        for p in self.phases:
            shrink *= p.stride
        if self.resolutions[0] < shrink:
            raise ConfigError(f"space {self.name!r}: resolution {self.resolutions[0]} shrinks "
                              f"below 1x1 after the phases' strides (x1/{shrink})")

    @property
    def multi_view(self) -> bool:
        return self.views > 1

    def sizes(self, resolution: int) -> list[int]:
        """Spatial size inside each phase (after its first block) at ``resolution``."""
        out, s = [], resolution
        for p in self.phases:
            s = (s + p.stride - 1) // p.stride
            out.append(s)
        return out

    # -- architectures -------------------------------------------------------------------------

    def largest(self, splits: Sequence[int] = ()) -> SplitArch:
        return self._extreme(-1, splits)

    def smallest(self, splits: Sequence[int] = ()) -> SplitArch:
        return self._extreme(0, splits)

    def _extreme(self, k: int, splits: Sequence[int]) -> SplitArch:
        phases = tuple(PhaseArch(p.widths[k], p.depth_before[k], p.depth_after[k],
                                 (p.expands[k],) * (p.depth_before[k] + p.depth_after[k]),
                                 p.reduced[k]) for p in self.phases)
        return SplitArch(self.resolutions[k], self.stem_widths[k], phases, self.head_widths[k],
                         ).with_splits(splits)

    def all_phases(self) -> tuple[int, ...]:
        return tuple(range(len(self.phases)))

    def validate(self, arch: SplitArch, *, deployable: bool = False) -> SplitArch:
        """``arch`` if it fits; else a ConfigError naming the first choice outside the space."""
        def check(what: str, value: int, allowed: Sequence[int]) -> None:
            if value not in allowed:
                raise ConfigError(f"space {self.name!r}: {what}={value} is not one of "
                                  f"{list(allowed)}")

        check("resolution", arch.resolution, self.resolutions)
        check("stem", arch.stem, self.stem_widths)
        check("head", arch.head, self.head_widths)
        if len(arch.phases) != len(self.phases):
            raise ConfigError(f"space {self.name!r} has {len(self.phases)} phases, the "
                              f"architecture {len(arch.phases)}")
        for i, (p, spec) in enumerate(zip(arch.phases, self.phases, strict=True)):
            check(f"phase {i} width", p.width, spec.widths)
            check(f"phase {i} before", p.before, spec.depth_before)
            check(f"phase {i} after", p.after, spec.depth_after)
            check(f"phase {i} reduced", p.reduced, spec.reduced)
            if len(p.expands) != p.blocks:
                raise ConfigError(f"space {self.name!r}: phase {i} has {p.blocks} blocks but "
                                  f"{len(p.expands)} expansion ratios")
            for e in p.expands:
                check(f"phase {i} expand", e, spec.expands)
        if any(s not in range(len(self.phases)) for s in arch.splits):
            raise ConfigError(f"space {self.name!r}: splits {list(arch.splits)} must be phase "
                              f"indices 0..{len(self.phases) - 1}")
        if (deployable or self.multi_view) and len(arch.splits) != 1:
            raise ConfigError(f"space {self.name!r}: a deployable (or multi-view) network has "
                              f"exactly one splitting module, this one {len(arch.splits)}")
        return arch

    # -- serialisation -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "in_channels": self.in_channels,
                "num_classes": self.num_classes, "views": self.views,
                "resolutions": list(self.resolutions), "stem_widths": list(self.stem_widths),
                "head_widths": list(self.head_widths), "description": self.description,
                "phases": [{"widths": list(p.widths), "expands": list(p.expands),
                            "depth_before": list(p.depth_before),
                            "depth_after": list(p.depth_after), "reduced": list(p.reduced),
                            "stride": p.stride} for p in self.phases]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SplitSpace:
        try:
            phases = tuple(PhaseSpec(tuple(p["widths"]), tuple(p["expands"]),
                                     tuple(p["depth_before"]), tuple(p["depth_after"]),
                                     tuple(p["reduced"]), int(p.get("stride", 2)))
                           for p in data["phases"])
            return cls(str(data["name"]), int(data["in_channels"]), int(data["num_classes"]),
                       tuple(data["resolutions"]), tuple(data["stem_widths"]), phases,
                       tuple(data["head_widths"]), int(data.get("views", 1)),
                       str(data.get("description", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"SplitNets space data is malformed ({type(exc).__name__}: "
                              f"{exc}); write it with SplitSpace.to_dict") from None

    def with_views(self, views: int, *, name: str | None = None) -> SplitSpace:
        return replace(self, views=views, name=name or self.name)
