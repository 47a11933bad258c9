"""Quantities people type: sizes such as ``2MiB`` or ``64MB``, for the CLI, configuration files
and Python users alike."""

from __future__ import annotations

import re

from edgesplit.errors import ConfigError

__all__ = ["parse_bytes"]

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
