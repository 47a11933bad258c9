"""Measure this machine's block times for one model and precision: the table
``this-machine`` prices that model with (:mod:`edgesplit.llm.planning.calibration`).

Three real stages are built from the model's checkpoint at the precision's engine (torch
modules, or one ONNX Runtime graph for quantized weights), each timed at the prompt lengths
:data:`PREFILL_TOKENS` (a prefill on an empty cache) and the cache lengths
:data:`DECODE_CACHED` (one decode step): the embedding with :data:`SHORT` and with
:data:`LONG` decoder blocks, whose difference is :data:`LONG` - :data:`SHORT` blocks'
time, and the head after :data:`SHORT` blocks. What is left of the short stage once its
blocks are taken off is the embedding's (with the stage's fixed cost of a step), and of the
head's the head's.

In one process every block's weights leave the caches before the next step reaches it (the
model is larger than the last-level cache), while a stage of a few blocks stepped back to back
keeps its own in cache and runs up to twice as fast. So before each timed step the blocks
after the long stage (up to :data:`FLUSH_BYTES` of their weights, none the timed stages hold)
take a decode step, as the rest of the model runs between two steps of a block: their weights
evict the timed stage's, while the engine's code and buffers stay in the caches, as they do in
a whole model's run (a plain read over a buffer evicts those too: in one run it priced the
quantized path, whose blocks take a fraction of a millisecond, 20-40 % slow). A model with no
such blocks reads a buffer of :data:`FLUSH_BYTES` instead. The three stages take turns at
every point, so a burst of other work slows them alike. Medians of ``repeats`` after a
warm-up; 15-40 s for SmolLM2 at Q4_1 on this busy 2-core machine (load 1-6). Cached per machine,
model, precision and thread count; measured again on ``EDGESPLIT_REMEASURE=1`` or
``llm plan --calibrate``. Timing needs a quiet machine: on a busy one the table is as noisy as
the machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import get_topology
from edgesplit.llm.model.description import CausalLM, describe_causal_lm
from edgesplit.llm.planning.calibration import (
    BlockKind,
    BlockTimes,
    load_block_times,
    model_key,
    save_block_times,
    stage_threads,
)
from edgesplit.llm.planning.costs import LLMWorkload
from edgesplit.llm.planning.plan import plan_llm_at
from edgesplit.llm.stage.compute import StageModel, open_stage

__all__ = ["DECODE_CACHED", "FLUSH_BYTES", "LONG", "PREFILL_TOKENS", "SHORT",
           "calibrate_this_machine", "measure_block_times"]

PREFILL_TOKENS = (8, 32, 64, 128)
DECODE_CACHED = (8, 64, 256)
SHORT, LONG = 1, 6  # decoder blocks of the two embedding stages
FLUSH_BYTES = 64 * 2**20  # twice the 32 MiB last-level cache of the machines measured
_CHAIN = "home-wifi"  # any 3-device chain: the stages are cut from plans on it

Timings = dict[str, dict[int, float]]  # phase -> points -> ms


def calibrate_this_machine(model: Any, dtype: str = "float32", *, threads: int | None = None,
                           repeats: int = 7, remeasure: bool = False) -> BlockTimes:
    """``model``'s block times at ``dtype`` on this machine: the cached table, else measured
    now (:func:`measure_block_times`) and cached, which ``this-machine`` then prices the
    model with in every plan."""
    lm = describe_causal_lm(model, dtype=dtype)
    threads = threads or stage_threads(lm)
    cached = None if remeasure else load_block_times(lm, threads)
    if cached is not None:
        return cached
    table = measure_block_times(lm, threads=threads, repeats=repeats)
    save_block_times(table)
    return table


def measure_block_times(lm: CausalLM, *, threads: int = 1, repeats: int = 7) -> BlockTimes:
    """Time ``lm``'s blocks here (module docstring): ConfigError for a model of fewer than
    two decoder blocks (one block's time is a difference of two stages)."""
    layers = lm.shape.num_layers
    if layers < 2:
        raise ConfigError(f"{lm.name} has {layers} decoder block(s): measuring one block's "
                          "time needs two stages that differ in blocks (at least 2)")
    limit = lm.shape.max_positions - 1
    prefill = tuple(sorted({min(t, limit) for t in PREFILL_TOKENS}))
    decode = tuple(sorted({min(c, limit - 1) for c in DECODE_CACHED}))
    long = min(LONG, layers)
    n = lm.n
    context = max(*prefill, *decode) + 1
    workload = LLMWorkload(prompt_tokens=max(prefill), new_tokens=context - max(prefill),
                           max_context=context)

    def stage(boundaries: tuple[int, ...], index: int) -> StageModel:
        plan = plan_llm_at(lm, get_topology(_CHAIN), boundaries, workload,
                           method="calibration")
        return open_stage(plan, index, threads=threads)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        stages = [stage((0, 1 + SHORT, n, n), 0), stage((0, 1 + long, n, n), 0),
                  stage((0, 0, n - 1 - SHORT, n), 2)]
        # the blocks none of the timed stages holds, run between their steps
        end = _flush_end(lm, 1 + long, n - 1 - SHORT)
        rest = stage((0, 1 + long, end, n), 1) if end > 1 + long else None
        short, longer, head = _time_stages(stages, lm, prefill, decode, repeats,
                                           _flusher(rest, lm))
    finally:
        torch.set_num_threads(before)

    def split(phase: str) -> dict[BlockKind, tuple[tuple[int, float], ...]]:
        block = {x: max(0.0, (longer[phase][x] - short[phase][x]) / (long - SHORT))
                 for x in short[phase]}
        rest = {"embed": short, "head": head}
        out: dict[BlockKind, tuple[tuple[int, float], ...]] = {
            "decoder": tuple(sorted(block.items()))}
        for kind in ("embed", "head"):
            out[kind] = tuple((x, max(0.0, ms - SHORT * block[x]))
                              for x, ms in sorted(rest[kind][phase].items()))
        return out

    return BlockTimes(model=model_key(lm), precision=lm.dtype, threads=threads,
                      prefill=split("prefill"), decode=split("decode"),
                      source=f"measured {time.strftime('%Y-%m-%d %H:%M')}: stages of "
                             f"{SHORT} and {long} blocks and the head, medians of {repeats} "
                             "steps, each after a step of other blocks")


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

    def timed(stage: StageModel, tokens: int, cached: int) -> float:
        cache = stage.new_cache()
        if cached:
            stage.step(x(stage, cached), 0, cache)
        step_input = x(stage, tokens)
        flush()
        start = time.perf_counter()
        stage.step(step_input, cached, cache)
        return (time.perf_counter() - start) * 1e3

    points = [("prefill", t, t, 0) for t in prefill] + [("decode", c, 1, c) for c in decode]
    times: list[dict[tuple[str, int], list[float]]] = [{} for _ in stages]
    for repeat in range(repeats + 1):  # the first warms up
        for phase, point, tokens, cached in points:
            for stage, got in zip(stages, times, strict=True):
                ms = timed(stage, tokens, cached)
                if repeat:
                    got.setdefault((phase, point), []).append(ms)
    return [{phase: {point: statistics.median(got[(phase, point)]) for _, point, _, _ in points
                     if (phase, point) in got} for phase in ("prefill", "decode")}
            for got in times]
