"""Model-guided breeding of AdaptiveNet's search (section 5.1).

The optimal subnets lie near the latency budget, so NearbyInit (:class:`NearbyBreeder`) draws
random subnets whose predicted latency (a :class:`~.latency.BlockLatencyTable`) lies in
``[budget - delta, budget + delta]``, and NearbyMutate replaces one branch and, if that leaves
the band, picks among the alternative branches the one that brings the latency closest back.
Pure graph operations: no subnet is run to breed one. :class:`UniformBreeder` breeds without a
band (the evolution baseline's). Both implement :class:`~edgesplit.nas.core.evolution.Breeder`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesplit.errors import ConfigError, option
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable
from edgesplit.nas.adaptivenet.space import ElasticSpace, SubnetArch
from edgesplit.nas.core.checks import is_number

__all__ = ["NearbyBreeder", "UniformBreeder"]

_MAX_SUBPATHS = 256  # alternatives enumerated per span: spans are a few blocks wide


# -- paths -----------------------------------------------------------------------------------


def _boundaries(space: ElasticSpace, arch: Sequence[str]) -> list[int]:
    """The block positions where ``arch``'s branches start, and n."""
    return [0, *(space.by_name[name].end for name in arch)]


def _subpaths(space: ElasticSpace, start: int, end: int) -> list[SubnetArch]:
    """Every path of branches from block ``start`` to ``end`` (at most ``_MAX_SUBPATHS``)."""
    found: list[SubnetArch] = []

    def walk(position: int, path: tuple[str, ...]) -> None:
        if len(found) >= _MAX_SUBPATHS:
            return
        if position == end:
            found.append(path)
            return
        for branch in space.starting_at[position]:
            if branch.end <= end:
                walk(branch.end, (*path, branch.name))

    walk(start, ())
    return found


def _random_subpath(space: ElasticSpace, start: int, end: int, rng: np.random.Generator
                    ) -> SubnetArch:
    """A random path from ``start`` to ``end`` (always exists: every block has its original)."""
    path: list[str] = []
    while start < end:
        options = [b for b in space.starting_at[start] if b.end <= end]
        branch = options[int(rng.integers(len(options)))]
        path.append(branch.name)
        start = branch.end
    return tuple(path)


@dataclass(frozen=True)
class _Mutation:
    """``arch`` with ``before[first:last]`` replaced; the replaced span's block positions."""

    arch: SubnetArch
    first: int
    last: int
    start: int
    end: int


def _replace_one(space: ElasticSpace, arch: SubnetArch, rng: np.random.Generator
                 ) -> _Mutation | None:
    """Replace one random branch of ``arch`` by another starting at the same block; a branch
    ending elsewhere is joined to the rest of ``arch`` by a random path to its next boundary.
    None when no branch of ``arch`` has an alternative."""
    movable = [k for k, name in enumerate(arch)
               if len(space.starting_at[space.by_name[name].start]) > 1]
    if not movable:
        return None
    k = movable[int(rng.integers(len(movable)))]
    start = space.by_name[arch[k]].start
    options = [b for b in space.starting_at[start] if b.name != arch[k]]
    new = options[int(rng.integers(len(options)))]
    bounds = _boundaries(space, arch)
    last = next(j for j in range(k + 1, len(bounds)) if bounds[j] >= new.end)
    joint = _random_subpath(space, new.end, bounds[last], rng)
    return _Mutation((*arch[:k], new.name, *joint, *arch[last:]), k, last, start, bounds[last])


def _alternatives(space: ElasticSpace, arch: SubnetArch, spans: Iterable[tuple[int, int]]
                  ) -> Iterator[SubnetArch]:
    """``arch`` with the branches ``arch[i:j]`` replaced by each other path over their blocks."""
    bounds = _boundaries(space, arch)
    for i, j in spans:
        for sub in _subpaths(space, bounds[i], bounds[j]):
            if sub != arch[i:j]:
                yield (*arch[:i], *sub, *arch[j:])


