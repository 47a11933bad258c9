"""L2S in the simulator: every policy of the paper's comparison on one model, device, server
and bandwidth trace, with the same noise for all (the document behind
``edgesplit simulate-l2s --json``).

Policies (L2S Section V): ``oracle`` (knows the expected delays), ``fpt`` (fixed at the privacy
point P^c), ``pdt`` (pure on-device), ``linucb`` (plain LinUCB), ``l2s`` (LinUCB-E with weight
synchronisation every 100 rounds) and ``l2s_fws`` (LinUCB-E synchronising at every change).
The bandits see each partition's context features x_p, scaled per feature to [0, 1] (the
linear model absorbs the scale; raw MACs and bytes differ by orders of magnitude), and the
device delay of each partition, which the device measures itself.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.graph import LayerGraph
from edgesplit.hardware import Device
from edgesplit.train.bandit import LinUCB, LinUCBE
from edgesplit.train.features import partition_features
from edgesplit.train.simulator import (BandwidthTrace, CutCost, FixedPolicy, OraclePolicy,
                                       simulate, training_costs)

__all__ = ["POLICIES", "scaled_features", "compare_policies", "SIM_VERSION"]

SIM_VERSION = 1
POLICIES = ("oracle", "fpt", "pdt", "linucb", "l2s", "l2s_fws")


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


def _policy(name: str, costs, trace, features, rounds, p_c, alpha: float):
    allowed = range(p_c, len(costs))
    delays = [c.device_ms for c in costs]
    if name == "oracle":
        return OraclePolicy(costs, trace, list(allowed))
    if name == "fpt":
        return FixedPolicy(p_c)
    if name == "pdt":
        return FixedPolicy(len(costs) - 1)
    if name == "linucb":
        return LinUCB(features, alpha, device_delays=delays, min_partition=p_c)
    return LinUCBE(features, rounds, alpha, device_delays=delays, min_partition=p_c)


def compare_policies(graph: LayerGraph, device: Device, server: Device, trace: BandwidthTrace,
                     rounds: int, *, privacy_split: int | None = None, seed: int = 0,
                     noise: float = 0.05, alpha: float = 1.0, sync_every: int = 100
                     ) -> dict[str, Any]:
    """Run every policy on the same trace and noise; per-round delays and partitions."""
    costs = training_costs(graph, device, server)
    features = scaled_features(graph, costs)
    p_c = _privacy_index(costs, privacy_split)
    out: dict[str, Any] = {}
    for name in POLICIES:
        policy = _policy(name, costs, trace, features, rounds, p_c, alpha)
        start = time.perf_counter()
        log = simulate(costs, trace, policy, rounds, noise=noise, seed=seed,
                       sync_every=None if name == "l2s_fws" else sync_every)
        per_round_us = (time.perf_counter() - start) / rounds * 1e6
        out[name] = {"delays_ms": log.delays_ms,
                     "partitions": [costs[i].split for i in log.partitions],
                     "sync_bytes": log.sync_bytes, "simulated_us_per_round": per_round_us,
                     "mean_delay_ms": float(np.mean(log.delays_ms))}
    return {"version": SIM_VERSION, "model": graph.model, "device": device.name,
            "server": server.name, "rounds": rounds, "seed": seed,
            "trace": {"mbps": trace.mbps, "rtt_ms": trace.rtt_ms, "drop_at": trace.drop_at,
                      "drop_to": trace.drop_to},
            "partitions": [{"split": c.split, "after": c.after, "device_ms": c.device_ms,
                            "server_ms": c.server_ms, "up_bytes": c.up_bytes,
                            "down_bytes": c.down_bytes} for c in costs],
            "privacy_point": costs[p_c].split, "policies": out}
