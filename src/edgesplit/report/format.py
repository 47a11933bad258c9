"""Human-readable numbers for tables (JSON output always carries the exact integers)."""

from __future__ import annotations

__all__ = ["human_bytes", "human_count"]


def human_count(value: float) -> str:
    """1234567 -> '1.23M' (decimal prefixes, as MAC and parameter counts are quoted)."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:g}"


def human_bytes(value: float) -> str:
    """1536 -> '1.5 KiB' (binary prefixes, as memory sizes are quoted)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{int(value)} B"
