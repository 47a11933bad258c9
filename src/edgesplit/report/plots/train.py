"""Figures of split training: L2S delay and partitions over rounds, learning curves, real
two-process runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.report.plots._figure import _COLORS, _new_figure, _save

__all__ = ["plot_l2s", "plot_l2s_curves", "plot_train_split"]


def plot_l2s(doc: dict[str, Any], path: str | Path, *, window: int = 20) -> Path:
    """L2S Figs. 10, 11 and 17: per-round delay (moving average over ``window`` rounds) with
    the bandwidth, the chosen partition of every policy, and the learners' relative error in
    predicting the edge delay, from :func:`edgesplit.train.l2s.compare_policies`."""
    policies = doc.get("policies") or {}
    if not policies:
        raise ConfigError("the simulation has no policies to plot")
    fig = _new_figure(9.0, 8.4)
    ax_delay, ax_part, ax_err = fig.subplots(3, 1, sharex=True, height_ratios=[3, 2, 2])
    for i, (name, run) in enumerate(policies.items()):
        if run.get("prediction_error"):  # Fig. 10
            r, err = _moving_mean(run["prediction_error"], 5)
            ax_err.plot(r, err, color=_COLORS[i % len(_COLORS)], linewidth=1.0)
        delays = [float(d) for d in run["delays_ms"]]
        k = max(1, min(window, len(delays)))
        smooth = np.convolve(delays, np.full(k, 1.0 / k), mode="valid")
        rounds = range(k, len(delays) + 1)
        color = _COLORS[i % len(_COLORS)]
        ax_delay.plot(list(rounds), smooth, color=color, label=name, linewidth=1.4)
        ax_part.step(range(1, len(delays) + 1), run["partitions"], where="post", color=color,
                     linewidth=1.0)
    trace = doc.get("trace", {})
    speeds = trace.get("mbps_per_round")
    if speeds:  # Fig. 17: the network speed next to the delay
        ax_speed = ax_delay.twinx()
        ax_speed.step(range(1, len(speeds) + 1), speeds, where="post", color="black",
                      linestyle=":", linewidth=1.2, label="bandwidth")
        ax_speed.set_ylabel("bandwidth, Mbps")
        ax_speed.set_ylim(0, max(speeds) * 1.15)
    for entry in (policies.get("l2s") or {}).get("adaptations", [])[1:]:
        ax_part.axvline(entry["round"], color=_COLORS[4], linewidth=0.8, alpha=0.6)
    for ax in (ax_delay, ax_part, ax_err):
        ax.grid(True, alpha=0.3)
    ax_delay.set_yscale("log")
    ax_err.set_yscale("log")
    ax_delay.set_ylabel(f"delay per round, ms ({window}-round mean)")
    ax_part.set_ylabel("layers on the device")
    ax_err.set_ylabel("edge-delay prediction\nerror (5 offloads)")
    ax_err.set_xlabel("training round (vertical lines: L2S re-enters adaptation)")
    ax_delay.legend(fontsize=8, loc="upper left")
    drop = trace.get("drop_at")
    ax_delay.set_title(f"{doc.get('model')}: {doc.get('device')} -> {doc.get('server')}, "
                       f"{trace.get('mbps')} Mbps"
                       + (f" -> {trace.get('drop_to')} Mbps at round {drop}" if drop else "")
                       + (f", back at {trace['restore_at']}" if trace.get("restore_at") else ""),
                       fontsize=10)
    return _save(fig, path)


def plot_l2s_curves(series: dict[str, list[float | None]], path: str | Path, *, ylabel: str,
                    title: str, window: int = 10, log: bool = False,
                    reference: dict[str, list[float]] | None = None) -> Path:
    """L2S Figs. 10 and 11: one curve per label over training rounds, a ``window``-round mean
    (rounds without a value, None, are skipped). ``reference`` curves (e.g. the Oracle's)
    are drawn dashed in the same colour as the label they belong to."""
    if not series:
        raise ConfigError("nothing to plot")
    fig = _new_figure(8.0, 4.4)
    ax = fig.subplots()
    for i, (label, values) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        rounds, smooth = _moving_mean(values, window)
        ax.plot(rounds, smooth, color=color, label=label, linewidth=1.4)
        if reference and label in reference:
            r_rounds, r_smooth = _moving_mean(reference[label], window)
            ax.plot(r_rounds, r_smooth, color=color, linestyle="--", linewidth=1.0)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("training round")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _moving_mean(values: Sequence[float | None], window: int
                 ) -> tuple[list[int], list[float]]:
    """(round, mean of the last ``window`` values that exist) at every round with a value."""
    rounds: list[int] = []
    out: list[float] = []
    recent: list[float] = []
    for t, v in enumerate(values, start=1):
        if v is None:
            continue
        recent = [*recent, float(v)][-window:]
        rounds.append(t)
        out.append(sum(recent) / len(recent))
    return rounds, out


def plot_train_split(doc: dict[str, Any], path: str | Path, *, window: int = 5) -> Path:
    """A real split-training run (``edgesplit train-split``): measured delay per round with
    the emulated bandwidth, the cut L2S chose, and the training loss."""
    rounds = doc["rounds"]
    delays = rounds["delays_ms"]
    if not delays:
        raise ConfigError("the run has no rounds to plot")
    fig = _new_figure(9.0, 7.0)
    ax_delay, ax_cut, ax_loss = fig.subplots(3, 1, sharex=True, height_ratios=[3, 2, 2])
    t = list(range(1, len(delays) + 1))
    ax_delay.plot(t, delays, color=_COLORS[0], alpha=0.3, linewidth=0.8)
    r, smooth = _moving_mean(delays, window)
    ax_delay.plot(r, smooth, color=_COLORS[0], linewidth=1.5, label=f"{window}-round mean")
    ax_speed = ax_delay.twinx()
    ax_speed.step(t, rounds["bandwidth_mbps"], where="post", color="black", linestyle=":",
                  linewidth=1.2)
    ax_speed.set_ylabel("emulated bandwidth, Mbps (dotted)")
    ax_speed.set_ylim(0, max(b or 0 for b in rounds["bandwidth_mbps"]) * 1.15 or 1)
    ax_cut.step(t, rounds["partitions"], where="post", color=_COLORS[1])
    for entry in doc.get("adaptations", [])[1:]:
        ax_cut.axvline(entry["round"], color=_COLORS[4], linewidth=0.8, alpha=0.6)
    ax_loss.plot(t, rounds["loss"], color=_COLORS[2], linewidth=0.9)
    ax_delay.set_ylabel("delay per round, ms")
    ax_cut.set_ylabel("cut (last device\nelement)")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_xlabel("training round (vertical lines: L2S re-enters adaptation)")
    for ax in (ax_delay, ax_cut, ax_loss):
        ax.grid(True, alpha=0.3)
    title = f"{doc['config']['model']}: split training, held-out accuracy {doc['accuracy']:.1f} %"
    if "baseline_accuracy" in doc:
        title += f" (unsplit {doc['baseline_accuracy']:.1f} %)"
    ax_delay.set_title(title, fontsize=10)
    ax_delay.legend(fontsize=8, loc="upper left")
    return _save(fig, path)
