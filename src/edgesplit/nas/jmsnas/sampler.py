"""Random architectures of a space, and the mutation and crossover an evolutionary search
breeds with.

Every function draws from a ``numpy.random.Generator`` the caller seeds and passes in, so a
search is reproducible from one seed and no function touches global random state.
"""

from __future__ import annotations

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.nas.jmsnas.space import Arch, SearchSpace

__all__ = ["SpaceBreeder", "crossover", "mutate", "random_arch"]


def random_arch(space: SearchSpace, rng: np.random.Generator) -> Arch:
    """An architecture with each layer's op drawn uniformly from the ops it allows."""
    return space.arch_from_indices([int(rng.integers(len(layer.ops))) for layer in space.layers])


def mutate(space: SearchSpace, arch: Arch, rng: np.random.Generator, prob: float) -> Arch:
    """``arch`` with each layer, with probability ``prob``, switched to a *different* allowed op
    drawn uniformly (a layer with a single allowed op never changes).

    A mutation that redraws the current op would be a silent no-op and lower the effective
    rate unevenly between layers with 6 and 13 candidates, so the current op is excluded.
    """
    if not 0.0 <= prob <= 1.0:
        raise ConfigError(f"mutation probability {prob!r} must be between 0 and 1")
    indices = list(space.arch_indices(arch))
    for i, layer in enumerate(space.layers):
        choices = len(layer.ops)
        if choices > 1 and rng.random() < prob:
            # Draw among the other choices-1 ops: shift past the current index.
            other = int(rng.integers(choices - 1))
            indices[i] = other + (other >= indices[i])
    return space.arch_from_indices(indices)


def crossover(space: SearchSpace, first: Arch, second: Arch, rng: np.random.Generator) -> Arch:
    """Uniform crossover: each layer's op from ``first`` or ``second`` with equal chance."""
    a, b = space.arch_indices(first), space.arch_indices(second)
    take_first = rng.random(len(a)) < 0.5
    return space.arch_from_indices([x if t else y for x, y, t in zip(a, b, take_first,
                                                                     strict=True)])


class SpaceBreeder:
    """A SearchSpace bred by this module's functions: the
    :class:`~edgesplit.nas.core.evolution.Breeder` ``EvolutionSearch`` uses for it."""

    def __init__(self, space: SearchSpace) -> None:
        self.space, self.name = space, space.name

    def random_arch(self, rng: np.random.Generator) -> Arch:
        return random_arch(self.space, rng)

    def mutate_arch(self, arch: Arch, rng: np.random.Generator, prob: float) -> Arch:
        return mutate(self.space, arch, rng, prob)

    def crossover_arch(self, first: Arch, second: Arch, rng: np.random.Generator) -> Arch:
        return crossover(self.space, first, second, rng)
