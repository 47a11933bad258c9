"""On-device subnet search of AdaptiveNet (sections 5.1 and 5.2, Algorithm 1).

:class:`AdaptiveSearch`: NearbyInit, then per iteration NearbyMutate and crossover of the best
candidates (:mod:`.breed`), each generation evaluated as a whole with the prefix tree
(:mod:`.evaluate`). Two baselines with the same history format and the same evaluator (the
paper's Fig. 12): :class:`EvolutionBaseline` (uniform breeding; subnets over budget are
discarded after prediction, never evaluated) and :class:`AnnealingSearch` (one chain,
one-branch moves). :class:`SearchStep` is one point of their curves.

All three follow the scikit-learn contract: parameters in ``__init__``, ``fit(evaluator,
table)`` returns ``self``, learned state with a trailing underscore (``best_``, ``history_``,
``curve_``, ``pareto_``...). :class:`~edgesplit.nas.core.evolution.EvolutionSearch` is not reused
as a whole: it scores one architecture per evaluator call, and the prefix tree needs the
whole generation at once. Its loop is: :class:`~edgesplit.nas.core.evolution.Breeding` (new
subnets only, mutants and crossovers) and :func:`~edgesplit.nas.core.evolution.evolve` (the
generations), with AdaptiveNet's own survivors (the best of parents and children, within the
budget first); so are its :class:`~edgesplit.nas.core.evolution.Candidate` records and
:func:`~edgesplit.nas.core.evolution.pareto_front`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Self

import numpy as np

from edgesplit.errors import InfeasibleError, option
from edgesplit.nas.adaptivenet.breed import NearbyBreeder, UniformBreeder
from edgesplit.nas.adaptivenet.evaluate import PrefixTreeEvaluator
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable
from edgesplit.nas.adaptivenet.space import ElasticSpace, SubnetArch
from edgesplit.nas.core.checks import Rule, is_count, is_fraction, is_number, refuse
from edgesplit.nas.core.evolution import Breeding, Candidate, evolve, pareto_front
from edgesplit.units import at_least

__all__ = ["AdaptiveSearch", "AnnealingSearch", "EvolutionBaseline", "SearchStep"]

SearchProgress = Callable[[int, int, "Candidate | None"], None]  # (iteration, of, best)


# -- the searches ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchStep:
    """The state after one iteration: subnets evaluated so far, the best accuracy within the
    budget (None before any) and its latency, the evaluation seconds spent so far, and the
    wall seconds since the search started (breeding and bookkeeping too: the paper's Fig. 12
    search time)."""

    iteration: int
    evaluated: int
    best_accuracy: float | None
    best_latency: float | None
    seconds: float
    wall_s: float = 0.0


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

    def _checks(self) -> list[Rule]:
        return [("budget", is_number(self.budget), "a number of seconds > 0"),
                ("max_attempts", is_count(self.max_attempts, 1), "an integer >= 1")]

    def _start(self, evaluator: PrefixTreeEvaluator, table: BlockLatencyTable) -> ElasticSpace:
        refuse(self, self._checks())
        table.check(evaluator.supernet)
        fastest, seconds = table.fastest()
        if seconds > self.budget:
            error = InfeasibleError(
                f"no subnet of {table.model or 'the supernet'} fits the latency budget "
                f"{self.budget * 1e3:.4g} ms: the fastest, {'-'.join(fastest)}, takes "
                f"{seconds * 1e3:.4g} ms (predicted); raise {option('budget')} to at least "
                f"{at_least(seconds)} s")
            error.fastest = (fastest, seconds)  # type: ignore[attr-defined]
            raise error
        self._evaluator, self._table, self._fastest = evaluator, table, fastest
        self._records: dict[SubnetArch, Candidate] = {}
        self._seconds = 0.0
        self._started = time.perf_counter()
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
                                      self._seconds, time.perf_counter() - self._started))
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


    def seconds_to(self, accuracy: float) -> float | None:
        """Wall seconds from the start until, at the end of an iteration, the best subnet
        within the budget had reached ``accuracy`` (None: never)."""
        return next((step.wall_s for step in self.curve_ if step.best_accuracy is not None
                     and step.best_accuracy >= accuracy), None)


def _better(a: Candidate, b: Candidate) -> bool:
    """More accurate, or as accurate and faster."""
    return (a.score, -a.metrics["latency"]) > (b.score, -b.metrics["latency"])


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

    def _checks(self) -> list[Rule]:
        return [*super()._checks(),
                ("population", is_count(self.population, 1), "an integer >= 1"),
                ("iterations", is_count(self.iterations, 0), "an integer >= 0"),
                ("parents_fraction", is_fraction(self.parents_fraction)
                 and self.parents_fraction > 0, "above 0 and at most 1"),
                ("crossover_fraction", is_fraction(self.crossover_fraction), "between 0 and 1"),
                ("mutation_prob", is_fraction(self.mutation_prob), "between 0 and 1")]

    def _breeder(self, space: ElasticSpace, table: BlockLatencyTable) -> UniformBreeder:
        raise NotImplementedError

    def _admit(self, arch: SubnetArch) -> bool:
        """Whether a bred subnet is evaluated (else it is discarded after prediction)."""
        raise NotImplementedError

    def fit(self, evaluator: PrefixTreeEvaluator, table: BlockLatencyTable) -> Self:
        """Run the search; returns ``self`` with the learned state set."""
        space = self._start(evaluator, table)
        # a small space or a narrow band runs out of new subnets: after max_attempts
        # proposals in a row all seen before, drawing on would only spin
        breeding = Breeding(self._breeder(space, table), np.random.default_rng(self.seed),
                            self._admitted, max_attempts=self.max_attempts,
                            patience=self.max_attempts)
        first = breeding.initial(self.population)
        if not any(self._latency(a) <= self.budget for a in first) \
                and self._fastest not in breeding.seen:
            first.append(self._fastest)  # so that the search has a subnet within the budget
        population = self._rank(self._evaluate(first, 0))
        self._record(0, self.iterations)
        self.population_ = evolve(
            population, self.iterations, parent_count=self._parents,
            breed=lambda parents: self._breed(breeding, parents),
            evaluate=self._evaluate,
            survivors=lambda population, _, children: self._rank(
                population + children)[:self.population],
            report=lambda iteration: self._record(iteration, self.iterations))
        self._finish()
        return self

    def _parents(self, size: int) -> int:
        return min(size, max(1, round(self.parents_fraction * self.population)))

    def _rank(self, candidates: list[Candidate]) -> list[Candidate]:
        return sorted(candidates, reverse=True,  # stable: ties keep their order
                      key=lambda c: (self._feasible(c), c.score, -c.metrics["latency"]))

    def _admitted(self, arch: SubnetArch) -> bool:
        if self._admit(arch):
            return True
        self.rejected_ += 1
        return False

    def _breed(self, breeding: Breeding, parents: list[SubnetArch]) -> list[SubnetArch]:
        crossovers = 0 if len(parents) < 2 else round(self.crossover_fraction * self.population)
        return breeding.children(parents, self.population, crossovers, self.mutation_prob)


class AdaptiveSearch(_Evolution):
    """AdaptiveNet's search (Algorithm 1): NearbyInit, then per iteration NearbyMutate and
    crossover of the best candidates, every generation evaluated at once by the
    :class:`PrefixTreeEvaluator`; the best subnet within ``budget`` (seconds) wins.

    ``delta`` (seconds; None: 10 % of the budget) sets the band ``[budget - delta, budget +
    delta]`` candidates are bred in. Subnets above the budget but in the band are evaluated
    too: they make the pool of subnets to switch to when the device slows down (section 5.3;
    ``pareto_`` holds the best accuracy at each latency). ``mutation_prob``: the chance of
    each further branch being replaced in a mutant (one always is).

    Learned: ``best_`` (a :class:`~edgesplit.nas.core.evolution.Candidate` with metrics
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

    def _checks(self) -> list[Rule]:
        return [*super()._checks(),
                ("delta", self.delta is None or is_number(self.delta, strict=False),
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

    def _checks(self) -> list[Rule]:
        return [*super()._checks(),
                ("steps", is_count(self.steps, 0), "an integer >= 0"),
                ("t_start", is_number(self.t_start), "a number > 0"),
                ("t_end", is_number(self.t_end) and self.t_end <= self.t_start,
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
