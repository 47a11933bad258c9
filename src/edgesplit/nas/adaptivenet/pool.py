"""Dynamic model update (AdaptiveNet section 5.3): a pool of searched subnets, a latency
monitor that picks among them as the load changes, and a runner that serves requests and
switches subnets between them.

- :class:`SubnetPool`: of the searched ``(arch, latency, accuracy)`` tuples, the subnets with
  the highest accuracy at each level of latency in ``[T_budget - dT, T_budget + dT]`` (the
  Pareto front of accuracy against latency, optionally one per latency bin), each with its
  latency relative to the optimal subnet (the most accurate one within the budget).
- :class:`LatencyMonitor`: the ratio ``r = actual / estimated`` latency of the running subnet
  over the last few requests; over budget it picks the most accurate subnet within
  ``T_budget / r``, and when a more accurate subnet fits again it switches back up.
- :class:`AdaptiveRunner`: serves requests one at a time on the supernet's shared weights
  (every block is resident, so a switch only changes the path) and applies the monitor's
  switches between requests.
- :class:`CpuLoad` (real background load, for benchmarks) and :class:`Slowdown` /
  :class:`SimulatedLatency` with :class:`ManualClock` (deterministic load, for tests and demos).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import queue
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import torch

from edgesplit.errors import ConfigError, InfeasibleError, option
from edgesplit.nas.adaptivenet.space import ElasticSpace, SubnetArch
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet

__all__ = [
    "POOL_VERSION",
    "AdaptiveRunner",
    "CpuLoad",
    "LatencyMonitor",
    "ManualClock",
    "PoolEntry",
    "PoolFileError",
    "Reply",
    "RequestRecord",
    "SimulatedLatency",
    "Slowdown",
    "SubnetPool",
    "SwitchEvent",
]

POOL_VERSION = 1
_KIND = "edgesplit-adaptivenet-subnet-pool"
_REBUILD = "rebuild it from the search history with SubnetPool.build(...).save(path)"

Clock = Callable[[], float]
LoadHook = Callable[[SubnetArch, float], None]  # (arch, compute seconds), after each request


def _arch_text(arch: Sequence[str]) -> str:
    return "-".join(arch)


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
        raise ConfigError(f"subnet {_arch_text(arch)} has latency {latency!r} s; latencies "
                          "must be finite and positive")
    if not math.isfinite(accuracy):
        raise ConfigError(f"subnet {_arch_text(arch)} has accuracy {accuracy!r}")
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
        self.budget_s, self.delta_s = _check_budget(budget_s, delta_s)
        items = _dedupe(map(_candidate, entries))
        if not items:
            raise ConfigError("a subnet pool needs at least one subnet")
        optimal = _best_within(items, self.budget_s)
        if optimal is None:
            raise InfeasibleError(f"no subnet of the pool fits the budget {_ms(self.budget_s)}; "
                                  f"the fastest, {_arch_text(items[0][0])}, takes "
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
        candidates with latency in ``[budget_s - delta_s, budget_s + delta_s]``, the most
        accurate at each latency (the Pareto front); with ``levels``, only the most accurate
        of each of ``levels`` equal latency bins over that window, plus the optimal subnet.
        ``space`` checks every arch is a subnet of that supernet."""
        budget_s, delta_s = _check_budget(budget_s, delta_s)
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
        front = _front(window)
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
                f"{_arch_text(self.optimal.arch)} at {_ms(self.optimal.latency_s)})")

    @property
    def fastest(self) -> PoolEntry:
        return self.entries[0]

    def entry(self, arch: Sequence[str]) -> PoolEntry:
        """The pool's entry of ``arch``, or ConfigError if the pool does not hold it."""
        found = self._by_arch.get(tuple(arch))
        if found is None:
            raise ConfigError(f"subnet {_arch_text(arch)} is not in the pool; it holds "
                              f"{len(self)} subnets from {_arch_text(self.fastest.arch)} "
                              f"({_ms(self.fastest.latency_s)}) up")
        return found

    def pick(self, budget_s: float) -> PoolEntry:
        """The most accurate subnet with latency <= ``budget_s`` (the faster one of a tie), or
        InfeasibleError naming the fastest subnet when none fits."""
        for entry in self._by_accuracy:
            if entry.latency_s <= budget_s:
                return entry
        raise InfeasibleError(f"no subnet in the pool fits {_ms(budget_s)}; the fastest, "
                              f"{_arch_text(self.fastest.arch)}, takes "
                              f"{_ms(self.fastest.latency_s)} (search again for this load)")

    def with_latencies(self, latencies: Mapping[SubnetArch, float]) -> SubnetPool:
        """The same subnets with new latencies (e.g. measured on the serving path, where the
        estimates of a latency table can be off by fixed costs); the optimal subnet and the
        relative latencies follow. Every subnet of the pool needs a latency."""
        missing = [_arch_text(e.arch) for e in self.entries if e.arch not in latencies]
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
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path, *, space: ElasticSpace | None = None) -> SubnetPool:
        """Read a pool written by :meth:`save` (PoolFileError naming the file if it cannot)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PoolFileError(f"cannot read subnet pool {str(path)!r}: {exc}; {_REBUILD}"
                                ) from None
        return cls.from_dict(data, source=str(path), space=space)


def _arch_field(value: Any) -> SubnetArch:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise TypeError(f"arch must be a list of branch names, got {value!r}")
    return tuple(value)


def _check_budget(budget_s: Any, delta_s: Any) -> tuple[float, float | None]:
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) \
            or not (math.isfinite(budget_s) and budget_s > 0):
        raise ConfigError(f"{option('budget_s', budget_s)} must be a positive number of seconds")
    if delta_s is None:
        return float(budget_s), None
    if isinstance(delta_s, bool) or not isinstance(delta_s, int | float) \
            or not (math.isfinite(delta_s) and delta_s >= 0):
        raise ConfigError(f"{option('delta_s', delta_s)} must be seconds >= 0 (the half-width "
                          "of the pool's latency window) or None (no window)")
    return float(budget_s), float(delta_s)


# -- the monitor ---------------------------------------------------------------------------

OVER_BUDGET = "over-budget"
HEADROOM = "headroom"
INFEASIBLE = "infeasible"
MANUAL = "manual"


@dataclass(frozen=True)
class SwitchEvent:
    """A change of the running subnet: when (monitor clock), from and to which subnet, the
    latency ratio ``r`` that decided it, why (``over-budget``, ``headroom``: a more accurate
    subnet fits again, ``infeasible``: nothing fits, so the fastest, or ``manual``) and after
    how many observed requests (``request``, counted by the monitor from 1)."""

    time_s: float
    from_arch: SubnetArch
    to_arch: SubnetArch
    r: float
    reason: str
    request: int

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "from": list(self.from_arch), "to": list(self.to_arch),
                "r": self.r, "reason": self.reason, "request": self.request}


class LatencyMonitor:
    """Decides when to switch subnets from the measured latency of the running one.

    Each :meth:`observe` adds ``measured / estimated`` of the running subnet; once ``window``
    requests have been seen since the last switch, ``r`` is their median (one slow outlier
    does not switch). Over budget (``r * estimated > budget * (1 + tolerance)``) it switches to
    the most accurate subnet within ``budget / r`` (the fastest one if none fits, and
    :attr:`needs_search` says the pool cannot serve this load). Otherwise it switches up to the
    most accurate subnet within ``budget * (1 - headroom) / r`` (within ``budget`` at least,
    once ``r <= 1``: the search's own choices) if that is more accurate than the running one:
    the paper's "actual latency smaller than the largest relative latency in the pool". A
    subnet switched to fits ``budget / r`` and the next more accurate one does not, so ``r``
    must fall by ``1 - headroom`` to switch up and then rise by ``(1 + tolerance) /
    (1 - headroom)`` to switch down again: a dead band against flapping.

    That holds while the estimates are right up to one factor and ``r`` is steady. Where they
    are not (a subnet slower than its estimate says, or noise around the threshold), a switch
    up is soon undone: one undone within ``backoff_s`` failed, and for ``backoff_s`` no switch
    up goes to a subnet as slow as the one that failed; each consecutive failure doubles that
    time (at most ``max_backoff_s``), so a wrong estimate costs a few switches, not a flap per
    window. Switching down is never held back.

    After a switch the window starts empty, so at least ``window`` requests (plus the
    cooldowns ``cooldown_requests`` and ``cooldown_s``) run before the next one. ``clock``
    (seconds) stamps the events; tests inject a :class:`ManualClock`.
    """

    def __init__(self, pool: SubnetPool, *, budget_s: float | None = None, window: int = 5,
                 tolerance: float = 0.1, headroom: float = 0.1, cooldown_requests: int = 0,
                 cooldown_s: float = 0.0, backoff_s: float = 0.5, max_backoff_s: float = 8.0,
                 start: Sequence[str] | None = None, clock: Clock = time.perf_counter) -> None:
        self.pool = pool
        self.budget_s, _ = _check_budget(pool.budget_s if budget_s is None else budget_s, None)
        _check_monitor(window, tolerance, headroom, cooldown_requests,
                       {"cooldown_s": cooldown_s, "backoff_s": backoff_s,
                        "max_backoff_s": max_backoff_s})
        self.window, self.tolerance, self.headroom = window, tolerance, headroom
        self.cooldown_requests, self.cooldown_s = cooldown_requests, cooldown_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.clock = clock
        self._current = pool.optimal if start is None else pool.entry(start)
        self._ratios: deque[float] = deque(maxlen=window)
        self.observed = 0
        self._switched_at: tuple[int, float] | None = None  # (observed, time) of the last
        self._trial_until: float | None = None  # a switch up undone before this failed
        self._failures = 0  # consecutive failed switches up
        self._ceiling: tuple[float, float] | None = None  # (latency, until): no switch up to it
        self.needs_search = False

    @property
    def current(self) -> PoolEntry:
        """The subnet the monitor believes is running."""
        return self._current

    @property
    def ratio(self) -> float | None:
        """``r`` over the current window (None until it is full)."""
        if len(self._ratios) < self.window:
            return None
        return statistics.median(self._ratios)

    def reset(self, arch: Sequence[str] | None = None) -> None:
        """Forget the window (and run ``arch`` from now on, if given: a manual switch)."""
        if arch is not None:
            self._current = self.pool.entry(arch)
        self._ratios.clear()
        self._trial_until = None

    def observe(self, latency_s: float, *, arch: Sequence[str] | None = None
                ) -> SwitchEvent | None:
        """Record one request's measured latency; the switch to make before the next request,
        if any (the monitor then already counts the new subnet as running). A measurement of
        another subnet than the current one (``arch``) is stale and ignored."""
        if arch is not None and tuple(arch) != self._current.arch:
            return None
        if not (math.isfinite(latency_s) and latency_s >= 0):
            raise ConfigError(f"a measured latency must be finite and >= 0, got {latency_s!r}")
        self.observed += 1
        self._ratios.append(latency_s / self._current.latency_s)
        r = self.ratio
        if r is None:
            return None
        now = self.clock()
        if self._cooling(now):
            return None
        target, reason = self._decide(r, now)
        self._judge_trial(reason if target is not None else None, now)
        if target is None:
            return None
        event = SwitchEvent(now, self._current.arch, target.arch, r, reason, self.observed)
        if reason == HEADROOM:
            self._trial_until = now + self._hold(self._failures)
        self._current = target
        self._ratios.clear()  # the next subnet's ratio needs its own evidence
        self._switched_at = (self.observed, now)
        return event

    def _cooling(self, now: float) -> bool:
        if self._switched_at is None:
            return False
        count, at = self._switched_at
        return self.observed - count < self.cooldown_requests or now - at < self.cooldown_s

    def _hold(self, failures: int) -> float:
        return min(self.backoff_s * 2 ** failures, self.max_backoff_s)

    def _judge_trial(self, reason: str | None, now: float) -> None:
        """Did the last switch up hold (for as long as the next failure would hold back)?"""
        if self._trial_until is None:
            return
        if reason in (OVER_BUDGET, INFEASIBLE) and now < self._trial_until:
            self._ceiling = (self._current.latency_s, now + self._hold(self._failures))
            self._failures += 1
            self._trial_until = None
        elif now >= self._trial_until:
            self._trial_until = None
            if self._ceiling is None or self._current.latency_s >= self._ceiling[0]:
                # Only a subnet as slow as the one that failed proves the load has gone; one
                # below it holding says nothing about the next try.
                self._failures, self._ceiling = 0, None

    def _decide(self, r: float, now: float) -> tuple[PoolEntry | None, str]:
        current = self._current
        if r * current.latency_s > self.budget_s * (1 + self.tolerance):
            try:
                target = self.pool.pick(self.budget_s / r)
                self.needs_search = False
            except InfeasibleError:
                # The paper searches again here; until then the fastest subnet is the best bet.
                target, self.needs_search = self.pool.fastest, True
                return (None if target == current else target), INFEASIBLE
            return target, OVER_BUDGET
        self.needs_search = False
        limit = self.budget_s * (1 - self.headroom) / r
        if r <= 1:  # no slower than estimated: the search's own choices within budget fit
            limit = max(limit, self.budget_s)
        ceiling = math.inf
        if self._ceiling is not None and now < self._ceiling[1]:
            ceiling = self._ceiling[0]
        fitting = [e for e in self.pool if e.latency_s <= limit and e.latency_s < ceiling]
        better = max(fitting, key=lambda e: (e.accuracy, -e.latency_s), default=None)
        if better is None or better.accuracy <= current.accuracy:
            return None, HEADROOM
        return better, HEADROOM


def _check_monitor(window: Any, tolerance: Any, headroom: Any, cooldown_requests: Any,
                   seconds: Mapping[str, Any]) -> None:
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConfigError(f"{option('window', window)} must be a whole number of requests >= 1")
    if not (isinstance(tolerance, int | float) and 0 <= tolerance < math.inf):
        raise ConfigError(f"{option('tolerance', tolerance)} must be a fraction >= 0 (how far "
                          "over budget the latency may go before switching down)")
    if not (isinstance(headroom, int | float) and 0 <= headroom < 1):
        raise ConfigError(f"{option('headroom', headroom)} must be a fraction in [0, 1) (the "
                          "margin a faster load must leave before switching up)")
    if not isinstance(cooldown_requests, int) or cooldown_requests < 0:
        raise ConfigError(f"{option('cooldown_requests', cooldown_requests)} must be a whole "
                          "number >= 0")
    for name, value in seconds.items():
        if not (isinstance(value, int | float) and 0 <= value < math.inf):
            raise ConfigError(f"{option(name, value)} must be seconds >= 0")


# -- the runner ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A served request: the output, the subnet that computed it, the request's number (in
    submission order, from 0) and its measured latency."""

    output: torch.Tensor
    arch: SubnetArch
    index: int
    latency_s: float


@dataclass(frozen=True)
class RequestRecord:
    """One served request for plots: start time (monitor clock), measured latency, time spent
    queued, its subnet and ``r`` of that request alone (latency over the subnet's estimate)."""

    index: int
    start_s: float
    latency_s: float
    wait_s: float
    arch: SubnetArch
    ratio: float

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "start_s": self.start_s, "latency_s": self.latency_s,
                "wait_s": self.wait_s, "arch": list(self.arch), "ratio": self.ratio}


