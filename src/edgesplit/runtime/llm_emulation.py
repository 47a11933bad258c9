"""Compute emulation and link shaping for the stages of a causal LM plan, so one fast machine
rehearses a chain of slower devices (a phone, a laptop GPU, a Jetson) over their links.

*Compute emulation* (:class:`StagePacer`, ``llm serve/generate/chat --emulate-device``): each
stage runs its real blocks, and is then slowed by the ratio of its device's speed to this
machine's for that work: after a step that took ``t`` ms of real compute it sleeps
``(factor - 1) x t``, with ``factor`` the cost model's time for the stage's blocks in that phase
on the plan's device over its time for the same blocks on this machine (``this-machine``:
peaks measured live, priced by the same estimators). Nothing replays the plan's prediction: a
cost model that misprices the work shows up as a gap between the plan's times and the
measured ones (both the device's absolute price and this machine's own are in the ratio's
terms, and only the real compute is scaled). The ratio of a phase is taken at the plan's
workload (prefill: its prompt length; decode: its mean cache length); where the device is
faster than this machine (factor < 1) emulation cannot speed the work up: it warns once and
runs as is. The time slept is reported per device (``<device>.emulated_ms``) and is part of
the stage's compute.

*Time dilation* (``dilation=D``, Python only; the benchmark's): where a device is faster than
this machine, emulation could not speed it up; run everything ``D`` times slower instead, with
every stage slept to ``D x factor`` of its real compute and every link's bandwidth divided and
its RTT multiplied by ``D``, so measured times divided by ``D`` compare with the plan's.

*Link shaping* (on unless ``shape=False`` / ``--no-shape``, as for ``serve``/``run``): the
sender of each step waits what the plan's link takes for the bytes it sends
(:class:`~edgesplit.transport.shaping.LinkShaper`, "up"), and each server waits the same for
its reply on the link it was called over ("down"), so a step's token pays every link both
ways, as the plan prices it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from edgesplit.errors import ConfigError
from edgesplit.plan.model import Plan
from edgesplit.runtime.llm_stage import llm_section

if TYPE_CHECKING:
    from edgesplit.hardware import Device, Link

__all__ = ["Phase", "StagePacer", "dilated", "phase_of", "slowdown_factors", "stage_links"]

log = logging.getLogger(__name__)

Phase = Literal["prefill", "decode"]


def phase_of(position: int) -> Phase:
    """A step at position 0 runs the prompt (a generation starts its session anew there)."""
    return "prefill" if position == 0 else "decode"


def slowdown_factors(plan: Plan, index: int, reference: Device | None = None
                     ) -> dict[Phase, float]:
    """Per phase, stage ``index``'s time on its plan device over its time on ``reference``
    (default: this machine, measured once per process), for the same blocks, both priced by
    the cost model at the plan's workload. 1.0 for a stage without blocks."""
    from edgesplit.graph import Phase as Work
    from edgesplit.graph import describe_causal_lm
    from edgesplit.hardware import get_device
    from edgesplit.plan.llm_costs import block_ms

    llm = llm_section(plan)
    stage = llm.stages[index]
    if stage.start == stage.end:
        return {"prefill": 1.0, "decode": 1.0}
    here = reference if reference is not None else get_device("this-machine")
    lm = describe_causal_lm(plan.model.source, dtype=llm.dtype)
    phases: dict[Phase, Work] = {"prefill": Work.prefill(llm.prompt_tokens),
                                 "decode": Work.decode(llm.decode_cached_tokens)}
    factors: dict[Phase, float] = {}
    for name, work in phases.items():
        ms = sum(block_ms(lm, here, work)[stage.start:stage.end])
        target = stage.prefill_ms if name == "prefill" else stage.decode_ms
        factors[name] = target / ms if ms > 0 else 1.0
    return factors


class StagePacer:
    """Slows each step of ``device`` by ``factors[phase]``: it sleeps ``(factor - 1)`` times
    the step's measured compute. ``clock`` and ``sleep`` are ``time``'s (tests give others)."""

    def __init__(self, device: str, factors: dict[Phase, float], *,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if any(not f > 0 for f in factors.values()) or set(factors) != {"prefill", "decode"}:
            raise ConfigError(f"stage {device!r}: slowdown factors must be > 0 for prefill and "
                              f"decode, got {factors}")
        self.device, self.factors = device, dict(factors)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def of(cls, plan: Plan, index: int, reference: Device | None = None, *,
           dilation: float = 1.0) -> StagePacer:
        """The pacer of stage ``index`` of ``plan`` (:func:`slowdown_factors`), every
        factor times ``dilation``."""
        stage = llm_section(plan).stages[index]
        factors = slowdown_factors(plan, index, reference)
        return cls(stage.device, {phase: f * dilation for phase, f in factors.items()})

    def pace(self, start: float, phase: Phase) -> float:
        """Sleep ``(factor - 1)`` times the compute since ``start`` (this pacer's clock);
        returns the milliseconds slept (0 when the device is faster than this machine)."""
        factor = self.factors[phase]
        measured_s = self._clock() - start
        if factor <= 1.0:
            if factor < 1.0:
                self._warn_once(factor, phase)
            return 0.0
        slept = self._clock()
        self._sleep(measured_s * (factor - 1.0))
        return (self._clock() - slept) * 1e3

    def _warn_once(self, factor: float, phase: Phase) -> None:
        # once per stage: every step would repeat it
        with self._lock:
            warn, self._warned = not self._warned, True
        if warn:
            log.warning("stage %r: its device is %.2fx this machine's speed for its %s work by "
                        "the cost model: emulation cannot speed this machine up, it runs as is",
                        self.device, 1 / factor, phase)


def dilated(link: Link, dilation: float) -> Link:
    """``link`` ``dilation`` times slower: bandwidths divided, RTT multiplied."""
    if dilation == 1.0:
        return link
    down = link.down_bandwidth_mbps
    return link.model_copy(update={
        "bandwidth_mbps": link.bandwidth_mbps / dilation, "rtt_ms": link.rtt_ms * dilation,
        "down_bandwidth_mbps": None if down is None else down / dilation})


def stage_links(plan: Plan, index: int, dilation: float = 1.0
                ) -> tuple[Link | None, Link | None]:
    """The plan's links before stage ``index`` (its caller's; None for the first) and after
    it (the next stage's; None for the last device), ``dilation`` times slower."""
    names = [d.name for d in plan.devices]

    def between(a: int, b: int) -> Link | None:
        if a < 0 or b >= len(names):
            return None
        for link in plan.links:
            if {link.src, link.dst} == {names[a], names[b]}:
                return dilated(link.link, dilation)
        raise ConfigError(f"the plan has no link between {names[a]!r} and {names[b]!r}")

    return between(index - 1, index), between(index, index + 1)
