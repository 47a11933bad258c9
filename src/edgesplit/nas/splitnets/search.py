"""Stage 2 of SplitNets: evolutionary search over a trained supernet with a hard constraint
(the sensor's peak memory of weights + activations <= Mem_sen) and a soft latency objective
(T_sen + T_comm + T_agg on the hardware model), section 3.2.

Each candidate costs an analytic latency and memory (:mod:`.cost`, microseconds) and, when it
fits, one accuracy measurement on validation data (batch-norms recalibrated). The score is
the accuracy minus a latency penalty: with ``latency_target_ms``, ``penalty`` accuracy points
per 1 % over the target (none under it); without, ``latency_weight`` points per 1 % of the
largest network's latency. Every evaluated candidate is kept, so the result is a whole
accuracy/latency front, and searching again for other hardware (faster sensors, less memory,
another bus) needs no retraining (appendix H).

The search never hangs: when no candidate fits the memory, :class:`~edgesplit.errors.
InfeasibleError` names the closest one and how far over it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgesplit.data import EvalData
from edgesplit.errors import InfeasibleError, option
from edgesplit.nas.core.checks import is_count, is_number, refuse
from edgesplit.nas.core.evolution import Candidate, Evaluation, EvolutionSearch, pareto_front
from edgesplit.nas.splitnets.cost import SplitCost, SplitHardware
from edgesplit.nas.splitnets.sampling import SplitBreeder
from edgesplit.nas.splitnets.space import SplitArch
from edgesplit.nas.splitnets.supernet import MultiResolution, SplitSupernet
from edgesplit.nas.splitnets.train import (
    CALIBRATION_IMAGES,
    calibration_samples,
    subnet_accuracy,
)

__all__ = ["SplitNetsSearch"]

SearchProgress = Callable[[int, int, Candidate], None]  # (generation, generations, best)


@dataclass
class SplitNetsSearch:
    """Search ``hardware`` for the best SplitNets of a trained supernet.

    Learned state: ``search_`` (the :class:`EvolutionSearch`, with every candidate in its
    ``history_``), ``front_`` (the accuracy/latency Pareto front of feasible candidates),
    ``best_`` (the highest score), ``costs_`` (architecture -> :class:`SplitCost`),
    ``reference_ms_`` (the largest network's latency at its best split)."""

    hardware: SplitHardware
    population: int = 32
    generations: int = 20
    mutation_prob: float = 0.2
    latency_target_ms: float | None = None
    penalty: float = 1.0
    latency_weight: float = 0.05
    calibration_images: int = CALIBRATION_IMAGES
    seed: int = 0
    progress: SearchProgress | None = None
    search_: EvolutionSearch = field(init=False)
    front_: list[Candidate] = field(init=False, default_factory=list)
    costs_: dict[SplitArch, SplitCost] = field(init=False, default_factory=dict)

    def validate(self) -> None:
        """Refuse bad options (ConfigError) before any work starts."""
        refuse(self, [
            ("latency_target_ms", self.latency_target_ms is None
             or is_number(self.latency_target_ms), "positive, or None"),
            ("penalty", is_number(self.penalty, strict=False), "a number >= 0"),
            ("latency_weight", is_number(self.latency_weight, strict=False), "a number >= 0"),
            ("calibration_images", is_count(self.calibration_images, 1),
             "a whole number >= 1")])

    def cost(self, supernet: SplitSupernet, arch: SplitArch) -> SplitCost:
        if arch not in self.costs_:
            self.costs_[arch] = self.hardware.cost(supernet.space, arch)
        return self.costs_[arch]

    def fit(self, supernet: SplitSupernet, validation: EvalData, calibration: EvalData
            ) -> SplitNetsSearch:
        """Search; ``validation`` scores candidates (keep the held-out test data for the
        final networks), ``calibration`` re-estimates their batch-norms."""
        self.validate()
        space = supernet.space
        calib = MultiResolution(calibration_samples(calibration, self.calibration_images))
        assert validation.labels is not None
        scored = (MultiResolution(validation.inputs[0]), validation.labels)
        smallest_split = min(self.cost(supernet, space.largest([s])).total_ms
                              for s in space.all_phases())
        self.reference_ms_ = smallest_split

        def constraint(arch: SplitArch) -> float:
            return self.hardware.check_memory(self.cost(supernet, arch))

        def evaluate(arch: SplitArch) -> Evaluation:
            cost = self.cost(supernet, arch)
            acc = subnet_accuracy(supernet, arch, scored, calib)
            metrics = {"accuracy": acc, "latency_ms": cost.total_ms, **{
                k: float(v) for k, v in cost.to_dict().items() if k != "total_ms"}}
            return Evaluation(acc - self._penalty(cost.total_ms), metrics)

        def report(generation: int, best: Candidate) -> None:
            if self.progress is not None:
                self.progress(generation, self.generations, best)

        search = EvolutionSearch(population=self.population, generations=self.generations,
                                 mutation_prob=self.mutation_prob, seed=self.seed,
                                 constraint=constraint, progress=report)
        try:
            self.search_ = search.fit(SplitBreeder(space), evaluate)
        except InfeasibleError as exc:
            raise self._infeasible(supernet, exc) from None
        self.front_ = pareto_front(self.search_.history_, "accuracy", "latency_ms")
        self.best_ = max(self.search_.history_, key=lambda c: c.score)
        return self

    def _infeasible(self, supernet: SplitSupernet, exc: InfeasibleError) -> InfeasibleError:
        """The evolution's refusal in the terms of the memory limit, naming the closest."""
        closest = getattr(exc, "closest", None)
        limit = self.hardware.memory_limit_bytes or 0
        text = (f"no network of space {supernet.space.name!r} fits the sensor memory of "
                f"{limit / 1024:.1f} KiB")
        if closest is not None:
            cost = self.cost(supernet, closest[0])
            text += (f": the closest drawn, {closest[0].describe()}, needs "
                     f"{cost.sensor_memory_bytes / 1024:.1f} KiB (weights "
                     f"{cost.sensor_weight_bytes / 1024:.1f} + activations "
                     f"{cost.sensor_activation_bytes / 1024:.1f})")
        error = InfeasibleError(f"{text}; raise {option('sensor_memory', 'SIZE')} or search a "
                                "space with smaller networks")
        error.closest = closest  # type: ignore[attr-defined]
        return error

    def _penalty(self, latency_ms: float) -> float:
        if self.latency_target_ms is not None:
            over = max(0.0, latency_ms / self.latency_target_ms - 1.0)
            return self.penalty * 100.0 * over
        return self.latency_weight * 100.0 * latency_ms / self.reference_ms_

    def summary(self) -> dict[str, Any]:
        """JSON-able: settings, the best candidate, the front and how many were evaluated."""
        def row(c: Candidate) -> dict[str, Any]:
            return {"arch": c.arch.to_dict(), "describe": c.arch.describe(),
                    "generation": c.generation, "score": c.score, **c.metrics}

        return {"hardware": self.hardware.describe(),
                "memory_limit_bytes": self.hardware.memory_limit_bytes,
                "latency_target_ms": self.latency_target_ms,
                "evaluated": len(self.search_.history_),
                "rejected_by_memory": self.search_.rejected_,
                "best": row(self.best_), "front": [row(c) for c in self.front_]}