def _splices(space: ElasticSpace, first: SubnetArch, second: SubnetArch) -> list[SubnetArch]:
    """Both parents cut at each block position where both have a boundary, and joined the
    other way round (new paths only)."""
    at_first = {p: i for i, p in enumerate(_boundaries(space, first))}
    at_second = {p: i for i, p in enumerate(_boundaries(space, second))}
    children: dict[SubnetArch, None] = {}
    for p in sorted(set(at_first) & set(at_second) - {0, space.num_blocks}):
        i, j = at_first[p], at_second[p]
        children[(*first[:i], *second[j:])] = None
        children[(*second[:j], *first[i:])] = None
    return [c for c in children if c not in (first, second)]


def _mutation_count(length: int, rng: np.random.Generator, prob: float) -> int:
    """How many branches one mutation replaces: each with ``prob``, at least one."""
    return max(1, int(rng.binomial(length, prob))) if prob > 0 else 1


# -- breeders --------------------------------------------------------------------------------


class UniformBreeder:
    """Plain breeding over an :class:`ElasticSpace` (the evolution baseline): uniform random
    subnets, mutation replacing one random branch, crossover splicing two paths at a common
    block position. Implements :class:`~edgesplit.nas.core.evolution.Breeder`."""

    def __init__(self, space: ElasticSpace) -> None:
        self.space = space
        self.name = f"adaptivenet[{space.num_blocks} blocks, {len(space.branches)} branches]"

    def random_arch(self, rng: np.random.Generator) -> SubnetArch:
        return self.space.random_arch(rng)

    def mutate_arch(self, arch: Any, rng: np.random.Generator, prob: float = 0.0
                    ) -> SubnetArch:
        """``arch`` with one branch (each with ``prob``, at least one) replaced."""
        arch = tuple(arch)
        for _ in range(_mutation_count(len(arch), rng, prob)):
            arch = self._mutate_once(arch, rng)
        return arch

    def _mutate_once(self, arch: SubnetArch, rng: np.random.Generator) -> SubnetArch:
        mutation = _replace_one(self.space, arch, rng)
        return arch if mutation is None else mutation.arch

    def crossover_arch(self, first: Any, second: Any, rng: np.random.Generator
                       ) -> SubnetArch:
        """A random splice of the parents (``first`` when they share no inner boundary)."""
        children = _splices(self.space, tuple(first), tuple(second))
        return children[int(rng.integers(len(children)))] if children else tuple(first)


