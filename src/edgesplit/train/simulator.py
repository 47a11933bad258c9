"""Trace-driven simulator of L2S split training: per-round delays from the model's layer
costs on the device and the server, and a link whose bandwidth follows a trace, with noise.

The per-round delay of partition p (L2S Section III) is d_p = d_p^dev + d_p^e: the device
runs the front layers forward and backward (known to the device: it measures it), the edge
part d_p^e = uplink of the activation and labels + the server's forward and backward + downlink
of the gradient at the cut (what the bandit learns; 0 for pure on-device training, p = P).
Backward costs twice the forward (the usual 1:2 rule for MAC-dominated layers). Weight
synchronisation adds the moved layers' bytes on the link when it happens (see ``simulate``).

Policies only see what L2S sees: ``select(t)`` a partition index, then ``update(p, d_e)`` with
the observed edge delay (and ``observe(t, d)`` with the whole round's, if they have it). The
Oracle is the exception: it is told the expected delays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edgesplit.errors import ConfigError, option
from edgesplit.graph import LayerGraph
from edgesplit.hardware import Device, LayerWork, estimator_for

__all__ = [
    "BACKWARD_FACTOR",
    "BandwidthTrace",
    "CutCost",
    "FixedPolicy",
    "OraclePolicy",
    "Policy",
    "RoundLog",
    "simulate",
    "training_costs",
]

BACKWARD_FACTOR = 2.0  # backward ~ 2x forward MACs; forward + backward = 3x forward


@dataclass(frozen=True)
class CutCost:
    """One partition point: layers [0, split) on the device, the rest on the server."""

    split: int  # layers on the device (len(layers): pure on-device, p = P)
    after: str | None  # last device layer
    device_ms: float  # forward + backward of the front part
    server_ms: float  # forward + backward of the back part
    up_bytes: int  # activation + labels
    down_bytes: int  # gradient at the cut
    layer_param_bytes: tuple[int, ...] = ()  # per layer of the whole model, for sync costs


@dataclass(frozen=True)
class BandwidthTrace:
    """Uplink/downlink bandwidth over rounds: ``mbps`` until ``drop_at``, then ``drop_to``,
    and ``mbps`` again from ``restore_at`` (L2S Fig. 17 drops and restores the speed)."""

    mbps: float
    rtt_ms: float = 5.0
    drop_at: int | None = None
    drop_to: float | None = None
    restore_at: int | None = None

    def __post_init__(self) -> None:
        if self.mbps <= 0 or (self.drop_to is not None and self.drop_to <= 0):
            raise ConfigError("bandwidths must be positive (Mbps)")
        if (self.drop_at is None) != (self.drop_to is None):
            raise ConfigError(f"a bandwidth drop needs both {option('drop_at')} and "
                              f"{option('drop_to')}")
        if self.restore_at is not None and (self.drop_at is None or
                                            self.restore_at <= self.drop_at):
            raise ConfigError(f"{option('restore_at')} needs a drop ({option('drop_at')}, "
                              f"{option('drop_to')}) before it")

    def at(self, t: int) -> float:
        if self.drop_at is None or self.drop_to is None or t < self.drop_at:
            return self.mbps  # (__post_init__ makes drop_at and drop_to come together)
        if self.restore_at is not None and t >= self.restore_at:
            return self.mbps
        return self.drop_to


def _train_ms(graph: LayerGraph, names: Sequence[str], device: Device) -> float:
    estimator = estimator_for(device)
    forward = sum(estimator.layer_ms(LayerWork.of(graph, n), device) for n in names)
    return forward * (1 + BACKWARD_FACTOR)


def training_costs(graph: LayerGraph, device: Device, server: Device,
                   label_bytes: int | None = None) -> list[CutCost]:
    """Every single-tensor cut of ``graph`` (a chain point, as in L2S) plus pure on-device."""
    names = [layer.name for layer in graph.layers]
    batch = int(graph.example_inputs[0].shape[0]) if graph.example_inputs else 1
    labels = label_bytes if label_bytes is not None else batch * 8  # int64 class ids
    params = tuple(layer.param_bytes for layer in graph.layers)
    costs = []
    for cut in graph.single_tensor_cuts():
        split = cut.index + 1
        if split == 0:
            continue  # L2S keeps the raw data on the device: cloud-only is not a partition
        last = split == len(names)
        crossing = 0 if last else sum(t.bytes for t in cut.tensors)
        costs.append(CutCost(
            split=split, after=cut.after, device_ms=_train_ms(graph, names[:split], device),
            server_ms=_train_ms(graph, names[split:], server),
            up_bytes=0 if last else crossing + labels, down_bytes=crossing,
            layer_param_bytes=params))
    if not costs or costs[-1].split != len(names):
        costs.append(CutCost(len(names), names[-1], _train_ms(graph, names, device), 0.0, 0, 0,
                             params))
    return costs


def edge_ms(cost: CutCost, mbps: float, rtt_ms: float) -> float:
    """d_p^e: the part of a round the bandit learns (0 for pure on-device)."""
    if cost.up_bytes == 0 and cost.server_ms == 0:
        return 0.0
    bits_per_ms = mbps * 1e3
    return (cost.up_bytes + cost.down_bytes) * 8 / bits_per_ms + cost.server_ms + rtt_ms


class Policy(Protocol):
    def select(self, t: int) -> int: ...

    def update(self, arm: int, edge_delay_ms: float) -> None: ...


@dataclass
class FixedPolicy:
    """FPT (fixed at the privacy point) or PDT (pure on-device): never changes its mind."""

    arm: int

    def select(self, t: int) -> int:
        return self.arm

    def update(self, arm: int, edge_delay_ms: float) -> None:
        return None


@dataclass
class OraclePolicy:
    """Knows every partition's expected delay at every round (the regret baseline)."""

    costs: Sequence[CutCost]
    trace: BandwidthTrace
    allowed: Sequence[int]

    def select(self, t: int) -> int:
        mbps = self.trace.at(t)
        return min(self.allowed, key=lambda p: self.costs[p].device_ms
                   + edge_ms(self.costs[p], mbps, self.trace.rtt_ms))

    def update(self, arm: int, edge_delay_ms: float) -> None:
        return None


