"""The benchmarks' quiet-machine gate: one refusal, worded once (benchmarks run as scripts, so
this folder is on their path)."""

from __future__ import annotations

import os

QUIET_LOAD = 1.0  # 1-minute load average above which the machine is not quiet (2 cores)


def require_quiet(threshold: float = QUIET_LOAD) -> float:
    """Refuse to measure on a busy machine (SystemExit); returns the load it started at."""
    load = os.getloadavg()[0]
    if load > threshold:
        raise SystemExit(f"load average {load:.2f} > {threshold:g}: the machine is not quiet "
                         "(tests, helpers or other jobs running?); wait, or pass --allow-load "
                         "for a trial run (with --out elsewhere)")
    return load
