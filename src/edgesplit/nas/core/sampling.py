"""Distinct architectures drawn in a bounded number of proposals: how every search, table
check and validation here samples architectures it has not seen.

A proposal that was seen before (drawn earlier, or excluded up front) is skipped; a new one is
remembered, and kept when ``admit`` says so. The draw stops when it has what it wants, after
``proposals`` proposals, or (given ``patience``) after that many proposals in a row that were
all seen before, so a small space never makes it spin.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

__all__ = ["draw_distinct"]

A = TypeVar("A")


def draw_distinct(propose: Callable[[], A], wanted: int, *, proposals: int,
                  seen: set[Hashable], key: Callable[[A], Hashable] | None = None,
                  admit: Callable[[A], bool] | None = None,
                  patience: int | None = None) -> list[A]:
    """Up to ``wanted`` new architectures from ``propose``, in at most ``proposals`` calls.

    ``seen`` holds the keys (``key(arch)``, the architecture itself by default) already drawn
    or excluded; it is updated in place, so several draws share it. A new architecture is
    kept when ``admit(arch)`` (default: always)."""
    found: list[A] = []
    stale = 0
    for _ in range(proposals):
        if len(found) >= wanted or stale == patience:
            break
        arch = propose()
        name = arch if key is None else key(arch)
        if name in seen:
            stale += 1
            continue
        stale = 0
        seen.add(name)
        if admit is None or admit(arch):
            found.append(arch)
    return found
