"""On-device subnet search of AdaptiveNet (sections 5.1 and 5.2, Algorithm 1).

Three parts:

- **model-guided breeding** (:class:`NearbyBreeder`): the optimal subnets lie near the latency
  budget, so NearbyInit draws random subnets whose predicted latency (a
  :class:`~.latency.BlockLatencyTable`) lies in ``[budget - delta, budget + delta]``, and
  NearbyMutate replaces one branch and, if that leaves the band, picks among the alternative
  branches the one that brings the latency closest back. Pure graph operations: no subnet is
  run to breed one.
- **reuse-based evaluation** (:class:`PrefixTreeEvaluator`): candidates of one generation share
  prefixes (the same first branches). A prefix tree of the generation is walked depth first for
  each batch of the edge data (the batch is loaded once for all candidates); the feature of a
  shared prefix is computed once, cached while its subtree is evaluated and released after, so
  at most ``max_depth`` features are held at once (Algorithm 1 BuildTree drops the least
  important prefixes, latency x candidates sharing it, to keep that bound). Outputs are the
  same tensors as a recomputation from scratch (same branch calls on the same inputs).
- **the search** (:class:`AdaptiveSearch`): NearbyInit, then per iteration NearbyMutate and
  crossover of the best candidates, each generation evaluated as a whole with the tree. Two
  baselines with the same history format and the same evaluator (the paper's Fig. 12):
  :class:`EvolutionBaseline` (uniform breeding; subnets over budget are discarded after
  prediction, never evaluated) and :class:`AnnealingSearch` (one chain, one-branch moves).

All three follow the scikit-learn contract: parameters in ``__init__``, ``fit(evaluator,
table)`` returns ``self``, learned state with a trailing underscore (``best_``, ``history_``,
``curve_``, ``pareto_``...). :class:`~edgesplit.nas.evolution.EvolutionSearch` is not reused
for the loop: it scores one architecture per evaluator call, and the prefix tree needs the
whole generation at once; its :class:`~edgesplit.nas.evolution.Candidate` records and
:func:`~edgesplit.nas.evolution.pareto_front` are.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Self

import numpy as np
import torch
from torch import nn

from edgesplit.errors import ConfigError, InfeasibleError, option
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable
from edgesplit.nas.adaptivenet.space import ElasticSpace, SubnetArch
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet
from edgesplit.nas.evolution import Candidate, pareto_front

__all__ = [
    "AdaptiveSearch",
    "AnnealingSearch",
    "Batch",
    "EvalStats",
    "EvolutionBaseline",
    "Metric",
    "NearbyBreeder",
    "PrefixTree",
    "PrefixTreeEvaluator",
    "SearchStep",
    "UniformBreeder",
    "measure_reuse",
]

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]  # (inputs, targets)
Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # per-sample scores
EvalProgress = Callable[[int, int], None]  # (subnet-batches done, total)
SearchProgress = Callable[[int, int, "Candidate | None"], None]  # (iteration, of, best)
OutputHook = Callable[[SubnetArch, int, torch.Tensor], None]  # (subnet, batch index, output)

_MAX_SUBPATHS = 256  # alternatives enumerated per span: spans are a few blocks wide


# -- paths -----------------------------------------------------------------------------------


def _boundaries(space: ElasticSpace, arch: Sequence[str]) -> list[int]:
    """The block positions where ``arch``'s branches start, and n."""
    return [0, *(space.by_name[name].end for name in arch)]


def _subpaths(space: ElasticSpace, start: int, end: int) -> list[SubnetArch]:
    """Every path of branches from block ``start`` to ``end`` (at most ``_MAX_SUBPATHS``)."""
    found: list[SubnetArch] = []

    def walk(position: int, path: tuple[str, ...]) -> None:
        if len(found) >= _MAX_SUBPATHS:
            return
        if position == end:
            found.append(path)
            return
        for branch in space.starting_at[position]:
            if branch.end <= end:
                walk(branch.end, (*path, branch.name))

    walk(start, ())
    return found


