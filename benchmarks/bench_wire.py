"""Wire-format throughput, each number against a plain memory copy timed in the same run.

1. The goal table (issue 19): ``encode_tensor(x, bits)`` then ``decode_tensor(msg)`` on the
   AUTO-SPLIT Table 6 activation (1x256x36x64 float32), per tensor and per channel, at 2/4/6/8
   bits and at 32, in GB/s of float32 input (4 bytes per value over encode + decode time); the
   copy, the encode and the decode are timed in turn within each repeat.
   Pass/fail columns: 4-bit at >= 4 GB/s and within 3.75x a copy (4 GB/s wherever a copy
   reaches 15 GB/s, issue 39), and 6-bit at least half the 4-bit speed.
2. Plain floats for a data plane: 32- and 16-bit encode and decode of 100 KB, 1 MB and 4 MB
   float32 tensors, each as a multiple of one copy of the tensor (decoding a memoryview slice of
   a larger receive buffer, as a data plane does).
3. The bit packer alone (pack + unpack) at realistic activation sizes, against AUTO-SPLIT's
   10 ms per 288 K values (Table 6).

Beside the figures it records what made them differ between machines (issue 39): torch's
thread count and ATen CPU capability, numpy's SIMD features, numba's target CPU and the wire
kernels' thread bound. Every GB/s figure has its ratio to the copy next to it.

Writes wire.md and wire.json to benchmarks/results/, or to --out. ``--quick`` runs a few
repetitions only (a smoke test: the numbers are not for quoting).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from edgesplit.hardware.profile import time_call
from edgesplit.quant import decode_tensor, encode_tensor, pack_bits, unpack_bits

RESULTS = Path(__file__).parent / "results"
TABLE6 = (1, 256, 36, 64)
SIZES = {"AUTO-SPLIT Table 6 (288 KB of 8-bit values)": 288 * 1024,
         "ResNet-50 layer4 output (2048x7x7)": 100_352,
         "ResNet-50 stage-1 output (256x56x56)": 802_816}
PLAIN_BYTES = {"100 KB": 100_000, "1 MB": 1 << 20, "4 MB": 4 << 20}
GOAL_GBS = 4.0
# issue 39: 4 GB/s wherever a copy reaches 15 GB/s, i.e. encode + decode within 3.75 copies
GOAL_X_COPY = 15.0 / GOAL_GBS
_NOTE = ("The codec runs no torch arithmetic or reduction on a float32 quantized tensor, and at "
         "most one thread per 2^19 values (the Table 6 tensor: the caller's thread alone), so "
         "its speed follows the memory, not the core count or the load (the instruction set only"
         " through numba's host target); until issue 39 its min/max was torch's aminmax on "
         "torch's thread pool, which cost 2-100x its quiet time on machines with many threads or"
         " a busy core (4-bit at 2.5 GB/s where a copy ran at 28). Compare machines by the x "
         "copy column.")


def settings() -> dict:
    """What the codec's speed could depend on besides memory bandwidth, for the results file."""
    import numba
    from llvmlite import binding

    from edgesplit.quant import _kernels
    try:  # numpy 2's module; numpy 1 called it numpy.core
        from numpy._core import _multiarray_umath as umath
    except ImportError:
        from numpy.core import _multiarray_umath as umath
    simd = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
    return {"torch_threads": torch.get_num_threads(),
            "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "numpy_simd": simd,
            "numba_cpu": numba.config.CPU_NAME or binding.get_host_cpu_name(),
            "wire_kernel_threads": _kernels.workers_for(1 << 30),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count()}


def _ms(fn, repeats: int) -> float:
    return time_call(fn, warmup=2, repeats=repeats)["median"]