class NearbyBreeder(UniformBreeder):
    """NearbyInit and NearbyMutate (section 5.1): breeding that stays in the latency band
    ``[budget - delta, budget + delta]`` (seconds, predicted by ``table``).

    ``random_arch`` walks from block 0, choosing at each block uniformly among the branches
    after which the band is still reachable (by the table's least and most latency of the
    rest), and rejects a walk that misses the band; after ``max_attempts`` walks it returns
    the closest one. ``mutate_arch`` replaces a branch; if that leaves the band it takes, among
    the other paths over the replaced span and the repairs of the mutated subnet over another
    span (at most as wide as the widest branch), one that brings the latency closest back
    (randomly among equals); when none of those is in the band, any one-span change of the
    parent is a candidate too. Crossover prefers splices inside the band.
    """

    def __init__(self, space: ElasticSpace, table: BlockLatencyTable, budget: float,
                 delta: float, *, max_attempts: int = 100) -> None:
        super().__init__(space)
        table.check(space)
        if not is_number(budget) or not is_number(delta, strict=False):
            raise ConfigError(f"NearbyBreeder needs {option('budget', budget)} > 0 and "
                              f"{option('delta', delta)} >= 0 (seconds)")
        self.table = table
        self.budget = float(budget)
        self.delta = float(delta)
        self.max_attempts = max_attempts
        # the widest span a repair replaces: the widest branch (a merged block)
        self._width = max(b.end - b.start for b in space.branches)

    @property
    def band(self) -> tuple[float, float]:
        return self.budget - self.delta, self.budget + self.delta

    def latency(self, arch: Sequence[str]) -> float:
        """Predicted seconds (no path check: breeding makes only paths)."""
        return self.table.side_seconds + self.table.segment(arch)

    def distance(self, arch: Sequence[str]) -> float:
        """Seconds outside the band (0 inside)."""
        low, high = self.band
        seconds = self.latency(arch)
        return max(low - seconds, 0.0, seconds - high)

    def in_band(self, arch: Sequence[str]) -> bool:
        return self.distance(arch) == 0.0

    # -- NearbyInit ---------------------------------------------------------------------------

    def random_arch(self, rng: np.random.Generator) -> SubnetArch:
        closest: SubnetArch | None = None
        for _ in range(self.max_attempts):
            arch = self._walk(rng)
            if self.in_band(arch):
                return arch
            if closest is None or self.distance(arch) < self.distance(closest):
                closest = arch
        assert closest is not None  # max_attempts >= 1
        return closest

    def _walk(self, rng: np.random.Generator) -> SubnetArch:
        low, high = self.band
        seconds, position, path = self.table.side_seconds, 0, []
        while position < self.space.num_blocks:
            options = self.space.starting_at[position]
            # a branch after which the band is out of reach only when none keeps it reachable
            choices = [b for b in options if self._can_reach(seconds, b.name, b.end, low, high)]
            choices = choices or list(options)
            branch = choices[int(rng.integers(len(choices)))]
            path.append(branch.name)
            seconds += self.table.branch_seconds[branch.name]
            position = branch.end
        return tuple(path)

    def _can_reach(self, seconds: float, name: str, end: int, low: float, high: float
                   ) -> bool:
        least, most = self.table.suffix_bounds(end)
        after = seconds + self.table.branch_seconds[name]
        return after + least <= high and after + most >= low

    # -- NearbyMutate -------------------------------------------------------------------------

    def _mutate_once(self, arch: SubnetArch, rng: np.random.Generator) -> SubnetArch:
        mutation = _replace_one(self.space, arch, rng)
        if mutation is None or self.in_band(mutation.arch):
            return arch if mutation is None else mutation.arch
        # first the other choices over the replaced span, and repairs elsewhere that keep
        # the replacement; only if none lands in the band, any one-span change of the parent
        options = [*_alternatives(self.space, arch, [(mutation.first, mutation.last)]),
                   *_alternatives(self.space, mutation.arch,
                                  self._spans(mutation.arch, (mutation.start, mutation.end)))]
        options = [o for o in options if o != arch]
        if not any(self.in_band(o) for o in options):
            options += [o for o in _alternatives(self.space, arch, self._spans(arch))
                        if o not in options]
        return self._closest(options, rng) if options else mutation.arch

    def _spans(self, arch: SubnetArch, keep: tuple[int, int] | None = None
               ) -> list[tuple[int, int]]:
        """Index spans ``(i, j)`` of ``arch`` over at most the widest branch's blocks, apart
        from the blocks ``keep`` (start, end)."""
        bounds = _boundaries(self.space, arch)
        spans = []
        for i in range(len(bounds) - 1):
            for j in range(i + 1, len(bounds)):
                if bounds[j] - bounds[i] > self._width:
                    break
                if keep is None or bounds[j] <= keep[0] or bounds[i] >= keep[1]:
                    spans.append((i, j))
        return spans

    def _closest(self, options: Sequence[SubnetArch], rng: np.random.Generator) -> SubnetArch:
        distances = [self.distance(o) for o in options]
        best = min(distances)
        ties = [o for o, d in zip(options, distances, strict=True) if d == best]
        return ties[int(rng.integers(len(ties)))]

    # -- crossover ----------------------------------------------------------------------------

    def crossover_arch(self, first: Any, second: Any, rng: np.random.Generator
                       ) -> SubnetArch:
        children = _splices(self.space, tuple(first), tuple(second))
        inside = [c for c in children if self.in_band(c)]
        pool = inside or children
        return pool[int(rng.integers(len(pool)))] if pool else tuple(first)
