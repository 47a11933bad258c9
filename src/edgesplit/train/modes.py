"""L2S's two modes and the delay monitor that switches between them (Section IV-D, Fig. 9).

- Adaptation: a fresh LinUCB-E learns the partition for ``horizon`` rounds; it ends when the
  last ``n_th`` decisions agree (else adaptation goes on for another ``horizon``).
- Regular training: the partition found is used as it is.
- Re-entry: the delay monitor compares the mean delay of the last ``r`` rounds with the mean
  over the ``r`` rounds that followed the last adaptation; a relative change above ``r_th`` is
  a concept drift and starts adaptation again. Independently, each regular round re-enters
  with probability ``r_d`` (seeded).

``AdaptiveL2S`` has the simulator's policy interface: ``select(t)``, then ``update(p, d_edge)``
and ``observe(total_ms)`` with the whole round's delay the device measures.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.train.bandit import LinUCBE

__all__ = ["ModeConfig", "AdaptiveL2S"]


@dataclass(frozen=True)
class ModeConfig:
    horizon: int = 100  # T: rounds of one adaptation phase
    n_th: int = 20  # the last n_th decisions of a phase must agree to leave adaptation
    r: int = 20  # delay-monitor window (rounds)
    r_th: float = 0.3  # relative change of the mean delay that counts as a drift
    r_d: float = 0.0  # probability of re-entering adaptation in any regular round
    seed: int = 0

    def __post_init__(self) -> None:
        if self.horizon < 1 or not 1 <= self.n_th <= self.horizon:
            raise ConfigError("need horizon >= 1 and 1 <= n_th <= horizon")
        if self.r < 1 or self.r_th <= 0 or not 0 <= self.r_d <= 1:
            raise ConfigError("need r >= 1, r_th > 0 and 0 <= r_d <= 1")


@dataclass
class AdaptiveL2S:
    """LinUCB-E in adaptation mode, a fixed partition in regular mode (see module docstring).
    ``make_learner(horizon)`` builds a fresh LinUCB-E for each adaptation phase."""

    make_learner: Callable[[int], LinUCBE]
    config: ModeConfig = field(default_factory=ModeConfig)
    mode: str = "adaptation"
    partition: int | None = None
    adaptations: list[int] = field(default_factory=list)  # rounds where adaptation began

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.config.seed)
        self._start(1)

    def _start(self, t: int) -> None:
        self.mode = "adaptation"
        self.learner = self.make_learner(self.config.horizon)
        self._phase_start = t
        self._decisions: list[int] = []
        self._recent: deque[float] = deque(maxlen=self.config.r)
        self._baseline: list[float] = []
        self.adaptations.append(t)

    def select(self, t: int) -> int:
        if self.mode == "regular" and self._rng.random() < self.config.r_d:
            self._start(t)
        if self.mode == "adaptation":
            arm = self.learner.select(t - self._phase_start + 1)
            self._decisions.append(arm)
            return arm
        assert self.partition is not None
        return self.partition

    def update(self, arm: int, edge_delay_ms: float) -> None:
        if self.mode == "adaptation":
            self.learner.update(arm, edge_delay_ms)

    def observe(self, t: int, total_ms: float) -> None:
        """The whole round's delay: ends adaptation phases and watches for drift."""
        if self.mode == "adaptation":
            self._maybe_settle(t)
            return
        self._recent.append(total_ms)
        if len(self._baseline) < self.config.r:
            self._baseline.append(total_ms)
            return
        base = float(np.mean(self._baseline))
        if len(self._recent) == self.config.r and \
                abs(float(np.mean(self._recent)) - base) > self.config.r_th * base:
            self._start(t + 1)

    def _maybe_settle(self, t: int) -> None:
        if len(self._decisions) < self.config.horizon:
            return
        tail = self._decisions[-self.config.n_th:]
        if len(set(tail)) == 1:
            self.mode, self.partition = "regular", tail[0]
            self._recent.clear()
            self._baseline = []
        else:  # no consensus: another phase with the same model, forced sampling restarting
            self._decisions = []
            self._phase_start = t + 1