def _random_subpath(space: ElasticSpace, start: int, end: int, rng: np.random.Generator
                    ) -> SubnetArch:
    """A random path from ``start`` to ``end`` (always exists: every block has its original)."""
    path: list[str] = []
    while start < end:
        options = [b for b in space.starting_at[start] if b.end <= end]
        branch = options[int(rng.integers(len(options)))]
        path.append(branch.name)
        start = branch.end
    return tuple(path)


@dataclass(frozen=True)
class _Mutation:
    """``arch`` with ``before[first:last]`` replaced; the replaced span's block positions."""

    arch: SubnetArch
    first: int
    last: int
    start: int
    end: int


def _replace_one(space: ElasticSpace, arch: SubnetArch, rng: np.random.Generator
                 ) -> _Mutation | None:
    """Replace one random branch of ``arch`` by another starting at the same block; a branch
    ending elsewhere is joined to the rest of ``arch`` by a random path to its next boundary.
    None when no branch of ``arch`` has an alternative."""
    movable = [k for k, name in enumerate(arch)
               if len(space.starting_at[space.by_name[name].start]) > 1]
    if not movable:
        return None
    k = movable[int(rng.integers(len(movable)))]
    start = space.by_name[arch[k]].start
    options = [b for b in space.starting_at[start] if b.name != arch[k]]
    new = options[int(rng.integers(len(options)))]
    bounds = _boundaries(space, arch)
    last = next(j for j in range(k + 1, len(bounds)) if bounds[j] >= new.end)
    joint = _random_subpath(space, new.end, bounds[last], rng)
    return _Mutation((*arch[:k], new.name, *joint, *arch[last:]), k, last, start, bounds[last])


def _alternatives(space: ElasticSpace, arch: SubnetArch, spans: Iterable[tuple[int, int]]
                  ) -> Iterator[SubnetArch]:
    """``arch`` with the branches ``arch[i:j]`` replaced by each other path over their blocks."""
    bounds = _boundaries(space, arch)
    for i, j in spans:
        for sub in _subpaths(space, bounds[i], bounds[j]):
            if sub != arch[i:j]:
                yield (*arch[:i], *sub, *arch[j:])


def _splices(space: ElasticSpace, first: SubnetArch, second: SubnetArch) -> list[SubnetArch]:
    """Both parents cut at each block position where both have a boundary, and joined the
    other way round (new paths only)."""
    at_first = {p: i for i, p in enumerate(_boundaries(space, first))}
    at_second = {p: i for i, p in enumerate(_boundaries(space, second))}
    children: dict[SubnetArch, None] = {}
    for p in sorted(set(at_first) & set(at_second) - {0, space.num_blocks}):
        i, j = at_first[p], at_second[p]
        children[(*first[:i], *second[j:])] = None
        children[(*second[:j], *first[i:])] = None
    return [c for c in children if c not in (first, second)]


def _mutation_count(length: int, rng: np.random.Generator, prob: float) -> int:
    """How many branches one mutation replaces: each with ``prob``, at least one."""
    return max(1, int(rng.binomial(length, prob))) if prob > 0 else 1


# -- breeders --------------------------------------------------------------------------------


