"""Measure this machine's block times for one model and precision: the table
``this-machine`` prices that model with (:mod:`edgesplit.llm.planning.calibration`).

Four real stages are built from the model's checkpoint at the precision's engine (torch
modules, or one ONNX Runtime graph for quantized weights, computing at the plan's
``activations``), each timed at the prompt lengths :data:`PREFILL_TOKENS` (a prefill on an
empty cache) and the cache lengths :data:`DECODE_CACHED` (a decode step after another, as a
generation's are): the embedding with :data:`SHORT` and with :data:`LONG` decoder blocks, whose
difference is :data:`LONG` - :data:`SHORT` blocks' time, the head after the last
:data:`SHORT` blocks, and those blocks alone. What is left of the short stage once its blocks
are taken off is the embedding's with the stage's fixed cost of a step; the head stage less
the stage of its blocks alone is the head's, without that fixed cost a second time (every
stage pays it, a model of one stage once: ~0.25 ms a decode step here, torch or ONNX Runtime,
counted twice it priced SmolLM2's Q4_1 decode 2 % high); that stage less its blocks is the
fixed cost itself (``step``).

Why :data:`LONG` is half of SmolLM2 and not a few blocks: a block's time is a difference of two
stages' medians, so a burst of other work on either moves it by that burst over the blocks
between them. With 1 and 6 blocks, two tables measured minutes apart on this (shared, 2-core)
machine priced SmolLM2's whole model -19 % and +16 % of the same run (Q4_1 decode: -3 % and
+48 %, its blocks a fraction of a millisecond); over 15 blocks the same bursts weigh a third.
Measured beside the whole model in one process (stages of 1, 6, 15 and 30 blocks, one thread),
blocks cost the same in a stage of any of these sizes (float32 decode 1.6-1.7 ms, prefill of 37
tokens 5.2-5.6 ms a block) and a stage of all 30 plus the head alone is within 1-3 % of the
whole model, prefill and decode, both precisions: the sum of blocks holds. Timed in turns with
the whole model (10-20 rounds), this table's sum is within 1 % of it at 37 prompt tokens and 52
cached, both precisions (Q4_1 decode within -0.2 to +3 % at 8-128 cached). A decode step
right after a prefill costs a stage of ONNX Runtime ~0.3 ms more than the next (it re-plans
for the new shape), which a generation pays once: so the decode step timed follows an
untimed one.

In one process every block's weights leave the caches before the next step reaches it (the
model is larger than the last-level cache), while a stage of a few blocks stepped back to back
keeps its own in cache and runs up to twice as fast. So before each timed step the blocks
after the long stage (up to :data:`FLUSH_BYTES` of their weights, none the timed stages hold)
take a decode step, as the rest of the model runs between two steps of a block: their weights
evict the timed stage's, while the engine's code and buffers stay in the caches, as they do in
a whole model's run (a plain read over a buffer evicts those too: in one run it priced the
quantized path, whose blocks take a fraction of a millisecond, 20-40 % slow). A model with no
such blocks reads a buffer of :data:`FLUSH_BYTES` instead. The four stages take turns at
every point, so a burst of other work slows them alike. Medians of ``repeats`` after a
warm-up; 10-25 s for SmolLM2 on this 2-core machine (float32 the longer). Cached per
machine, model, precision, activations and thread count with the load it was measured at
and the code that measured it (:func:`~edgesplit.llm.planning.calibration.table_problem`);
measured again over a table measured under load or by other code, on
``EDGESPLIT_REMEASURE=1`` or ``llm plan --calibrate``. Timing needs a quiet machine: a
measurement while other work kept cores busy
(:func:`~edgesplit.llm.planning.calibration.table_problem`) is refused, not cached.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import get_topology
from edgesplit.llm.model.description import CausalLM, describe_causal_lm
from edgesplit.llm.planning.calibration import (
    BlockTimes,
    StaleBlockTimesError,
    TableKind,
    code_versions,
    load_block_times,
    model_key,
    save_block_times,
    stage_threads,
    table_problem,
)
from edgesplit.llm.planning.costs import Activations, LLMWorkload, resolve_activations
from edgesplit.llm.planning.plan import plan_llm_at
from edgesplit.llm.stage.compute import StageModel, open_stage

__all__ = ["DECODE_CACHED", "DECODE_STEPS", "FLUSH_BYTES", "LONG", "PREFILL_TOKENS", "SHORT",
           "calibrate_this_machine", "measure_block_times"]

PREFILL_TOKENS = (8, 32, 64, 128)
DECODE_CACHED = (8, 64, 256)
SHORT, LONG = 1, 16  # decoder blocks of the two embedding stages
DECODE_STEPS = 4  # decode steps timed one after another from each cache length
FLUSH_BYTES = 64 * 2**20  # twice the 32 MiB last-level cache of the machines measured
_CHAIN = "home-wifi"  # any 3-device chain: the stages are cut from plans on it

Timings = dict[str, dict[int, float]]  # phase -> points -> ms
log = logging.getLogger(__name__)


def calibrate_this_machine(model: Any, dtype: str = "float32", *, threads: int | None = None,
                           activations: Activations | Literal["auto"] = "auto",
                           repeats: int = 7, remeasure: bool = False) -> BlockTimes:
    """``model``'s block times at ``dtype`` and ``activations`` (``auto``: what a plan of
    that precision computes with by default) on this machine: the cached
    table, else (none, or one measured under load or by other code) measured now
    (:func:`measure_block_times`) and cached, which ``this-machine`` then prices the model
    with in every plan. StaleBlockTimesError, caching nothing, where the machine was busy
    while measuring."""
    lm = describe_causal_lm(model, dtype=dtype)
    activations = resolve_activations(activations, lm.weights.quantized)
    threads = threads or stage_threads(lm)
    cached = None if remeasure else load_block_times(lm, threads, activations)
    if cached is not None:
        problem = table_problem(cached)
        if problem is None:
            return cached
        log.info("this machine's block times of %s were %s: measuring them again",
                 lm.name, problem)
    table = measure_block_times(lm, threads=threads, repeats=repeats, activations=activations)
    problem = table_problem(table)
    if problem is not None:
        raise StaleBlockTimesError(
            f"this machine was busy while measuring {lm.name}'s block times ({problem}): "
            "nothing was cached; stop the other work and calibrate again (`edgesplit llm "
            "plan ... --calibrate`)")
    save_block_times(table)
    return table


def measure_block_times(lm: CausalLM, *, threads: int = 1, repeats: int = 9,
                        activations: Activations = "float") -> BlockTimes:
    """Time ``lm``'s blocks here at ``activations`` (module docstring), recording the
    highest 1-minute load average seen and the code measuring: ConfigError for a model of
    fewer than two decoder blocks (one block's time is a difference of two stages)."""
    layers = lm.shape.num_layers
    if layers < 2:
        raise ConfigError(f"{lm.name} has {layers} decoder block(s): measuring one block's "
                          "time needs two stages that differ in blocks (at least 2)")
    limit = lm.shape.max_positions - 1
    prefill = tuple(sorted({min(t, limit) for t in PREFILL_TOKENS}))
    decode = tuple(sorted({max(1, min(c, limit - DECODE_STEPS)) for c in DECODE_CACHED}))
    long = min(LONG, layers)
    n = lm.n
    context = max(*prefill, *(c + DECODE_STEPS for c in decode)) + 1
    workload = LLMWorkload(prompt_tokens=max(prefill), new_tokens=context - max(prefill),
                           max_context=context, activations=activations)

    def stage(boundaries: tuple[int, ...], index: int) -> StageModel:
        plan = plan_llm_at(lm, get_topology(_CHAIN), boundaries, workload,
                           method="calibration")
        return open_stage(plan, index, threads=threads)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    load, start = os.getloadavg()[0], _cpu_seconds()
    try:
        stages = [stage((0, 1 + SHORT, n, n), 0), stage((0, 1 + long, n, n), 0),
                  stage((0, 0, n - 1 - SHORT, n), 2), stage((0, n - 1 - SHORT, n - 1, n), 1)]
        # the blocks none of the timed stages holds, run between their steps
        end = _flush_end(lm, 1 + long, n - 1 - SHORT)
        rest = stage((0, 1 + long, end, n), 1) if end > 1 + long else None
        short, longer, head, middle = _time_stages(stages, lm, prefill, decode, repeats,
                                                   _flusher(rest, lm))
    finally:
        torch.set_num_threads(before)
    load, busy = max(load, os.getloadavg()[0]), _busy_elsewhere(start, _cpu_seconds())

    def split(phase: str) -> dict[TableKind, tuple[tuple[int, float], ...]]:
        block = {x: max(0.0, (longer[phase][x] - short[phase][x]) / (long - SHORT))
                 for x in short[phase]}

        def points(ms: Callable[[int], float]) -> tuple[tuple[int, float], ...]:
            return tuple((x, max(0.0, ms(x))) for x in sorted(block))

        # the head stage less the middle one: the same blocks and the stage's fixed cost of
        # a step, which the embedding's time holds already (counted once per model)
        return {"decoder": points(block.__getitem__),
                "embed": points(lambda x: short[phase][x] - SHORT * block[x]),
                "head": points(lambda x: head[phase][x] - middle[phase][x]),
                "step": points(lambda x: middle[phase][x] - SHORT * block[x])}

    return BlockTimes(model=model_key(lm), precision=lm.dtype, threads=threads,
                      activations=activations, prefill=split("prefill"),
                      decode=split("decode"), load=load, busy=busy,
                      versions=code_versions(),
                      source=f"measured {time.strftime('%Y-%m-%d %H:%M')}: stages of "
                             f"{SHORT} and {long} blocks and the head, medians of {repeats} "
                             f"prefills and {repeats * DECODE_STEPS} decode steps, each after "
                             f"a step of other blocks, at load {load:.1f}")


CpuSeconds = tuple[float, float, float] | None  # wall, every core's busy, this process's


def _cpu_seconds() -> CpuSeconds:
    """Now: wall seconds, the seconds every core has been busy since boot (Linux's /proc/stat,
    steal included: the hypervisor gave the core to other work) and this process's CPU
    seconds; None where /proc/stat cannot be read."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    own = os.times()
    return (time.monotonic(), (user + nice + system + irq + softirq + steal)
            / os.sysconf("SC_CLK_TCK"), own.user + own.system)


def _busy_elsewhere(start: CpuSeconds, end: CpuSeconds) -> float | None:
    """Cores other work kept busy on average between ``start`` and ``end``."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    other = (end[1] - start[1]) - (end[2] - start[2])
    return round(max(0.0, other / (end[0] - start[0])), 3)


def _flush_end(lm: CausalLM, start: int, stop: int) -> int:
    """The end of the fewest blocks from ``start`` (before ``stop``) holding
    :data:`FLUSH_BYTES` of weights, or ``stop``."""
    end = start
    while end < stop and lm.stage_param_bytes(start, end) < FLUSH_BYTES:
        end += 1
    return end


def _flusher(rest: StageModel | None, lm: CausalLM) -> Callable[[], None]:
    """What runs before each timed step: a decode step of ``rest``, blocks of the model the
    timed stages do not hold, as the rest of the model runs between a block's steps in one
    process (its weights stream through the caches while the engine's code and buffers stay
    in them); without such blocks (a model of a few), a read over :data:`FLUSH_BYTES`."""
    if rest is None:
        buffer = torch.zeros(FLUSH_BYTES // 4)

        def read() -> None:
            buffer.sum()  # a read: the lines it leaves are clean, evicting them costs nothing

        return read
    hidden = torch.randn(1, 1, lm.shape.hidden_size).to(rest.dtype)

    def flush() -> None:
        rest.step(hidden, 0, rest.new_cache())

    return flush


@torch.no_grad()
def _time_stages(stages: list[StageModel], lm: CausalLM, prefill: tuple[int, ...],
                 decode: tuple[int, ...], repeats: int, flush: Callable[[], None]
                 ) -> list[Timings]:
    """Per stage, the median ms of a prefill of each length and of a decode step at each
    cache length. The stages take turns at every point and repeat, so a burst of other work
    on the machine slows them alike rather than one of the stages whose difference is a
    block's time."""
    def x(stage: StageModel, tokens: int) -> torch.Tensor:
        if stage.io.hidden_in:
            return torch.randn(1, tokens, lm.shape.hidden_size).to(stage.dtype)
        return torch.randint(0, lm.shape.vocab_size, (1, tokens))

    def timed(stage: StageModel, tokens: int, cached: int) -> list[float]:
        """One prefill of ``tokens``, or :data:`DECODE_STEPS` decode steps from ``cached``
        on, each after a flush: a decode step is short, so it takes more samples."""
        cache = stage.new_cache()
        if cached:  # a decode step after another, as a generation's: the first re-plans
            filled = max(1, cached - 1)
            stage.step(x(stage, filled), 0, cache)
            if filled < cached:
                stage.step(x(stage, cached - filled), filled, cache)
        got = []
        for i in range(DECODE_STEPS if cached else 1):
            step_input = x(stage, tokens)
            flush()
            start = time.perf_counter()
            stage.step(step_input, cached + i, cache)
            got.append((time.perf_counter() - start) * 1e3)
        return got

    points = [("prefill", t, t, 0) for t in prefill] + [("decode", c, 1, c) for c in decode]
    times: list[dict[tuple[str, int], list[float]]] = [{} for _ in stages]
    for repeat in range(repeats + 1):  # the first warms up
        for phase, point, tokens, cached in points:
            for stage, got in zip(stages, times, strict=True):
                ms = timed(stage, tokens, cached)
                if repeat:
                    got.setdefault((phase, point), []).extend(ms)
    return [{phase: {point: statistics.median(got[(phase, point)]) for _, point, _, _ in points
                     if (phase, point) in got} for phase in ("prefill", "decode")}
            for got in times]
