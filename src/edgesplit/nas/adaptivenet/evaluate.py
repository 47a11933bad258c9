"""Reuse-based evaluation of AdaptiveNet's search (section 5.2, Algorithm 1 BuildTree and
DFS-Evaluate).

Candidates of one generation share prefixes (the same first branches). A prefix tree
(:class:`PrefixTree`) of the generation is walked depth first for each batch of the edge data
(the batch is loaded once for all candidates) by :class:`PrefixTreeEvaluator`; the feature of
a shared prefix is computed once, cached while its subtree is evaluated and released after, so
at most ``max_depth`` features are held at once (Algorithm 1 BuildTree drops the least
important prefixes, latency x candidates sharing it, to keep that bound). Outputs are the same
tensors as a recomputation from scratch (same branch calls on the same inputs).
:class:`EvalStats` counts what an evaluation cost; :func:`measure_reuse` compares the tree with
the recomputation (the paper's Fig. 11).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from edgesplit.errors import ConfigError, option
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable
from edgesplit.nas.adaptivenet.space import SubnetArch
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet

__all__ = [
    "Batch",
    "EvalStats",
    "Metric",
    "PrefixTree",
    "PrefixTreeEvaluator",
    "measure_reuse",
]

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]  # (inputs, targets)
Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # per-sample scores
EvalProgress = Callable[[int, int], None]  # (subnet-batches done, total)
OutputHook = Callable[[SubnetArch, int, torch.Tensor], None]  # (subnet, batch index, output)


# -- the prefix tree -------------------------------------------------------------------------


@dataclass
class _Node:
    """A cached prefix feature: ``segment`` runs from the parent's feature to this one;
    ``leaves`` are the subnets finishing from here, with the rest of their path."""

    prefix: SubnetArch
    segment: SubnetArch
    children: list[_Node] = field(default_factory=list)
    leaves: list[tuple[SubnetArch, SubnetArch]] = field(default_factory=list)


@dataclass
class PrefixTree:
    """The feature-cache tree of a set of subnets (Algorithm 1 BuildTree).

    Inner nodes are the prefixes whose feature is cached: prefixes shared by two or more
    subnets that diverge right after them (a shared run of branches is cached once, at its
    end). When a subnet would need more than ``max_depth`` cached features at once, the least
    important of its prefixes (prefix cost x subnets sharing it) is dropped until none does.
    """

    root: _Node
    cached: tuple[SubnetArch, ...]
    importance: dict[SubnetArch, float]
    depth: int

    @classmethod
    def build(cls, archs: Sequence[SubnetArch], *, max_depth: int | None = None,
              cost: Callable[[SubnetArch], float] = len) -> PrefixTree:
        """The tree of ``archs`` (distinct paths); ``cost(prefix)`` prices a prefix (seconds
        from a latency table, or its branch count)."""
        sharing: Counter[SubnetArch] = Counter()
        following: dict[SubnetArch, set[str]] = {}
        for arch in archs:
            for k in range(1, len(arch)):
                sharing[arch[:k]] += 1
                following.setdefault(arch[:k], set()).add(arch[k])
        points = {p for p, count in sharing.items() if count >= 2 and len(following[p]) >= 2}
        importance = {p: float(cost(p)) * sharing[p] for p in points}
        if max_depth is not None:
            _limit_depth(archs, points, importance, max_depth)
        root = _Node((), ())
        nodes: dict[SubnetArch, _Node] = {(): root}
        for prefix in sorted(points, key=lambda p: (len(p), p)):
            parent = _deepest(prefix, nodes)
            node = _Node(prefix, prefix[len(parent.prefix):])
            parent.children.append(node)
            nodes[prefix] = node
        for arch in archs:
            parent = _deepest(arch, nodes)
            parent.leaves.append((arch, arch[len(parent.prefix):]))
        depth = max((_chain_length(a, points) for a in archs), default=0)
        return cls(root, tuple(sorted(points, key=lambda p: (len(p), p))),
                   {p: importance[p] for p in points}, depth)

    def branch_calls(self) -> int:
        """Branch calls one batch costs with this tree (each cached segment once, each subnet's
        rest once)."""
        def calls(node: _Node) -> int:
            return (sum(len(rest) for _, rest in node.leaves)
                    + sum(len(c.segment) + calls(c) for c in node.children))
        return calls(self.root)


def _chain_length(arch: SubnetArch, points: set[SubnetArch]) -> int:
    return sum(arch[:k] in points for k in range(1, len(arch)))


def _limit_depth(archs: Sequence[SubnetArch], points: set[SubnetArch],
                 importance: dict[SubnetArch, float], max_depth: int) -> None:
    """Drop (from ``points``) the least important prefix of any subnet with more than
    ``max_depth`` of them, until none has. A drop only shortens other chains, so one pass
    suffices."""
    for arch in archs:
        chain = [arch[:k] for k in range(1, len(arch)) if arch[:k] in points]
        while len(chain) > max_depth:
            weakest = min(chain, key=lambda p: (importance[p], len(p)))
            points.discard(weakest)
            chain.remove(weakest)


def _deepest(arch: SubnetArch, nodes: dict[SubnetArch, _Node]) -> _Node:
    """The node of the longest proper prefix of ``arch`` in ``nodes`` (the root at least)."""
    for k in range(len(arch) - 1, 0, -1):
        node = nodes.get(arch[:k])
        if node is not None:
            return node
    return nodes[()]


# -- evaluation ------------------------------------------------------------------------------


@dataclass
class EvalStats:
    """What evaluations cost: subnets scored, branch and side-input calls executed (and per
    branch, to price them with a latency table), features cached (in all, and the most held at
    once) and wall seconds."""

    subnets: int = 0
    batches: int = 0
    branch_calls: int = 0
    side_calls: int = 0
    cached_features: int = 0
    peak_cached: int = 0
    seconds: float = 0.0
    calls_by_branch: Counter[str] = field(default_factory=Counter)

    def __add__(self, other: EvalStats) -> EvalStats:
        return EvalStats(self.subnets + other.subnets, self.batches + other.batches,
                         self.branch_calls + other.branch_calls,
                         self.side_calls + other.side_calls,
                         self.cached_features + other.cached_features,
                         max(self.peak_cached, other.peak_cached),
                         self.seconds + other.seconds,
                         self.calls_by_branch + other.calls_by_branch)

    def predicted_seconds(self, table: BlockLatencyTable) -> float:
        """The compute executed, priced by ``table`` at its batch size (meaningful to compare
        two evaluations on the same batches, not as a time)."""
        return (self.side_calls * table.side_seconds
                + sum(n * table.branch_seconds[b] for b, n in self.calls_by_branch.items()))

    def to_dict(self) -> dict[str, Any]:
        return {"subnets": self.subnets, "batches": self.batches,
                "branch_calls": self.branch_calls, "side_calls": self.side_calls,
                "cached_features": self.cached_features, "peak_cached": self.peak_cached,
                "seconds": self.seconds}


@contextmanager
def _inference(module: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd for the duration; the caller's mode is restored."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


class _Scores:
    """Per-subnet sums of per-sample scores, added in batch order (so that reuse and
    recomputation add the same numbers in the same order and agree exactly)."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric
        self.total: dict[SubnetArch, float] = {}
        self.count: dict[SubnetArch, int] = {}

    def add(self, arch: SubnetArch, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        scores = self.metric(outputs, targets)
        if scores.dim() != 1 or scores.shape[0] != outputs.shape[0]:
            raise ConfigError(f"the metric must return one score per sample (shape "
                              f"[{outputs.shape[0]}]), not shape {list(scores.shape)}")
        self.total[arch] = self.total.get(arch, 0.0) + float(scores.double().sum())
        self.count[arch] = self.count.get(arch, 0) + int(scores.shape[0])

    def means(self, archs: Sequence[SubnetArch]) -> dict[SubnetArch, float]:
        return {a: self.total[a] / self.count[a] for a in archs}


class PrefixTreeEvaluator:
    """Accuracy of subnets of ``supernet`` on ``batches`` (the edge data, a list of
    ``(inputs, targets)``): the mean over all samples of ``metric(outputs, targets)``, one
    score per sample (e.g. ``top1`` against labels, ``cosine`` against the pretrained
    model's outputs).

    With ``reuse`` (section 5.2) each :meth:`evaluate` builds a :class:`PrefixTree` of the
    candidates (``max_depth``: the most features cached at once, None: no bound; ``table``
    prices prefixes for pruning, else a prefix costs its branch count) and walks it depth
    first once per batch (the side inputs computed once per batch too). Without, every
    subnet runs from scratch, batch after batch: the baseline. ``stats`` adds up every call's
    :class:`EvalStats`, ``last_stats`` and ``last_tree`` describe the last one.
    """

    def __init__(self, supernet: ElasticSupernet, batches: Sequence[Batch], metric: Metric, *,
                 max_depth: int | None = None, reuse: bool = True,
                 table: BlockLatencyTable | None = None,
                 progress: EvalProgress | None = None) -> None:
        if max_depth is not None and (isinstance(max_depth, bool)
                                      or not isinstance(max_depth, int) or max_depth < 0):
            raise ConfigError(f"{option('max_depth', max_depth)} must be a whole number >= 0 "
                              "(features cached at once; 0 caches none)")
        if not batches:
            raise ConfigError("PrefixTreeEvaluator needs at least one batch of edge data")
        if table is not None:
            table.check(supernet)
        self.supernet = supernet
        self.batches = list(batches)
        self.metric = metric
        self.max_depth = max_depth
        self.reuse = reuse
        self.table = table
        self.progress = progress
        self.stats = EvalStats()
        self.last_stats = EvalStats()
        self.last_tree: PrefixTree | None = None

    def evaluate(self, archs: Iterable[Sequence[str]], *, on_output: OutputHook | None = None
                 ) -> dict[SubnetArch, float]:
        """Accuracy of each distinct subnet of ``archs``. ``on_output(arch, batch_index,
        outputs)`` sees every subnet's outputs on every batch."""
        space = self.supernet.space
        unique = list(dict.fromkeys(space.check(a) for a in archs))
        stats = EvalStats(subnets=len(unique), batches=len(self.batches))
        scores = _Scores(self.metric)
        if unique:
            started = time.perf_counter()
            with _inference(self.supernet):
                if self.reuse:
                    self._with_tree(unique, stats, scores, on_output)
                else:
                    self._from_scratch(unique, stats, scores, on_output)
            stats.seconds = time.perf_counter() - started
        self.last_stats = stats
        self.stats = self.stats + stats
        return scores.means(unique)

    # -- the two schedules --------------------------------------------------------------------

    def _with_tree(self, archs: list[SubnetArch], stats: EvalStats, scores: _Scores,
                   on_output: OutputHook | None) -> None:
        tree = PrefixTree.build(archs, max_depth=self.max_depth, cost=self._cost)
        self.last_tree = tree
        for index, (inputs, targets) in enumerate(self.batches):  # each batch loaded once
            side = self._side(inputs, stats)
            walk = _Walk(self, side, targets, index, stats, scores, on_output)
            walk.visit(tree.root, inputs[0], 0)
            self._report((index + 1) * len(archs), len(archs) * len(self.batches))

    def _from_scratch(self, archs: list[SubnetArch], stats: EvalStats, scores: _Scores,
                      on_output: OutputHook | None) -> None:
        self.last_tree = None
        done = 0
        for arch in archs:
            for index, (inputs, targets) in enumerate(self.batches):
                out = self._run(inputs[0], self._side(inputs, stats), arch, stats)
                _score(arch, index, out, targets, scores, on_output)
                done += 1
                self._report(done, len(archs) * len(self.batches))

    # -- pieces -------------------------------------------------------------------------------

    def _cost(self, prefix: SubnetArch) -> float:
        return float(len(prefix)) if self.table is None else self.table.segment(prefix)

    def _side(self, inputs: tuple[torch.Tensor, ...], stats: EvalStats
              ) -> dict[str, torch.Tensor]:
        stats.side_calls += 1
        return self.supernet.side_tensors(*inputs)

    def _run(self, x: torch.Tensor, side: dict[str, torch.Tensor], path: SubnetArch,
             stats: EvalStats) -> torch.Tensor:
        """``supernet.run``, counted."""
        stats.branch_calls += len(path)
        stats.calls_by_branch.update(path)
        return self.supernet.run(x, side, path)

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)


