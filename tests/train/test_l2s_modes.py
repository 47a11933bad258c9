"""L2S's adaptation and regular modes with the delay monitor (Fig. 9)."""

from __future__ import annotations

import numpy as np
import pytest

from edgesplit.errors import ConfigError
from edgesplit.train.bandit import LinUCBE
from edgesplit.train.modes import AdaptiveL2S, ModeConfig

# Three partitions: edge delay = theta . x with x_2 = 0 (pure on-device, p = P)
FEATURES = {0: np.array([1.0, 0.0]), 1: np.array([0.0, 1.0]), 2: np.array([0.0, 0.0])}
DEVICE = [1.0, 3.0, 20.0]


def _run(policy, rounds, theta_at):
    chosen = []
    for t in range(1, rounds + 1):
        arm = policy.select(t)
        edge = float(FEATURES[arm] @ theta_at(t))
        policy.update(arm, edge)
        policy.observe(t, DEVICE[arm] + edge)
        chosen.append(arm)
    return chosen


def _policy(**kw) -> AdaptiveL2S:
    return AdaptiveL2S(lambda horizon: LinUCBE(FEATURES, horizon, 0.5, device_delays=DEVICE),
                       ModeConfig(**kw))


def test_settles_into_regular_mode_on_the_best_partition():
    policy = _policy(horizon=60, n_th=10)
    chosen = _run(policy, 200, lambda t: np.array([2.0, 10.0]))  # p0: 3 ms, p1: 13, P: 20
    assert policy.mode == "regular" and policy.partition == 0
    assert set(chosen[60:]) == {0} and policy.adaptations == [1]


def test_a_delay_drift_starts_a_new_adaptation_that_finds_the_new_best():
    policy = _policy(horizon=60, n_th=10, r=10, r_th=0.3)
    drift = lambda t: np.array([2.0, 10.0]) if t < 100 else np.array([40.0, 1.0])  # noqa: E731
    chosen = _run(policy, 300, drift)
    assert len(policy.adaptations) == 2 and 100 < policy.adaptations[1] <= 125
    assert policy.mode == "regular" and policy.partition == 1  # p1 now: 4 ms
    assert chosen[-1] == 1


def test_random_reentry_happens_at_rate_r_d_without_drift():
    policy = _policy(horizon=20, n_th=5, r_d=0.05, seed=3)
    _run(policy, 400, lambda t: np.array([2.0, 10.0]))
    assert len(policy.adaptations) >= 3  # it re-enters now and then though nothing changed


def test_bad_mode_settings():
    with pytest.raises(ConfigError):
        ModeConfig(horizon=10, n_th=20)
    with pytest.raises(ConfigError):
        ModeConfig(r_d=1.5)


def test_settles_on_pure_on_device_training_despite_forced_sampling():
    # P (20 ms) beats p0 (1 + 40) and p1 (3 + 30): forced rounds keep offloading during
    # adaptation, but the learner's decision is P, so it settles there and stops forcing
    policy = _policy(horizon=40, n_th=10)
    chosen = _run(policy, 150, lambda t: np.array([40.0, 30.0]))
    assert policy.mode == "regular" and policy.partition == 2
    assert set(chosen[:40]) != {2} and set(chosen[40:]) == {2}


def test_sync_is_requested_when_settling_and_when_a_drift_restarts_adaptation():
    policy = _policy(horizon=30, n_th=5, r=5, r_th=0.3)
    due = []
    for t in range(1, 121):
        arm = policy.select(t)
        theta = np.array([2.0, 10.0]) if t < 60 else np.array([40.0, 1.0])
        edge = float(FEATURES[arm] @ theta)
        policy.update(arm, edge)
        policy.observe(t, DEVICE[arm] + edge)
        if policy.sync_due:
            due.append(t)
    assert due[0] == 30  # settled after the first phase
    assert policy.reasons[:2] == ["start", "drift"]
    assert policy.adaptations[1] - 1 in due  # the drift's round asks for a sync


def test_measured_device_delays_replace_the_profile():
    policy = _policy(horizon=20, n_th=5)
    policy.observe_device(0, 2.0)
    policy.observe_device(0, 2.2)
    # played: the mean of what was measured; not played: the profile x the measured ratio
    assert policy.learner.device_delays == pytest.approx({0: 2.1, 1: 3.0 * 2.1, 2: 20.0 * 2.1})
    policy._start(5, "drift")  # a fresh learner starts from the estimates, not the profile
    assert policy.learner.device_delays[2] == pytest.approx(42.0)
