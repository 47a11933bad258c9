"""Compute emulation and link shaping for the stages of a causal LM plan, so one fast machine
rehearses a chain of slower devices (a phone, a laptop GPU, a Jetson) over their links.

*Compute emulation* (:class:`StagePacer`, ``llm serve/generate --emulate-device``): after a
stage computes a step it sleeps until the step took what the plan predicts for its device in
that phase: ``LLMStage.prefill_ms`` for the prompt (the step at position 0; priced for the
plan's prompt length), ``decode_ms`` for each later token (priced at the generation's mean
cache length). As :class:`~edgesplit.runtime.program.DeviceStep` does for layer plans, it
cannot speed a slower machine up: it then warns once and runs as is. The time slept is
reported per device (``<device>.emulated_ms``) and is part of the stage's compute.

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
from typing import TYPE_CHECKING, Literal

from edgesplit.errors import ConfigError
from edgesplit.plan.model import Plan
from edgesplit.runtime.llm_stage import llm_section

if TYPE_CHECKING:
    from edgesplit.hardware import Link

__all__ = ["Phase", "StagePacer", "phase_of", "stage_links"]

log = logging.getLogger(__name__)

Phase = Literal["prefill", "decode"]


def phase_of(position: int) -> Phase:
    """A step at position 0 runs the prompt (a generation starts its session anew there)."""
    return "prefill" if position == 0 else "decode"


class StagePacer:
    """Makes each step of ``device`` last the plan's ``prefill_ms`` or ``decode_ms``."""

    def __init__(self, device: str, prefill_ms: float, decode_ms: float) -> None:
        if prefill_ms < 0 or decode_ms < 0:
            raise ConfigError(f"stage {device!r}: emulated times must be >= 0, got prefill "
                              f"{prefill_ms} ms and decode {decode_ms} ms")
        self.device = device
        self.targets: dict[Phase, float] = {"prefill": prefill_ms, "decode": decode_ms}
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def of(cls, plan: Plan, index: int) -> StagePacer:
        """The pacer of stage ``index`` of ``plan``: its predicted times per phase."""
        stage = llm_section(plan).stages[index]
        return cls(stage.device, stage.prefill_ms, stage.decode_ms)

    def pace(self, start: float, phase: Phase) -> float:
        """Sleep what is left of the phase's target since ``start`` (``perf_counter``);
        returns the milliseconds slept (0 when the compute already took longer)."""
        target = self.targets[phase]
        measured_ms = (time.perf_counter() - start) * 1e3
        left_s = (target - measured_ms) / 1e3
        if left_s <= 0:
            if target > 0:
                self._warn_once(measured_ms, target, phase)
            return 0.0
        slept = time.perf_counter()
        time.sleep(left_s)
        return (time.perf_counter() - slept) * 1e3

    def _warn_once(self, measured_ms: float, target: float, phase: Phase) -> None:
        # once per stage: every step would repeat it
        with self._lock:
            warn, self._warned = not self._warned, True
        if warn:
            log.warning("stage %r computed a %s step in %.2f ms, slower than the plan's %.2f "
                        "ms for it: emulation cannot speed this machine up, it runs as is",
                        self.device, phase, measured_ms, target)


def stage_links(plan: Plan, index: int) -> tuple[Link | None, Link | None]:
    """The plan's links before stage ``index`` (its caller's; None for the first) and after
    it (the next stage's; None for the last device)."""
    names = [d.name for d in plan.devices]

    def between(a: int, b: int) -> Link | None:
        if a < 0 or b >= len(names):
            return None
        for link in plan.links:
            if {link.src, link.dst} == {names[a], names[b]}:
                return link.link
        raise ConfigError(f"the plan has no link between {names[a]!r} and {names[b]!r}")

    return between(index - 1, index), between(index, index + 1)