def _score(arch: SubnetArch, index: int, outputs: torch.Tensor, targets: torch.Tensor,
           scores: _Scores, on_output: OutputHook | None) -> None:
    if on_output is not None:
        on_output(arch, index, outputs)
    scores.add(arch, outputs, targets)


@dataclass
class _Walk:
    """One batch's depth-first walk of a prefix tree (Algorithm 1 DFS-Evaluate)."""

    evaluator: PrefixTreeEvaluator
    side: dict[str, torch.Tensor]
    targets: torch.Tensor
    index: int
    stats: EvalStats
    scores: _Scores
    on_output: OutputHook | None

    def visit(self, node: _Node, feature: torch.Tensor, cached: int) -> None:
        """Finish the subnets at ``node`` from its ``feature`` (``cached`` features held
        now, this one included), then each subtree from its own feature."""
        for arch, rest in node.leaves:
            out = self.evaluator._run(feature, self.side, rest, self.stats)
            _score(arch, self.index, out, self.targets, self.scores, self.on_output)
        for child in node.children:
            shared = self.evaluator._run(feature, self.side, child.segment, self.stats)
            self.stats.cached_features += 1
            self.stats.peak_cached = max(self.stats.peak_cached, cached + 1)
            self.visit(child, shared, cached + 1)
            del shared  # released: no later subnet shares this prefix


