"""A bounded count of workers, taken and given back once per request.

``threading.BoundedSemaphore`` is written in Python on top of a ``Condition``: taking and
giving back a slot runs a dozen Python calls even when nobody waits, which a served request
pays in its cold path right after compute. Here the uncontended case is one C-level lock and an
integer; only a caller that finds every slot taken waits on the condition.
"""

from __future__ import annotations

import threading
import time

__all__ = ["Slots"]


class Slots:
    """At most ``n`` holders at once."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"Slots needs at least one slot, got {n}")
        self._free, self._waiting = n, 0
        self._closed = False
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._unwaited = threading.Condition(self._lock)  # no take() waiting any more

    def take_free(self) -> bool:
        """Take a slot if one is free, without waiting; whether one was."""
        with self._lock:
            if self._free:
                self._free -= 1
                return True
            return False

    def take(self, timeout: float | None = None) -> bool:
        """Take a slot, waiting at most ``timeout`` seconds (None: as long as it takes); False
        when none came free in time, or :meth:`close` was called while it waited."""
        with self._lock:
            if self._free:
                self._free -= 1
                return True
            deadline = None if timeout is None else time.monotonic() + timeout
            self._waiting += 1
            try:
                while not self._free:
                    if self._closed:
                        return False
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._freed.wait(left)
                self._free -= 1
                return True
            finally:
                self._waiting -= 1
                if not self._waiting:
                    self._unwaited.notify_all()

    def give(self) -> None:
        """Give a slot back (one taken before)."""
        with self._lock:
            self._free += 1
            if self._waiting:
                self._freed.notify()

    def drain(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until no :meth:`take` is waiting (a stopping
        server serves the calls that came before it stopped); whether none is."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._unwaited.wait(left)
            return True

    def close(self) -> None:
        """The server is stopping: every :meth:`take` that has to wait returns False at once
        (a free slot is still taken: calls in flight finish; slots held are given back)."""
        with self._lock:
            self._closed = True
            self._freed.notify_all()
