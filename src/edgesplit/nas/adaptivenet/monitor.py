"""The latency monitor of AdaptiveNet's dynamic model update (section 5.3).

:class:`LatencyMonitor`: the ratio ``r = actual / estimated`` latency of the running subnet over
the last few requests; over budget it picks the most accurate subnet of the
:class:`~.pool.SubnetPool` within ``T_budget / r``, and when a more accurate subnet fits again
it switches back up. Each switch is a :class:`SwitchEvent`, with one of the reasons
:data:`OVER_BUDGET`, :data:`HEADROOM`, :data:`INFEASIBLE` or :data:`MANUAL`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgesplit.errors import ConfigError, InfeasibleError, option
from edgesplit.nas.adaptivenet._checks import check_budget
from edgesplit.nas.adaptivenet.pool import PoolEntry, SubnetPool
from edgesplit.nas.adaptivenet.space import SubnetArch

__all__ = [
    "CONFIRM",
    "COOLDOWN_REQUESTS",
    "COOLDOWN_S",
    "HEADROOM",
    "INFEASIBLE",
    "MANUAL",
    "OVER_BUDGET",
    "TOLERANCE",
    "LatencyMonitor",
    "SwitchEvent",
    "count_flaps",
]

Clock = Callable[[], float]

# A switch up waits this long after the last switch (see LatencyMonitor).
COOLDOWN_REQUESTS = 20
COOLDOWN_S = 0.5
# A switch is made once its verdict held on this many requests in a row (see LatencyMonitor).
CONFIRM = 10
# How far over budget the window's latency may run before a switch down (see LatencyMonitor).
TOLERANCE = 0.2

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

    A verdict must hold: a switch is made once the same verdict (down, or up) came on
    ``confirm`` requests in a row, so a slowdown (or a dip) shorter than ``confirm`` requests
    switches nothing. With a window of 5, a burst of slow requests gives as many over-budget
    verdicts as it has requests, so ``confirm`` is the shortest burst acted on. On the 2-core
    virtual machine the benchmarks ran on, the serving path with nothing else running had
    bursts of 1.1-1.8x its calibrated latency (the host's other guests), and every such burst
    switched down and back up: two flaps with no load (the switches before the load in
    ``vision_real.json``'s runs came at r 1.11-1.77, half of them at most 1.2). So the
    defaults are a ``tolerance`` of 0.2 and ``confirm`` 10: a load is met about 10 requests
    later than by the window alone, and a dip under a steady load must last as long to
    switch up. Alone they left the flaps under a real load at a median of 2 (the switches
    up below were the rest).

    That holds while the estimates are right up to one factor and ``r`` is steady. Where they
    are not (a subnet slower than its estimate says, or noise around the threshold), a switch
    up is soon undone: one undone within ``backoff_s`` failed, and for ``backoff_s`` no switch
    up goes to a subnet as slow as the one that failed; each consecutive failure doubles that
    time (at most ``max_backoff_s``), so a wrong estimate costs a few switches, not a flap per
    window. Switching down is never held back.

    After a switch the window starts empty, so at least ``window`` requests run before the
    next one; a switch *up* also waits out a cooldown, ``cooldown_requests`` requests and
    ``cooldown_s`` seconds since the last switch (on by default: under a real load ``r``
    wanders, and a window of 5 can see headroom that is not there, the flap a cooldown
    prevents). Switching down is never held back: the budget comes first. ``clock`` (seconds)
    stamps the events; tests inject a :class:`~.loads.ManualClock`.

    A load need not slow every subnet alike: a real CPU load slowed a small subnet 1.15x and
    larger ones 2-2.5x, so ``r`` read on the small one promises headroom the larger ones do
    not have, and every switch up under the load was undone. So after a switch down, the
    subnet switched to is gauged while the cooldown runs: its loaded ratio ``r0`` is the
    median of its first ``max(window, cooldown_requests)`` requests, and a switch up waits
    until its own ratio shows the load gone (``r <= 1 + tolerance / 2``: about its quiet
    speed; a tenth below ``r0``, the rule before, was met by the load's own wander and undone
    on ResNet-18), or for a probe ``max_backoff_s`` after the switch down. A load that slows
    the small subnet by no more than the ``tolerance`` (``r0 <= 1 + tolerance``) cannot be
    seen going from it, so then only the probe switches up: in the benchmark's runs the subnet
    switched to under two busy cores ran at 0.92-1.07x its estimate, and every switch up read
    from its ratio was undone by the load within a second; the price is a switch back up to
    ``max_backoff_s`` after such a load ends.
    """

    def __init__(self, pool: SubnetPool, *, budget_s: float | None = None, window: int = 5,
                 tolerance: float = TOLERANCE, headroom: float = 0.1, confirm: int = CONFIRM,
                 cooldown_requests: int = COOLDOWN_REQUESTS, cooldown_s: float = COOLDOWN_S,
                 backoff_s: float = 0.5, max_backoff_s: float = 8.0,
                 start: Sequence[str] | None = None, clock: Clock = time.perf_counter) -> None:
        self.pool = pool
        self.budget_s, _ = check_budget(pool.budget_s if budget_s is None else budget_s, None)
        _check_monitor(window, tolerance, headroom, {"cooldown_requests": cooldown_requests,
                                                     "confirm": confirm},
                       {"cooldown_s": cooldown_s, "backoff_s": backoff_s,
                        "max_backoff_s": max_backoff_s})
        self.window, self.tolerance, self.headroom = window, tolerance, headroom
        self.cooldown_requests, self.cooldown_s = cooldown_requests, cooldown_s
        self.confirm = confirm
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.clock = clock
        self._current = pool.optimal if start is None else pool.entry(start)
        self._ratios: deque[float] = deque(maxlen=window)
        self.observed = 0
        self._switched_at: tuple[int, float] | None = None  # (observed, time) of the last
        self._trial_until: float | None = None  # a switch up undone before this failed
        self._failures = 0  # consecutive failed switches up
        self._ceiling: tuple[float, float] | None = None  # (latency, until): no switch up to it
        self._loaded: _Loaded | None = None  # since the last switch down, until one up
        self._streak: tuple[bool, int] | None = None  # (down?, requests) of the verdict held
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
        self._loaded = None
        self._streak = None

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
        if self._loaded is not None:
            self._loaded.add(self._ratios[-1])
        r = self.ratio
        if r is None:
            return None
        now = self.clock()
        target, reason = self._decide(r, now)
        if target is not None and reason == HEADROOM and (self._cooling(now)
                                                          or not self._eased(r, now)):
            self._streak = None
            return None
        if target is None:
            self._streak = None
        if target is None or not self._held(reason != HEADROOM):
            self._judge_trial(None, now)  # a verdict not yet held switches nothing
            return None
        self._judge_trial(reason, now)
        event = SwitchEvent(now, self._current.arch, target.arch, r, reason, self.observed)
        if reason == HEADROOM:
            self._trial_until = now + self._hold(self._failures)
            self._loaded = None
        else:
            self._loaded = _Loaded(now, max(self.window, self.cooldown_requests))
        self._current = target
        self._ratios.clear()  # the next subnet's ratio needs its own evidence
        self._streak = None
        self._switched_at = (self.observed, now)
        return event

    def _held(self, down: bool) -> bool:
        """Count this request's verdict (a switch ``down`` or up); has it held on ``confirm``
        requests in a row?"""
        same = self._streak is not None and self._streak[0] == down
        count = self._streak[1] + 1 if same and self._streak is not None else 1
        self._streak = (down, count)
        return count >= self.confirm

    def _cooling(self, now: float) -> bool:
        if self._switched_at is None:
            return False
        count, at = self._switched_at
        return self.observed - count < self.cooldown_requests or now - at < self.cooldown_s

    def _eased(self, r: float, now: float) -> bool:
        """May the monitor switch up, as far as the load it last switched down for goes?"""
        loaded = self._loaded
        if loaded is None or now - loaded.since_s >= self.max_backoff_s:
            return True  # no switch down since the last up, or time for a probe
        r0 = loaded.ratio
        if r0 is None or r0 <= 1 + self.tolerance:
            # the load barely slows this subnet: its going is lost in the noise, and only
            # the probe can tell (a switch up on r <= 1 here was undone under the load)
            return False
        return r <= 1 + self.tolerance / 2

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


