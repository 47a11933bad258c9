"""The subnet pool of AdaptiveNet's dynamic model update (section 5.3), and its JSON file.

:class:`SubnetPool`: of the searched ``(arch, latency, accuracy)`` tuples, the subnets with the
highest accuracy at each level of latency in ``[T_budget - dT, T_budget + dT]`` (the Pareto
front of accuracy against latency, optionally one per latency bin), each a :class:`PoolEntry`
with its latency relative to the optimal subnet (the most accurate one within the budget). A
pool is a versioned JSON document; one that cannot be read is a :class:`PoolFileError`.
:mod:`.monitor` picks among its subnets as the load changes and :mod:`.runner` serves requests
with them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.errors import ConfigError, InfeasibleError, option
from edgesplit.nas.adaptivenet._checks import arch_text, check_budget
from edgesplit.nas.adaptivenet.space import ElasticSpace, SubnetArch
from edgesplit.nas.core.files import read_json, write_json

__all__ = ["POOL_VERSION", "PoolEntry", "PoolFileError", "SubnetPool"]

POOL_VERSION = 1
_KIND = "edgesplit-adaptivenet-subnet-pool"
_REBUILD = "rebuild it from the search history with SubnetPool.build(...).save(path)"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


class PoolFileError(ConfigError):
    """A subnet pool file or document is unreadable, of another kind or version, malformed, or
    names subnets of another supernet."""


# -- the pool ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolEntry:
    """One subnet of the pool: its predicted latency, its accuracy and ``relative`` latency
    (``latency_s`` over the optimal subnet's)."""

    arch: SubnetArch
    latency_s: float
    accuracy: float
    relative: float

    def to_dict(self) -> dict[str, Any]:
        return {"arch": list(self.arch), "latency_s": self.latency_s,
                "accuracy": self.accuracy, "relative": self.relative}


def _candidate(item: Any) -> tuple[SubnetArch, float, float]:
    """``(arch, latency_s, accuracy)`` checked, or ConfigError naming the bad value."""
    try:
        arch, latency, accuracy = item
        arch, latency, accuracy = tuple(arch), float(latency), float(accuracy)
    except (TypeError, ValueError):
        raise ConfigError(f"a pool candidate must be (arch, latency_s, accuracy), got {item!r}"
                          ) from None
    if not arch or not all(isinstance(name, str) for name in arch):
        raise ConfigError(f"a pool candidate's arch must be branch names, got {arch!r}")
    if not (math.isfinite(latency) and latency > 0):
        raise ConfigError(f"subnet {arch_text(arch)} has latency {latency!r} s; latencies "
                          "must be finite and positive")
    if not math.isfinite(accuracy):
        raise ConfigError(f"subnet {arch_text(arch)} has accuracy {accuracy!r}")
    return arch, latency, accuracy


def _dedupe(candidates: Iterable[tuple[SubnetArch, float, float]]
            ) -> list[tuple[SubnetArch, float, float]]:
    """One tuple per arch (a history may hold a subnet twice): the most accurate, then fastest."""
    best: dict[SubnetArch, tuple[SubnetArch, float, float]] = {}
    for c in candidates:
        seen = best.get(c[0])
        if seen is None or (c[2], -c[1]) > (seen[2], -seen[1]):
            best[c[0]] = c
    return sorted(best.values(), key=lambda c: (c[1], -c[2], c[0]))


def _front(candidates: Iterable[tuple[SubnetArch, float, float]]
           ) -> list[tuple[SubnetArch, float, float]]:
    """The most accurate subnet at each latency: accuracy strictly rises with latency."""
    front: list[tuple[SubnetArch, float, float]] = []
    for arch, latency, accuracy in sorted(candidates, key=lambda c: (c[1], -c[2], c[0])):
        if not front or accuracy > front[-1][2]:
            front.append((arch, latency, accuracy))
    return front


def _binned(front: list[tuple[SubnetArch, float, float]], low: float, high: float,
            levels: int) -> list[tuple[SubnetArch, float, float]]:
    """The most accurate (on a front: the slowest) subnet of each of ``levels`` equal latency
    bins over ``[low, high]``."""
    width = (high - low) / levels
    best: dict[int, tuple[SubnetArch, float, float]] = {}
    for item in front:  # sorted by latency, so a later one in a bin is more accurate
        index = 0 if width <= 0 else min(int((item[1] - low) / width), levels - 1)
        best[index] = item
    return [best[i] for i in sorted(best)]


def _best_within(items: Iterable[tuple[SubnetArch, float, float]], budget_s: float
                 ) -> tuple[SubnetArch, float, float] | None:
    fitting = [c for c in items if c[1] <= budget_s]
    return max(fitting, key=lambda c: (c[2], -c[1]), default=None)


class SubnetPool:
    """Subnets of different latency-accuracy trade-offs for one latency budget.

    ``entries`` are ``(arch, latency_s, accuracy)``, kept as given (:meth:`build` selects them
    from a search history); ``budget_s`` is the latency budget the pool was searched for and
    ``delta_s`` the half-width of its latency window (None: no window). The optimal subnet is
    the most accurate one within the budget; when none is, the pool is refused
    (InfeasibleError), as the search that made it found nothing to serve.
    """

    def __init__(self, entries: Iterable[tuple[Sequence[str], float, float]], budget_s: float,
                 delta_s: float | None = None, *, meta: Mapping[str, Any] | None = None
                 ) -> None:
        self.budget_s, self.delta_s = check_budget(budget_s, delta_s)
        items = _dedupe(map(_candidate, entries))
        if not items:
            raise ConfigError("a subnet pool needs at least one subnet")
        optimal = _best_within(items, self.budget_s)
        if optimal is None:
            raise InfeasibleError(f"no subnet of the pool fits the budget {_ms(self.budget_s)}; "
                                  f"the fastest, {arch_text(items[0][0])}, takes "
                                  f"{_ms(items[0][1])} (search again with a larger budget)")
        self.entries: tuple[PoolEntry, ...] = tuple(
            PoolEntry(arch, latency, accuracy, latency / optimal[1])
            for arch, latency, accuracy in items)
        self.meta: dict[str, Any] = dict(meta or {})
        self._by_arch = {e.arch: e for e in self.entries}
        self._by_accuracy = sorted(self.entries, key=lambda e: (-e.accuracy, e.latency_s))
        self.optimal: PoolEntry = self._by_arch[optimal[0]]

    @classmethod
    def build(cls, candidates: Iterable[tuple[Sequence[str], float, float]], budget_s: float,
              delta_s: float | None, *, levels: int | None = None,
              space: ElasticSpace | None = None, meta: Mapping[str, Any] | None = None
              ) -> SubnetPool:
        """The pool of a search history: of the evaluated ``(arch, latency_s, accuracy)``
        candidates with latency in ``[budget_s - delta_s, budget_s + delta_s]`` and the most
        accurate one within the budget wherever it lies (the search's choice, where the
        monitor starts: it may be faster than the window), the most accurate at each latency
        (the Pareto front, so it drops the window's slower, less accurate ones); with
        ``levels``, only the most accurate
        of each of ``levels`` equal latency bins over that window, plus the optimal subnet.
        ``space`` checks every arch is a subnet of that supernet."""
        budget_s, delta_s = check_budget(budget_s, delta_s)
        if levels is not None and (not isinstance(levels, int) or levels < 1):
            raise ConfigError(f"{option('levels', levels)} must be a whole number >= 1 (latency "
                              "bins of the pool) or None (the whole Pareto front)")
        items = _dedupe(map(_candidate, candidates))
        if not items:
            raise ConfigError("a subnet pool needs the evaluated subnets of a search; got none")
        if space is not None:
            for arch, _, _ in items:
                space.check(arch)
        low, high = ((budget_s - delta_s, budget_s + delta_s) if delta_s is not None
                     else (-math.inf, math.inf))
        window = [c for c in items if low <= c[1] <= high]
        if not window:
            raise InfeasibleError(f"none of the {len(items)} searched subnets has a latency in "
                                  f"[{_ms(low)}, {_ms(high)}]; search again or widen "
                                  f"{option('delta_s')}")
        best = _best_within(items, budget_s)
        front = _front(window if best is None or best in window else [*window, best])
        if levels is not None:
            optimal = _best_within(front, budget_s)
            lo, hi = (max(low, front[0][1]), min(high, front[-1][1]))
            front = _binned(front, lo, hi, levels)
            if optimal is not None and optimal not in front:
                front = sorted([*front, optimal], key=lambda c: c[1])
        return cls(front, budget_s, delta_s, meta=meta)

    # -- queries -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[PoolEntry]:
        return iter(self.entries)

    def __contains__(self, arch: object) -> bool:
        return isinstance(arch, Sequence) and tuple(arch) in self._by_arch

    def __repr__(self) -> str:
        return (f"SubnetPool({len(self)} subnets, budget {_ms(self.budget_s)}, optimal "
                f"{arch_text(self.optimal.arch)} at {_ms(self.optimal.latency_s)})")

    @property
    def fastest(self) -> PoolEntry:
        return self.entries[0]

    def entry(self, arch: Sequence[str]) -> PoolEntry:
        """The pool's entry of ``arch``, or ConfigError if the pool does not hold it."""
        found = self._by_arch.get(tuple(arch))
        if found is None:
            raise ConfigError(f"subnet {arch_text(arch)} is not in the pool; it holds "
                              f"{len(self)} subnets from {arch_text(self.fastest.arch)} "
                              f"({_ms(self.fastest.latency_s)}) up")
        return found

    def pick(self, budget_s: float) -> PoolEntry:
        """The most accurate subnet with latency <= ``budget_s`` (the faster one of a tie), or
        InfeasibleError naming the fastest subnet when none fits."""
        for entry in self._by_accuracy:
            if entry.latency_s <= budget_s:
                return entry
        raise InfeasibleError(f"no subnet in the pool fits {_ms(budget_s)}; the fastest, "
                              f"{arch_text(self.fastest.arch)}, takes "
                              f"{_ms(self.fastest.latency_s)} (search again for this load)")

    def with_latencies(self, latencies: Mapping[SubnetArch, float]) -> SubnetPool:
        """The same subnets with new latencies (e.g. measured on the serving path, where the
        estimates of a latency table can be off by fixed costs); the optimal subnet and the
        relative latencies follow. Every subnet of the pool needs a latency."""
        missing = [arch_text(e.arch) for e in self.entries if e.arch not in latencies]
        if missing:
            raise ConfigError(f"no new latency for subnets {', '.join(missing)} of the pool")
        return SubnetPool([(e.arch, latencies[e.arch], e.accuracy) for e in self.entries],
                          self.budget_s, self.delta_s, meta=self.meta)

    # -- files ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``kind``, ``version`` first)."""
        return {"kind": _KIND, "version": POOL_VERSION, "budget_s": self.budget_s,
                "delta_s": self.delta_s, "optimal": list(self.optimal.arch),
                "meta": self.meta, "entries": [e.to_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "", space: ElasticSpace | None = None
                  ) -> SubnetPool:
        """Inverse of :meth:`to_dict`; another kind or version, a malformed document or (with
        ``space``) an arch of another supernet is a :class:`PoolFileError`."""
        what = f"subnet pool {source!r}" if source else "this subnet pool"
        if not isinstance(data, Mapping) or data.get("kind") != _KIND:
            raise PoolFileError(f"{what} is not an edgesplit subnet pool; {_REBUILD}")
        if data.get("version") != POOL_VERSION:
            raise PoolFileError(f"{what} has version {data.get('version')!r}; this edgesplit "
                                f"reads version {POOL_VERSION}: {_REBUILD}")
        try:
            entries = [(_arch_field(e["arch"]), e["latency_s"], e["accuracy"])
                       for e in data["entries"]]
            pool = cls(entries, data["budget_s"], data["delta_s"], meta=data.get("meta"))
        except (KeyError, TypeError, ValueError, InfeasibleError) as exc:
            detail = str(exc) if isinstance(exc, ConfigError | InfeasibleError) else \
                f"{type(exc).__name__}: {exc}"
            raise PoolFileError(f"{what} is malformed ({detail}); {_REBUILD}") from None
        if space is not None:
            for entry in pool:
                try:
                    space.check(entry.arch)
                except ConfigError as exc:
                    raise PoolFileError(f"{what} was made for another supernet ({exc}); "
                                        f"{_REBUILD} of this supernet's search") from None
        return pool

    def save(self, path: str | Path) -> Path:
        """Write the pool as JSON (it ships with the searched supernet)."""
        path = Path(path)
        write_json(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: str | Path, *, space: ElasticSpace | None = None) -> SubnetPool:
        """Read a pool written by :meth:`save` (PoolFileError naming the file if it cannot)."""
        path = Path(path)
        data = read_json(path, what="subnet pool", fix=_REBUILD, error=PoolFileError)
        return cls.from_dict(data, source=str(path), space=space)


def _arch_field(value: Any) -> SubnetArch:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise TypeError(f"arch must be a list of branch names, got {value!r}")
    return tuple(value)
