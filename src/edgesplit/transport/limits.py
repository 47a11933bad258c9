"""How long a server lets a connection be silent or slow, and how much memory frames still
arriving may hold in all: what keeps idle, trickling or unauthenticated peers from taking a
server's connections, workers or memory."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from edgesplit.errors import ConfigError

__all__ = ["DEFAULT_PENDING_BYTES", "ConnectionLimits", "PendingBudget"]

DEFAULT_PENDING_BYTES = 256 << 20  # at least this much for frames still arriving, server-wide


@dataclass(frozen=True)
class ConnectionLimits:
    """Timeouts (seconds) and the memory budget a server applies to its callers.

    ``idle_s``: a data-plane connection, or a gRPC ``RunStream``, that sends nothing between
    calls for this long is closed. ``frame_s``: once a frame's first byte arrived, its header
    and meta must arrive within this (the parts within the call's own timeout when that is
    longer, up to ``idle_s``). ``hello_s``: a new connection must have sent its first call's
    header and meta, with the token, within this (an unauthenticated peer cannot hold a
    connection longer). ``pending_bytes``: the memory all frames still arriving may hold
    together (None: four times the message limit, at least ``DEFAULT_PENDING_BYTES``); a
    frame that would need more is refused RESOURCE_EXHAUSTED and its connection closed."""

    idle_s: float = 300.0
    frame_s: float = 60.0
    hello_s: float = 10.0
    pending_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("idle_s", "frame_s", "hello_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0):
                raise ConfigError(f"ConnectionLimits.{name} must be a positive number of "
                                  f"seconds, got {value!r}")
        if self.pending_bytes is not None and not (
                isinstance(self.pending_bytes, int) and self.pending_bytes > 0):
            raise ConfigError(f"ConnectionLimits.pending_bytes must be a positive byte count "
                              f"(or None for the default), got {self.pending_bytes!r}")

    def budget_bytes(self, limit: int) -> int:
        """The server-wide budget for frames still arriving, for messages up to ``limit``."""
        if self.pending_bytes is not None:
            return self.pending_bytes
        return max(DEFAULT_PENDING_BYTES, 4 * limit)


class PendingBudget:
    """A count of bytes taken and given back, never above ``total``: the receive memory that
    frames still arriving hold, across all connections. ``held`` is what is taken now and
    ``peak`` the most ever taken (what a test reads)."""

    def __init__(self, total: int) -> None:
        self.total, self.held, self.peak = total, 0, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Take ``n`` bytes; False (nothing taken) when that would exceed the total."""
        with self._lock:
            if self.held + n > self.total:
                return False
            self.held += n
            self.peak = max(self.peak, self.held)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n
