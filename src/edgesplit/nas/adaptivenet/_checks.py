"""The budget check shared by modules of this package, and how their messages name a subnet
(the predicates are :mod:`edgesplit.nas.core.checks`', as every NAS system's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgesplit.errors import ConfigError, option
from edgesplit.nas.core.checks import is_number

__all__ = ["arch_text", "check_budget"]


def arch_text(arch: Sequence[str]) -> str:
    return "-".join(arch)


def check_budget(budget_s: Any, delta_s: Any) -> tuple[float, float | None]:
    if not is_number(budget_s):
        raise ConfigError(f"{option('budget_s', budget_s)} must be a positive number of seconds")
    if delta_s is None:
        return float(budget_s), None
    if not is_number(delta_s, strict=False):
        raise ConfigError(f"{option('delta_s', delta_s)} must be seconds >= 0 (the half-width "
                          "of the pool's latency window) or None (no window)")
    return float(budget_s), float(delta_s)