class UniformBreeder:
    """Plain breeding over an :class:`ElasticSpace` (the evolution baseline): uniform random
    subnets, mutation replacing one random branch, crossover splicing two paths at a common
    block position. Implements :class:`~edgesplit.nas.evolution.Breeder`."""

    def __init__(self, space: ElasticSpace) -> None:
        self.space = space
        self.name = f"adaptivenet[{space.num_blocks} blocks, {len(space.branches)} branches]"

    def random_arch(self, rng: np.random.Generator) -> SubnetArch:
        return self.space.random_arch(rng)

    def mutate_arch(self, arch: Any, rng: np.random.Generator, prob: float = 0.0
                    ) -> SubnetArch:
        """``arch`` with one branch (each with ``prob``, at least one) replaced."""
        arch = tuple(arch)
        for _ in range(_mutation_count(len(arch), rng, prob)):
            arch = self._mutate_once(arch, rng)
        return arch

    def _mutate_once(self, arch: SubnetArch, rng: np.random.Generator) -> SubnetArch:
        mutation = _replace_one(self.space, arch, rng)
        return arch if mutation is None else mutation.arch

    def crossover_arch(self, first: Any, second: Any, rng: np.random.Generator
                       ) -> SubnetArch:
        """A random splice of the parents (``first`` when they share no inner boundary)."""
        children = _splices(self.space, tuple(first), tuple(second))
        return children[int(rng.integers(len(children)))] if children else tuple(first)


class NearbyBreeder(UniformBreeder):
    """NearbyInit and NearbyMutate (section 5.1): breeding that stays in the latency band
    ``[budget - delta, budget + delta]`` (seconds, predicted by ``table``).

    ``random_arch`` walks from block 0, choosing at each block uniformly among the branches
    after which the band is still reachable (by the table's least and most latency of the
    rest), and rejects a walk that misses the band; after ``max_attempts`` walks it returns
    the closest one. ``mutate_arch`` replaces a branch; if that leaves the band it takes, among
    the other paths over the replaced span and the repairs of the mutated subnet over another
    span (at most as wide as the widest branch), one that brings the latency closest back
    (randomly among equals); when none of those is in the band, any one-span change of the
    parent is a candidate too. Crossover prefers splices inside the band.
    """

    def __init__(self, space: ElasticSpace, table: BlockLatencyTable, budget: float,
                 delta: float, *, max_attempts: int = 100) -> None:
        super().__init__(space)
        table.check(space)
        if not _positive(budget) or not _positive(delta, allow_zero=True):
            raise ConfigError(f"NearbyBreeder needs {option('budget', budget)} > 0 and "
                              f"{option('delta', delta)} >= 0 (seconds)")
        self.table = table
        self.budget = float(budget)
        self.delta = float(delta)
        self.max_attempts = max_attempts
        # the widest span a repair replaces: the widest branch (a merged block)
        self._width = max(b.end - b.start for b in space.branches)

    @property
    def band(self) -> tuple[float, float]:
        return self.budget - self.delta, self.budget + self.delta

    def latency(self, arch: Sequence[str]) -> float:
        """Predicted seconds (no path check: breeding makes only paths)."""
        return self.table.side_seconds + self.table.segment(arch)

    def distance(self, arch: Sequence[str]) -> float:
        """Seconds outside the band (0 inside)."""
        low, high = self.band
        seconds = self.latency(arch)
        return max(low - seconds, 0.0, seconds - high)

    def in_band(self, arch: Sequence[str]) -> bool:
        return self.distance(arch) == 0.0

    # -- NearbyInit ---------------------------------------------------------------------------

    def random_arch(self, rng: np.random.Generator) -> SubnetArch:
        closest: SubnetArch | None = None
        for _ in range(self.max_attempts):
            arch = self._walk(rng)
            if self.in_band(arch):
                return arch
            if closest is None or self.distance(arch) < self.distance(closest):
                closest = arch
        assert closest is not None  # max_attempts >= 1
        return closest

    def _walk(self, rng: np.random.Generator) -> SubnetArch:
        low, high = self.band
        seconds, position, path = self.table.side_seconds, 0, []
        while position < self.space.num_blocks:
            options = self.space.starting_at[position]
            # a branch after which the band is out of reach only when none keeps it reachable
            choices = [b for b in options if self._can_reach(seconds, b.name, b.end, low, high)]
            choices = choices or list(options)
            branch = choices[int(rng.integers(len(choices)))]
            path.append(branch.name)
            seconds += self.table.branch_seconds[branch.name]
            position = branch.end
        return tuple(path)

    def _can_reach(self, seconds: float, name: str, end: int, low: float, high: float
                   ) -> bool:
        least, most = self.table.suffix_bounds(end)
        after = seconds + self.table.branch_seconds[name]
        return after + least <= high and after + most >= low

    # -- NearbyMutate -------------------------------------------------------------------------

    def _mutate_once(self, arch: SubnetArch, rng: np.random.Generator) -> SubnetArch:
        mutation = _replace_one(self.space, arch, rng)
        if mutation is None or self.in_band(mutation.arch):
            return arch if mutation is None else mutation.arch
        # first the other choices over the replaced span, and repairs elsewhere that keep
        # the replacement; only if none lands in the band, any one-span change of the parent
        options = [*_alternatives(self.space, arch, [(mutation.first, mutation.last)]),
                   *_alternatives(self.space, mutation.arch,
                                  self._spans(mutation.arch, (mutation.start, mutation.end)))]
        options = [o for o in options if o != arch]
        if not any(self.in_band(o) for o in options):
            options += [o for o in _alternatives(self.space, arch, self._spans(arch))
                        if o not in options]
        return self._closest(options, rng) if options else mutation.arch

    def _spans(self, arch: SubnetArch, keep: tuple[int, int] | None = None
               ) -> list[tuple[int, int]]:
        """Index spans ``(i, j)`` of ``arch`` over at most the widest branch's blocks, apart
        from the blocks ``keep`` (start, end)."""
        bounds = _boundaries(self.space, arch)
        spans = []
        for i in range(len(bounds) - 1):
            for j in range(i + 1, len(bounds)):
                if bounds[j] - bounds[i] > self._width:
                    break
                if keep is None or bounds[j] <= keep[0] or bounds[i] >= keep[1]:
                    spans.append((i, j))
        return spans

    def _closest(self, options: Sequence[SubnetArch], rng: np.random.Generator) -> SubnetArch:
        distances = [self.distance(o) for o in options]
        best = min(distances)
        ties = [o for o, d in zip(options, distances, strict=True) if d == best]
        return ties[int(rng.integers(len(ties)))]

    # -- crossover ----------------------------------------------------------------------------

    def crossover_arch(self, first: Any, second: Any, rng: np.random.Generator
                       ) -> SubnetArch:
        children = _splices(self.space, tuple(first), tuple(second))
        inside = [c for c in children if self.in_band(c)]
        pool = inside or children
        return pool[int(rng.integers(len(pool)))] if pool else tuple(first)


