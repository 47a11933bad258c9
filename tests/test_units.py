"""Sizes people type, parsed once in the library for the CLI, files and Python users."""

import pytest

from edgesplit.errors import ConfigError
from edgesplit.units import parse_bytes


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
