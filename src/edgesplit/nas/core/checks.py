"""How the three NAS systems refuse a setting: one style for all of them.

A class lists its settings' rules as ``(name, ok, allowed)`` triples, in the order a user
would fix them, and :func:`refuse` raises a :class:`~edgesplit.errors.ConfigError` for the
first that fails, before any work starts::

    JMSNAS latency_budget_ms=-1.0 must be positive          (Python)
    JMSNAS --latency-budget-ms -1.0 must be positive        (under the CLI)

The setting is named as its caller writes it (:func:`~edgesplit.errors.option`), and
``allowed`` says what it must be. The predicates below refuse what Python would let through a
plain comparison: ``True`` as a count, ``nan`` as a rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from edgesplit.errors import ConfigError, option

__all__ = ["Rule", "is_count", "is_fraction", "is_number", "refuse"]

Rule = tuple[str, bool, str]  # (attribute name, whether its value is allowed, what is allowed)


def refuse(owner: object, rules: Iterable[Rule]) -> None:
    """A ConfigError for the first rule of ``owner``'s settings that does not hold."""
    for name, ok, allowed in rules:
        if not ok:
            raise ConfigError(f"{type(owner).__name__} {option(name, getattr(owner, name))} "
                              f"must be {allowed}")


def is_count(value: object, least: int = 0) -> bool:
    """A whole number (not a bool) >= ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def is_number(value: object, *, least: float = 0.0, strict: bool = True) -> bool:
    """A finite real (not a bool) above ``least`` (``strict``) or at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value > least if strict else value >= least


def is_fraction(value: object) -> bool:
    """A finite real in [0, 1]."""
    return is_number(value, strict=False) and float(value) <= 1  # type: ignore[arg-type]
