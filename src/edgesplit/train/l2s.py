"""L2S in the simulator: every policy of the paper's comparison on one model, device, server
and bandwidth trace, with the same noise for all (the document behind
``edgesplit simulate-l2s --json``).

Policies (L2S Section V): ``oracle`` (knows the expected delays), ``fpt`` (fixed at the privacy
point P^c), ``pdt`` (pure on-device), ``linucb`` (plain LinUCB, no modes), ``l2s`` (LinUCB-E
inside the adaptation/regular modes of Fig. 9, weight sync every 100 rounds and at mode
changes) and ``l2s_fws`` (the same, synchronising at every partition change).
The bandits see each partition's context features x_p, scaled per feature to [0, 1] (the
linear model absorbs the scale; raw MACs and bytes differ by orders of magnitude), and the
device delay of each partition, which the device measures itself. Their exploration weight
alpha is in units of the pure on-device delay d_P^m (see ``LinUCB``'s ``delay_scale``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.graph import LayerGraph
from edgesplit.hardware import Device
from edgesplit.train.bandit import LinUCB, LinUCBE
from edgesplit.train.features import partition_features
from edgesplit.train.modes import AdaptiveL2S, ModeConfig
from edgesplit.train.simulator import (
    BandwidthTrace,
    CutCost,
    FixedPolicy,
    OraclePolicy,
    simulate,
    training_costs,
)

__all__ = [
    "L2S_ALPHA",
    "L2S_RIDGE",
    "POLICIES",
    "SIM_VERSION",
    "OracleCut",
    "compare_policies",
    "oracle_cut",
    "scaled_features",
]

SIM_VERSION = 2
L2S_ALPHA = 0.3
"""Default exploration weight, in units of d_P^m (the paper gives no value): chosen by the sweep
in benchmarks/bench_l2s.py on its tuning settings, which are disjoint from the settings it
reports."""
L2S_RIDGE = 0.03
"""Default beta of A_0 = beta I (Algorithm 1 line 5), chosen by the same sweep on the same
tuning settings."""
POLICIES = ("oracle", "fpt", "pdt", "linucb", "l2s", "l2s_fws")


@dataclass(frozen=True)
class OracleCut:
    """Where the Oracle trains in the first round: ``split`` layers on the device. ``kind`` is
    ``"on-device"`` (pure on-device training, p = P), ``"earliest"`` (the earliest cut allowed:
    P^c with a privacy point, else one layer) or ``"interior"`` (neither: the case of L2S
    Fig. 1, where a learner has to find a middle cut)."""

    split: int
    kind: Literal["on-device", "earliest", "interior"]


def oracle_cut(graph: LayerGraph, device: Device, server: Device, trace: BandwidthTrace, *,
               privacy_split: int | None = None) -> OracleCut:
    """The Oracle's cut at round 1 of ``trace`` (expected delays, no noise, no sync)."""
    costs = training_costs(graph, device, server)
    p_c = _privacy_index(costs, privacy_split)
    arm = OraclePolicy(costs, trace, list(range(p_c, len(costs)))).select(1)
    kind: Literal["on-device", "earliest", "interior"] = "interior"
    if arm == len(costs) - 1:
        kind = "on-device"
    elif arm == p_c:
        kind = "earliest"
    return OracleCut(costs[arm].split, kind)


def scaled_features(graph: LayerGraph, costs: list[CutCost]) -> dict[int, np.ndarray]:
    """x_p per partition (keyed by index into ``costs``), each feature divided by its largest
    value over the partitions."""
    rows = np.stack([partition_features(graph, c.split - 1) for c in costs])
    scale = rows.max(axis=0)
    scale[scale == 0] = 1.0
    return {i: rows[i] / scale for i in range(len(costs))}


def _privacy_index(costs: list[CutCost], privacy_split: int | None) -> int:
    """The first partition at or after ``privacy_split`` layers on the device (P^c)."""
    if privacy_split is None:
        return 0
    for i, c in enumerate(costs):
        if c.split >= privacy_split:
            return i
    raise ConfigError(f"no partition keeps {privacy_split} layers on the device")


