"""LinUCB / LinUCB-E of L2S (edgesplit.train.bandit): update equations by hand, the
forced-sampling schedule, the on-device trap and its escape, convergence, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesplit.errors import ConfigError
from edgesplit.train.bandit import LinUCB, LinUCBE, forced_sampling_rounds

# --- 1. update equations by hand ---------------------------------------------------------------

# Two offloading cuts and pure on-device (p = 2, x_2 = 0); d^m known; beta = 1, alpha = 1.
HAND_FEATURES = {0: [1.0, 0.0], 1: [1.0, 1.0], 2: [0.0, 0.0]}
HAND_DEVICE = {0: 2.0, 1: 2.0, 2: 5.0}


def test_update_equations_match_hand_computation() -> None:
    L = LinUCB(HAND_FEATURES, alpha=1.0, ridge=1.0, device_delays=HAND_DEVICE)
    np.testing.assert_array_equal(L.A, np.eye(2))  # A_0 = beta I
    np.testing.assert_array_equal(L.b, np.zeros(2))  # b_0 = 0

    # Round 1: theta = 0; scores 2 - 1 = 1, 2 - sqrt 2, 5 -> cut 1.
    assert L.scores() == pytest.approx({0: 1.0, 1: 2.0 - math.sqrt(2.0), 2: 5.0})
    assert L.select(1) == 1
    L.update(1, 3.0)  # A = I + [1 1][1 1]^T, b = [1 1] * 3
    np.testing.assert_allclose(L.A, [[2.0, 1.0], [1.0, 2.0]])
    np.testing.assert_allclose(L.b, [3.0, 3.0])
    np.testing.assert_allclose(L.theta, [1.0, 1.0])  # A^-1 = [[2,-1],[-1,2]]/3

    # Round 2: x^T A^-1 x = 2/3 for both cuts; predictions 2 + 1 and 2 + 2.
    conf = math.sqrt(2.0 / 3.0)
    assert L.confidence(0) == pytest.approx(conf)
    assert L.predict(0) == pytest.approx(3.0)
    assert L.predict(1) == pytest.approx(4.0)
    assert L.score(0) == pytest.approx(3.0 - conf)
    assert L.score(1) == pytest.approx(4.0 - conf)
    assert L.select(2) == 0
    L.update(0, 0.5)
    np.testing.assert_allclose(L.A, [[3.0, 1.0], [1.0, 2.0]])
    np.testing.assert_allclose(L.b, [3.5, 3.0])
    np.testing.assert_allclose(L.theta, [0.8, 1.1])  # A^-1 = [[2,-1],[-1,3]]/5

    # Round 3: scores 2.8 - sqrt(2/5), 3.9 - sqrt(3/5), 5.
    assert L.score(0) == pytest.approx(2.8 - math.sqrt(0.4))
    assert L.score(1) == pytest.approx(3.9 - math.sqrt(0.6))
    assert L.score(2) == pytest.approx(5.0)
    assert L.select(3) == 0

    # The on-device arm gives no edge feedback: A, b unchanged (Algorithm 1 lines 19-20).
    A, b = L.A.copy(), L.b.copy()
    L.update(2, 123.0)
    np.testing.assert_array_equal(L.A, A)
    np.testing.assert_array_equal(L.b, b)
    assert L.predict(2) == 5.0 and L.confidence(2) == 0.0


def test_update_total_subtracts_known_device_delay() -> None:
    a = LinUCB(HAND_FEATURES, device_delays=HAND_DEVICE)
    b = LinUCB(HAND_FEATURES, device_delays=HAND_DEVICE)
    a.update(1, 3.0)
    b.update_total(1, 5.0)  # d = d^m + d^e = 2 + 3
    np.testing.assert_allclose(a.b, b.b)


def test_ties_go_to_lowest_partition_point() -> None:
    L = LinUCB({3: [1.0], 4: [1.0], 5: [0.0]}, alpha=0.0)
    assert L.select(1) == 3


def test_array_features_and_privacy_domain() -> None:
    X = np.array([[1.0, 0.0], [0.5, 0.0], [0.2, 0.0], [0.0, 0.0]])
    L = LinUCB(X, alpha=2.0, device_delays=[0.0, 0.0, 0.0, 1.0], min_partition=1)
    assert L.arms == (1, 2, 3) and L.on_device_arm == 3
    assert all(L.select(t) != 0 for t in range(1, 5))


# --- 2. forced-sampling schedule --------------------------------------------------------------

def test_forced_schedule() -> None:
    assert forced_sampling_rounds(16) == [2, 4, 6, 8, 10, 12, 14, 16]  # 16^0.25 = 2
    assert forced_sampling_rounds(81) == list(range(3, 82, 3))  # 81^0.25 = 3, no float slip
    f500 = forced_sampling_rounds(500)  # 500^0.25 = 4.7287...: t_n = floor(n * 4.7287)
    assert f500[:6] == [4, 9, 14, 18, 23, 28]
    assert len(f500) == math.floor(500 ** 0.75) == 105
    assert forced_sampling_rounds(1) == [1]
    assert forced_sampling_rounds(10, mu=0.0) == list(range(1, 11))
    assert forced_sampling_rounds(10, mu=1.0) == [10]
    assert forced_sampling_rounds(100, mu=0.5) == list(range(10, 101, 10))


def test_forced_arm_is_best_offloading_cut_only_when_linucb_would_pick_on_device() -> None:
    # On-device looks best (d^m_P = 0), so outside F the learner plays P; in F it plays the
    # offloading cut with the lowest score (cut 1 here), never round-robin.
    feats = {0: [2.0, 0.0], 1: [1.0, 0.0], 2: [0.0, 1.0], 3: [0.0, 0.0]}
    # theta_hat = 0, A = I: scores 3 - 1, 2 - 0.5, 4 - 0.5, 0.
    E = LinUCBE(feats, horizon=16, alpha=0.5, device_delays={0: 3, 1: 2, 2: 4, 3: 0})
    assert E.forced_rounds() == [2, 4, 6, 8, 10, 12, 14, 16]
    assert E.forced_rounds(81) == list(range(3, 82, 3))
    assert [E.is_forced(t) for t in range(1, 6)] == [False, True, False, True, False]
    for t in range(1, 17):
        expect = 1 if t % 2 == 0 else 3
        assert E.select(t) == expect
    assert E.select(17) == 3  # past T: never forced
    # Where LinUCB would not pick P anyway, forcing changes nothing.
    E2 = LinUCBE(feats, horizon=16, alpha=0.5, device_delays={0: 1, 1: 1, 2: 3, 3: 9})
    assert [E2.select(t) for t in range(1, 9)] == [LinUCB(feats, 0.5, device_delays={
        0: 1, 1: 1, 2: 3, 3: 9}).select(t) for t in range(1, 9)]


# --- 3. the on-device trap ----------------------------------------------------------------------

TRAP_FEATURES = {1: [2.0, 1.0], 2: [1.0, 0.5], 3: [0.0, 0.0]}  # x_2 = x_1 / 2, x_P = 0
TRAP_DEVICE = {1: 1.0, 2: 2.0, 3: 6.0}
TRAP_THETA = np.array([1.0, 1.0])  # true d^e: 3.0 and 1.5 -> totals 4.0, 3.5, 6.0: best is 2


def _run_trap(learner: LinUCB, horizon: int) -> list[int]:
    """Round 1's edge delay has a one-off 20 ms spike (a stalled link); then tiny noise."""
    rng = np.random.default_rng(0)
    chosen = []
    for t in range(1, horizon + 1):
        p = learner.select(t)
        chosen.append(p)
        spike = 20.0 if t == 1 else rng.normal(0.0, 0.05)
        edge = 0.0 if p == 3 else float(TRAP_THETA @ np.asarray(TRAP_FEATURES[p])) + spike
        learner.update(p, edge)
    return chosen


