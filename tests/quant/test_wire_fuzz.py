"""The wire decoder under mutated messages whose CRC is re-sealed, so the mutations reach the
checks behind it: every input raises WireError or decodes to the header's shape and dtype, and
none allocates more than 4x the size it declares. The engine is scripts/fuzz_wire.py (``make
fuzz`` runs it at 500,000 inputs and also bounds the time per decode); here it runs a few
thousand, deterministically, and asserts no timings (they would depend on the machine)."""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_wire.py"


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_wire", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_wire"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("fuzz_wire", None)


@pytest.fixture(scope="module")
def fuzzer(fuzz):
    return fuzz.Fuzzer(seed=0, time_limit_ms=None)


def assert_clean(summary) -> None:
    assert summary.crashes == [], summary.crashes[:3]
    assert summary.over_allocated == [], summary.over_allocated[:3]


def test_random_mutations(fuzzer):
    summary = fuzzer.run(4000)
    assert_clean(summary)
    assert summary.decoded > 100 and summary.rejected > 1000
    reasons = " | ".join(summary.reasons)
    for deep in ("zstd frame states", "cannot expand", "not finite", "cannot decompress",
                 "uncompressed payload", "quantization parameters", "does not match shape"):
        assert deep in reasons, f"no mutation reached the {deep!r} check"


def test_every_field_at_every_boundary(fuzz, fuzzer):
    def variants():
        for seed in fuzz.varied(fuzzer.seeds):
            for _name, at, width in fuzz.fields(seed):
                for value in fuzz.BOUNDARIES:
                    msg = bytearray(seed)
                    msg[at:at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
                    fuzz.reseal(msg)
                    yield bytes(msg)

    summary = fuzzer.run_inputs(variants())
    assert_clean(summary)
    assert summary.inputs > 5000


def test_every_byte_at_boundary_values(fuzz, fuzzer):
    def variants():
        for seed in fuzz.varied(fuzzer.seeds):
            for i in range(min(len(seed), 64)):
                for value in (0, 1, 0x7F, 0x80, 0xFF):
                    msg = bytearray(seed)
                    msg[i] = value
                    fuzz.reseal(msg)
                    yield bytes(msg)

    assert_clean(fuzzer.run_inputs(variants()))


def test_crafted_bodies_under_every_header(fuzz, fuzzer):
    """Bombs and malformed bodies under each valid header, called zstd and lz4, with raw_len as
    the header says or as the body claims."""
    def variants():
        for seed in fuzz.varied(fuzzer.seeds):
            body_at = dict((n, o) for n, o, _ in fuzz.fields(seed))["payload_len"] + 12
            for body in fuzzer.bodies:
                for code in (1, 2):
                    for raw_len in (None, 1 << 20, 1 << 22, 1 << 40):
                        msg = bytearray(seed[:body_at]) + body
                        msg[9] = code
                        struct.pack_into("<Q", msg, body_at - 12, len(body))
                        if raw_len is not None:
                            struct.pack_into("<Q", msg, body_at - 20, raw_len)
                        fuzz.reseal(msg)
                        yield bytes(msg)

    summary = fuzzer.run_inputs(variants())
    assert_clean(summary)
    assert summary.inputs > 1000
