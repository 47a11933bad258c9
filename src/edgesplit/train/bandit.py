"""Online partition learning of L2S (Zhang & Xu, "Learning the Optimal Partition for
Collaborative DNN Training with Privacy Requirements", Section IV-B): LinUCB and LinUCB-E.

The learner picks, every training round t = 1, 2, ..., a partition point p from the privacy
domain P' = {P^c, ..., P} of problem (1) (cuts before P^c leak too much). Layers 1..p train on the
end device, the rest on the edge server; p = P is pure on-device training.

Sign convention (as in the paper, eq. (2)): the learner *minimises delay*. The end-to-end delay
of p is d_p^m + d_p^e, where d_p^m (end-device training delay, called d_p^front in Algorithm 1)
is known from profiling and the edge training delay d_p^e = theta^T x_p (linear model of
Section IV-A-2) is learned from feedback. The score minimised is a *lower* confidence bound on
delay, d_p^m + theta_hat^T x_p - alpha * sqrt(x_p^T A^{-1} x_p): optimism under uncertainty for
a cost.

One model is shared by all arms (a single d x d matrix A and d-vector b, Section IV-B-1): what
is learned from one cut transfers to the others through their features. A_0 = beta I_d, b_0 = 0
(Algorithm 1 line 5); ``ridge`` is beta.

The pure on-device arm P is special (Section IV-B-1): its edge delay is 0 whatever theta is, so
it gives no feedback and A, b are left unchanged when it is played (Algorithm 1 lines 16-20).
Plain LinUCB can therefore get stuck on it forever; LinUCB-E forbids it in the forced-sampling
rounds F = {t = n T^mu, t <= T} so that learning goes on.

Features x_p are inputs (eight counts per cut in the paper: MACs and weights per layer type and
the two intermediate data sizes); this module never computes them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, Self

import numpy as np

from edgesplit.errors import ConfigError

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MU",
    "LinUCB",
    "LinUCBE",
    "forced_sampling_rounds",
]

DEFAULT_ALPHA = 1.0
"""Exploration weight alpha of eq. (2), in units of ``delay_scale``; the paper gives no value,
1.0 is the LinUCB custom."""

DEFAULT_MU = 0.25
"""Forced-sampling exponent mu; 0.25 minimises the regret bound of Theorem 1 (O(T^0.75 log T))."""

FeatureInput = Mapping[int, "np.ndarray | Sequence[float]"] | np.ndarray
DelayInput = Mapping[int, float] | Sequence[float] | np.ndarray | None


def _as_arm_table(features: FeatureInput) -> dict[int, np.ndarray | Sequence[float]]:
    """Arm index -> feature row (checked by :func:`_check_vectors`); an array's row i is
    partition point i."""
    if isinstance(features, np.ndarray):
        if features.ndim != 2:
            raise ConfigError(
                f"features: a 2-D array (one row per partition point) is needed, got shape "
                f"{features.shape}; pass a mapping {{p: x_p}} for a sparse domain")
        return {i: features[i] for i in range(features.shape[0])}
    if not isinstance(features, Mapping):
        raise ConfigError(f"features: expected a mapping {{p: x_p}} or a 2-D numpy array, got "
                          f"{type(features).__name__}")
    table: dict[int, np.ndarray | Sequence[float]] = {}
    for p, x in features.items():
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
            raise ConfigError(f"features: partition points must be ints, got {p!r}")
        table[int(p)] = x
    return table


def _check_vectors(table: Mapping[int, object]) -> dict[int, np.ndarray]:
    """Every x_p a finite 1-D float vector of one common, non-zero length d."""
    out: dict[int, np.ndarray] = {}
    for p, x in sorted(table.items()):
        vec = np.asarray(x, dtype=float)
        if vec.ndim != 1 or vec.size == 0:
            raise ConfigError(f"features: x_{p} must be a non-empty 1-D vector, got shape "
                              f"{vec.shape}")
        if not np.all(np.isfinite(vec)):
            raise ConfigError(f"features: x_{p} has NaN or inf entries; give finite counts")
        out[p] = vec
    sizes = {v.size for v in out.values()}
    if len(sizes) > 1:
        detail = ", ".join(f"x_{p}: {v.size}" for p, v in out.items())
        raise ConfigError(f"features: every x_p must have the same length d, got {detail}")
    return out


def _domain(table: dict[int, np.ndarray], min_partition: int | None) -> dict[int, np.ndarray]:
    """Restrict to the privacy domain {P^c, ..., P} of problem (1)."""
    if not table:
        raise ConfigError("features: the partition domain is empty; give x_p for at least one "
                          "partition point")
    if min_partition is None:
        return table
    kept = {p: x for p, x in table.items() if p >= min_partition}
    if not kept:
        raise ConfigError(f"min_partition={min_partition} (P^c) is after every partition point "
                          f"given (last is {max(table)}); lower P^c or give more points")
    return kept


def _device_delays(delays: DelayInput, arms: Sequence[int]) -> dict[int, float]:
    """Known end-device delay d_p^m per arm (0 for all when not given)."""
    if delays is None:
        return {p: 0.0 for p in arms}
    if isinstance(delays, Mapping):
        missing = [p for p in arms if p not in delays]
        if missing:
            raise ConfigError(f"device_delays: no d_p^m for partition points {missing}")
        values = {p: delays[p] for p in arms}
    else:
        seq = np.asarray(delays, dtype=float)
        if seq.ndim != 1 or seq.size <= max(arms):
            raise ConfigError(f"device_delays: a 1-D sequence indexed by partition point with at "
                              f"least {max(arms) + 1} entries is needed, got shape {seq.shape}")
        values = {p: seq[p] for p in arms}
    out = {p: float(v) for p, v in values.items()}
    bad = [p for p, v in out.items() if not math.isfinite(v)]
    if bad:
        raise ConfigError(f"device_delays: d_p^m is NaN or inf for partition points {bad}")
    return out


def _check_nonneg(name: str, value: float) -> float:
    if not (isinstance(value, (int, float, np.floating)) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_round(t: int) -> int:
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise ConfigError(f"round_index must be an int >= 1 (rounds are numbered 1..T as in "
                          f"Algorithm 1), got {t!r}")
    return int(t)


def forced_sampling_rounds(horizon: int, mu: float = DEFAULT_MU) -> list[int]:
    """The forced-sampling sequence F = {t | t = n T^mu, t <= T, n = 1, 2, ...} (Section IV-B-2).

    T^mu is rarely an integer, so round n is t_n = floor(n T^mu): exactly n T^mu when T^mu is an
    integer, otherwise the same average spacing T^mu and floor(T^(1 - mu)) forced rounds, the
    count behind the O(T^(1 - mu)) term of Theorem 1. (A tiny tolerance keeps e.g. 81^0.25 = 3
    from flooring to 2.999... .)
    """
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ConfigError(f"horizon T must be an int >= 1 (number of training rounds), got "
                          f"{horizon!r}")
    mu = _check_mu(mu)
    step = float(horizon) ** mu
    rounds, n = [], 1
    while (t := math.floor(n * step + 1e-9)) <= horizon:
        rounds.append(t)
        n += 1
    return rounds


def _check_mu(mu: float) -> float:
    # mu < 0 would make the spacing T^mu < 1 (repeated rounds); mu > 1 leaves no round <= T.
    if not (isinstance(mu, (int, float, np.floating)) and 0.0 <= mu <= 1.0):
        raise ConfigError(f"mu must be in [0, 1] (Theorem 1 wants 0 < mu < 0.5, 0.25 is best), "
                          f"got {mu!r}")
    return float(mu)


class LinUCB:
    """Plain LinUCB for L2S (Section IV-B-1, selection rule eq. (2)), cost-minimising.

    Parameters
    ----------
    features:
        x_p per partition point: a mapping {p: x_p} or a 2-D array whose row i is x_i. All
        vectors share one length d. The largest p is P, pure on-device training; the paper's x_P
        is the zero vector and its edge delay is 0 by definition, so x_P is never used.
    alpha:
        Exploration weight alpha >= 0 of eq. (2).
    ridge:
        beta > 0 of A_0 = beta I_d (Algorithm 1 line 5).
    device_delays:
        Known end-device training delay d_p^m (ms) per partition point (mapping, or sequence
        indexed by p); all zero if omitted, and then the learner is a plain edge-delay LinUCB.
    min_partition:
        P^c: partition points p < P^c are outside the privacy domain and never chosen.
    delay_scale:
        The unit of ``alpha`` in milliseconds: the bonus is alpha * delay_scale * width. The
        width sqrt(x^T A^-1 x) is a pure number (features are scaled), while delays are in ms
        and span 1 ms to minutes between settings, so a fixed alpha in ms explores far too much
        on one model and not at all on another. Callers pass a delay the device knows, e.g.
        its pure on-device delay d_P^m; the default 1.0 keeps alpha in ms as in eq. (2).

    The parameters are stored as given (``get_params``) and checked at construction; the
    learned state is created by :meth:`reset`, which the first decision or update calls:
    ``A_`` (d x d) and ``b_`` (d), the paper's auxiliary variables A_t, b_t (also read as
    ``A`` and ``b``), the domain's ``arms_``, its checked ``features_`` and the d_p^m in use
    ``device_delays_`` (which L2S's modes refine as the device measures them). ``theta`` is
    theta_hat = A^{-1} b. Ties in the argmin go to the lowest partition point
    (earliest cut), so the learner is deterministic.
    """

    # learned state, created by reset()
    features_: dict[int, np.ndarray]
    arms_: tuple[int, ...]
    device_delays_: dict[int, float]
    A_: np.ndarray
    b_: np.ndarray

    def __init__(self, features: FeatureInput, alpha: float = DEFAULT_ALPHA, ridge: float = 1.0,
                 *, device_delays: DelayInput = None, min_partition: int | None = None,
                 delay_scale: float = 1.0) -> None:
        self.features = features
        self.alpha = alpha
        self.ridge = ridge
        self.device_delays = device_delays
        self.min_partition = min_partition
        self.delay_scale = delay_scale
        self._arm_table()  # a bad parameter fails here, where it was given

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The ``__init__`` parameters as given (the scikit-learn estimator contract)."""
        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {name: getattr(self, name) for name in names}

    def set_params(self, **params: Any) -> Self:
        """Set ``__init__`` parameters, checked. ``alpha``, ``delay_scale`` and
        ``device_delays`` (d_p^m, which L2S refines as the device measures them) apply from the
        next decision on; the others from the next :meth:`reset`."""
        unknown = sorted(set(params) - set(self.get_params()))
        if unknown:
            raise ConfigError(f"{type(self).__name__} has no parameter(s) {unknown}; "
                              f"it has {sorted(self.get_params())}")
        old = self.get_params()
        self.__dict__.update(params)
        try:
            self._arm_table()
        except ConfigError:
            self.__dict__.update(old)  # a refused value changes nothing
            raise
        if hasattr(self, "A_") and "device_delays" in params:
            self.device_delays_ = _device_delays(self.device_delays, self.arms_)
        return self

    def _arm_table(self) -> dict[int, np.ndarray]:
        """The checked x_p of the privacy domain; checks every parameter."""
        table = _domain(_check_vectors(_as_arm_table(self.features)), self.min_partition)
        _check_nonneg("alpha", self.alpha)
        if _check_nonneg("delay_scale", self.delay_scale) == 0:
            raise ConfigError("delay_scale must be > 0 ms (the unit of alpha)")
        if _check_nonneg("ridge (beta of A_0 = beta I)", self.ridge) == 0:
            raise ConfigError("ridge must be > 0: A_0 = beta I has to be invertible for "
                              "theta_hat = A^{-1} b before any feedback")
        _device_delays(self.device_delays, tuple(sorted(table)))
        return table

    def reset(self) -> Self:
        """Start learning afresh (Algorithm 1 line 5): A_0 = beta I, b_0 = 0. The first
        decision or update does this; learned state ends with ``_``."""
        table = self._arm_table()
        self.features_ = table
        self.arms_ = tuple(sorted(table))
        self.device_delays_ = _device_delays(self.device_delays, self.arms_)
        self.A_ = float(self.ridge) * np.eye(next(iter(table.values())).size)
        self.b_ = np.zeros(self.A_.shape[0])
        return self

    def _learned(self) -> Self:
        return self if hasattr(self, "A_") else self.reset()

    # read-only views of the learned state under the paper's names
    @property
    def A(self) -> np.ndarray:
        """A_t (d x d)."""
        return self._learned().A_

    @property
    def b(self) -> np.ndarray:
        """b_t (d)."""
        return self._learned().b_

    @property
    def arms(self) -> tuple[int, ...]:
        """The partition points of the privacy domain, increasing."""
        return self._learned().arms_

    @property
    def on_device_arm(self) -> int:
        """P: everything trained on the end device (the last arm)."""
        return self.arms[-1]

    @property
    def dim(self) -> int:
        """d, the length of every x_p."""
        return self.A.shape[0]

    # --- model -------------------------------------------------------------------------------
    @property
    def theta(self) -> np.ndarray:
        """theta_hat_t = A_{t-1}^{-1} b_{t-1} (Algorithm 1 line 7)."""
        return np.linalg.solve(self.A, self.b)

    def _arm(self, arm: int) -> int:
        if isinstance(arm, bool) or not isinstance(arm, (int, np.integer)) or arm not in \
                self._learned().device_delays_:
            raise ConfigError(f"arm {arm!r} is not in the partition domain {list(self.arms)}")
        return int(arm)

    def confidence(self, arm: int) -> float:
        """Width sqrt(x_p^T A^{-1} x_p) of eq. (2); 0 for the on-device arm (no edge part)."""
        arm = self._arm(arm)
        if arm == self.on_device_arm:
            return 0.0
        x = self.features_[arm]
        return float(math.sqrt(max(float(x @ np.linalg.solve(self.A, x)), 0.0)))

    def predict_edge(self, arm: int) -> float:
        """Predicted edge training delay theta_hat^T x_p (0 for p = P, Section IV-B-1)."""
        arm = self._arm(arm)
        if arm == self.on_device_arm:
            return 0.0
        return float(self.theta @ self.features_[arm])

    def predict(self, arm: int) -> float:
        """Predicted end-to-end delay d_p^m + theta_hat^T x_p (no exploration bonus)."""
        arm = self._arm(arm)
        return self.device_delays_[arm] + self.predict_edge(arm)

    def score(self, arm: int) -> float:
        """Lower confidence bound minimised by eq. (2) / Algorithm 1 lines 9-14:
        d_p^m + theta_hat^T x_p - alpha sqrt(x_p^T A^{-1} x_p) (alpha in ``delay_scale`` units)."""
        return self.predict(arm) - self.alpha * self.delay_scale * self.confidence(arm)

    def scores(self) -> dict[int, float]:
        """score(p) for every p in the domain."""
        return {p: self.score(p) for p in self.arms}

    # --- decisions ---------------------------------------------------------------------------
    def _argmin(self, candidates: Sequence[int]) -> int:
        # One solve for theta and one for A^-1 X per round (not two per arm): the decision
        # overhead is a benchmark figure. np.argmin keeps the lowest p on ties.
        arms = list(candidates)
        x = np.stack([self.features_[p] for p in arms])
        theta = np.linalg.solve(self.A_, self.b_)
        width = np.sqrt(np.maximum(np.einsum("ij,ji->i", x, np.linalg.solve(self.A_, x.T)), 0.0))
        edge = x @ theta - self.alpha * self.delay_scale * width
        edge[[p == self.on_device_arm for p in arms]] = 0.0  # no edge part at p = P
        scores = np.array([self.device_delays_[p] for p in arms]) + edge
        return arms[int(np.argmin(scores))]

    def select(self, round_index: int) -> int:
        """Partition point for round t (eq. (2)); t only matters to LinUCB-E."""
        _check_round(round_index)
        return self._argmin(self.arms)

    def best_estimate(self) -> int:
        """The partition with the lowest *predicted* delay d_p^m + theta_hat^T x_p (no
        exploration bonus): what the learner currently believes is optimal. L2S's mode switch
        judges convergence on these decisions and trains on the last one in regular mode."""
        x = np.stack([self.features_[p] for p in self.arms])
        edge = x @ np.linalg.solve(self.A, self.b)
        edge[-1] = 0.0  # the last arm is P: no edge part
        delays = np.array([self.device_delays_[p] for p in self.arms]) + edge
        return self.arms[int(np.argmin(delays))]

    def update(self, arm: int, delay_ms: float) -> None:
        """Feed back the observed *edge* training delay d_{p_t}^e of the round played with arm.

        A_t = A_{t-1} + x x^T and b_t = b_{t-1} + x d^e (Algorithm 1 line 17); for the
        on-device arm nothing changes (lines 19-20: no edge feedback exists).
        """
        arm = self._arm(arm)
        if not (isinstance(delay_ms, (int, float, np.floating)) and math.isfinite(delay_ms)):
            raise ConfigError(f"delay_ms must be a finite number, got {delay_ms!r}")
        if arm == self.on_device_arm:
            return
        x = self.features_[arm]
        self.A_ += np.outer(x, x)
        self.b_ += x * float(delay_ms)

    def update_total(self, arm: int, total_delay_ms: float) -> None:
        """Same as :meth:`update` from a measured end-to-end delay: d^e = d - d_p^m."""
        arm = self._arm(arm)
        if not (isinstance(total_delay_ms, (int, float, np.floating))
                and math.isfinite(total_delay_ms)):
            raise ConfigError(f"total_delay_ms must be a finite number, got {total_delay_ms!r}")
        self.update(arm, float(total_delay_ms) - self.device_delays_[arm])


class LinUCBE(LinUCB):
    """LinUCB-E (Algorithm 1): LinUCB plus forced sampling to escape pure on-device training.

    In a forced round t in F (:func:`forced_sampling_rounds`) the argmin of the same score runs
    over P' minus {P} (line 12): the learner plays the best-looking *offloading* cut, not a
    round-robin one. Outside F it is plain LinUCB (line 14). Forced sampling changes nothing
    in a round where LinUCB would not have picked P anyway. F needs the horizon T up front; rounds
    after T are never forced.

    Extra parameters: ``horizon`` (T >= 1) and ``mu`` (default 0.25, in [0, 1]).
    """

    def __init__(self, features: FeatureInput, horizon: int, alpha: float = DEFAULT_ALPHA,
                 ridge: float = 1.0, *, mu: float = DEFAULT_MU, device_delays: DelayInput = None,
                 min_partition: int | None = None, delay_scale: float = 1.0) -> None:
        self.horizon = horizon
        self.mu = mu
        super().__init__(features, alpha, ridge, device_delays=device_delays,
                         min_partition=min_partition, delay_scale=delay_scale)

    forced_: frozenset[int]  # learned state: F, created by reset()

    def _arm_table(self) -> dict[int, np.ndarray]:
        table = super()._arm_table()
        if len(table) < 2:
            raise ConfigError(f"LinUCB-E needs at least one offloading partition point besides "
                              f"pure on-device p={max(table)}; lower min_partition (P^c)")
        forced_sampling_rounds(self.horizon, _check_mu(self.mu))  # validates T and mu
        return table

    def reset(self) -> Self:
        super().reset()
        self.forced_ = frozenset(forced_sampling_rounds(self.horizon, self.mu))
        return self

    def forced_rounds(self, horizon: int | None = None) -> list[int]:
        """F for this learner's T (or for another T with the same mu), increasing."""
        if horizon is None:
            return sorted(self._learned().forced_)
        return forced_sampling_rounds(horizon, self.mu)

    def is_forced(self, round_index: int) -> bool:
        """Whether t is in F, i.e. p = P is not an option in round t."""
        return _check_round(round_index) in self._learned().forced_

    def select(self, round_index: int) -> int:
        """Algorithm 1 lines 11-14."""
        if self.is_forced(round_index):
            return self._argmin(self.arms[:-1])  # P' without P (P is the last arm)
        return self._argmin(self.arms)