def _positive(value: object, *, allow_zero: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (value >= 0 if allow_zero else value > 0)


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
                  table: BlockLatencyTable | None = None) -> dict[str, Any]:
    """The evaluation time reuse saves on ``archs`` (the paper's Fig. 11): the baseline (every
    subnet from scratch) and the prefix tree, one after the other on the same data. Returns
    both :class:`EvalStats`, ``saving_pct`` (wall time), ``call_saving_pct`` (branch calls),
    ``predicted_saving_pct`` (compute priced by ``table``, when given) and ``identical``
    (whether every accuracy agrees exactly)."""
    base = PrefixTreeEvaluator(supernet, batches, metric, reuse=False, table=table)
    tree = PrefixTreeEvaluator(supernet, batches, metric, max_depth=max_depth, table=table)
    first = base.evaluate(archs)
    second = tree.evaluate(archs)
    b, t = base.last_stats, tree.last_stats
    result = {"subnets": b.subnets, "baseline": b.to_dict(), "reuse": t.to_dict(),
              "saving_pct": _saving(b.seconds, t.seconds),
              "call_saving_pct": _saving(b.branch_calls, t.branch_calls),
              "identical": first == second}
    if table is not None:
        result["predicted_saving_pct"] = _saving(b.predicted_seconds(table),
                                                 t.predicted_seconds(table))
    return result


def _saving(before: float, after: float) -> float:
    return 100.0 * (before - after) / before if before > 0 else 0.0


