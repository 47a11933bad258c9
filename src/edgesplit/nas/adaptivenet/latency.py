"""The on-device latency model of AdaptiveNet (section 5.1): a table of block latencies.

Blocks of the supernet are never fused with their neighbours (elastification cuts the model at
block boundaries), so a subnet's latency is the sum of its branches' latencies plus the side
inputs' (computed once per inference). :meth:`BlockLatencyTable.profile` measures every branch
once on this machine -- a few seconds even for a ResNet, since there are far fewer branches
than subnets -- and :meth:`~BlockLatencyTable.predict` then prices any subnet without running
it, which is what lets the search stay near the budget without measuring candidates.

Branches are timed *in context* (:class:`~edgesplit.nas.core.timing.InContextTimer`), at the
batch size of the example inputs, with the process's thread setting and no autograd: every
round runs random subnets that together pass through every branch (each one a subnet through
a branch not yet covered), and times each branch call (and the side inputs) where it sits in
its chain. Each chain runs three times back to back and the first pass is not kept, so weights
are as warm as in a network serving one request after another. Timing each branch alone on
the feature reaching it along the pretrained path was tried first: on digits_cnn at batch 100
(2 cores) its sums missed whole subnets by 14-56 % (mean absolute error; the first,
memory-bound block read twice as slow as inside a network), in context by 2-5 %.
:func:`table_error` reports how well the sums predict whole subnets.

A table is a :class:`~edgesplit.nas.core.table.SecondsTable` (seconds, a versioned JSON
document) that embeds the space it was measured for, with a fingerprint, so
:meth:`~BlockLatencyTable.load` refuses a table of another supernet.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware.timing import (
    check_counts,
    machine_identity,
    synced,
    time_block,
    timing_conditions,
)
from edgesplit.nas.adaptivenet.space import ElasticSpace, SubnetArch
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet
from edgesplit.nas.core.sampling import draw_distinct
from edgesplit.nas.core.table import SecondsTable
from edgesplit.nas.core.timing import InContextTimer

__all__ = ["BLOCK_TABLE_VERSION", "FAR_FACTOR", "FAR_SLACK_S", "BlockLatencyTable",
           "far_from_estimate", "measure_subnet", "space_fingerprint", "table_error"]

_SIDE = "side inputs"

TableProgress = Callable[[str, int, int], None]  # (stage, done, total), as JMSNAS tables

_REPROFILE = "profile the supernet again (BlockLatencyTable.profile(supernet, example_inputs))"


def space_fingerprint(space: ElasticSpace) -> str:
    """sha256 of the space's canonical JSON (branch names, spans, levels, kept fractions)."""
    text = json.dumps(space.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class BlockLatencyTable(SecondsTable):
    """Seconds of every branch of ``space`` and of the side inputs, at batch size ``batch``.

    ``measurement`` records how it was taken (repeats, warmup, threads, torch, machine).
    Validates itself on construction: every branch of the space has a time, no other name.
    """

    KIND: ClassVar[str] = "edgesplit-adaptivenet-latency-table"
    VERSION: ClassVar[int] = 1
    WHAT: ClassVar[str] = "block latency table"
    TITLE: ClassVar[str] = "an AdaptiveNet block latency table"
    REBUILD: ClassVar[str] = _REPROFILE

    space: ElasticSpace
    branch_seconds: Mapping[str, float]
    side_seconds: float
    batch: int
    model: str = ""
    measurement: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_batch(self.batch)
        names = set(self.space.by_name)
        missing, extra = names - set(self.branch_seconds), set(self.branch_seconds) - names
        if missing or extra:
            self.refuse(f"does not fit its space: missing branches {sorted(missing) or 'none'}"
                        f", unknown branches {sorted(extra) or 'none'}")
        seconds = {name: self.seconds(f"branch_seconds[{name!r}]", self.branch_seconds[name])
                   for name in self.space.by_name}  # in the space's order
        object.__setattr__(self, "branch_seconds", seconds)
        object.__setattr__(self, "side_seconds", self.seconds("side_seconds", self.side_seconds))

    @property
    def fixed_seconds(self) -> float:
        return self.side_seconds

    def entry_seconds(self, key: str) -> float:
        return self.branch_seconds[key]

    # -- prediction --------------------------------------------------------------------------

    def predict(self, arch: Sequence[str]) -> float:
        """Predicted seconds of subnet ``arch``: side inputs + the sum of its branches."""
        return self.total_seconds(self.space.check(arch))

    def segment(self, path: Sequence[str]) -> float:
        """Seconds of some consecutive branches (a prefix, a span): no side inputs, no check."""
        return sum(self.branch_seconds[name] for name in path)

    @cached_property
    def _bounds(self) -> tuple[tuple[float, ...], tuple[float, ...],
                               tuple[SubnetArch, ...], tuple[SubnetArch, ...]]:
        """Per position i: the least and most seconds of a path from i to the end, and those
        paths (dynamic programming from the end: a path's cost is a sum over its branches)."""
        n = self.space.num_blocks
        low, high = [0.0] * (n + 1), [0.0] * (n + 1)
        fast: list[SubnetArch] = [()] * (n + 1)
        slow: list[SubnetArch] = [()] * (n + 1)
        for i in reversed(range(n)):
            options = self.space.starting_at[i]
            best = min(options, key=lambda b: self.branch_seconds[b.name] + low[b.end])
            worst = max(options, key=lambda b: self.branch_seconds[b.name] + high[b.end])
            low[i] = self.branch_seconds[best.name] + low[best.end]
            high[i] = self.branch_seconds[worst.name] + high[worst.end]
            fast[i], slow[i] = (best.name, *fast[best.end]), (worst.name, *slow[worst.end])
        return tuple(low), tuple(high), tuple(fast), tuple(slow)

    def suffix_bounds(self, position: int) -> tuple[float, float]:
        """The least and most seconds any path from block ``position`` to the end takes."""
        low, high, _, _ = self._bounds
        return low[position], high[position]

    def fastest(self) -> tuple[SubnetArch, float]:
        """The fastest subnet and its predicted seconds."""
        arch = self._bounds[2][0]
        return arch, self.predict(arch)

    def slowest(self) -> tuple[SubnetArch, float]:
        """The slowest subnet and its predicted seconds."""
        arch = self._bounds[3][0]
        return arch, self.predict(arch)

    @property
    def min_latency(self) -> float:
        return self.fastest()[1]

    @property
    def max_latency(self) -> float:
        return self.slowest()[1]

    # -- measuring ---------------------------------------------------------------------------

    @classmethod
    def profile(cls, supernet: ElasticSupernet, example_inputs: Sequence[torch.Tensor], *,
                repeats: int = 20, warmup: int = 2, seed: int = 0,
                progress: TableProgress | None = None) -> BlockLatencyTable:
        """Measure every branch of ``supernet`` on this machine (see the module docstring):
        ``warmup`` untimed rounds, then ``repeats`` timed rounds (each branch timed at least
        twice a round); each entry is the median. ``seed`` draws the chains."""
        check_counts(repeats=(repeats, 1), warmup=(warmup, 0))
        inputs = tuple(example_inputs)
        started = time.perf_counter()
        threads = torch.get_num_threads()
        timer = InContextTimer(inputs[0].device)
        rng = np.random.default_rng(seed)
        rounds = warmup + repeats
        was_training = supernet.training
        supernet.eval()
        try:
            with timing_conditions(threads):
                for r in range(rounds):
                    for path in _covering_paths(supernet.space, rng):
                        timer.burst(partial(_chain, supernet, inputs, path, timer), r >= warmup)
                    if progress:
                        progress("timing branches in context", r + 1, rounds)
        finally:
            supernet.train(was_training)
        branches = {name: timer.seconds(name) for name in supernet.space.by_name}
        side = timer.seconds(_SIDE)
        measurement = {"method": "in context", "repeats": repeats, "warmup": warmup,
                       "threads": threads, "torch": torch.__version__,
                       "machine": machine_identity(),
                       "device": str(inputs[0].device),
                       "created": datetime.now(UTC).isoformat(timespec="seconds"),
                       "seconds": time.perf_counter() - started}
        return cls(supernet.space, branches, side, int(inputs[0].shape[0]),
                   str(supernet.meta.get("model", "")), measurement)

    # -- compatibility and files -------------------------------------------------------------

    def check(self, space: ElasticSpace | ElasticSupernet, *, source: str = ""
              ) -> BlockLatencyTable:
        """This table if it was measured for ``space`` (or that supernet's space); else a
        ConfigError saying so."""
        space = space.space if isinstance(space, ElasticSupernet) else space
        if space_fingerprint(space) != space_fingerprint(self.space):
            what = f"block latency table {source!r}" if source else "block latency table"
            raise ConfigError(f"{what} was measured for another supernet ({self.model or '?'}, "
                              f"{len(self.space.branches)} branches over "
                              f"{self.space.num_blocks} blocks; this one has "
                              f"{len(space.branches)} over {space.num_blocks}): {_REPROFILE}")
        return self

    def payload(self) -> dict[str, Any]:
        return {"model": self.model, "batch": self.batch,
                "space_fingerprint": space_fingerprint(self.space),
                "side_seconds": self.side_seconds,
                "branch_seconds": dict(self.branch_seconds),
                "space": self.space.to_dict(), "measurement": dict(self.measurement)}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> BlockLatencyTable:
        space = ElasticSpace.from_dict(data["space"])
        if data.get("space_fingerprint") != space_fingerprint(space):
            raise ConfigError("its space_fingerprint does not match its space (edited or "
                              "truncated)")
        measurement = data.get("measurement") or {}
        if not isinstance(measurement, Mapping):
            raise ConfigError("measurement must be an object")
        return cls(space, dict(data["branch_seconds"]), data["side_seconds"], data["batch"],
                   str(data.get("model", "")), dict(measurement))

    @classmethod
    def load(cls, path: str | Path, *, supernet: ElasticSupernet | ElasticSpace | None = None
             ) -> BlockLatencyTable:
        """Read a table; with ``supernet`` also check it was measured for it."""
        table = cls.read(path)
        return table if supernet is None else table.check(supernet, source=str(path))


BLOCK_TABLE_VERSION = BlockLatencyTable.VERSION


# -- sanity check against an estimate --------------------------------------------------------

# A table whose pretrained path takes more than FAR_FACTOR x its estimate + FAR_SLACK_S is
# suspect. The slack keeps tiny models quiet: eager PyTorch spends microseconds per op that a
# roofline does not count (digits_cnn at batch 1: about 2x its roofline in total, one small
# block 7x), while a loaded machine or contending OpenMP threads made it 280x (82 ms).
FAR_FACTOR = 5.0
FAR_SLACK_S = 1e-3


def far_from_estimate(table: BlockLatencyTable, estimate_s: Mapping[str, float], *,
                      side_s: float = 0.0, estimate: str = "roofline estimate",
                      factor: float = FAR_FACTOR, slack_s: float = FAR_SLACK_S) -> str | None:
    """One warning line when ``table`` times the pretrained path far slower than an estimate
    of it (``estimate_s``: seconds of each of its branches; ``side_s``: of the side inputs),
    naming the path, the block that adds the most, and both numbers of each; None when the
    table is within ``factor`` x the estimate + ``slack_s``, or the estimate lacks a branch."""
    path = table.space.original
    if not path or any(name not in estimate_s for name in path):
        return None
    measured = table.predict(path)
    estimated = side_s + sum(estimate_s[name] for name in path)
    if measured <= factor * estimated + slack_s:
        return None
    worst = max(path, key=lambda name: table.branch_seconds[name] - estimate_s[name])
    ratio = f"{measured / estimated:.0f}x" if estimated > 0 else "far above"
    return (f"the block latency table times the pretrained path ({'-'.join(path)}) at "
            f"{measured * 1e3:.4g} ms, {ratio} its {estimate} of {estimated * 1e3:.4g} ms "
            f"(block {worst}: {table.branch_seconds[worst] * 1e3:.4g} ms measured, "
            f"{estimate_s[worst] * 1e3:.4g} ms estimated); the search prices subnets with "
            "these times: is the machine busy, or do torch's threads contend (try fewer)?")


# -- timing helpers --------------------------------------------------------------------------


def _covering_paths(space: ElasticSpace, rng: np.random.Generator) -> list[SubnetArch]:
    """Random subnets that together run every branch: for each branch (in random order) not
    yet on one, a subnet through it (random branches before and after)."""
    covered: set[str] = set()
    paths = []
    for k in rng.permutation(len(space.branches)):
        branch = space.branches[int(k)]
        if branch.name in covered:
            continue
        path = (*_random_path(space, 0, branch.start, rng), branch.name,
                *_random_path(space, branch.end, space.num_blocks, rng))
        covered.update(path)
        paths.append(path)
    return paths


def _random_path(space: ElasticSpace, start: int, end: int, rng: np.random.Generator
                 ) -> SubnetArch:
    path: list[str] = []
    while start < end:
        options = [b for b in space.starting_at[start] if b.end <= end]
        branch = options[int(rng.integers(len(options)))]
        path.append(branch.name)
        start = branch.end
    return tuple(path)


def _chain(supernet: ElasticSupernet, inputs: tuple[torch.Tensor, ...], path: SubnetArch,
           timer: InContextTimer) -> None:
    """Run subnet ``path`` as a deployment does (side inputs, then each branch on the last
    one's output), each call timed by ``timer``."""
    side = timer.call(_SIDE, supernet.side_tensors, *inputs)
    x = inputs[0]
    for name in path:
        x = timer.call(name, supernet.branch(name), x, side)


def measure_subnet(supernet: ElasticSupernet, arch: Sequence[str],
                   example_inputs: Sequence[torch.Tensor], *, repeats: int = 30, warmup: int = 3
                   ) -> float:
    """Median seconds of subnet ``arch`` run whole (side inputs and all its branches)."""
    check_counts(repeats=(repeats, 1), warmup=(warmup, 0))
    subnet = supernet.subnet(arch).eval()
    inputs = tuple(example_inputs)
    samples: list[int] = []
    with timing_conditions(torch.get_num_threads()):
        time_block(synced(lambda: subnet(*inputs), inputs[0]), warmup, repeats, samples)
    return statistics.median(samples) / 1e9


def table_error(table: BlockLatencyTable, supernet: ElasticSupernet,
                example_inputs: Sequence[torch.Tensor], *, samples: int = 20, seed: int = 0,
                repeats: int = 30, warmup: int = 3, progress: TableProgress | None = None
                ) -> dict[str, Any]:
    """How well ``table`` predicts whole subnets here: up to ``samples`` distinct random
    subnets (the pretrained path first) measured with :func:`measure_subnet`.

    Returns ``mape_pct``, ``worst_error_pct`` (signed, largest in size),
    ``fraction_within_10pct`` and per subnet ``arch``, ``predicted_s``, ``measured_s``,
    ``error_pct`` (positive: the table predicts slower than measured)."""
    table.check(supernet)
    check_counts(samples=(samples, 1))
    if int(example_inputs[0].shape[0]) != table.batch:
        raise ConfigError(f"the table was measured at batch size {table.batch}; measure with "
                          f"inputs of that batch size, not {int(example_inputs[0].shape[0])}")
    archs = _distinct_archs(table.space, samples, np.random.default_rng(seed))
    rows: list[dict[str, Any]] = []
    for done, arch in enumerate(archs, start=1):
        measured = measure_subnet(supernet, arch, example_inputs, repeats=repeats, warmup=warmup)
        predicted = table.predict(arch)
        rows.append({"arch": list(arch), "predicted_s": predicted, "measured_s": measured,
                     "error_pct": 100.0 * (predicted - measured) / measured})
        if progress:
            progress("timing subnets", done, len(archs))
    errors = [row["error_pct"] for row in rows]
    return {"model": table.model, "batch": table.batch, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "samples": len(rows),
            "mape_pct": statistics.fmean(abs(e) for e in errors),
            "worst_error_pct": max(errors, key=abs),
            "fraction_within_10pct": sum(abs(e) <= 10.0 for e in errors) / len(errors),
            "archs": rows}


def _distinct_archs(space: ElasticSpace, count: int, rng: np.random.Generator
                    ) -> list[SubnetArch]:
    """The pretrained path and random others, at most ``count`` (fewer in a small space)."""
    first = space.original
    others = draw_distinct(lambda: space.random_arch(rng), min(count, space.count()) - 1,
                           proposals=count * 20, seen={first})
    return [first, *others][:count]
