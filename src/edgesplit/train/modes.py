"""L2S's two modes and the delay monitor that switches between them (Section IV-D, Fig. 9).

- Adaptation: LinUCB-E learns the partition for ``horizon`` rounds; the phase ends when the
  learner's last ``n_th`` *decisions* agree (else another phase of ``horizon`` rounds follows).
  A decision is the partition the learner believes best after the round, the argmin of its
  predicted delay without the exploration bonus. (Judging convergence on the partitions
  played would never settle where pure on-device training is best, since every T^mu-th round
  is forced away, and rarely where exploration keeps two close partitions alternating.)
- Regular training: the partition found is used as it is; no forced sampling.
- Re-entry: the delay monitor compares the mean delay of the last ``r`` rounds with the mean
  over the first ``r`` regular rounds; a relative change above ``r_th`` is a concept drift and
  starts adaptation. Independently, each regular round re-enters with probability ``r_d``
  (seeded): the monitor cannot see every change (at pure on-device training the link is never
  used, and a change during an adaptation phase is in its baseline). Either way the learner
  starts afresh, as the paper's adaptation mode learns "in a new network environment": a
  learner that kept hundreds of rounds of the old environment was measured to settle back on
  the old partition after a bandwidth drop (benchmarks/results/l2s.md, Fig. 17).
- Weight sync: entering adaptation (Section IV-D: "L2S first synchronizes weights") and
  settling on a partition set ``sync_due`` for that round, so the caller synchronises the layers
  that changed sides before training on.

The learner keeps receiving the edge delays of regular rounds too (free feedback).
``AdaptiveL2S`` has the simulator's policy interface: ``select(t)``, then ``update(p, d_edge)``
and ``observe(t, total_ms)`` with the round's training delay the device measures (without the
sync transfer, which would otherwise look like a drift).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.train.bandit import LinUCBE

__all__ = ["AdaptiveL2S", "ModeConfig"]


@dataclass(frozen=True)
class ModeConfig:
    """Mode switching of Fig. 9. The paper gives no values; these make the simulated L2S settle
    within 50 rounds in its setting (Fig. 11 converges in ~50) and catch a drift within ``r``
    rounds (Fig. 17 compares the last 10 rounds)."""

    horizon: int = 50  # T: rounds of one adaptation phase (also the forced-sampling horizon)
    n_th: int = 10  # the last n_th decisions of a phase must agree to leave adaptation
    r: int = 10  # delay-monitor window (rounds)
    r_th: float = 0.1  # relative change of the mean delay that counts as a drift
    # probability of re-entering adaptation in any regular round. Off by default: every
    # re-entry explores again, and exploring a cut that puts large layers on the other side
    # costs a weight merge (AlexNet's fc6/fc7: 436 MB) that the learner does not see coming;
    # benchmarks/results/l2s.md measures the price of r_d = 0.001.
    r_d: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.horizon < 1 or not 1 <= self.n_th <= self.horizon:
            raise ConfigError("need horizon >= 1 and 1 <= n_th <= horizon")
        if self.r < 1 or self.r_th <= 0 or not 0 <= self.r_d <= 1:
            raise ConfigError("need r >= 1, r_th > 0 and 0 <= r_d <= 1")


@dataclass
class AdaptiveL2S:
    """LinUCB-E in adaptation mode, a fixed partition in regular mode (see module docstring).
    ``make_learner(horizon)`` builds a fresh LinUCB-E."""

    make_learner: Callable[[int], LinUCBE]
    config: ModeConfig = field(default_factory=ModeConfig)
    mode: str = "adaptation"
    partition: int | None = None
    adaptations: list[int] = field(default_factory=list)  # rounds where adaptation began
    reasons: list[str] = field(default_factory=list)  # "start", "drift" or "random"
    settled: list[tuple[int, int]] = field(default_factory=list)  # (round, partition)
    sync_due: bool = False  # the caller should synchronise weights after this round

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.config.seed)
        self.learner = self.make_learner(self.config.horizon)
        self._profile = dict(self.learner.reset().device_delays_)
        self._measured: dict[int, list[float]] = {}
        self._start(1, "start")

    def _start(self, t: int, reason: str) -> None:
        if reason != "start":
            self.learner = self.make_learner(self.config.horizon)
            self.learner.set_params(device_delays=self._device_estimates())
        self.mode = "adaptation"
        self._phase_start = t
        self._decisions: list[int] = []
        self._recent: deque[float] = deque(maxlen=self.config.r)
        self._baseline: list[float] = []
        self.adaptations.append(t)
        self.reasons.append(reason)
        self.sync_due = reason != "start"  # at round 1 both sides hold the same weights

    @property
    def next_partition(self) -> int | None:
        """The partition of the rounds to come when it is fixed (regular mode), else None: a
        sync that is due can bring the layers about to change sides."""
        return self.partition if self.mode == "regular" else None

    def select(self, t: int) -> int:
        self.sync_due = False
        if self.mode == "regular" and self._rng.random() < self.config.r_d:
            self._start(t, "random")
        if self.mode == "adaptation":
            return self.learner.select(t - self._phase_start + 1)
        assert self.partition is not None
        return self.partition

    def update(self, arm: int, edge_delay_ms: float) -> None:
        self.learner.update(arm, edge_delay_ms)

    def observe_device(self, arm: int, device_ms: float) -> None:
        """The device's own measured training time at ``arm`` (a real run). d_p^m becomes the
        mean of the measurements where the partition was played; elsewhere the profile scaled
        by the median measured/profiled ratio, since a profile taken before training misses
        what the real loop costs (optimizer state, other processes on the machine)."""
        if arm in self._profile and math.isfinite(device_ms) and device_ms >= 0:
            self._measured.setdefault(arm, []).append(float(device_ms))
            self.learner.set_params(device_delays=self._device_estimates())

    def _device_estimates(self) -> dict[int, float]:
        means = {a: float(np.mean(v[-50:])) for a, v in self._measured.items()}
        ratios = [means[a] / self._profile[a] for a in means if self._profile[a] > 0]
        scale = float(np.median(ratios)) if ratios else 1.0
        return {a: means.get(a, p * scale) for a, p in self._profile.items()}

    def predict_edge(self, arm: int) -> float:
        """The learner's current prediction of d_p^e (L2S Fig. 10 plots its error)."""
        return self.learner.predict_edge(arm)

    def observe(self, t: int, total_ms: float) -> None:
        """The round's training delay: ends adaptation phases and watches for drift."""
        if self.mode == "adaptation":
            self._decisions.append(self.learner.best_estimate())
            self._maybe_settle(t)
            return
        self._recent.append(total_ms)
        if len(self._baseline) < self.config.r:
            self._baseline.append(total_ms)
            return
        base = float(np.mean(self._baseline))
        if len(self._recent) == self.config.r and \
                abs(float(np.mean(self._recent)) - base) > self.config.r_th * base:
            self._start(t + 1, "drift")

    def _maybe_settle(self, t: int) -> None:
        if len(self._decisions) < self.config.horizon:
            return
        tail = self._decisions[-self.config.n_th:]
        if len(set(tail)) == 1:
            self.mode, self.partition = "regular", tail[0]
            self.settled.append((t, tail[0]))
            self._recent.clear()
            self._baseline = []
            self.sync_due = True
        else:  # no consensus: another phase with the same model, forced sampling restarting
            self._decisions = []
            self._phase_start = t + 1
