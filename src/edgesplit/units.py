"""Quantities people type: sizes such as ``2MiB`` or ``64MB``, for the CLI, configuration files
and Python users alike."""

from __future__ import annotations

import math
import re

from edgesplit.errors import ConfigError

__all__ = ["at_least", "parse_bytes"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}


def parse_bytes(text: str | int | None, what: str = "size") -> int | None:
    """Bytes from an integer or a string with an optional unit (B, kB, MB, GB, KiB, MiB, GiB;
    case-insensitive); None stays None. ``what`` names the value in the error."""
    if text is None or isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{what} {text!r} is not a size: use bytes or a unit, e.g. 2097152, "
                          "2MiB, 64MB")
    try:
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    except ValueError:  # "1.2.3"
        raise ConfigError(f"{what} {text!r} is not a number of bytes") from None


def at_least(value: float, digits: int = 4) -> str:
    """``value`` written with ``digits`` significant digits, rounded *up*: a hint such as "give
    --budget 0.72 or more" must name a value that passes, and ``f"{x:.2g}"`` rounds to the
    nearest (0.7249 would print 0.72, which still fails)."""
    if value <= 0 or not math.isfinite(value):
        return f"{value:.{digits}g}"
    scale = 10 ** (digits - 1 - math.floor(math.log10(value)))
    # The epsilon keeps 0.72 (72.00000000000001 once scaled) at 0.72; the check after it
    # bumps a value the epsilon rounded below the original (0.1 + 0.2 must not print 0.3).
    steps = math.ceil(value * scale - 1e-9)
    while True:
        up = steps / scale
        whole = math.floor(math.log10(up)) + 1  # never exponent notation for the integer part
        text = f"{up:.{max(digits, whole)}g}"
        if float(text) >= value:
            return text
        steps += 1
