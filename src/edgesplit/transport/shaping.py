"""Link emulation inside the transport: the bytes a hop sends take as long as the plan's link
says (size / bandwidth, queued behind earlier sends as on a real link, plus half the round
trip), so a run on loopback shows the latency the plan predicts.

Portable and used by the tests; for kernel-level shaping see the ``tc`` recipe in docs/serving.md.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the type only: the transport layer imports nothing of the model's world
    from edgesplit.hardware import Link

__all__ = ["LinkShaper", "tc_commands"]


class LinkShaper:
    """A FIFO link: each send waits for the link to be free, occupies it for its transfer
    time, and arrives half an RTT later. ``enabled=False`` passes everything at once."""

    def __init__(self, link: Link | None, enabled: bool = True) -> None:
        self.link = link
        self.enabled = enabled and link is not None
        self._lock = threading.Lock()
        self._free_at = {"up": 0.0, "down": 0.0}

    def delay_s(self, nbytes: int, direction: Literal["up", "down"] = "up") -> float:
        """How long ``nbytes`` take on an idle link."""
        if not self.enabled:
            return 0.0
        assert self.link is not None
        return (self.link.transfer_ms(nbytes, direction=direction) + self.link.rtt_ms / 2) / 1e3

    def send(self, nbytes: int, direction: Literal["up", "down"] = "up") -> float:
        """Block for as long as sending ``nbytes`` takes; returns the seconds waited."""
        if not self.enabled:
            return 0.0
        assert self.link is not None
        start = time.perf_counter()
        transfer_s = self.link.transfer_ms(nbytes, direction=direction) / 1e3
        with self._lock:
            begin = max(start, self._free_at[direction])
            self._free_at[direction] = begin + transfer_s
        arrive = begin + transfer_s + self.link.rtt_ms / 2e3
        _sleep_until(arrive)
        return time.perf_counter() - start


def _sleep_until(deadline: float) -> None:
    # sleep() overshoots by ~0.1 ms per call; finish the last millisecond by polling
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left - 0.001 if left > 0.002 else 0)


def tc_commands(link: Link, interface: str = "veth-edge") -> list[str]:
    """Linux ``tc``/netem commands that make ``interface`` behave like ``link`` (for users
    with root who prefer kernel shaping to the transport's; see the recipe in
    docs/serving.md). netem delays every packet by half the RTT in this direction; the other
    end's interface takes the other half (and the down rate)."""
    half_rtt = link.rtt_ms / 2
    up = link.bandwidth_mbps
    down = link.down_bandwidth_mbps or link.bandwidth_mbps
    loss = f" loss {link.loss * 100:g}%" if link.loss else ""
    return [
        f"tc qdisc replace dev {interface} root netem delay {half_rtt:g}ms rate {up:g}mbit{loss}",
        "# on the peer interface (the cloud side of the veth pair):",
        f"tc qdisc replace dev {interface}-peer root netem delay {half_rtt:g}ms rate {down:g}mbit",
    ]
