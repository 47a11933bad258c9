"""The SplitNets benchmark's fair comparison: baselines across the size range of the supernet
(smallest to largest) and each searched network against the fastest baseline that fits the
sensor at >= its accuracy (Table 4's equal-accuracy reading)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from edgesplit.nas.splitnets import get_split_space

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_nas_splitnets.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_nas_splitnets", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _r(method, label, acc, ms, fits=True):
    return {"method": method, "label": label, "accuracy": acc, "latency_ms": ms, "fits": fits}


def test_equal_accuracy_takes_the_fastest_fitting_baseline_at_least_as_accurate():
    bench = _bench()
    rows = [_r("SplitNets", "best", 90.0, 1.0), _r("SplitNets", "front-0", 99.0, 0.5),
            _r("all on aggregator", "small", 89.0, 0.1),  # less accurate: not a match
            _r("Neurosurgeon", "mid", 90.0, 2.0), _r("all on aggregator", "big", 95.0, 3.0),
            _r("Neurosurgeon", "over", 96.0, 0.2, fits=False)]  # over the sensor memory
    pairs = {p["searched"]: p for p in bench.equal_accuracy(rows)}
    assert pairs["best"]["baseline"] == "Neurosurgeon: mid"
    assert pairs["best"]["speedup"] == 2.0 / 1.0
    assert pairs["front-0"]["baseline"] is None and pairs["front-0"]["speedup"] is None
    assert bench._summary(list(pairs.values())).startswith(
        "At equal accuracy, 1 of 2 searched networks are faster")


def test_size_range_spans_smallest_to_largest_by_macs():
    bench = _bench()
    space = get_split_space("digits-split")
    archs = bench.size_range(space, 5)
    assert archs[0] == space.smallest() and archs[-1] == space.largest()
    macs = [bench._macs(space, a) for a in archs]
    assert macs == sorted(macs) and len(set(macs)) == len(macs)
    assert all(not a.splits for a in archs)
    last = (len(space.phases) - 1,)
    assert all(a.splits == last for a in bench.size_range(space, 3, last))
