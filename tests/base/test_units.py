"""Sizes people type, parsed once in the library for the CLI, files and Python users."""

import pytest

from edgesplit.errors import ConfigError
from edgesplit.units import at_least, parse_bytes


@pytest.mark.parametrize("text, expected", [("2097152", 2097152), ("2MiB", 2 * 2**20),
                                            ("64MB", 64 * 10**6), ("1.5 kib", 1536),
                                            (" 3 GB ", 3 * 10**9), ("10b", 10), (None, None),
                                            (4096, 4096)])
def test_sizes_with_and_without_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "2 parsecs", "1.2.3MB", ""])
def test_what_is_not_a_size_is_named(text):
    with pytest.raises(ConfigError, match=r"--edge-memory .* is not"):
        parse_bytes(text, "--edge-memory")


@pytest.mark.parametrize("value, digits", [(0.7249, 2), (0.72, 2), (1.2341, 4), (0.0012344, 4),
                                           (123.41, 2), (0.1 + 0.2, 1), (9.991, 3)])
def test_a_suggested_least_value_is_rounded_up_and_is_short(value, digits):
    """A hint's "give X or more" must pass when followed: X is never below the value."""
    text = at_least(value, digits)
    assert float(text) >= value
    assert float(text) <= value * (1 + 10 ** (1 - digits))
    assert "e" not in text