def _ms_in_turn(fns: list, repeats: int, warmup: int = 2) -> list[float]:
    """Median ms of each of ``fns``, timed in turn within every repeat (copy, encode, decode,
    copy, ...): a burst of other work then lands on one repeat of each, which the medians drop,
    where timed one after another it could inflate all of one function's repeats and none of
    the copy's."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            spent.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(spent) for spent in times]


def _gbs(nbytes: int, ms: float) -> float:
    return nbytes / 1e6 / ms


def goal_rows(repeats: int) -> list[dict]:
    """Encode + decode of the Table 6 tensor at each width, with a copy timed alongside."""
    x = torch.randn(*TABLE6, generator=torch.Generator().manual_seed(0))
    source, nbytes = x.numpy(), x.numel() * 4
    rows = []
    for layout, axis in (("per tensor", None), ("per channel", 1)):
        for bits in (2, 4, 6, 8, 32):
            if bits == 32 and axis is not None:
                continue
            message = encode_tensor(x, bits, per_channel_axis=axis)
            decode_tensor(message)  # compiles the kernels (or loads them from numba's cache)
            copy_ms, encode_ms, decode_ms = _ms_in_turn(
                [lambda: source.copy(),
                 lambda: encode_tensor(x, bits, per_channel_axis=axis),
                 lambda: decode_tensor(message)], repeats)
            rows.append({"layout": layout, "bits": bits, "encode_ms": encode_ms,
                         "decode_ms": decode_ms, "copy_ms": copy_ms,
                         "gb_per_s": _gbs(nbytes, encode_ms + decode_ms),
                         "copy_gb_per_s": _gbs(nbytes, copy_ms)})
    return _judged(rows)


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Each row's median over repeated runs of :func:`goal_rows` (a verdict near its goal is
    read from the median of runs, never from one), judged again."""
    keys = ("encode_ms", "decode_ms", "copy_ms", "gb_per_s", "copy_gb_per_s")
    rows = []
    for same in zip(*runs, strict=True):
        row = dict(same[0])
        row.update({k: statistics.median(r[k] for r in same) for k in keys})
        row["x_copy"] = statistics.median((r["encode_ms"] + r["decode_ms"]) / r["copy_ms"]
                                          for r in same)
        rows.append(row)
    return _judged(rows)


def _x_copy(row: dict) -> float:
    """Encode + decode time in copies: the median of the runs' ratios where it was taken."""
    return row.get("x_copy", (row["encode_ms"] + row["decode_ms"]) / row["copy_ms"])


def _judged(rows: list[dict]) -> list[dict]:
    for layout in ("per tensor", "per channel"):
        by_bits = {r["bits"]: r for r in rows if r["layout"] == layout}
        for r in by_bits.values():
            r["goal_4gbs"] = r["gb_per_s"] >= GOAL_GBS if r["bits"] == 4 else None
            r["goal_x_copy"] = _x_copy(r) <= GOAL_X_COPY if r["bits"] == 4 else None
            r["goal_half_of_4bit"] = (r["gb_per_s"] >= by_bits[4]["gb_per_s"] / 2
                                      if r["bits"] == 6 else None)
    return rows


def plain_rows(repeats: int) -> list[dict]:
    """32/16-bit encode and decode (of a slice of a receive buffer) as multiples of a copy."""
    rows = []
    for label, nbytes in PLAIN_BYTES.items():
        x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(1))
        source = x.numpy()
        for bits in (32, 16):
            message = encode_tensor(x, bits)
            receive = bytearray(64 + len(message))
            receive[64:] = message
            view = memoryview(receive)[64:]
            copy_ms = _ms(lambda: source.copy(), repeats)
            encode_ms = _ms(lambda: encode_tensor(x, bits), repeats)
            decode_ms = _ms(lambda: decode_tensor(view), repeats)
            rows.append({"tensor": label, "bytes": nbytes, "bits": bits, "copy_ms": copy_ms,
                         "encode_ms": encode_ms, "decode_ms": decode_ms,
                         "encode_x_copy": encode_ms / copy_ms,
                         "decode_x_copy": decode_ms / copy_ms})
    return rows


def packer_rows(repeats: int) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    for label, count in SIZES.items():
        source = rng.random(count, dtype=np.float32)
        copy_ms = _ms(lambda: source.copy(), repeats)
        for bits in (2, 4, 6, 8):
            values = rng.integers(0, 1 << bits, count, dtype=np.uint8)
            packed = pack_bits(values, bits)
            pack_ms = _ms(lambda: pack_bits(values, bits), repeats)
            unpack_ms = _ms(lambda: unpack_bits(packed, bits, count), repeats)
            rows.append({"activation": label, "elements": count, "bits": bits,
                         "pack_ms": pack_ms, "unpack_ms": unpack_ms, "copy_ms": copy_ms,
                         "pack_unpack_gb_per_s": _gbs(count * 4, pack_ms + unpack_ms),
                         "vs_copy": (pack_ms + unpack_ms) / copy_ms,
                         "speedup_vs_autosplit_packer": (10.0 * count / (288 * 1024)) / pack_ms})
    return rows


def _mark(ok: bool | None) -> str:
    return "" if ok is None else "pass" if ok else "FAIL"