def test_linucb_trapped_on_device_linucbe_escapes() -> None:
    T = 200
    plain = LinUCB(TRAP_FEATURES, alpha=0.5, device_delays=TRAP_DEVICE)
    chosen = _run_trap(plain, T)
    # Round 1 offloads (theta_hat = 0 looks optimistic), the spike makes offloading look slow,
    # P looks best, gives no feedback, and nothing ever changes again (Section IV-B-1).
    assert chosen[0] == 1
    assert set(chosen[1:]) == {3}
    A1 = np.eye(2) + np.outer(TRAP_FEATURES[1], TRAP_FEATURES[1])
    np.testing.assert_allclose(plain.A, A1)

    escaping = LinUCBE(TRAP_FEATURES, horizon=T, alpha=0.5, device_delays=TRAP_DEVICE)
    chosen_e = _run_trap(escaping, T)
    forced = set(escaping.forced_rounds())
    # Every forced round while trapped samples the best-looking offloading cut (2).
    assert chosen_e[1] == 3 and all(chosen_e[t - 1] == 2 for t in forced)
    tail = chosen_e[int(0.8 * T):]
    assert tail.count(2) / len(tail) >= 0.9
    assert chosen_e[-1] == 2
    # The spike still biases the least-squares fit a little; P (6.0) is far behind.
    assert escaping.predict(2) == pytest.approx(3.5, abs=0.5)

    def total(ch: list[int]) -> float:
        return sum(TRAP_DEVICE[p] + float(TRAP_THETA @ np.asarray(TRAP_FEATURES[p])) for p in ch)
    assert total(chosen_e) < total(chosen)


# --- 4. convergence on a noisy linear model --------------------------------------------------