@dataclass
class RoundLog:
    delays_ms: list[float] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)  # index into the cost list
    sync_bytes: list[int] = field(default_factory=list)
    edge_ms: list[float] = field(default_factory=list)  # observed d_p^e (0 on the device)
    predicted_edge_ms: list[float | None] = field(default_factory=list)  # learners only


def _layer_bytes(cost: CutCost, lo: int, hi: int) -> int:
    return sum(cost.layer_param_bytes[lo:hi])


@dataclass
class _SyncState:
    """Which layers the two sides trained since the last sync (layer l trains on the device
    iff l < split): those in [min split, max split) were trained on both."""

    lo: int
    hi: int

    def see(self, split: int) -> None:
        self.lo, self.hi = min(self.lo, split), max(self.hi, split)


def simulate(costs: Sequence[CutCost], trace: BandwidthTrace, policy: Policy, rounds: int, *,
             noise: float = 0.05, seed: int = 0, sync_every: int | None = 100) -> RoundLog:
    """Run ``policy`` for ``rounds`` rounds. ``noise`` is the relative standard deviation of
    each observed delay.

    Weight sync (the protocol of :mod:`edgesplit.train.remote`): both sides keep a copy of every
    layer. With ``sync_every=None`` (L2S-FWS) every partition change first sends the layers that
    change sides from their old owner to the new one. Otherwise (L2S) a change sends nothing
    and each side trains its own copy; every ``sync_every`` rounds, and after any round where
    the policy sets ``sync_due``, the layers trained on *both* sides since the last sync are
    merged: each side sends its update (2x their weight bytes; the layers a settling policy
    is about to move come along, sent once by their owner). Sync bytes count in that
    round's delay. Policies with ``observe(t, total_ms)`` get the round's training delay
    (without the sync transfer)."""
    if rounds < 1:
        raise ConfigError("rounds must be at least 1")
    rng = np.random.default_rng(seed)
    log = RoundLog()
    state: _SyncState | None = None
    previous: int | None = None
    observe = getattr(policy, "observe", None)
    predict = getattr(policy, "predict_edge", None)
    for t in range(1, rounds + 1):
        arm = policy.select(t)
        log.predicted_edge_ms.append(None if predict is None else float(predict(arm)))
        cost, mbps = costs[arm], trace.at(t)
        d_edge = edge_ms(cost, mbps, trace.rtt_ms) * max(0.0, 1 + noise * rng.standard_normal())
        d_dev = cost.device_ms * max(0.0, 1 + noise * rng.standard_normal())
        moved = 0
        if sync_every is None:
            if previous is not None and arm != previous:
                lo, hi = sorted((costs[previous].split, cost.split))
                moved = _layer_bytes(cost, lo, hi)
        else:
            state = state or _SyncState(cost.split, cost.split)
            state.see(cost.split)
        policy.update(arm, d_edge)
        if observe is not None:
            observe(t, d_dev + d_edge)
        due = getattr(policy, "sync_due", False)
        if state is not None and sync_every is not None and (t % sync_every == 0 or due):
            both = 2 * _layer_bytes(cost, state.lo, state.hi)
            settled = getattr(policy, "next_partition", None) if due else None
            anchor = cost.split
            if settled is not None:
                anchor = costs[settled].split
                state.see(anchor)  # layers about to change sides come along, sent one way
                both += _layer_bytes(cost, state.lo, state.hi) - both // 2
            moved += both
            state = _SyncState(anchor, anchor)
        sync_ms = moved * 8 / (mbps * 1e3) if moved else 0.0
        log.delays_ms.append(d_dev + d_edge + sync_ms)
        log.partitions.append(arm)
        log.sync_bytes.append(moved)
        log.edge_ms.append(d_edge)
        previous = arm
    return log


def regret_ms(log: RoundLog, oracle: RoundLog) -> list[float]:
    """Cumulative extra delay against the Oracle, round by round."""
    return list(np.cumsum(np.asarray(log.delays_ms) - np.asarray(oracle.delays_ms)))


def mean_tail(values: Sequence[float], fraction: float = 0.5) -> float:
    tail = values[-max(1, math.ceil(len(values) * fraction)):]
    return float(np.mean(tail))
