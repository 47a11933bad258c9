"""``this-machine`` priced from its own measured block times, not the roofline alone.

The roofline predicted SmolLM2's decode 2.7x and prefill 2.2x faster than a stage runs here:
most of a step is dispatch, attention over the cache and the cache's own traffic, which peaks
do not see. So this machine's device is priced from a table of real block times
(:class:`BlockTimes`: one decoder block, the embedding and the head, each at a few prompt
lengths (prefill) and cache lengths (decode), for one model, precision and stage thread
count), measured by :func:`edgesplit.llm.stage.calibration.calibrate_this_machine` in a few
seconds and cached beside ``this-machine``'s own measurement under the same machine
fingerprint, keyed by model, precision, activations setting (``float`` | ``int8`` | ``mixed``:
a quantized stage's kernels differ by it) and thread count.

A table records what it was measured under: the cores other work kept busy meanwhile (where
the OS says), the highest 1-minute load average seen while measuring and the code that
measured it (edgesplit, torch, ONNX Runtime). A table measured
on a busy machine, or by other code, is not a price of this machine now
(:func:`table_problem`): planning refuses it with a line saying how to measure again
(:class:`StaleBlockTimesError`), and calibrating measures again over it. On a busy machine
a table is as noisy as the machine: one cached while other work ran mispredicted a whole
model by up to +217 %.

:class:`MeasuredBlocks` is the estimator that reads the tables: it interpolates a block's time
in tokens or cache length (linearly, extrapolating the nearest segment) and hands any model or
precision it has no table for, and every single kernel, to the estimator it wraps (the
roofline). :func:`llm_estimator_for` picks it for ``this-machine`` when a table is cached,
the device's own estimator otherwise.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgesplit.data.cache import cache_dir
from edgesplit.errors import ConfigError
from edgesplit.hardware import Device, LatencyEstimator, LayerWork, estimator_for
from edgesplit.llm.model.description import CausalLM, Phase

__all__ = [
    "BUSY_LIMIT",
    "THIS_MACHINE",
    "BlockKind",
    "BlockTimes",
    "MeasuredBlocks",
    "StaleBlockTimesError",
    "TableKind",
    "block_times_path",
    "code_versions",
    "llm_estimator_for",
    "load_block_times",
    "model_key",
    "ops_ms",
    "quiet_load",
    "save_block_times",
    "stage_threads",
    "table_problem",
]

log = logging.getLogger(__name__)
THIS_MACHINE = "this-machine"
BlockKind = Literal["embed", "decoder", "head"]
KINDS: tuple[BlockKind, ...] = ("embed", "decoder", "head")
# what a table holds: each kind of block, and "step", a stage's fixed cost of a step (a call
# into its engine: ~0.25 ms a decode step on one thread here, torch or ONNX Runtime), which
# "embed" holds already: a model of one stage pays it once
TableKind = Literal["embed", "decoder", "head", "step"]
TABLE_VERSION = 2  # raise when what is measured changes: older tables are not taken
BUSY_LIMIT = 0.5  # cores other work may keep busy on average while a table is measured
# the code whose versions a table records: another one computes (or times) otherwise
_CODE = ("edgesplit", "torch", "onnxruntime")

Points = tuple[tuple[int, float], ...]  # (tokens or cached tokens, ms), rising
# tables saved by this process, by path: taken even where EDGESPLIT_REMEASURE ignores the
# cache (what it asks for is measured anew, once, not that the new table be ignored)
_SAVED: dict[Path, BlockTimes] = {}


class BlockTimes(BaseModel):
    """Measured milliseconds of one block of each kind of a model at one precision on this
    machine: ``prefill[kind]`` by prompt tokens, ``decode[kind]`` by cached tokens. A
    stage's fixed cost of a step (a call into its engine) is in ``embed``: every stage of
    one process starts there; ``step`` holds it apart (a stage of middle blocks pays it too,
    which a sum of block times does not price: ~2 % of a stage of a few blocks)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="the model's fingerprint, or its source when random")
    precision: str
    threads: int = Field(ge=1, description="threads the stage computed on")
    activations: str = Field("float", description="how quantized weights' stages compute "
                                                  "(float, int8, mixed)")
    prefill: dict[TableKind, Points]
    decode: dict[TableKind, Points]
    load: float = Field(ge=0, description="the highest 1-minute load average seen while "
                                          "measuring")
    busy: float | None = Field(None, description="cores other work (other processes, the "
                                                 "hypervisor's steal) kept busy on average "
                                                 "while measuring; None: not known here")
    versions: dict[str, str] = Field(description="the code that measured it: edgesplit, "
                                                 "torch, onnxruntime")
    source: str = ""
    version: int = TABLE_VERSION

    def ms(self, kind: TableKind, phase: Phase) -> float:
        """One ``kind`` block's time in ``phase``."""
        if phase.kind == "prefill":
            return _interpolate(self.prefill[kind], phase.tokens)
        return _interpolate(self.decode[kind], phase.cached)

    def matches(self, lm: CausalLM, threads: int, activations: str = "float") -> bool:
        return (self.model, self.precision, self.threads, self.activations, self.version) == (
            model_key(lm), lm.dtype, threads, activations, TABLE_VERSION)


