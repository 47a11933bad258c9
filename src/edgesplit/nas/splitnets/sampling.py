"""Random, mutated and crossed SplitNets architectures, and the sub-networks each supernet
training step trains (appendix D).

Single view, ``five`` (appendix D.1): the largest network without a splitting module (the
accuracy upper bound), the largest with all of them (every weight updated), the smallest
without (the most shared weights), the smallest with all (the lower bound) and a random one
with exactly one (what the search deploys). ``sandwich``, the baseline of Fig. 12, samples the
largest and the smallest with one module instead of all of them. Multi-view networks fuse
exactly once, so they always use ``sandwich`` with one module (appendix D.2): largest,
smallest, and random networks.

Every function draws from a ``numpy.random.Generator`` the caller seeds.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.nas.splitnets.space import PhaseArch, PhaseSpec, SplitArch, SplitSpace

__all__ = ["SAMPLERS", "Sampler", "SplitBreeder", "crossover_split", "mutate_split",
           "random_split_arch", "training_subnets"]

Sampler = Literal["five", "sandwich"]
SAMPLERS: tuple[str, ...] = get_args(Sampler)


def _pick(rng: np.random.Generator, values: tuple[int, ...]) -> int:
    return int(values[int(rng.integers(len(values)))])


def _random_phase(spec: PhaseSpec, rng: np.random.Generator) -> PhaseArch:
    before, after = _pick(rng, spec.depth_before), _pick(rng, spec.depth_after)
    expands = tuple(_pick(rng, spec.expands) for _ in range(before + after))
    return PhaseArch(_pick(rng, spec.widths), before, after, expands, _pick(rng, spec.reduced))


def random_split_arch(space: SplitSpace, rng: np.random.Generator) -> SplitArch:
    """Every choice uniform, exactly one splitting module at a uniform phase."""
    phases = tuple(_random_phase(p, rng) for p in space.phases)
    return SplitArch(_pick(rng, space.resolutions), _pick(rng, space.stem_widths), phases,
                     _pick(rng, space.head_widths), (int(rng.integers(len(space.phases))),))


def _other(rng: np.random.Generator, values: tuple[int, ...], current: int) -> int:
    """A different value than ``current`` (a mutation that redraws itself is a no-op)."""
    others = [v for v in values if v != current]
    return current if not others else int(others[int(rng.integers(len(others)))])


def _mutate_phase(spec: PhaseSpec, p: PhaseArch, rng: np.random.Generator, prob: float
                  ) -> PhaseArch:
    def maybe(values: tuple[int, ...], current: int) -> int:
        return _other(rng, values, current) if rng.random() < prob else current

    width, before, after = maybe(spec.widths, p.width), maybe(spec.depth_before, p.before), \
        maybe(spec.depth_after, p.after)
    # keep each surviving block's expansion; a new block draws one
    old = list(p.expands[:p.before][:before]) + \
        [_pick(rng, spec.expands) for _ in range(max(0, before - p.before))] + \
        list(p.expands[p.before:][:after]) + \
        [_pick(rng, spec.expands) for _ in range(max(0, after - p.after))]
    expands = tuple(maybe(spec.expands, e) for e in old)
    return PhaseArch(width, before, after, expands, maybe(spec.reduced, p.reduced))


def mutate_split(space: SplitSpace, arch: SplitArch, rng: np.random.Generator, prob: float
                 ) -> SplitArch:
    """``arch`` with each choice (and the split's phase), with probability ``prob``, changed
    to a different allowed value."""
    if not 0.0 <= prob <= 1.0:
        raise ConfigError(f"mutation probability {prob!r} must be between 0 and 1")

    def maybe(values: tuple[int, ...], current: int) -> int:
        return _other(rng, values, current) if rng.random() < prob else current

    phases = tuple(_mutate_phase(spec, p, rng, prob)
                   for spec, p in zip(space.phases, arch.phases, strict=True))
    split = maybe(space.all_phases(), arch.split)
    return SplitArch(maybe(space.resolutions, arch.resolution),
                     maybe(space.stem_widths, arch.stem), phases,
                     maybe(space.head_widths, arch.head), (split,))


def crossover_split(space: SplitSpace, first: SplitArch, second: SplitArch,
                    rng: np.random.Generator) -> SplitArch:
    """Uniform crossover: the resolution, stem, head, split position and each whole phase
    from either parent with equal chance (a phase's depths and expansions stay together)."""
    def take(a: int, b: int) -> int:
        return a if rng.random() < 0.5 else b

    phases = tuple(a if rng.random() < 0.5 else b
                   for a, b in zip(first.phases, second.phases, strict=True))
    return SplitArch(take(first.resolution, second.resolution), take(first.stem, second.stem),
                     phases, take(first.head, second.head), (take(first.split, second.split),))


class SplitBreeder:
    """What :class:`~edgesplit.nas.EvolutionSearch` breeds SplitNets architectures with."""

    def __init__(self, space: SplitSpace) -> None:
        self.space = space
        self.name = space.name

    def random_arch(self, rng: np.random.Generator) -> SplitArch:
        return random_split_arch(self.space, rng)

    def mutate_arch(self, arch: SplitArch, rng: np.random.Generator, prob: float) -> SplitArch:
        return mutate_split(self.space, arch, rng, prob)

    def crossover_arch(self, first: SplitArch, second: SplitArch, rng: np.random.Generator
                       ) -> SplitArch:
        return crossover_split(self.space, first, second, rng)


def training_subnets(space: SplitSpace, sampler: str, rng: np.random.Generator,
                     randoms: int = 1) -> list[tuple[str, SplitArch]]:
    """The (name, architecture) pairs one training step trains, largest first (its logits can
    teach the others). ``randoms``: random one-module networks (the paper samples one; BigNAS
    samples two, which trains the middle of the space faster on a small budget)."""
    if sampler not in SAMPLERS:
        raise ConfigError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
    if not isinstance(randoms, int) or randoms < 0:
        raise ConfigError(f"random sub-networks per step {randoms!r} must be an integer >= 0")
    random_nets = [random_split_arch(space, rng) for _ in range(randoms)]
    every = space.all_phases()

    def one() -> tuple[int]:
        return (int(rng.integers(len(space.phases))),)

    if space.multi_view or sampler == "sandwich":
        nets = [("max-one-hot", space.largest(one())), ("min-one-hot", space.smallest(one()))]
        if not space.multi_view:
            nets = [("max-zero-hot", space.largest()), nets[0],
                    ("min-zero-hot", space.smallest()), nets[1]]
    else:
        nets = [("max-zero-hot", space.largest()), ("max-all-hot", space.largest(every)),
                ("min-zero-hot", space.smallest()), ("min-all-hot", space.smallest(every))]
    return [*nets, *((f"random-one-hot{'' if k == 0 else k + 1}", arch)
                     for k, arch in enumerate(random_nets))]