@dataclass
class _Request:
    index: int
    inputs: tuple[torch.Tensor, ...]
    future: Future[Reply]
    submitted_s: float


_STOP = object()


class AdaptiveRunner:
    """Serves requests with the running subnet of ``monitor``'s pool on ``supernet``.

    :meth:`submit` (thread-safe) queues a request; one worker thread runs them in order, each
    on one subnet, measures its latency with the monitor's clock, feeds the monitor, and applies
    a switch before the next request, so no request is dropped, repeated or split between
    subnets, and each :class:`Reply` names its subnet. ``hook(arch, compute_s)`` runs after each
    request's compute and counts in its latency (:class:`Slowdown`, :class:`SimulatedLatency`);
    ``adapt=False`` serves the starting subnet throughout (the static baseline).
    :attr:`events` and :attr:`records` (the last ``max_records``) are for plots.
    """

    def __init__(self, supernet: ElasticSupernet, monitor: LatencyMonitor, *,
                 hook: LoadHook | None = None, adapt: bool = True,
                 max_records: int = 100_000) -> None:
        for entry in monitor.pool:
            try:
                supernet.space.check(entry.arch)
            except ConfigError as exc:
                raise ConfigError(f"this supernet cannot run the pool's subnet "
                                  f"{_arch_text(entry.arch)} ({exc}); build the pool from "
                                  "this supernet's search") from None
        self.supernet, self.monitor, self.hook, self.adapt = supernet, monitor, hook, adapt
        self.clock = monitor.clock
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Request | object] = queue.SimpleQueue()
        self._arch = monitor.current.arch
        self._pending: SubnetArch | None = None
        self._events: list[SwitchEvent] = []
        self._records: deque[RequestRecord] = deque(maxlen=max_records)
        self._submitted = 0
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="edgesplit-adaptive-runner",
                                        daemon=True)
        self._worker.start()

    # -- API -----------------------------------------------------------------------------

    @property
    def arch(self) -> SubnetArch:
        """The subnet the next request will run on."""
        with self._lock:
            return self._pending or self._arch

    @property
    def events(self) -> list[SwitchEvent]:
        with self._lock:
            return list(self._events)

    @property
    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def submit(self, *inputs: torch.Tensor) -> Future[Reply]:
        """Queue one request; its future gives a :class:`Reply` (or the model's exception)."""
        future: Future[Reply] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("this AdaptiveRunner is closed; make a new one")
            request = _Request(self._submitted, inputs, future, self.clock())
            self._submitted += 1
            self._queue.put(request)
        return future

    def __call__(self, *inputs: torch.Tensor) -> Reply:
        return self.submit(*inputs).result()

    def switch_to(self, arch: Sequence[str]) -> None:
        """Run ``arch`` (a subnet of the pool) from the next request on; the monitor goes on
        adapting from there."""
        entry = self.monitor.pool.entry(arch)
        with self._lock:
            self._pending = entry.arch

    def close(self, timeout_s: float | None = None) -> None:
        """Serve what was submitted, then stop the worker (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._worker.join(timeout_s)

    def __enter__(self) -> AdaptiveRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reaction_time(self, since_s: float) -> float | None:
        """Seconds from ``since_s`` (monitor clock; e.g. when a load started) to the first
        switch after it, or None if there was none."""
        after = [e.time_s for e in self.events if e.time_s >= since_s]
        return after[0] - since_s if after else None

    def recovery_time(self, since_s: float) -> float | None:
        """Seconds from ``since_s`` to the end of the first request that ran on a subnet
        switched to after ``since_s`` and met the budget (the paper's "recover the latency"),
        or None if none did."""
        switched = [e for e in self.events if e.time_s >= since_s]
        if not switched:
            return None
        for record in self.records:
            if record.start_s >= switched[0].time_s \
                    and record.latency_s <= self.monitor.budget_s:
                return record.start_s + record.latency_s - since_s
        return None

    # -- worker --------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while (item := self._queue.get()) is not _STOP:
                assert isinstance(item, _Request)
                self._serve(item)

    def _serve(self, request: _Request) -> None:
        if not request.future.set_running_or_notify_cancel():
            return
        try:
            reply = self._run(request)
        except Exception as exc:  # this request's failure (the model's, the hook's), not the
            request.future.set_exception(exc)  # runner's: the next request is served
            return
        request.future.set_result(reply)

    def _run(self, request: _Request) -> Reply:
        arch = self._take_pending()
        start = self.clock()
        output = self.supernet(*request.inputs, arch=arch)
        if self.hook is not None:
            self.hook(arch, self.clock() - start)
        latency = self.clock() - start
        estimate = self.monitor.pool.entry(arch).latency_s
        event = self.monitor.observe(latency, arch=arch) if self.adapt else None
        with self._lock:
            self._records.append(RequestRecord(request.index, start, latency,
                                               start - request.submitted_s, arch,
                                               latency / estimate))
            if event is not None:  # the next request runs on the new subnet
                self._events.append(event)
                self._arch = event.to_arch
        return Reply(output, arch, request.index, latency)

    def _take_pending(self) -> SubnetArch:
        """The arch of the next request, after applying a manual :meth:`switch_to`."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None or pending == self._arch:
                return self._arch
            event = SwitchEvent(self.clock(), self._arch, pending, math.nan, MANUAL,
                                self.monitor.observed)
            self._events.append(event)
            self._arch = pending
        self.monitor.reset(pending)
        return pending


# -- injected load -------------------------------------------------------------------------


class ManualClock:
    """A clock that moves only when told (:meth:`advance`, :meth:`sleep`): deterministic
    latencies and events in tests and demos."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += max(0.0, seconds)

    sleep = advance


class _InjectedLoad:
    """A load factor (thread-safe), changed with :meth:`set` or for a while with
    :meth:`active`."""

    def __init__(self, factor: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._factor = 1.0
        self.set(factor)

    @property
    def factor(self) -> float:
        with self._lock:
            return self._factor

    def set(self, factor: float) -> None:
        if not (isinstance(factor, int | float) and 1 <= factor < math.inf):
            raise ConfigError(f"{option('factor', factor)} must be >= 1 (1: no load)")
        with self._lock:
            self._factor = float(factor)

    @contextlib.contextmanager
    def active(self, factor: float) -> Iterator[None]:
        """``factor`` inside the block, the previous factor after it."""
        previous = self.factor
        self.set(factor)
        try:
            yield
        finally:
            self.set(previous)


class Slowdown(_InjectedLoad):
    """A runner hook that sleeps so a request takes ``factor`` times its compute time: load of
    a known size on a real clock, without CPU contention."""

    def __init__(self, factor: float = 1.0, *, sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        super().__init__(factor)
        self._sleep = sleep

    def __call__(self, arch: SubnetArch, compute_s: float) -> None:
        extra = (self.factor - 1.0) * compute_s
        if extra > 0:
            self._sleep(extra)


class SimulatedLatency(_InjectedLoad):
    """A runner hook for a :class:`ManualClock`: each request takes exactly ``factor`` times
    ``estimate(arch)`` (e.g. the pool's predicted latency), whatever the machine does."""

    def __init__(self, estimate: Callable[[SubnetArch], float], clock: ManualClock,
                 factor: float = 1.0) -> None:
        super().__init__(factor)
        self.estimate, self.clock = estimate, clock

    def __call__(self, arch: SubnetArch, compute_s: float) -> None:
        self.clock.advance(self.factor * self.estimate(arch))


def _burn(stop: MpEvent, go: MpEvent, ready: MpEvent, size: int) -> None:
    """A load process: one-thread matrix products while ``go`` is set, until ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, even on Ctrl-C
    torch.set_num_threads(1)
    a, b = torch.rand(size, size), torch.rand(size, size)
    out = torch.empty(size, size)
    ready.set()
    while not stop.is_set():
        if go.wait(0.05):  # one product is a few ms, so pausing takes effect that fast
            torch.mm(a, b, out=out)


class CpuLoad:
    """``processes`` background processes (spawned) that each keep one CPU core busy with
    matrix products: a real load for benchmarks.

    Starting processes takes seconds (they import torch) and loads the CPU itself, so for a
    sharp load edge :meth:`prepare` them first; :meth:`resume` and :meth:`pause` then switch
    the load on and off within milliseconds (``resumed_s``, ``paused_s``: ``perf_counter``
    times of the last edges). :meth:`start` is both; as a context manager it returns once
    every process is burning and stops them all on exit, exception or not.
    """

    def __init__(self, processes: int = 1, *, size: int = 256, start_timeout_s: float = 60.0
                 ) -> None:
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise ConfigError(f"{option('processes', processes)} must be a whole number >= 1")
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"{option('size', size)} must be a whole number >= 1")
        self.processes, self.size, self.start_timeout_s = processes, size, start_timeout_s
        self._context = multiprocessing.get_context("spawn")  # no forked torch thread pools
        self._stop: MpEvent | None = None
        self._go: MpEvent | None = None
        self._procs: list[Any] = []
        self.resumed_s: float | None = None
        self.paused_s: float | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def alive(self) -> int:
        """How many load processes are running (burning or paused)."""
        return sum(p.is_alive() for p in self._procs)

    def prepare(self) -> CpuLoad:
        """Start the processes, paused; return once all of them are ready to burn."""
        if self.alive():
            raise RuntimeError("this CpuLoad is already running; stop it first")
        self._stop, self._go, self._procs = self._context.Event(), self._context.Event(), []
        readies = [self._context.Event() for _ in range(self.processes)]
        try:
            for ready in readies:
                proc = self._context.Process(target=_burn,
                                             args=(self._stop, self._go, ready, self.size),
                                             name="edgesplit-cpu-load", daemon=True)
                proc.start()
                self._procs.append(proc)
            self._wait_ready(readies)
        except BaseException:
            self.stop()
            raise
        return self

    def resume(self) -> None:
        """Switch the load on."""
        if self._go is None:
            raise RuntimeError("this CpuLoad has no processes; prepare() or start() it first")
        self._go.set()
        self.resumed_s = time.perf_counter()

    def pause(self) -> None:
        """Switch the load off, keeping the processes."""
        if self._go is not None:
            self._go.clear()
            self.paused_s = time.perf_counter()

    def start(self) -> CpuLoad:
        """Start the processes and the load."""
        if not self.alive():
            self.prepare()
        self.resume()
        return self

    def _wait_ready(self, readies: list[MpEvent]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        for proc, ready in zip(self._procs, readies, strict=True):
            while not ready.wait(0.05):
                if not proc.is_alive():
                    raise RuntimeError(f"a CPU load process exited with code {proc.exitcode} "
                                       "before it started")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the CPU load processes did not start within "
                                       f"{self.start_timeout_s} s")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every process (terminate, then kill, any that does not stop in time)."""
        self.pause()
        if self._stop is not None:
            self._stop.set()
        for proc in self._procs:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._stop = self._go = None  # the stopped processes stay listed (pids, exit codes)

    def __enter__(self) -> CpuLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
