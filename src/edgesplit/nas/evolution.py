"""Evolutionary architecture search (regularised to the Once-for-All recipe) with the
scikit-learn estimator contract: parameters in ``__init__``, ``fit(space, evaluator)``, learned
state with a trailing underscore.

Each generation keeps the best ``parents_fraction`` of the population and fills the rest with
children: ``mutation_fraction`` of them mutants of a random parent, the others uniform
crossovers of two. Children are new architectures only (never evaluated before) that pass the
``constraint``, so every evaluator call explores, and an expensive evaluator (a fine-tune, a
latency measurement) is never asked twice about one architecture.

Termination is bounded: each architecture the search wants gets at most ``max_attempts``
draws. When the constraint rejects every draw of the initial population, ``fit`` raises
:class:`~edgesplit.errors.InfeasibleError` naming the closest candidate (the least violation,
when the constraint says by how much); when only some are feasible (or a small space runs out
of new architectures), the search goes on with the smaller population it could fill. (The
once-for-all evolution finder loops forever in that case.)

The space is anything that breeds architectures: a :class:`~edgesplit.nas.space.SearchSpace`
(op per layer), or an object with ``name``, ``random_arch(rng)``, ``mutate_arch(arch, rng,
prob)`` and ``crossover_arch(a, b, rng)`` (:class:`Breeder`; SplitNets' spaces have one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgesplit.errors import ConfigError, InfeasibleError, option
from edgesplit.nas.sampler import crossover, mutate, random_arch
from edgesplit.nas.space import Arch, SearchSpace

__all__ = ["Breeder", "Candidate", "Constraint", "Evaluation", "Evaluator", "EvolutionSearch",
           "Progress", "pareto_front"]


@dataclass(frozen=True)
class Evaluation:
    """What an evaluator may return instead of a bare score: the score (higher is better) and
    metrics to keep alongside it in the history (accuracy, latency, size...)."""

    score: float
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """One evaluated architecture: the generation that proposed it, its score and metrics."""

    generation: int
    arch: Any  # an Arch, or whatever the breeder breeds
    score: float
    metrics: Mapping[str, float] = field(default_factory=dict)


Evaluator = Callable[[Any], "float | Evaluation"]
# True / False, or how far the architecture is over the limit (0 or less: feasible)
Constraint = Callable[[Any], "bool | float"]
Progress = Callable[[int, Candidate], None]  # (generation, best candidate so far)


@runtime_checkable
class Breeder(Protocol):
    """Random, mutated and crossed architectures of some space (hashable architectures)."""

    name: str

    def random_arch(self, rng: np.random.Generator) -> Hashable: ...

    def mutate_arch(self, arch: Any, rng: np.random.Generator, prob: float) -> Hashable: ...

    def crossover_arch(self, first: Any, second: Any, rng: np.random.Generator
                       ) -> Hashable: ...


class _SpaceBreeder:
    """A SearchSpace bred by :mod:`edgesplit.nas.sampler`."""

    def __init__(self, space: SearchSpace) -> None:
        self.space, self.name = space, space.name

    def random_arch(self, rng: np.random.Generator) -> Arch:
        return random_arch(self.space, rng)

    def mutate_arch(self, arch: Arch, rng: np.random.Generator, prob: float) -> Arch:
        return mutate(self.space, arch, rng, prob)

    def crossover_arch(self, first: Arch, second: Arch, rng: np.random.Generator) -> Arch:
        return crossover(self.space, first, second, rng)


def _breeder(space: SearchSpace | Breeder) -> Breeder:
    return _SpaceBreeder(space) if isinstance(space, SearchSpace) else space


def pareto_front(candidates: Sequence[Candidate], maximize: str, minimize: str
                 ) -> list[Candidate]:
    """The candidates no other beats on both metrics (higher ``maximize``, lower
    ``minimize``), by increasing ``minimize``; candidates without both metrics are ignored."""
    rows = sorted((c for c in candidates if maximize in c.metrics and minimize in c.metrics),
                  key=lambda c: (c.metrics[minimize], -c.metrics[maximize]))
    front: list[Candidate] = []
    for c in rows:
        if not front or c.metrics[maximize] > front[-1].metrics[maximize]:
            front.append(c)
    return front


class EvolutionSearch:
    """Search ``space`` for the architecture the evaluator scores highest.

    Parameters are stored as given and checked by :meth:`fit`. ``constraint(arch) -> bool``
    filters architectures before they are evaluated (e.g. a latency budget); ``progress`` is
    called after each generation with the generation number and the best candidate so far
    (wrap a tqdm bar in it). ``seed`` makes the whole search reproducible.

    Learned state: ``best_arch_``, ``best_score_``, ``best_metrics_``, ``history_`` (every
    evaluation, in order, each with its generation), ``population_`` (the last generation's
    population, best first), ``rejected_`` (architectures the constraint turned down) and
    ``closest_`` (the rejected one with the least violation and its violation, or None).
    """

    def __init__(self, *, population: int = 50, generations: int = 20,
                 mutation_prob: float = 0.1, parents_fraction: float = 0.25,
                 mutation_fraction: float = 0.5, seed: int | None = 0,
                 constraint: Constraint | None = None, max_attempts: int = 100,
                 progress: Progress | None = None) -> None:
        self.population = population
        self.generations = generations
        self.mutation_prob = mutation_prob
        self.parents_fraction = parents_fraction
        self.mutation_fraction = mutation_fraction
        self.seed = seed
        self.constraint = constraint
        self.max_attempts = max_attempts
        self.progress = progress

    def fit(self, space: SearchSpace | Breeder, evaluator: Evaluator) -> EvolutionSearch:
        """Run the search; returns ``self`` with the learned state set."""
        self._check_params()
        breeder = _breeder(space)
        rng = np.random.default_rng(self.seed)
        seen: set[Hashable] = set()  # proposed so far, feasible or not: never proposed twice
        self.history_: list[Candidate] = []
        self.rejected_ = 0
        self.closest_: tuple[Any, float] | None = None
        archs = self._draw(self.population, lambda: breeder.random_arch(rng), seen)
        if not archs:
            closest = ""
            if self.closest_ is not None and self.closest_[1] > 0:
                closest = (f"; the closest, {_describe(self.closest_[0])}, is "
                           f"{self.closest_[1]:g} over the limit")
            error = InfeasibleError(
                f"the constraint rejected all {self.rejected_} distinct architectures drawn "
                f"from space {breeder.name!r}{closest}: relax the constraint or raise "
                f"{option('max_attempts', self.max_attempts * 10)}")
            error.closest = self.closest_  # type: ignore[attr-defined]
            raise error
        population = self._rank(self._evaluate(archs, evaluator, 0))
        self._report(0)
        for generation in range(1, self.generations + 1):
            parents = population[:self._parent_count(len(population))]
            children = self._breed(breeder, [c.arch for c in parents], rng, seen)
            population = self._rank(parents + self._evaluate(children, evaluator, generation))
            self._report(generation)
        self.population_ = population
        return self

    # -- steps -------------------------------------------------------------------------------

    def _check_params(self) -> None:
        checks = [("population", _is_int(self.population, 1), "an integer >= 1"),
                  ("generations", _is_int(self.generations, 0), "an integer >= 0"),
                  ("max_attempts", _is_int(self.max_attempts, 1), "an integer >= 1"),
                  ("mutation_prob", _in_unit(self.mutation_prob), "between 0 and 1"),
                  ("parents_fraction", _in_unit(self.parents_fraction, open_low=True),
                   "above 0 and at most 1"),
                  ("mutation_fraction", _in_unit(self.mutation_fraction), "between 0 and 1")]
        for name, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"EvolutionSearch {name}={getattr(self, name)!r} must be "
                                  f"{allowed}")

    def _draw(self, count: int, propose: Callable[[], Any], seen: set[Hashable]) -> list[Any]:
        """Up to ``count`` new feasible architectures from ``propose``, in at most
        ``count * max_attempts`` proposals."""
        found: list[Any] = []
        for _ in range(count * self.max_attempts):
            if len(found) == count:
                break
            arch = propose()
            if arch in seen:
                continue
            seen.add(arch)
            if self._feasible(arch):
                found.append(arch)
        return found

    def _feasible(self, arch: Any) -> bool:
        if self.constraint is None:
            return True
        verdict = self.constraint(arch)
        if isinstance(verdict, bool | np.bool_):
            violation = 0.0 if verdict else math.inf
        else:
            violation = max(0.0, float(verdict))
        if violation > 0:
            self.rejected_ += 1
            if self.closest_ is None or violation < self.closest_[1]:
                self.closest_ = (arch, violation)
        return violation == 0

    def _parent_count(self, size: int) -> int:
        return min(size, max(1, round(self.parents_fraction * self.population)))

    def _breed(self, breeder: Breeder, parents: list[Any], rng: np.random.Generator,
               seen: set[Hashable]) -> list[Any]:
        wanted = self.population - len(parents)
        mutants = wanted if len(parents) < 2 else round(self.mutation_fraction * wanted)

        def mutant() -> Hashable:
            return breeder.mutate_arch(parents[rng.integers(len(parents))], rng,
                                       self.mutation_prob)

        def child() -> Hashable:
            i, j = rng.choice(len(parents), size=2, replace=False)
            return breeder.crossover_arch(parents[i], parents[j], rng)

        children = self._draw(mutants, mutant, seen)
        children += self._draw(wanted - mutants, child, seen)
        # parents that have converged cross into little that is new: mutate for the rest
        return children + self._draw(wanted - len(children), mutant, seen)

    def _evaluate(self, archs: list[Any], evaluator: Evaluator,
                  generation: int) -> list[Candidate]:
        scored = []
        for arch in archs:
            result = evaluator(arch)
            evaluation = result if isinstance(result, Evaluation) else Evaluation(float(result))
            score = float(evaluation.score)
            if math.isnan(score):
                raise ConfigError(f"the evaluator scored architecture {arch} as NaN; return a "
                                  "number (use -inf for an architecture that must never win)")
            scored.append(Candidate(generation, arch, score, dict(evaluation.metrics)))
        self.history_.extend(scored)
        return scored

    @staticmethod
    def _rank(candidates: list[Candidate]) -> list[Candidate]:
        return sorted(candidates, key=lambda c: -c.score)  # stable: ties keep proposal order

    def _report(self, generation: int) -> None:
        best = max(self.history_, key=lambda c: c.score)  # the first of equal scores wins
        self.best_arch_, self.best_score_ = best.arch, best.score
        self.best_metrics_ = dict(best.metrics)
        if self.progress is not None:
            self.progress(generation, best)


def _describe(arch: Any) -> str:
    describe = getattr(arch, "describe", None)
    return describe() if callable(describe) else str(arch)


def _is_int(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _in_unit(value: object, *, open_low: bool = False) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    return (value > 0 if open_low else value >= 0) and value <= 1