def test_linucbe_converges_on_linear_model() -> None:
    # Columns: conv MACs, fc MACs, IR size of the back end (shrink with p); p = 7 on-device.
    X = np.array([[3.0, 1.0, 4.0], [2.6, 1.0, 3.5], [2.2, 1.0, 2.5], [1.6, 1.0, 1.0],
                  [1.2, 0.8, 1.2], [0.8, 0.6, 0.8], [0.4, 0.3, 0.5], [0.0, 0.0, 0.0]])
    device = np.array([0.5, 1.0, 1.5, 2.0, 3.5, 3.0, 6.0, 20.0])
    theta = np.array([1.5, 1.0, 0.8])
    true_total = device + X @ theta  # 9.2 8.7 7.8 6.2 7.06 5.44 7.3 20
    best = 5  # not the first cut tried: the learner has to move 1 -> 3 -> 5
    assert int(np.argmin(true_total[1:])) + 1 == best

    rng = np.random.default_rng(7)
    T = 500
    E = LinUCBE(X, horizon=T, alpha=1.0, device_delays=device, min_partition=1)
    chosen = []
    for t in range(1, T + 1):
        p = E.select(t)
        chosen.append(p)
        edge = 0.0 if p == E.on_device_arm else float(X[p] @ theta) + rng.normal(0.0, 1.0)
        E.update(p, edge)
    tail = chosen[int(0.8 * T):]
    assert 0 not in chosen  # below P^c: outside the privacy domain
    assert tail.count(best) / len(tail) >= 0.9


# --- 5. bad inputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"features": {}}, "empty"),
    ({"features": np.zeros((0, 2))}, "empty"),
    ({"features": np.zeros(3)}, "2-D"),
    ({"features": {0: [1.0, 2.0], 1: [1.0]}}, "same length"),
    ({"features": {0: [1.0, float("nan")]}}, "NaN"),
    ({"features": {0: []}}, "non-empty"),
    ({"features": {"a": [1.0]}}, "ints"),
    ({"features": {0: [1.0], 1: [0.0]}, "alpha": -1.0}, "alpha"),
    ({"features": {0: [1.0], 1: [0.0]}, "ridge": 0.0}, "ridge"),
    ({"features": {0: [1.0], 1: [0.0]}, "min_partition": 5}, "P\\^c"),
    ({"features": {0: [1.0], 1: [0.0]}, "device_delays": {0: 1.0}}, "d_p\\^m"),
    ({"features": {0: [1.0], 1: [0.0]}, "device_delays": [1.0]}, "device_delays"),
])
def test_bad_config_raises(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        LinUCB(**kwargs)


def test_bad_calls_raise() -> None:
    L = LinUCB({0: [1.0], 1: [0.0]})
    with pytest.raises(ConfigError, match="not in the partition domain"):
        L.update(7, 1.0)
    with pytest.raises(ConfigError, match="finite"):
        L.update(0, float("inf"))
    with pytest.raises(ConfigError, match="round_index"):
        L.select(0)
    with pytest.raises(ConfigError, match="horizon"):
        LinUCBE({0: [1.0], 1: [0.0]}, horizon=0)
    with pytest.raises(ConfigError, match="mu"):
        LinUCBE({0: [1.0], 1: [0.0]}, horizon=10, mu=-0.1)
    with pytest.raises(ConfigError, match="offloading"):
        LinUCBE({0: [0.0]}, horizon=10)


# --- 6. the estimator contract ------------------------------------------------------------------

X_CONTRACT = np.array([[1.0, 0.0], [0.5, 0.0], [0.2, 1.0], [0.0, 0.0]])

def test_parameters_are_stored_as_given_and_state_is_learned_later() -> None:
    from sklearn.base import clone

    delays = [0.0, 0.0, 0.0, 1.0]
    E = LinUCBE(X_CONTRACT, horizon=16, alpha=2.0, device_delays=delays, min_partition=1)
    assert E.get_params() == {"features": X_CONTRACT, "horizon": 16, "alpha": 2.0, "ridge": 1.0,
                              "mu": 0.25, "device_delays": delays, "min_partition": 1,
                              "delay_scale": 1.0}
    assert E.get_params()["features"] is X_CONTRACT
    assert not hasattr(E, "A_") and not hasattr(E, "arms_")  # nothing learned in __init__
    E.select(1)
    assert E.arms_ == (1, 2, 3) and E.device_delays_ == {1: 0.0, 2: 0.0, 3: 1.0}
    twin = clone(E)  # scikit-learn can rebuild it from its parameters
    assert type(twin) is LinUCBE and not hasattr(twin, "A_")
    assert [twin.select(t) for t in range(1, 5)] == [LinUCBE(**E.get_params()).select(t)
                                                     for t in range(1, 5)]


def test_set_params_checks_and_new_device_delays_apply_at_once() -> None:
    L = LinUCB(HAND_FEATURES, device_delays=HAND_DEVICE)
    L.update(0, 3.0)
    A = L.A.copy()
    with pytest.raises(ConfigError, match="alpha"):
        L.set_params(alpha=-1.0)
    with pytest.raises(ConfigError, match="no parameter"):
        L.set_params(beta=1.0)
    assert L.alpha == 1.0 and L.device_delays is HAND_DEVICE  # a refused value changes nothing
    L.set_params(device_delays={p: 100.0 * p for p in L.arms})
    assert L.predict(2) == pytest.approx(200.0 + L.predict_edge(2))
    np.testing.assert_array_equal(L.A, A)  # learning goes on
    np.testing.assert_array_equal(L.reset().A, np.eye(2))
