"""The subnet space of an elastified model: branches over blocks, and subnets as paths.

Block positions are 0..n-1. A :class:`Branch` replaces blocks ``start`` to ``end - 1``: the
original block (``end = start + 1``, level 0), a merged block ``B_i^(j)`` that replaces ``j + 1``
blocks (level ``j > 0``), or a shrunk block ``B_i^(-k)`` (level ``-k``). A subnet is a path of
branches from position 0 to n, written as the tuple of branch names (hashable, JSON-able), so
every path is a valid network and the all-original path is the pretrained model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from edgesplit.errors import ConfigError

__all__ = ["Branch", "ElasticSpace", "SubnetArch", "branch_name"]

SubnetArch = tuple[str, ...]
KINDS = ("original", "merged", "shrunk")


def branch_name(start: int, level: int) -> str:
    """``b3`` (original), ``b3+1`` (merged, one block fewer), ``b3-2`` (shrunk, level 2)."""
    if level == 0:
        return f"b{start}"
    return f"b{start}{'+' if level > 0 else '-'}{abs(level)}"


@dataclass(frozen=True)
class Branch:
    """One choice in the supernet (see the module docstring). ``donor`` is the original block
    whose weights seeded it; ``keep`` the fraction of channels a shrunk block kept."""

    name: str
    start: int
    end: int
    level: int
    donor: int
    keep: float = 1.0

    @property
    def kind(self) -> str:
        return "original" if self.level == 0 else "merged" if self.level > 0 else "shrunk"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "start": self.start, "end": self.end, "level": self.level,
                "donor": self.donor, "keep": self.keep, "kind": self.kind}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Branch:
        return cls(str(data["name"]), int(data["start"]), int(data["end"]), int(data["level"]),
                   int(data["donor"]), float(data.get("keep", 1.0)))


@dataclass(frozen=True)
class ElasticSpace:
    """``num_blocks`` positions and the branches over them."""

    num_blocks: int
    branches: tuple[Branch, ...]

    def __post_init__(self) -> None:
        names = [b.name for b in self.branches]
        if len(set(names)) != len(names):
            raise ConfigError("elastic space: branch names must be unique")
        for b in self.branches:
            if not 0 <= b.start < b.end <= self.num_blocks:
                raise ConfigError(f"elastic space: branch {b.name} spans {b.start}..{b.end} "
                                  f"outside 0..{self.num_blocks}")
        missing = [i for i in range(self.num_blocks) if branch_name(i, 0) not in self.by_name]
        if missing:
            raise ConfigError(f"elastic space: blocks {missing} have no original branch")

    @cached_property
    def by_name(self) -> dict[str, Branch]:
        return {b.name: b for b in self.branches}

    @cached_property
    def starting_at(self) -> tuple[tuple[Branch, ...], ...]:
        return tuple(tuple(b for b in self.branches if b.start == i)
                     for i in range(self.num_blocks))

    @property
    def original(self) -> SubnetArch:
        """The pretrained model's path."""
        return tuple(branch_name(i, 0) for i in range(self.num_blocks))

    def count(self) -> int:
        """How many subnets (paths from 0 to n) the space holds."""
        ways = [0] * (self.num_blocks + 1)
        ways[self.num_blocks] = 1
        for i in reversed(range(self.num_blocks)):
            ways[i] = sum(ways[b.end] for b in self.starting_at[i])
        return ways[0]

    def check(self, arch: Iterable[str]) -> SubnetArch:
        """``arch`` as a tuple, or ConfigError saying why it is not a path of this space."""
        arch = tuple(arch)
        position = 0
        for name in arch:
            branch = self.by_name.get(name)
            if branch is None:
                raise ConfigError(f"unknown branch {name!r}; this supernet has "
                                  f"{', '.join(sorted(self.by_name))}")
            if branch.start != position:
                raise ConfigError(f"branch {name} starts at block {branch.start} but the subnet "
                                  f"{'-'.join(arch)} is at block {position} there")
            position = branch.end
        if position != self.num_blocks:
            raise ConfigError(f"subnet {'-'.join(arch)} stops at block {position} of "
                              f"{self.num_blocks}")
        return arch

    def random_arch(self, rng: np.random.Generator) -> SubnetArch:
        """A path drawn one branch at a time, uniformly among the branches at each position."""
        arch, position = [], 0
        while position < self.num_blocks:
            choices = self.starting_at[position]
            branch = choices[int(rng.integers(len(choices)))]
            arch.append(branch.name)
            position = branch.end
        return tuple(arch)

    def branches_of(self, arch: Sequence[str]) -> list[Branch]:
        return [self.by_name[name] for name in arch]

    def to_dict(self) -> dict[str, Any]:
        return {"num_blocks": self.num_blocks,
                "branches": [b.to_dict() for b in self.branches]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ElasticSpace:
        return cls(int(data["num_blocks"]),
                   tuple(Branch.from_dict(b) for b in data["branches"]))
