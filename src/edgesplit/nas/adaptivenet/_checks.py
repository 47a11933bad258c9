"""Argument checks shared by modules of this package, and how their messages name a subnet."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from edgesplit.errors import ConfigError, option

__all__ = ["arch_text", "check_budget", "positive"]


def arch_text(arch: Sequence[str]) -> str:
    return "-".join(arch)


def positive(value: object, *, allow_zero: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (value >= 0 if allow_zero else value > 0)


def check_budget(budget_s: Any, delta_s: Any) -> tuple[float, float | None]:
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