def measure_reuse(supernet: ElasticSupernet, batches: Sequence[Batch], metric: Metric,
                  archs: Sequence[Sequence[str]], *, max_depth: int | None = None,
                  table: BlockLatencyTable | None = None, repeats: int = 5) -> dict[str, Any]:
    """The evaluation time reuse saves on ``archs`` (the paper's Fig. 11): the baseline (every
    subnet from scratch) and the prefix tree on the same data, ``repeats`` times each with
    fresh caches, the order alternated (baseline first in even runs, the tree first in odd
    ones) so that neither always runs on a warmer machine. Returns the last runs'
    :class:`EvalStats` (calls are the same every run), ``saving_pct`` from the median wall
    times, every run's seconds, ``call_saving_pct`` (branch calls), ``predicted_saving_pct``
    (compute priced by ``table``, when given) and ``identical`` (whether every accuracy of
    every run agrees exactly)."""
    if repeats < 1:
        raise ConfigError(f"{option('repeats', repeats)} must be at least 1")
    seconds: dict[str, list[float]] = {"baseline": [], "reuse": []}
    scores: list[dict[SubnetArch, float]] = []
    stats: dict[str, EvalStats] = {}
    for run in range(repeats):
        order = ("baseline", "reuse") if run % 2 == 0 else ("reuse", "baseline")
        for kind in order:
            evaluator = PrefixTreeEvaluator(supernet, batches, metric, reuse=kind == "reuse",
                                            max_depth=max_depth if kind == "reuse" else None,
                                            table=table)
            scores.append(evaluator.evaluate(archs))
            stats[kind] = evaluator.last_stats
            seconds[kind].append(evaluator.last_stats.seconds)
    b, t = stats["baseline"], stats["reuse"]
    median = {kind: statistics.median(runs) for kind, runs in seconds.items()}
    result = {"subnets": b.subnets, "baseline": b.to_dict(), "reuse": t.to_dict(),
              "repeats": repeats, "seconds": seconds, "median_seconds": median,
              "saving_pct": _saving(median["baseline"], median["reuse"]),
              "call_saving_pct": _saving(b.branch_calls, t.branch_calls),
              "identical": all(s == scores[0] for s in scores)}
    if table is not None:
        result["predicted_saving_pct"] = _saving(b.predicted_seconds(table),
                                                 t.predicted_seconds(table))
    return result


def _saving(before: float, after: float) -> float:
    return 100.0 * (before - after) / before if before > 0 else 0.0