def _policy(name: str, costs, trace, features, p_c, alpha: float, ridge: float,
            modes: ModeConfig):
    allowed = range(p_c, len(costs))
    delays = [c.device_ms for c in costs]
    learner = dict(ridge=ridge, device_delays=delays, min_partition=p_c,
                   delay_scale=costs[-1].device_ms)
    if name == "oracle":
        return OraclePolicy(costs, trace, list(allowed))
    if name == "fpt":
        return FixedPolicy(p_c)
    if name == "pdt":
        return FixedPolicy(len(costs) - 1)
    if name == "linucb":
        return LinUCB(features, alpha, **learner)
    return AdaptiveL2S(lambda horizon: LinUCBE(features, horizon, alpha, **learner), modes)


def _prediction_error(log) -> list[float | None]:
    """|predicted - observed| / observed edge delay per round (L2S Fig. 10); None in rounds
    that offload nothing."""
    return [None if pred is None or obs <= 0 else abs(pred - obs) / obs
            for pred, obs in zip(log.predicted_edge_ms, log.edge_ms, strict=True)]


def compare_policies(graph: LayerGraph, device: Device, server: Device, trace: BandwidthTrace,
                     rounds: int, *, privacy_split: int | None = None, seed: int = 0,
                     noise: float = 0.05, alpha: float = L2S_ALPHA, sync_every: int = 100,
                     ridge: float = L2S_RIDGE, modes: ModeConfig | None = None,
                     privacy: dict | None = None
                     ) -> dict[str, Any]:
    """Run every policy on the same trace and noise; per-round delays and partitions.
    ``privacy`` (e.g. the KL analysis behind ``privacy_split``) is copied into the document."""
    modes = modes or ModeConfig(seed=seed)
    costs = training_costs(graph, device, server)
    features = scaled_features(graph, costs)
    p_c = _privacy_index(costs, privacy_split)
    out: dict[str, Any] = {}
    for name in POLICIES:
        policy = _policy(name, costs, trace, features, p_c, alpha, ridge, modes)
        start = time.perf_counter()
        log = simulate(costs, trace, policy, rounds, noise=noise, seed=seed,
                       sync_every=None if name == "l2s_fws" else sync_every)
        per_round_us = (time.perf_counter() - start) / rounds * 1e6
        out[name] = {"delays_ms": log.delays_ms,
                     "partitions": [costs[i].split for i in log.partitions],
                     "sync_bytes": log.sync_bytes, "simulated_us_per_round": per_round_us,
                     "mean_delay_ms": float(np.mean(log.delays_ms))}
        if name in ("linucb", "l2s", "l2s_fws"):
            out[name]["prediction_error"] = _prediction_error(log)
        if isinstance(policy, AdaptiveL2S):
            out[name]["adaptations"] = [{"round": t, "reason": r}
                                        for t, r in zip(policy.adaptations, policy.reasons,
                                                        strict=True)]
            out[name]["settled"] = [{"round": t, "partition": costs[arm].split}
                                    for t, arm in policy.settled]
    return {"version": SIM_VERSION, "model": graph.model, "device": device.name,
            "server": server.name, "rounds": rounds, "seed": seed,
            "trace": {"mbps": trace.mbps, "rtt_ms": trace.rtt_ms, "drop_at": trace.drop_at,
                      "drop_to": trace.drop_to, "restore_at": trace.restore_at,
                      "mbps_per_round": [trace.at(t) for t in range(1, rounds + 1)]},
            "partitions": [{"split": c.split, "after": c.after, "device_ms": c.device_ms,
                            "server_ms": c.server_ms, "up_bytes": c.up_bytes,
                            "down_bytes": c.down_bytes} for c in costs],
            "privacy_point": costs[p_c].split, "privacy": privacy, "alpha": alpha,
            "modes": {"horizon": modes.horizon, "n_th": modes.n_th, "r": modes.r,
                      "r_th": modes.r_th, "r_d": modes.r_d},
            "policies": out}