class _Loaded:
    """The subnet a switch down went to, gauged: its ratio over its first requests."""

    def __init__(self, since_s: float, requests: int) -> None:
        self.since_s, self.requests = since_s, requests
        self._ratios: list[float] = []
        self.ratio: float | None = None  # r0, once `requests` ratios are in

    def add(self, ratio: float) -> None:
        if self.ratio is None:
            self._ratios.append(ratio)
            if len(self._ratios) == self.requests:
                self.ratio = statistics.median(self._ratios)


def count_flaps(events: Sequence[SwitchEvent], latency_s: Callable[[SubnetArch], float],
                changes: Sequence[tuple[float, str | None]]) -> int:
    """Switches no load change asked for: the flapping of a run whose load changed at
    ``changes`` (monitor-clock time, and the direction the change calls for: ``"down"`` when
    a load starts, ``"up"`` when it ends, None for the start of a steady run).

    Within each phase (from one change to the next) switches in the phase's direction are
    the reaction to it, several steps of it included; the first switch the other way, and
    every switch after it in that phase, is a flap, as is any switch in a phase that asked
    for none. Manual switches are not the monitor's and do not count. A switch's direction
    is by ``latency_s`` of its two subnets (down: to a faster one)."""
    bounds = sorted(changes)
    flaps = 0
    for k, (start, wanted) in enumerate(bounds):
        end = bounds[k + 1][0] if k + 1 < len(bounds) else math.inf
        flapping = wanted is None  # a steady phase: every switch is a flap
        for event in events:
            if event.reason == MANUAL or not start <= event.time_s < end:
                continue
            down = latency_s(event.to_arch) < latency_s(event.from_arch)
            flapping = flapping or ("down" if down else "up") != wanted
            flaps += flapping
    return flaps


def _check_monitor(window: Any, tolerance: Any, headroom: Any, counts: Mapping[str, Any],
                   seconds: Mapping[str, Any]) -> None:
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConfigError(f"{option('window', window)} must be a whole number of requests >= 1")
    if not (isinstance(tolerance, int | float) and 0 <= tolerance < math.inf):
        raise ConfigError(f"{option('tolerance', tolerance)} must be a fraction >= 0 (how far "
                          "over budget the latency may go before switching down)")
    if not (isinstance(headroom, int | float) and 0 <= headroom < 1):
        raise ConfigError(f"{option('headroom', headroom)} must be a fraction in [0, 1) (the "
                          "margin a faster load must leave before switching up)")
    for name, value in counts.items():
        least = 1 if name == "confirm" else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigError(f"{option(name, value)} must be a whole number of requests >= "
                              f"{least}")
    for name, value in seconds.items():
        if not (isinstance(value, int | float) and 0 <= value < math.inf):
            raise ConfigError(f"{option(name, value)} must be seconds >= 0")
