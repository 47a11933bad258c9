"""Injected loads and clocks for AdaptiveNet's dynamic model update (section 5.3).

:class:`CpuLoad` (real background load, for benchmarks) and :class:`Slowdown` /
:class:`SimulatedLatency` with :class:`ManualClock` (deterministic load, for tests and demos).
:class:`Slowdown` and :class:`SimulatedLatency` are hooks of an :class:`~.runner.AdaptiveRunner`.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import torch

from edgesplit.errors import ConfigError, option
from edgesplit.nas.adaptivenet.space import SubnetArch

__all__ = ["CpuLoad", "ManualClock", "SimulatedLatency", "Slowdown"]


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