def report(goal: list[dict], runs: list[list[dict]], plain: list[dict], packer: list[dict],
           load: str, setup: dict) -> str:
    lines = ["# Wire format throughput", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
             f"load average before the run: {load}. Every ratio is against a copy timed in the "
             "same run.", "",
             f"Settings: torch {setup['torch_threads']} threads, ATen capability "
             f"{setup['aten_capability']}, numpy SIMD {' '.join(setup['numpy_simd']) or 'none'}"
             f", numba target {setup['numba_cpu']}, wire kernels at most "
             f"{setup['wire_kernel_threads']} threads ({setup['cpus_usable']} CPUs usable).", "",
             _NOTE, "",
             "## Encode + decode of the AUTO-SPLIT Table 6 tensor (1x256x36x64 float32)", "",
             "GB/s of float32 input: 4 bytes a value over (encode + decode) time. Goals: 4-bit "
             f">= {GOAL_GBS:g} GB/s and within {GOAL_X_COPY:g}x a copy ({GOAL_GBS:g} GB/s wherever"
             " a copy reaches 15 GB/s); 6-bit at least half the 4-bit speed.", "",
             "| layout | bits | encode ms | decode ms | GB/s | copy GB/s | x copy | >= 4 GB/s | "
             f"<= {GOAL_X_COPY:g}x copy | 6-bit >= half 4-bit |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in goal:
        lines.append(f"| {r['layout']} | {r['bits']} | {r['encode_ms']:.3f} | "
                     f"{r['decode_ms']:.3f} | {r['gb_per_s']:.2f} | {r['copy_gb_per_s']:.1f} | "
                     f"{r['x_copy']:.2f} | "
                     f"{_mark(r['goal_4gbs'])} | {_mark(r['goal_x_copy'])} | "
                     f"{_mark(r['goal_half_of_4bit'])} |")
    lines += ["", f"Each figure is the median of {len(runs)} runs (each itself the median of its "
              "repeats, the copy, the encode and the decode timed in turn within each "
              "repeat). Every run's 4-bit GB/s (x copy):"]
    for layout in ("per tensor", "per channel"):
        each = [next(r for r in run if r["layout"] == layout and r["bits"] == 4) for run in runs]
        lines.append(f"- {layout}: " + ", ".join(
            f"{r['gb_per_s']:.2f} ({_x_copy(r):.2f})" for r in each)
            + f"; every run within {GOAL_X_COPY:g}x a copy: "
            + ("yes" if all(r["goal_x_copy"] for r in each) else "no"))
    lines += ["", "## Plain floats (a data plane's 32/16-bit tensors)", "",
              "Decoding reads a memoryview slice of a larger receive buffer; the tensor owns its "
              "memory.", "",
              "| tensor | bits | copy ms | encode ms | x copy | decode ms | x copy |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in plain:
        lines.append(f"| {r['tensor']} | {r['bits']} | {r['copy_ms']:.3f} | "
                     f"{r['encode_ms']:.3f} | {r['encode_x_copy']:.1f} | {r['decode_ms']:.3f} | "
                     f"{r['decode_x_copy']:.1f} |")
    lines += ["", "## The bit packer alone (numpy)", "",
              "Throughput counts the float32 activation the values stand for; `vs paper` "
              "compares packing time with AUTO-SPLIT Table 6 (10 ms per 288 K values).", "",
              "| activation | bits | pack ms | unpack ms | pack+unpack GB/s | x copy | vs paper |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in packer:
        lines.append(f"| {r['activation']} | {r['bits']} | {r['pack_ms']:.3f} | "
                     f"{r['unpack_ms']:.3f} | {r['pack_unpack_gb_per_s']:.2f} | "
                     f"{r['vs_copy']:.1f} | {r['speedup_vs_autosplit_packer']:.0f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for wire.md and wire.json (default benchmarks/results)")
    parser.add_argument("--quick", action="store_true",
                        help="a few repetitions: checks the script runs, numbers not for quoting")
    parser.add_argument("--runs", type=int, default=5,
                        help="runs of the Table 6 measurement; the table shows their median")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 25
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    setup = settings()
    runs = [goal_rows(repeats) for _ in range(1 if args.quick else max(1, args.runs))]
    goal, plain = median_rows(runs), plain_rows(repeats)
    packer = packer_rows(repeats)
    load_after = " ".join(f"{v:.2f}" for v in os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wire.json").write_text(json.dumps(
        {"version": 5, "load_average": load, "load_average_after": load_after,
         "settings": setup, "quick": args.quick, "goal": goal, "goal_runs": runs,
         "plain": plain, "packer": packer}, indent=2) + "\n")
    text = report(goal, runs, plain, packer, f"{load} (after: {load_after})", setup)
    (args.out / "wire.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