# -- the searches ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchStep:
    """The state after one iteration: subnets evaluated so far, the best accuracy within the
    budget (None before any) and its latency, and the evaluation seconds spent so far."""

    iteration: int
    evaluated: int
    best_accuracy: float | None
    best_latency: float | None
    seconds: float


class _SubnetSearch:
    """What the three searches share: checks, the history of evaluations (each subnet is
    evaluated once; asking again returns its record), the best subnet within the budget, the
    per-iteration curve and the progress callback."""

    def __init__(self, budget: float, *, seed: int | None = 0, max_attempts: int = 100,
                 progress: SearchProgress | None = None) -> None:
        self.budget = budget
        self.seed = seed
        self.max_attempts = max_attempts
        self.progress = progress

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [("budget", _positive(self.budget), "a number of seconds > 0"),
                ("max_attempts", _count(self.max_attempts, 1), "an integer >= 1")]

    def _start(self, evaluator: PrefixTreeEvaluator, table: BlockLatencyTable) -> ElasticSpace:
        for name, ok, allowed in self._checks():
            if not ok:
                raise ConfigError(f"{type(self).__name__} {option(name, getattr(self, name))} "
                                  f"must be {allowed}")
        table.check(evaluator.supernet)
        fastest, seconds = table.fastest()
        if seconds > self.budget:
            error = InfeasibleError(
                f"no subnet of {table.model or 'the supernet'} fits the latency budget "
                f"{self.budget * 1e3:.4g} ms: the fastest, {'-'.join(fastest)}, takes "
                f"{seconds * 1e3:.4g} ms (predicted); raise {option('budget')} to at least "
                f"{seconds:.4g} s")
            error.fastest = (fastest, seconds)  # type: ignore[attr-defined]
            raise error
        self._evaluator, self._table, self._fastest = evaluator, table, fastest
        self._records: dict[SubnetArch, Candidate] = {}
        self._seconds = 0.0
        self.history_: list[Candidate] = []
        self.curve_: list[SearchStep] = []
        self.rejected_ = 0
        self.best_: Candidate | None = None
        return evaluator.supernet.space

    def _latency(self, arch: SubnetArch) -> float:
        return self._table.predict(arch)

    def _feasible(self, candidate: Candidate) -> bool:
        return candidate.metrics["latency"] <= self.budget

    def _evaluate(self, archs: Sequence[SubnetArch], iteration: int) -> list[Candidate]:
        """Records of ``archs``, evaluating (as one generation) those never evaluated."""
        new = [a for a in dict.fromkeys(archs) if a not in self._records]
        if new:
            accuracy = self._evaluator.evaluate(new)
            self._seconds += self._evaluator.last_stats.seconds
            for arch in new:
                record = Candidate(iteration, arch, accuracy[arch],
                                   {"accuracy": accuracy[arch], "latency": self._latency(arch)})
                self._records[arch] = record
                self.history_.append(record)
                if self._feasible(record) and (self.best_ is None or _better(record,
                                                                             self.best_)):
                    self.best_ = record
        return [self._records[a] for a in archs]

    def _record(self, iteration: int, of: int) -> None:
        best = self.best_
        self.curve_.append(SearchStep(iteration, len(self.history_),
                                      None if best is None else best.score,
                                      None if best is None else best.metrics["latency"],
                                      self._seconds))
        if self.progress is not None:
            self.progress(iteration, of, best)

    def _finish(self) -> None:
        if self.best_ is None:  # _start checked the fastest fits; the searches seed it then
            raise InfeasibleError(f"the search evaluated no subnet within the budget "
                                  f"{self.budget:.4g} s")
        self.best_arch_ = self.best_.arch
        self.best_accuracy_ = self.best_.score
        self.best_latency_ = self.best_.metrics["latency"]
        self.pareto_ = pareto_front(self.history_, "accuracy", "latency")

    def evaluated(self) -> list[tuple[SubnetArch, float, float]]:
        """Every evaluated subnet as ``(arch, latency_s, accuracy)``, in order: what
        :meth:`SubnetPool.build <edgesplit.nas.adaptivenet.pool.SubnetPool.build>` takes."""
        return [(c.arch, c.metrics["latency"], c.score) for c in self.history_]

    def evaluations_to(self, accuracy: float) -> int | None:
        """How many subnets were evaluated when one within the budget first reached
        ``accuracy`` (None: never)."""
        for count, record in enumerate(self.history_, start=1):
            if self._feasible(record) and record.score >= accuracy:
                return count
        return None


