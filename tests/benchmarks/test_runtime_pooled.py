"""Section 6's runs pooled (render_runtime.baseline_runs): runs against the same commit are
kept in order, a run against another commit starts the list again, and the verdict reads a
throughput and a time in their own directions."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import render_runtime


def _baseline(commit: str, ratio: float) -> dict:
    metric = {"run": "single client", "metric": "throughput_rps", "ratios": [ratio, ratio]}
    return {"commit": commit, "method": "interleaved", "date": "d", "load_before": 0.5,
            "load_after": 1.0, "rounds": 2,
            "setups": [{"plane": "tcp", "batching": True, "metrics": [metric]}]}


def test_runs_against_one_commit_are_kept_in_order() -> None:
    first = {"baseline": _baseline("abc", 0.9)}
    runs = render_runtime.baseline_runs(first, _baseline("abc", 1.1))
    assert [r["ratios"]["tcp/on single client throughput_rps"] for r in runs] == \
        [[0.9, 0.9], [1.1, 1.1]]
    third = render_runtime.baseline_runs({"baseline": _baseline("abc", 1.1),
                                          "baseline_runs": runs}, _baseline("abc", 1.0))
    assert len(third) == 3


def test_another_commit_starts_again() -> None:
    runs = render_runtime.baseline_runs({"baseline": _baseline("old", 0.9)},
                                        _baseline("new", 1.0))
    assert len(runs) == 1


def test_verdicts_read_each_metric_in_its_direction() -> None:
    assert render_runtime._pooled_verdict("x throughput_rps", 0.94) == "worse"
    assert render_runtime._pooled_verdict("x p50_ms", 0.94) == "better"
    assert render_runtime._pooled_verdict("x p50_ms", 1.06) == "worse"
    assert render_runtime._pooled_verdict("x p50_ms", 1.04) == "within 5 %"
