"""The switching runner of AdaptiveNet's dynamic model update (section 5.3).

:class:`AdaptiveRunner` serves requests one at a time on the supernet's shared weights (every
block is resident, so a switch only changes the path) and applies the
:class:`~.monitor.LatencyMonitor`'s switches between requests; each answer is a :class:`Reply`,
and each served request leaves a :class:`RequestRecord` for plots.
"""

from __future__ import annotations

import math
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from edgesplit.errors import ConfigError
from edgesplit.nas.adaptivenet._checks import arch_text
from edgesplit.nas.adaptivenet.monitor import MANUAL, LatencyMonitor, SwitchEvent
from edgesplit.nas.adaptivenet.space import SubnetArch
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet

__all__ = ["AdaptiveRunner", "Reply", "RequestRecord"]

LoadHook = Callable[[SubnetArch, float], None]  # (arch, compute seconds), after each request


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
    request's compute and counts in its latency (:class:`~.loads.Slowdown`,
    :class:`~.loads.SimulatedLatency`); ``adapt=False`` serves the starting subnet throughout
    (the static baseline).
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
                                  f"{arch_text(entry.arch)} ({exc}); build the pool from "
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