def _better(a: Candidate, b: Candidate) -> bool:
    """More accurate, or as accurate and faster."""
    return (a.score, -a.metrics["latency"]) > (b.score, -b.metrics["latency"])


def _count(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _fraction(value: object) -> bool:
    return _positive(value, allow_zero=True) and isinstance(value, int | float) and value <= 1


class _Evolution(_SubnetSearch):
    """The evolutionary loop: an initial generation, then per iteration a new generation of
    ``population`` children (a ``crossover_fraction`` of them crossovers of two of the best
    ``parents_fraction``, the rest mutants), evaluated as a whole; the next population is the
    best ``population`` of parents and children (within the budget first)."""

    def __init__(self, budget: float, *, population: int = 20, iterations: int = 10,
                 parents_fraction: float = 0.5, crossover_fraction: float = 0.5,
                 mutation_prob: float = 0.0, seed: int | None = 0, max_attempts: int = 100,
                 progress: SearchProgress | None = None) -> None:
        super().__init__(budget, seed=seed, max_attempts=max_attempts, progress=progress)
        self.population = population
        self.iterations = iterations
        self.parents_fraction = parents_fraction
        self.crossover_fraction = crossover_fraction
        self.mutation_prob = mutation_prob

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [*super()._checks(),
                ("population", _count(self.population, 1), "an integer >= 1"),
                ("iterations", _count(self.iterations, 0), "an integer >= 0"),
                ("parents_fraction", _fraction(self.parents_fraction)
                 and self.parents_fraction > 0, "above 0 and at most 1"),
                ("crossover_fraction", _fraction(self.crossover_fraction), "between 0 and 1"),
                ("mutation_prob", _fraction(self.mutation_prob), "between 0 and 1")]

    def _breeder(self, space: ElasticSpace, table: BlockLatencyTable) -> UniformBreeder:
        raise NotImplementedError

    def _admit(self, arch: SubnetArch) -> bool:
        """Whether a bred subnet is evaluated (else it is discarded after prediction)."""
        raise NotImplementedError

    def fit(self, evaluator: PrefixTreeEvaluator, table: BlockLatencyTable) -> Self:
        """Run the search; returns ``self`` with the learned state set."""
        space = self._start(evaluator, table)
        breeder = self._breeder(space, table)
        rng = np.random.default_rng(self.seed)
        seen: set[Hashable] = set()
        first = self._draw(self.population, lambda: breeder.random_arch(rng), seen)
        if not any(self._latency(a) <= self.budget for a in first) \
                and self._fastest not in seen:
            first.append(self._fastest)  # so that the search has a subnet within the budget
        population = self._rank(self._evaluate(first, 0))
        self._record(0, self.iterations)
        for iteration in range(1, self.iterations + 1):
            parents = [c.arch for c in population[:self._parents(len(population))]]
            children = self._breed(breeder, parents, rng, seen)
            population = self._rank(population + self._evaluate(children, iteration))
            population = population[:self.population]
            self._record(iteration, self.iterations)
        self.population_ = population
        self._finish()
        return self

    def _parents(self, size: int) -> int:
        return min(size, max(1, round(self.parents_fraction * self.population)))

    def _rank(self, candidates: list[Candidate]) -> list[Candidate]:
        return sorted(candidates, reverse=True,  # stable: ties keep their order
                      key=lambda c: (self._feasible(c), c.score, -c.metrics["latency"]))

    def _draw(self, count: int, propose: Callable[[], SubnetArch], seen: set[Hashable]
              ) -> list[SubnetArch]:
        """Up to ``count`` new admitted subnets in at most ``count * max_attempts``
        proposals, stopping early after ``max_attempts`` in a row that were all seen before
        (a small space or a narrow band is exhausted: drawing on would only spin)."""
        found: list[SubnetArch] = []
        stale = 0
        for _ in range(count * self.max_attempts):
            if len(found) == count or stale == self.max_attempts:
                break
            arch = propose()
            if arch in seen:
                stale += 1
                continue
            stale = 0
            seen.add(arch)
            if self._admit(arch):
                found.append(arch)
            else:
                self.rejected_ += 1
        return found

    def _breed(self, breeder: UniformBreeder, parents: list[SubnetArch],
               rng: np.random.Generator, seen: set[Hashable]) -> list[SubnetArch]:
        crossovers = 0 if len(parents) < 2 else round(self.crossover_fraction * self.population)

        def mutant() -> SubnetArch:
            return breeder.mutate_arch(parents[int(rng.integers(len(parents)))], rng,
                                       self.mutation_prob)

        def child() -> SubnetArch:
            i, j = rng.choice(len(parents), size=2, replace=False)
            return breeder.crossover_arch(parents[int(i)], parents[int(j)], rng)

        children = self._draw(self.population - crossovers, mutant, seen)
        children += self._draw(crossovers, child, seen)
        # converged parents cross into little that is new: mutate for the rest
        return children + self._draw(self.population - len(children), mutant, seen)


class AdaptiveSearch(_Evolution):
    """AdaptiveNet's search (Algorithm 1): NearbyInit, then per iteration NearbyMutate and
    crossover of the best candidates, every generation evaluated at once by the
    :class:`PrefixTreeEvaluator`; the best subnet within ``budget`` (seconds) wins.

    ``delta`` (seconds; None: 10 % of the budget) sets the band ``[budget - delta, budget +
    delta]`` candidates are bred in. Subnets above the budget but in the band are evaluated
    too: they make the pool of subnets to switch to when the device slows down (section 5.3;
    ``pareto_`` holds the best accuracy at each latency). ``mutation_prob``: the chance of
    each further branch being replaced in a mutant (one always is).

    Learned: ``best_`` (a :class:`~edgesplit.nas.evolution.Candidate` with metrics
    ``accuracy`` and ``latency``), ``best_arch_``, ``best_accuracy_``, ``best_latency_``,
    ``history_`` (every evaluated subnet, in order), ``curve_`` (a :class:`SearchStep` per
    iteration), ``population_``, ``pareto_``, ``rejected_`` (bred subnets discarded unseen),
    ``delta_`` (the band's half-width used), ``breeder_``. :meth:`evaluations_to` reads how
    many evaluations reaching an accuracy took; :meth:`evaluated` gives the history as the
    subnet pool (section 5.3) takes it.
    Raises InfeasibleError naming the fastest subnet when even that exceeds the budget.
    """

    def __init__(self, budget: float, *, delta: float | None = None, population: int = 20,
                 iterations: int = 10, parents_fraction: float = 0.5,
                 crossover_fraction: float = 0.5, mutation_prob: float = 0.0,
                 seed: int | None = 0, max_attempts: int = 100,
                 progress: SearchProgress | None = None) -> None:
        super().__init__(budget, population=population, iterations=iterations,
                         parents_fraction=parents_fraction,
                         crossover_fraction=crossover_fraction, mutation_prob=mutation_prob,
                         seed=seed, max_attempts=max_attempts, progress=progress)
        self.delta = delta

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [*super()._checks(),
                ("delta", self.delta is None or _positive(self.delta, allow_zero=True),
                 "None or a number of seconds >= 0")]

    def _breeder(self, space: ElasticSpace, table: BlockLatencyTable) -> NearbyBreeder:
        self.delta_ = 0.1 * self.budget if self.delta is None else float(self.delta)
        self.breeder_ = NearbyBreeder(space, table, self.budget, self.delta_,
                                      max_attempts=self.max_attempts)
        return self.breeder_

    def _admit(self, arch: SubnetArch) -> bool:
        # the band's top: in-band subnets over the budget are kept for the pool
        return self._latency(arch) <= self.breeder_.band[1]


class EvolutionBaseline(_Evolution):
    """Plain evolutionary search (the paper's baseline [41]): uniform random initial subnets,
    uniform one-branch mutations and splices; a subnet predicted over the budget is discarded
    before evaluation. Same parameters (but no band), learned state and evaluator as
    :class:`AdaptiveSearch`, so their curves compare."""

    def _breeder(self, space: ElasticSpace, table: BlockLatencyTable) -> UniformBreeder:
        return UniformBreeder(space)

    def _admit(self, arch: SubnetArch) -> bool:
        return self._latency(arch) <= self.budget



class AnnealingSearch(_SubnetSearch):
    """Simulated annealing (the paper's baseline [34]): one chain from a random subnet within
    the budget; each step proposes a neighbour (one branch replaced, uniformly; over-budget
    neighbours are discarded before evaluation, up to ``max_attempts`` per step) and moves to
    it if it is more accurate, or with probability ``exp(gain / T)``; ``T`` cools
    geometrically from ``t_start`` to ``t_end`` (accuracy units, 0..1) over ``steps``. A
    subnet seen before is not evaluated again. Learned state as :class:`AdaptiveSearch`
    (one :class:`SearchStep` per step), plus ``current_`` (where the chain ended)."""

    def __init__(self, budget: float, *, steps: int = 100, t_start: float = 0.05,
                 t_end: float = 0.001, seed: int | None = 0, max_attempts: int = 100,
                 progress: SearchProgress | None = None) -> None:
        super().__init__(budget, seed=seed, max_attempts=max_attempts, progress=progress)
        self.steps = steps
        self.t_start = t_start
        self.t_end = t_end

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [*super()._checks(),
                ("steps", _count(self.steps, 0), "an integer >= 0"),
                ("t_start", _positive(self.t_start), "a number > 0"),
                ("t_end", _positive(self.t_end) and self.t_end <= self.t_start,
                 "a number > 0 and at most t_start")]

    def fit(self, evaluator: PrefixTreeEvaluator, table: BlockLatencyTable) -> Self:
        """Run the chain; returns ``self`` with the learned state set."""
        space = self._start(evaluator, table)
        breeder = UniformBreeder(space)
        rng = np.random.default_rng(self.seed)
        start = self._propose(lambda: breeder.random_arch(rng)) or self._fastest
        current = self._evaluate([start], 0)[0]
        self._record(0, self.steps)
        for step in range(1, self.steps + 1):
            neighbour = self._propose(partial(breeder.mutate_arch, current.arch, rng))
            if neighbour is not None:
                proposal = self._evaluate([neighbour], step)[0]
                if self._accept(proposal.score - current.score, self._temperature(step), rng):
                    current = proposal
            self._record(step, self.steps)
        self.current_ = current
        self._finish()
        return self

    def _propose(self, draw: Callable[[], SubnetArch]) -> SubnetArch | None:
        """A drawn subnet within the budget, or None after ``max_attempts`` draws."""
        for _ in range(self.max_attempts):
            arch = draw()
            if self._latency(arch) <= self.budget:
                return arch
            self.rejected_ += 1
        return None

    def _temperature(self, step: int) -> float:
        return float(self.t_start * (self.t_end / self.t_start) ** (step / max(self.steps, 1)))

    @staticmethod
    def _accept(gain: float, temperature: float, rng: np.random.Generator) -> bool:
        return gain >= 0 or bool(rng.random() < math.exp(gain / temperature))