class StaleBlockTimesError(ConfigError):
    """This machine's cached block times were measured on a busy machine or by other code."""


def quiet_load(threads: int) -> float:
    """The highest 1-minute load average a table measured on ``threads`` threads is taken
    at: every core the stage does not use busy at most half the time (1.5 on 2 cores, one
    thread). Above it other work shared the cores and the memory the blocks were timed on."""
    return max(1, (os.cpu_count() or 1) - threads) + 0.5


def code_versions() -> dict[str, str]:
    """The installed versions of the code a table's times depend on ("" where absent)."""
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return ""

    return {name: version(name) for name in _CODE}


def table_problem(table: BlockTimes) -> str | None:
    """Why ``table`` does not price this machine now (None: it does): measured while other
    work ran (by the cores it kept busy where known: the load average lags a minute, so it
    still holds work that ended before the measurement began, such as a benchmark's own stage
    processes; else by the load average), or by other code than the installed."""
    limit = quiet_load(table.threads)
    if table.busy is not None:
        if table.busy > BUSY_LIMIT:
            return (f"measured while other work kept {table.busy:.1f} cores busy (above "
                    f"{BUSY_LIMIT})")
    elif table.load > limit:
        return (f"measured under load {table.load:.1f} (above {limit:.1f}: other work was "
                "running)")
    now = code_versions()
    changed = [f"{name} {table.versions.get(name) or '-'} (now {now[name] or '-'})"
               for name in _CODE if table.versions.get(name, "") != now[name]]
    return f"measured by other code: {', '.join(changed)}" if changed else None


def _interpolate(points: Points, x: int) -> float:
    """Linear between measured points; beyond them along the nearest segment (at least 0)."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if not xs:
        raise ConfigError("a block time table needs at least one measured point")
    if len(xs) == 1 or xs[0] <= x <= xs[-1]:
        return float(np.interp(x, xs, ys))
    i = 0 if x < xs[0] else len(xs) - 2
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return max(0.0, ys[i] + slope * (x - xs[i]))


def model_key(lm: CausalLM) -> str:
    """What a table is measured on: the checkpoint's content, or the config a random model
    is built from (its times do not depend on the values)."""
    return lm.fingerprint or lm.source


def stage_threads(lm: CausalLM) -> int:
    """Threads a stage of ``lm`` computes on unless told: one ONNX Runtime thread for
    quantized weights, torch's count for a float precision."""
    if lm.weights.quantized:
        return 1
    import torch

    return torch.get_num_threads()


def ops_ms(lm: CausalLM, device: Device, phase: Phase,
           estimator: LatencyEstimator) -> list[float]:
    """Each block's time as the sum of its kernels through ``estimator``, at the LM's
    activation width."""
    bits = 8 * lm.dtype_bytes
    return [sum(estimator.layer_ms(LayerWork(**vars(op), bits=bits), device)
                for op in lm.ops(i, phase)) for i in range(lm.n)]


