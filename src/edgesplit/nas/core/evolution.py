"""The evolutionary loop every NAS search here runs, and the toolkit's search on it.

:class:`Breeding` draws new architectures only (bounded, each proposal remembered) and breeds a
generation's children; :func:`evolve` runs the generations. :class:`EvolutionSearch` is the
toolkit's search on them; AdaptiveNet's searches run the same two with their own survivors and
a whole generation evaluated at once.

:class:`EvolutionSearch`: regularised to the Once-for-All recipe, with the scikit-learn
estimator contract: parameters in ``__init__``, ``fit(space, evaluator)``, learned state with a
trailing underscore.

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

The space is anything that breeds architectures: an object with ``name``,
``random_arch(rng)``, ``mutate_arch(arch, rng, prob)`` and ``crossover_arch(a, b, rng)``
(:class:`Breeder`; SplitNets' spaces have one), or a space whose ``breeder()`` gives one
(:class:`Breedable`: a JMSNAS :class:`~edgesplit.nas.jmsnas.space.SearchSpace`, bred by
:mod:`edgesplit.nas.jmsnas.sampler`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgesplit.errors import ConfigError, InfeasibleError, option
from edgesplit.nas.core.sampling import draw_distinct

__all__ = ["Breedable", "Breeder", "Breeding", "Candidate", "Constraint", "Evaluation",
           "Evaluator", "EvolutionSearch", "Progress", "evolve", "pareto_front"]


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


@runtime_checkable
class Breedable(Protocol):
    """A space that names its own breeder (a JMSNAS SearchSpace: ``space.breeder()``)."""

    def breeder(self) -> Breeder: ...


def _breeder(space: Breeder | Breedable) -> Breeder:
    return space if isinstance(space, Breeder) else space.breeder()


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


class Breeding:
    """What every evolutionary search here breeds with: new architectures only (each proposal
    is remembered in ``seen``, feasible or not, and never proposed twice), drawn in a bounded
    number of proposals, and a generation's children as mutants and crossovers of parents.

    ``admit(arch)`` says whether a new architecture joins (a constraint, a latency band);
    ``max_attempts`` bounds the proposals per wanted architecture; ``patience`` (None: never)
    stops a draw after that many proposals in a row that were all seen before.
    """

    def __init__(self, breeder: Breeder, rng: np.random.Generator, admit: Callable[[Any], bool],
                 *, max_attempts: int, patience: int | None = None) -> None:
        self.breeder = breeder
        self.rng = rng
        self.admit = admit
        self.max_attempts = max_attempts
        self.patience = patience
        self.seen: set[Hashable] = set()

    def draw(self, count: int, propose: Callable[[], Any]) -> list[Any]:
        """Up to ``count`` new admitted architectures from ``propose``, in at most
        ``count * max_attempts`` proposals."""
        return draw_distinct(propose, count, proposals=count * self.max_attempts,
                             seen=self.seen, admit=self.admit, patience=self.patience)

    def initial(self, count: int) -> list[Any]:
        """Up to ``count`` new random architectures: the first generation."""
        return self.draw(count, lambda: self.breeder.random_arch(self.rng))

    def children(self, parents: Sequence[Any], wanted: int, crossovers: int,
                 mutation_prob: float) -> list[Any]:
        """Up to ``wanted`` children: ``wanted - crossovers`` mutants of a random parent, then
        ``crossovers`` crossovers of two (``crossovers`` must be 0 with fewer than two
        parents); parents that have converged cross into little that is new, so mutants fill
        the rest."""
        breeder, rng = self.breeder, self.rng

        def mutant() -> Hashable:
            return breeder.mutate_arch(parents[int(rng.integers(len(parents)))], rng,
                                       mutation_prob)

        def child() -> Hashable:
            i, j = rng.choice(len(parents), size=2, replace=False)
            return breeder.crossover_arch(parents[int(i)], parents[int(j)], rng)

        found = self.draw(wanted - crossovers, mutant)
        found += self.draw(crossovers, child)
        return found + self.draw(wanted - len(found), mutant)


def evolve(population: list[Candidate], generations: int, *,
           parent_count: Callable[[int], int], breed: Callable[[list[Any]], list[Any]],
           evaluate: Callable[[list[Any], int], list[Candidate]],
           survivors: Callable[[list[Candidate], list[Candidate], list[Candidate]],
                               list[Candidate]],
           report: Callable[[int], None]) -> list[Candidate]:
    """The generational loop every evolutionary search here runs: per generation the best
    ``parent_count(len(population))`` of the ranked ``population`` breed children, which are
    evaluated; ``survivors(population, parents, children)`` is the next population, ranked
    best first; ``report(generation)`` after each. Returns the last population."""
    for generation in range(1, generations + 1):
        parents = population[:parent_count(len(population))]
        children = evaluate(breed([c.arch for c in parents]), generation)
        population = survivors(population, parents, children)
        report(generation)
    return population


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

    def fit(self, space: Breeder | Breedable, evaluator: Evaluator) -> EvolutionSearch:
        """Run the search; returns ``self`` with the learned state set."""
        self._check_params()
        breeder = _breeder(space)
        self.history_: list[Candidate] = []
        self.rejected_ = 0
        self.closest_: tuple[Any, float] | None = None
        breeding = Breeding(breeder, np.random.default_rng(self.seed), self._feasible,
                            max_attempts=self.max_attempts)
        archs = breeding.initial(self.population)
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
        self.population_ = evolve(
            population, self.generations, parent_count=self._parent_count,
            breed=lambda parents: self._breed(breeding, parents),
            evaluate=lambda archs, generation: self._evaluate(archs, evaluator, generation),
            survivors=lambda _, parents, children: self._rank(parents + children),
            report=self._report)
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

    def _breed(self, breeding: Breeding, parents: list[Any]) -> list[Any]:
        wanted = self.population - len(parents)
        mutants = wanted if len(parents) < 2 else round(self.mutation_fraction * wanted)
        return breeding.children(parents, wanted, wanted - mutants, self.mutation_prob)

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
