"""Compute emulation and link shaping for the stages of a causal LM plan, so one fast machine
rehearses a chain of slower devices (a phone, a laptop GPU, a Jetson) over their links.

*Compute emulation* (:class:`StagePacer`, ``llm serve/generate/chat --emulate-device``): each
stage runs its real blocks, and is then slowed by the ratio of its device's speed to this
machine's for that work: after a step that took ``t`` ms of real compute it sleeps
``(factor - 1) x t``, with ``factor`` the plan's time for the stage's blocks in that phase on
its device (priced by the cost model) over this machine's time for the same blocks, measured
when the stage starts (:func:`measured_reference`: a prefill of the plan's prompt length, a
decode step at its mean cache length, each after the idle a run leaves the stage between its
steps, :func:`idle_between_steps`). Nothing sleeps to the plan's prediction: what the
measurement can disagree with is how the plan composes its parts (per-step work as the context
grows, links, encoding, serving overhead), and this machine's own cost model is checked apart
(:func:`predicted_reference` against :func:`measured_reference`). Where the device is faster
than this machine (factor < 1) emulation cannot speed the work up: it warns once and runs as
is. The time slept is reported per device (``<device>.emulated_ms``) and is part of the
stage's compute.

*Time dilation* (``dilation=D``, Python only; the benchmark's): where a device is faster than
this machine, emulation could not speed it up; run everything ``D`` times slower instead, with
every stage slept to ``D x factor`` of its real compute and every link's bandwidth divided and
its RTT multiplied by ``D``, so measured times divided by ``D`` compare with the plan's.

*Link shaping* (only when asked, ``shape=True`` / ``--shape``, as for ``serve``/``run``): the
sender of each step waits what the plan's link takes for the bytes it sends
(:class:`~edgesplit.transport.shaping.LinkShaper`, "up"), and each server waits the same for
its reply on the link it was called over ("down"), so a step's token pays every link both
ways, as the plan prices it.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import torch

from edgesplit.errors import ConfigError
from edgesplit.llm.stage.compute import StageModel, llm_section
from edgesplit.plan.model import Plan

if TYPE_CHECKING:
    from edgesplit.hardware import Device, Link

__all__ = [
    "Phase",
    "StagePacer",
    "dilated",
    "idle_between_steps",
    "measured_reference",
    "phase_of",
    "predicted_reference",
    "slowdown_factors",
    "stage_links",
]

log = logging.getLogger(__name__)

Phase = Literal["prefill", "decode"]


def phase_of(position: int) -> Phase:
    """A step at position 0 runs the prompt (a generation starts its session anew there)."""
    return "prefill" if position == 0 else "decode"


def predicted_reference(plan: Plan, index: int, device: Device | None = None
                        ) -> dict[Phase, float]:
    """Per phase, stage ``index``'s blocks priced by the cost model on ``device`` (default:
    ``this-machine``, its peaks measured once per process) at the plan's workload."""
    from edgesplit.hardware import get_device
    from edgesplit.llm.model.description import Phase as Work
    from edgesplit.llm.model.description import describe_causal_lm
    from edgesplit.llm.planning.costs import block_ms

    llm = llm_section(plan)
    stage = llm.stages[index]
    here = device if device is not None else get_device("this-machine")
    lm = describe_causal_lm(plan.model.local_source, dtype=llm.dtype)
    phases: dict[Phase, Work] = {"prefill": Work.prefill(llm.prompt_tokens),
                                 "decode": Work.decode(llm.decode_cached_tokens)}
    return {name: sum(block_ms(lm, here, work, activations=llm.activations)
                      [stage.start:stage.end])
            for name, work in phases.items()}


# Past this idle, a step here is slowed no further by it (SmolLM2-135M on this 2-core machine,
# one thread: a 3-block stage's decode step took 2.4 ms back to back, 4.9 ms after 50 ms idle
# and 5.2 after 200 ms; a 10-block stage 23.0, 26.2 and 25.8 ms).
IDLE_CAP_S = 0.1