class MeasuredBlocks(LatencyEstimator):
    """Block times from measured :class:`BlockTimes` where one matches the model, its
    precision, ``threads`` (default: :func:`stage_threads`) and ``activations``;
    ``fallback`` for the rest."""

    def __init__(self, tables: Iterable[BlockTimes], fallback: LatencyEstimator, *,
                 threads: int | None = None, activations: str = "float") -> None:
        self.tables = list(tables)
        self.fallback = fallback
        self.threads = threads
        self.activations = activations

    def layer_ms(self, work: LayerWork, device: Device) -> float:
        # one kernel: the tables hold whole blocks
        return self.fallback.layer_ms(work, device)

    def table_for(self, lm: CausalLM) -> BlockTimes | None:
        threads = self.threads or stage_threads(lm)
        return next((t for t in self.tables if t.matches(lm, threads, self.activations)),
                    None)

    def blocks_ms(self, lm: CausalLM, phase: Phase, device: Device) -> list[float]:
        table = self.table_for(lm)
        if table is None:
            return ops_ms(lm, device, phase, self.fallback)
        return [table.ms(block.kind, phase) for block in lm.blocks]


def block_times_path(model: str, precision: str, threads: int,
                     activations: str = "float") -> Path:
    """Where the table of ``model`` (:func:`model_key`) at ``precision`` and ``activations``
    on ``threads`` is cached for this machine (its fingerprint: processor, cores, memory,
    torch)."""
    from edgesplit.hardware.this_machine import machine_fingerprint

    key = hashlib.sha256(f"{model}|{precision}|{threads}|{activations}|{TABLE_VERSION}"
                         .encode()).hexdigest()
    return cache_dir() / "hardware" / f"llm-blocks-{machine_fingerprint()}-{key[:16]}.json"


def load_block_times(lm: CausalLM, threads: int | None = None,
                     activations: str = "float") -> BlockTimes | None:
    """The cached table of ``lm`` at ``activations`` on this machine (None: not measured
    here), whether or not it prices the machine now (:func:`table_problem`)."""
    threads = threads or stage_threads(lm)
    path = block_times_path(model_key(lm), lm.dtype, threads, activations)
    if path in _SAVED:
        return _SAVED[path]
    if os.environ.get("EDGESPLIT_REMEASURE") or not path.is_file():
        return None
    try:
        table = BlockTimes.model_validate_json(path.read_text())
    except (OSError, ValueError):
        log.warning("unreadable %s: this machine's block times are measured again", path)
        return None
    return table if table.matches(lm, threads, activations) else None


def save_block_times(table: BlockTimes) -> Path:
    """Cache ``table`` for this machine (whole or not at all); returns where."""
    path = block_times_path(table.model, table.precision, table.threads, table.activations)
    _SAVED[path] = table
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(table.model_dump_json(indent=1))
        partial.replace(path)
    except OSError as exc:
        log.warning("could not cache this machine's block times at %s (%s)", path, exc)
    return path


def llm_estimator_for(lm: CausalLM, device: Device,
                      activations: str = "float") -> LatencyEstimator:
    """How ``lm``'s blocks are priced on ``device`` at ``activations``: ``this-machine``
    from its measured block times when a table of ``lm`` is cached here, else the device's
    own estimator. StaleBlockTimesError for a cached table measured under load or by other
    code (:func:`table_problem`): it would price a machine that is not this one now."""
    base = estimator_for(device)
    if device.name != THIS_MACHINE:
        return base
    table = load_block_times(lm, activations=activations)
    if table is None:
        return base
    problem = table_problem(table)
    if problem is not None:
        raise StaleBlockTimesError(
            f"this machine's block times of {lm.name} at {lm.dtype} ({activations} "
            f"activations) were {problem}: measure them again on a quiet machine "
            f"(`edgesplit llm plan ... --precision {lm.dtype} --activations {activations} "
            "--calibrate`)")
    return MeasuredBlocks([table], base, activations=activations)