def idle_between_steps(plan: Plan, index: int, dilation: float = 1.0) -> dict[Phase, float]:
    """Per phase, seconds stage ``index`` idles before a step when it runs ``plan`` (at most
    :data:`IDLE_CAP_S`): the rest of the step's planned time, the other stages and the links,
    ``dilation`` times slower. Between steps the caches lose the stage's weights and the
    cores slow down, so a step after idle takes longer than one back to back (up to twice,
    for a stage of a few blocks): the reference is timed after the same idle."""
    llm = llm_section(plan)
    stage = llm.stages[index]
    rest: dict[Phase, float] = {"prefill": llm.ttft_ms - stage.prefill_ms,
                                "decode": llm.tpot_ms - stage.decode_ms}
    return {phase: min(IDLE_CAP_S, max(0.0, ms) * dilation / 1e3) for phase, ms in rest.items()}


@torch.no_grad()
def measured_reference(stage: StageModel, plan: Plan, repeats: int = 3,
                       idle: dict[Phase, float] | None = None) -> dict[Phase, float]:
    """Per phase, the stage's own blocks timed on this machine at the plan's workload (the
    median of ``repeats`` after one warm-up): a prefill of the plan's prompt length on an
    empty cache, and a decode step against a cache of the plan's mean length, each after
    ``idle[phase]`` seconds of sleep, as in a run (:func:`idle_between_steps`; None: none)."""
    llm = llm_section(plan)
    if stage.io.empty:
        return {"prefill": 0.0, "decode": 0.0}
    prompt, cached = llm.prompt_tokens, max(1, llm.decode_cached_tokens)
    idle = idle or {"prefill": 0.0, "decode": 0.0}

    def x(tokens: int) -> torch.Tensor:
        if stage.io.hidden_in:
            return torch.randn(1, tokens, llm.hidden_size).to(stage.dtype)
        return torch.randint(0, llm.vocab_size, (1, tokens))

    times: dict[Phase, list[float]] = {"prefill": [], "decode": []}
    for _ in range(repeats + 1):
        cache = None  # one cache at a time: a quantized stage may have room for one only
        time.sleep(idle["prefill"])
        t0 = time.perf_counter()
        stage.step(x(prompt), 0, stage.new_cache())
        times["prefill"].append((time.perf_counter() - t0) * 1e3)
        cache = stage.new_cache()
        stage.step(x(cached), 0, cache)
        time.sleep(idle["decode"])
        t0 = time.perf_counter()
        stage.step(x(1), cached, cache)
        times["decode"].append((time.perf_counter() - t0) * 1e3)
    return {phase: statistics.median(ms[1:]) for phase, ms in times.items()}


def slowdown_factors(plan: Plan, index: int, reference: dict[Phase, float]
                     ) -> dict[Phase, float]:
    """Per phase, stage ``index``'s time on its plan device (the plan's) over ``reference``,
    this machine's time for the same blocks (:func:`measured_reference`, or
    :func:`predicted_reference`). 1.0 for a stage without blocks."""
    stage = llm_section(plan).stages[index]
    if stage.start == stage.end:
        return {"prefill": 1.0, "decode": 1.0}
    targets: dict[Phase, float] = {"prefill": stage.prefill_ms, "decode": stage.decode_ms}
    return {phase: targets[phase] / reference[phase] if reference[phase] > 0 else 1.0
            for phase in targets}


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
    def of(cls, plan: Plan, index: int, reference: dict[Phase, float], *,
           dilation: float = 1.0) -> StagePacer:
        """The pacer of stage ``index`` of ``plan`` against this machine's ``reference``
        times (:func:`slowdown_factors`), every factor times ``dilation``."""
        stage = llm_section(plan).stages[index]
        factors = slowdown_factors(plan, index, reference)
        return cls(stage.device, {phase: f * dilation for phase, f in factors.items()})

    @classmethod
    def measured(cls, stage: StageModel, plan: Plan, *, dilation: float = 1.0
                 ) -> StagePacer:
        """The pacer of ``stage`` against its own blocks timed here now, each step after the
        idle a run of ``plan`` leaves it (:func:`measured_reference`)."""
        index = stage.io.index
        reference = measured_reference(stage, plan,
                                       idle=idle_between_steps(plan, index, dilation))
        return cls.of(plan, index, reference, dilation=dilation)

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
