"""Split generation of a real checkpoint, SmolLM2-135M-Instruct (the built-in
``smollm2-135m-instruct``), measured: stage processes on this machine, and placements on
emulated devices whose compute is real.

**A. Stage processes on this machine** (links unshaped, nothing emulated), at the precision
``edgesplit llm plan`` picks for the model: its GGUF's own (Q4_1 weights in ONNX Runtime
stages). The model split in
1, 2 and 3 stages (blocks [0, 32), [0, 16) + [16, 32), [0, 11) + [11, 21) + [21, 32)): the
first stage runs in this process (``LLMClient``), every later one in an ``edgesplit llm serve``
process of its own, over the data plane on 127.0.0.1. Threads shared fairly: every process,
this one included, computes with one thread, and a single session's steps never overlap
across stages, so every configuration uses one core at a time. Per configuration: a greedy
generation of ``--new-tokens`` tokens after the chat prompt "What is the capital of France?"
(37 tokens), one warm-up then ``--repeats``; the median TTFT and decode tokens/s (tokens after
the first over the time after the first). Goal (issue 35): 2 stages >= 0.85x one process's
decode tokens/s. Each stage's resident memory is measured in a process of its own that builds
only that stage (``open_stage``): the resident set after the imports a stage server makes (the
process baseline, reported), after loading, and in use (the plan's sessions' KV caches filled
to its max context), and the peak; goal (issue 53): in use within 20 % of the baseline plus
the plan's ``weight_bytes`` and ``kv_cache_bytes``.

**This machine's cost model** (``this_machine_check``): ``this-machine`` prices the model
from its own measured block times (``calibrate_this_machine``: cached, seconds to measure),
float32 and at the GGUF's own precision (Q4_1), against the whole model run as one stage in
this process (one thread); goal: prefill and decode within 15 %. The roofline's prediction is
shown beside it.

**B. Placements with real compute on emulated devices.** The model at its GGUF's precision
(Q4_1 linears, Q8_0 embedding), KV caches for 1,024 tokens, planned by every method (DP,
memory-proportional (exo), equal split, best single device) on two topologies where no device
holds it (``examples/llm-pi-tx2.yaml``: 2 devices; ``examples/llm-pi-tx2-nano.yaml``: 3;
of different speeds and memory), so every feasible placement splits and the best single device
is infeasible; each plan served as a chain of in-process stage servers (gRPC and the data
plane over 127.0.0.1). Each stage runs its real blocks and is then slowed by the ratio of its
device's planned time for them to this machine's, measured when the stage starts, each step
timed after the idle a run leaves the stage between its steps (``--emulate-device``; never
paced to the plan), and links are shaped to the plan's. Some
devices are faster than this machine (factor < 1), which no sleep can emulate, so everything
runs ``D`` times slower (time dilation: every stage's factor and every link's time times ``D``,
the smallest ``D`` that makes every factor >= 1, plus 30 %), and measured times are divided by
``D``. Goals: the DP splits, measures the best request time, and its predicted tokens/s and
TTFT are within 15 % of the measured: the median over the DP's plan run on ``--dp-chains`` (5)
chains of new stages, each stage measuring its reference afresh (one run to the next, the
references are where the spread is). What this can show: how the plan composes the parts it
prices (a decode step priced at the mean cache length, links both ways, encoding, serving
overhead), not whether a device preset is right (no such device here): the emulated compute
equals the plan's by construction; this machine's own cost model is checked apart.

Quiet machine: refuses to start above a 1-minute load of 1.0 (``--allow-load`` for a trial
run, with ``--out`` elsewhere); the load is recorded before and after. Writes llm.md,
llm.json and llm.png (B's first topology: measured against planned, by method).
``--smoke``: this machine's cost model and section B only, 8 new tokens, one generation,
written under the temporary folder.

    python benchmarks/bench_llm.py [--quick | --smoke] [--repeats 5] [--out DIR]
                                   [--allow-load X]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from quiet import require_quiet

from edgesplit.hardware import Topology, estimator_for, get_device, get_topology, resolve_topology
from edgesplit.hardware.profile import machine_info
from edgesplit.llm import LLMPlanning, LLMWorkload, describe_causal_lm, plan_llm, plan_llm_at
from edgesplit.llm import Phase as Work
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.generate.engine import plan_tokenizer
from edgesplit.llm.generate.report import generation_report
from edgesplit.llm.model.precision import default_precision
from edgesplit.llm.planning.costs import block_ms
from edgesplit.llm.stage.calibration import calibrate_this_machine
from edgesplit.llm.stage.compute import open_stage
from edgesplit.llm.stage.emulation import (
    IDLE_CAP_S,
    measured_reference,
    slowdown_factors,
)
from edgesplit.llm.stage.server import head_stage, llm_stage_server
from edgesplit.plan.model import Plan
from edgesplit.report.plots import plot_llm_methods
from edgesplit.runtime.options import ServeOptions
from edgesplit.runtime.shell import ServingShell

RESULTS = Path(__file__).parent / "results"
QUIET_LOAD = 1.0
MODEL = "smollm2-135m-instruct"
SPLITS = {1: (0, 32, 32, 32), 2: (0, 16, 32, 32), 3: (0, 11, 21, 32)}
EXAMPLES = Path(__file__).parents[1] / "examples"
# B's topologies: no device holds the model at B's precision, devices of different speeds
TOPOLOGIES = (EXAMPLES / "llm-pi-tx2.yaml", EXAMPLES / "llm-pi-tx2-nano.yaml")
B_DTYPE = "gguf"  # the GGUF's own: Q4_1 linears, a Q8_0 embedding
B_CONTEXT = 1024  # the KV cache every device holds room for (a chat's, not the run's 72)
PRECISIONS = ("float32", "gguf")  # this machine's cost model is checked at both
METHODS = ("dp", "memory_proportional", "equal_split", "single_device")
GOAL_TWO_STAGES = 0.85
GOAL_MEMORY = 0.20
GOAL_PREDICTION = 0.15
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _edgesplit() -> str:
    return str(Path(sys.executable).parent / "edgesplit")


# ---- A: stage processes on this machine --------------------------------------------------------
def split_plan(stages: int, new_tokens: int, prompt_tokens: int) -> Plan:
    """SmolLM2 over home-wifi's three devices, cut at SPLITS[stages], at the precision
    ``edgesplit llm plan`` picks for it: its GGUF's own (Q4_1, ONNX Runtime stages)."""
    return plan_llm_at(MODEL, get_topology("home-wifi"), SPLITS[stages],
                       LLMWorkload(prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                                   max_context=prompt_tokens + new_tokens),
                       method=f"{stages}-stage", dtype=default_precision(MODEL))


@contextlib.contextmanager
def stage_processes(plan: Plan, path: Path) -> Iterator[str | None]:
    """`edgesplit llm serve` for every stage after the first (the last started first); yields
    the second's address (None: one stage)."""
    assert plan.llm is not None
    procs: list[subprocess.Popen[str]] = []
    nxt: str | None = None
    try:
        for i in range(head_stage(plan.llm), 0, -1):
            cmd = [_edgesplit(), "llm", "serve", str(path), "--device", plan.devices[i].name,
                   "--port", "0", "--threads", "1", "--no-shape"]
            if nxt is not None:
                cmd += ["--next", nxt]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("listening on "):
                raise SystemExit(f"stage {plan.devices[i].name} did not start: {line!r}")
            nxt = line.split()[2]
        yield nxt
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def _generations(client: LLMClient, plan: Plan, prompt: list[int], new_tokens: int,
                 repeats: int, warmup: int, log, label: str) -> list[dict[str, Any]]:
    runs = []
    for i in range(warmup + repeats):
        tokens = list(client.generate(prompt, new_tokens))
        client.end_session()
        doc = generation_report(plan, prompt, tokens, session=client.session,
                                data_plane=client.data_plane)
        if i >= warmup:
            runs.append(doc)
            log(f"  {label}: run {i - warmup + 1}/{repeats}: TTFT {doc['ttft_ms']:.1f} ms, "
                f"{doc['tokens_per_s'] or 0:.2f} tokens/s")
    return runs


_MEASURE_STAGE = """
import gc, json, sys
import torch
torch.set_num_threads(1)
import edgesplit.llm.stage.server  # what `edgesplit llm serve` imports before it loads
from edgesplit.llm.model.precision import FLOAT_BYTES
from edgesplit.llm.stage.compute import open_stage
from edgesplit.plan import load_plan
plan = load_plan(sys.argv[1])
if plan.llm.dtype in FLOAT_BYTES:  # and what the stage imports to load its blocks
    import transformers.models.llama.modeling_llama
else:
    import gguf, onnx, onnxruntime, edgesplit.llm.stage.quantized_compute
def status():
    got = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = int(value.split()[0]) * 1024
    return got
gc.collect(); base = status()
stage = open_stage(plan, int(sys.argv[2]))
gc.collect(); loaded = status()
held = getattr(stage, "weight_bytes", None) or sum(  # quantized: what its graph holds
    t.numel() * t.element_size() for t in stage.tensors().values())
# the plan's sessions, each cache filled to the max context: the stage's resident worst case
length = plan.llm.max_context
x = (torch.randn(1, length, plan.llm.hidden_size, generator=torch.Generator().manual_seed(0))
     .to(stage.dtype) if stage.io.hidden_in else torch.arange(length).reshape(1, -1))
caches = [stage.new_cache() for _ in range(plan.llm.sessions)]
for cache in caches:
    stage.step(x, 0, cache)
gc.collect(); used = status()
print(json.dumps({"baseline": base["VmRSS"], "baseline_peak": base["VmHWM"],
                  "loaded": loaded["VmRSS"], "loaded_peak": loaded["VmHWM"],
                  "in_use": used["VmRSS"], "peak": used["VmHWM"], "held": held,
                  "modules": sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[3:]))}))
"""
# the large packages a stage process may import, reported as imported or not
_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "onnx", "onnxruntime", "gguf",
             "scipy", "networkx", "grpc")


def stage_memory(plan: Plan, path: Path) -> list[dict[str, Any]]:
    """Each stage with blocks built alone in a fresh process: resident bytes after the imports
    a stage server makes (the baseline), after loading, and with the plan's sessions' caches
    filled to the max context (in use), against the baseline plus the plan's weight and KV
    cache bytes."""
    assert plan.llm is not None
    rows = []
    for i, stage in enumerate(plan.llm.stages):
        if stage.start == stage.end:
            continue
        out = subprocess.run([sys.executable, "-c", _MEASURE_STAGE, str(path), str(i),
                              *_PACKAGES], capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        expected = got["baseline"] + stage.weight_bytes + stage.kv_cache_bytes
        rows.append({"device": stage.device, "blocks": stage.end - stage.start,
                     "planned_weight_bytes": stage.weight_bytes,
                     "planned_kv_cache_bytes": stage.kv_cache_bytes,
                     "baseline_bytes": got["baseline"], "expected_bytes": expected,
                     "loaded_bytes": got["loaded"], "loaded_peak_bytes": got["loaded_peak"],
                     "resident_bytes": got["in_use"], "peak_bytes": got["peak"],
                     "tensor_bytes": got["held"], "imports": got["modules"],
                     "ratio": got["in_use"] / expected})
    return rows


@torch.no_grad()
def one_process(dtype: str, prompt_tokens: int, new_tokens: int, repeats: int
                ) -> dict[str, float]:
    """The whole model as one stage in this process (the precision's engine, one thread): the
    median TTFT (the prompt's prefill through the head) and decode ms a token of a greedy
    generation of ``new_tokens`` after a random prompt, over ``repeats`` after a warm-up."""
    lm = describe_causal_lm(MODEL, dtype=dtype)
    n = lm.n
    plan = plan_llm_at(lm, get_topology("home-wifi"), (0, n, n, n),
                       LLMWorkload(prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                                   max_context=prompt_tokens + new_tokens), method="1-stage")
    stage = open_stage(plan, 0, threads=1)
    prompt = torch.randint(0, lm.shape.vocab_size, (1, prompt_tokens),
                           generator=torch.Generator().manual_seed(0))
    ttft, decode = [], []
    for _ in range(repeats + 1):
        cache = None  # the last generation's cache row back first: the stage has one
        cache = stage.new_cache()
        start = time.perf_counter()
        token = stage.step(prompt, 0, cache)
        first = time.perf_counter()
        for i in range(new_tokens - 1):
            token = stage.step(token.reshape(1, 1), prompt_tokens + i, cache)
        ttft.append((first - start) * 1e3)
        decode.append((time.perf_counter() - first) * 1e3 / max(1, new_tokens - 1))
    return {"ttft_ms": _median(ttft[1:]), "decode_ms": _median(decode[1:])}


def this_machine_check(prompt_tokens: int, new_tokens: int, one: dict[str, Any] | None = None,
                       repeats: int = 5) -> dict[str, Any]:
    """The whole model on this machine by its own cost model (``this-machine``, one thread:
    each precision's measured block times, :func:`calibrate_this_machine`, cached) against a
    real single process (:func:`one_process`), float32 and quantized, with the roofline's
    prediction beside it. ``one``: section A's one-process run, shown with the row of its precision.
    Section B does not carry this error: its emulation measures each stage's own blocks."""
    here = get_device("this-machine")
    prefill = Work.prefill(prompt_tokens)
    decode = Work.decode(prompt_tokens + max(0, new_tokens - 2) // 2)
    rows: dict[str, Any] = {}
    for dtype in PRECISIONS:
        table = calibrate_this_machine(MODEL, dtype, threads=1)
        lm = describe_causal_lm(MODEL, dtype=dtype)
        measured = one_process(dtype, prompt_tokens, new_tokens, repeats)
        roofline = estimator_for(here)
        row = {"precision": lm.dtype, "calibration": table.source,
               "predicted_prefill_ms": sum(block_ms(lm, here, prefill)),
               "predicted_decode_ms": sum(block_ms(lm, here, decode)),
               "roofline_prefill_ms": sum(block_ms(lm, here, prefill, roofline)),
               "roofline_decode_ms": sum(block_ms(lm, here, decode, roofline)),
               "measured_ttft_ms": measured["ttft_ms"],
               "measured_decode_ms": measured["decode_ms"]}
        if one and one.get("precision", "float32") == lm.dtype:
            row["section_a_ttft_ms"] = one["ttft_ms"]
            row["section_a_decode_ms"] = 1e3 / one["tokens_per_s"]
        row["error"] = {"prefill": row["predicted_prefill_ms"] / row["measured_ttft_ms"] - 1,
                        "decode": row["predicted_decode_ms"] / row["measured_decode_ms"] - 1}
        rows[lm.dtype] = row
    worst = max(abs(e) for r in rows.values() for e in r["error"].values())
    return {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "rows": rows,
            "worst_error": worst, "met": worst <= GOAL_PREDICTION}


def section_a(new_tokens: int, repeats: int, warmup: int, log=print) -> dict[str, Any]:
    probe = split_plan(1, new_tokens, 1)
    prompt = plan_tokenizer(probe).apply_chat_template(QUESTION, add_generation_prompt=True,
                                                       tokenize=True, return_dict=False)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for stages in SPLITS:
            plan = split_plan(stages, new_tokens, len(prompt))
            path = Path(tmp) / f"plan{stages}.json"
            plan.save(path)
            log(f"A: {stages} stage process(es)")
            with stage_processes(plan, path) as address, \
                    LLMClient(plan, address, shape=False) as client:
                runs = _generations(client, plan, prompt, new_tokens, repeats, warmup, log,
                                    f"{stages} stage(s)")
            rows[str(stages)] = {
                "stages": stages, "boundaries": list(SPLITS[stages]),
                "data_plane": runs[0]["data_plane"],
                "ttft_ms": _median([r["ttft_ms"] for r in runs]),
                "tokens_per_s": _median([r["tokens_per_s"] for r in runs]),
                "runs": [{"ttft_ms": r["ttft_ms"], "tokens_per_s": r["tokens_per_s"]}
                         for r in runs],
                "tokens": runs[0]["tokens"],
                "memory": stage_memory(plan, path),
            }
    one = rows["1"]["tokens_per_s"]
    for row in rows.values():
        row["vs_one_process"] = row["tokens_per_s"] / one
    memory = [m for row in rows.values() for m in row["memory"]]
    assert probe.llm is not None
    return {"prompt_tokens": len(prompt), "precision": probe.llm.dtype, "rows": rows,
            "this_machine": this_machine_check(len(prompt), new_tokens,
                                               {**rows["1"], "precision": probe.llm.dtype}),
            "same_tokens": len({tuple(r["tokens"]) for r in rows.values()}) == 1,
            "two_stages_vs_one": rows["2"]["vs_one_process"],
            "met_two_stages": rows["2"]["vs_one_process"] >= GOAL_TWO_STAGES,
            "memory_within": max(abs(m["ratio"] - 1) for m in memory),
            "met_memory": all(abs(m["ratio"] - 1) <= GOAL_MEMORY for m in memory)}


# ---- B: placements on emulated devices -----------------------------------------------------------
# A stage whose planned time in a phase is below this share of its plan's (an embedding
# alone: microseconds by a preset, a step's fixed cost here) does not set the dilation: it
# runs as is, its real time (a fraction of a millisecond) over its plan's.
NEGLIGIBLE_SHARE = 0.05


def dilation_for(planning: LLMPlanning) -> float:
    """The smallest slowdown that lets every stage of every method be emulated (factor >= 1),
    with a 30 % margin, at least 1, leaving out stages of a negligible share of their plan's
    compute in a phase (:data:`NEGLIGIBLE_SHARE`). Each distinct stage is built here and
    times its blocks as a stage does when it starts (``measured_reference`` after the run's
    idle, which at these dilations is the cap, ``IDLE_CAP_S``)."""
    idle = {"prefill": IDLE_CAP_S, "decode": IDLE_CAP_S}
    references: dict[tuple[int, int], dict] = {}
    low = math.inf
    for name in METHODS:
        plan = planning.plans[name]
        if not planning.placements[name].feasible:
            continue
        llm = plan.llm
        assert llm is not None
        totals = {"prefill": sum(s.prefill_ms for s in llm.stages),
                  "decode": sum(s.decode_ms for s in llm.stages)}
        for i, s in enumerate(llm.stages):
            if s.start == s.end:
                continue
            if (s.start, s.end) not in references:
                references[(s.start, s.end)] = measured_reference(
                    open_stage(plan, i), plan, repeats=1, idle=idle)
            planned = {"prefill": s.prefill_ms, "decode": s.decode_ms}
            factors = slowdown_factors(plan, i, references[(s.start, s.end)])
            low = min([low, *(f for phase, f in factors.items()
                              if planned[phase] >= NEGLIGIBLE_SHARE * totals[phase])])
    return max(1.0, math.ceil(13.0 / low) / 10.0)


@contextlib.contextmanager
def emulated_chain(plan: Plan, dilation: float) -> Iterator[str | None]:
    assert plan.llm is not None
    servers: list[ServingShell] = []
    nxt: str | None = None
    try:
        for i in range(head_stage(plan.llm), 0, -1):
            server = llm_stage_server(plan, plan.devices[i].name, ServeOptions(shape=True),
                                      next_address=nxt, emulate=True, dilation=dilation)
            nxt = f"127.0.0.1:{server.start('127.0.0.1', 0)}"
            servers.append(server)
        yield nxt
    finally:
        for server in servers:
            server.stop(grace_s=1.0)


def _method_row(name: str, plan: Plan, runs: list[dict[str, Any]], dilation: float
                ) -> dict[str, Any]:
    llm = plan.llm
    assert llm is not None
    ttft = [r["ttft_ms"] / dilation for r in runs]
    rate = [(r["tokens_per_s"] or 0.0) * dilation for r in runs]
    request = [r["total_ms"] / dilation for r in runs]
    row = {
        "method": name, "reason": plan.reason,
        "assignment": {s.device: s.end - s.start for s in llm.stages},
        "ttft_ms": _median(ttft), "tokens_per_s": _median(rate),
        "request_ms": _median(request),
        "predicted": {"ttft_ms": llm.ttft_ms, "tokens_per_s": llm.tokens_per_s,
                      "request_ms": plan.predicted.total_ms},
        "runs": [{"ttft_ms": a, "tokens_per_s": b, "request_ms": c}
                 for a, b, c in zip(ttft, rate, request, strict=True)],
        "tokens": runs[0]["tokens"],
        "stages": [{"device": s["device"], "blocks": len(s["blocks"]),
                    "prefill_ms": _median([r["stages"][i]["prefill_ms"] / dilation
                                           for r in runs]),
                    "decode_ms": _median([(r["stages"][i]["decode_ms"] or 0) / dilation
                                          for r in runs]),
                    "predicted_prefill_ms": s["predicted_prefill_ms"],
                    "predicted_decode_ms": s["predicted_decode_ms"]}
                   for i, s in enumerate(runs[0]["stages"])],
    }
    p = row["predicted"]
    row["error"] = {"tokens_per_s": p["tokens_per_s"] / row["tokens_per_s"] - 1,
                    "ttft": p["ttft_ms"] / row["ttft_ms"] - 1,
                    "request": p["request_ms"] / row["request_ms"] - 1}
    return row


def _fresh_dp_chain(plan: Plan, prompt: list[int], new_tokens: int, repeats: int, warmup: int,
                    dilation: float, log, k: int) -> dict[str, float]:
    """The DP's plan on a chain of new stages (each measures its reference again): its
    prediction's error on tokens/s and TTFT."""
    with emulated_chain(plan, dilation) as address, \
            LLMClient(plan, address, emulate=True, shape=True, dilation=dilation) as client:
        runs = _generations(client, plan, prompt, new_tokens, repeats, warmup, log,
                            f"dp (chain {k})")
    return _method_row("dp", plan, runs, dilation)["error"]


def section_b(topology: Topology, prompt_tokens: int, new_tokens: int, repeats: int,
              warmup: int, dp_chains: int = 1, log=print) -> dict[str, Any]:
    planning = plan_llm(MODEL, topology, LLMWorkload(
        prompt_tokens=prompt_tokens, new_tokens=new_tokens, max_context=B_CONTEXT),
        dtype=B_DTYPE)
    dilation = dilation_for(planning)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, planning.lm.shape.vocab_size, (prompt_tokens,),
                           generator=g).tolist()
    log(f"B: {topology.name}, time dilation x{dilation:g}")
    rows: dict[str, Any] = {}
    for name in METHODS:
        plan = planning.plans[name]
        if not planning.placements[name].feasible:
            rows[name] = {"method": name, "feasible": False, "reason": plan.reason}
            continue
        with emulated_chain(plan, dilation) as address, \
                LLMClient(plan, address, emulate=True, shape=True,
                          dilation=dilation) as client:
            runs = _generations(client, plan, prompt, new_tokens, repeats, warmup, log, name)
        rows[name] = _method_row(name, plan, runs, dilation) | {"feasible": True}
    ran = {n: r for n, r in rows.items() if r["feasible"]}
    best = min(ran, key=lambda n: ran[n]["request_ms"])
    dp = ran["dp"]
    # the DP's verdict is near its goal: more runs on fresh chains, each stage measuring its
    # own reference again (the run-to-run spread is there), the median of all the verdict
    chains = [dp["error"]] + [
        _fresh_dp_chain(planning.plans["dp"], prompt, new_tokens, repeats, warmup, dilation,
                        log, k) for k in range(2, dp_chains + 1)]
    dp_error = {key: statistics.median(c[key] for c in chains) for key in ("tokens_per_s",
                                                                           "ttft")}
    # a baseline that places the blocks as the DP does is the same plan: its run is a repeat
    others = [r["request_ms"] for n, r in ran.items() if r["assignment"] != dp["assignment"]]
    costs = planning.costs
    return {"topology": topology.name, "dilation": dilation, "methods": rows,
            "precision": planning.lm.dtype, "max_context": costs.workload.context,
            "model_bytes": int(costs.memory_need[0, costs.n]),
            "memory_limits": dict(zip(costs.devices, costs.memory_limits, strict=True)),
            # what the goal asks of the topology: no device holds the model, the DP splits
            "single_device_fits": planning.placements["single_device"].feasible,
            "dp_stages": sum(1 for hi_lo in planning.placements["dp"].ranges()
                             if hi_lo[1] > hi_lo[0]),
            "best_measured": best,
            "same_as_dp": [n for n, r in ran.items() if n != "dp"
                           and r["assignment"] == dp["assignment"]],
            "met_dp_best": all(dp["request_ms"] <= x for x in others),
            "dp_error": dp_error, "dp_chains": chains,
            "met_dp_prediction": max(abs(dp_error["tokens_per_s"]),
                                     abs(dp_error["ttft"])) <= GOAL_PREDICTION,
            "same_tokens": len({tuple(r["tokens"]) for r in ran.values()}) == 1}


# ---- the run -----------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def render(doc: dict[str, Any]) -> list[str]:
    a = doc["a"]
    w = doc["workload"]
    lines = [
        "# Split generation of a real checkpoint: SmolLM2-135M-Instruct",
        "",
        f"Greedy; median of {w['repeats']} generation(s) after {w['warmup']} "
        f"warm-up, {w['new_tokens']} new tokens. Load average {doc['load_before']:.2f} "
        f"before, {doc['load_after']:.2f} after; {doc['wall_s']:.0f} s"
        f"{' (quick)' if doc['quick'] else ''}. Every run is in llm.json.",
        "",
        "## A. Stage processes on this machine (one compute thread each, links unshaped)",
        "",
        f"Precision {a.get('precision', 'float32')} (the plan's default for the model). "
        f"Prompt: the chat template around \"What is the capital of France?\" "
        f"({a['prompt_tokens']} tokens).",
        "",
        "| stages | blocks | TTFT ms | decode tokens/s | vs 1 process | runs (tokens/s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in a["rows"].values():
        cuts = r["boundaries"]
        lines.append(f"| {r['stages']} | {cuts} | {r['ttft_ms']:.1f} | "
                     f"{r['tokens_per_s']:.2f} | x{r['vs_one_process']:.2f} | "
                     + ", ".join(f"{x['tokens_per_s']:.1f}" for x in r["runs"]) + " |")
    lines += [
        "",
        f"Goal: 2 stages >= {GOAL_TWO_STAGES}x one process's decode tokens/s: "
        f"x{a['two_stages_vs_one']:.2f} ({'met' if a['met_two_stages'] else 'MISSED'}). "
        f"Same tokens in every configuration: {'yes' if a['same_tokens'] else 'NO'}.",
        "",
        "Resident memory of each stage, built alone in a fresh process: the baseline after "
        "the imports a stage server makes (nothing loaded), loaded, and in use (the plan's "
        "sessions' KV caches filled to its max context), against the baseline + the plan's "
        "weight and KV cache bytes; peak: the most resident at any time:",
        "",
        "| stages | device | blocks | baseline MiB | planned weights MiB | planned KV MiB | "
        "expected MiB | loaded MiB | in use MiB | peak MiB | vs expected |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mib = 2**20
    for r in a["rows"].values():
        for m in r["memory"]:
            lines.append(f"| {r['stages']} | {m['device']} | {m['blocks']} | "
                         f"{m['baseline_bytes'] / mib:.0f} | "
                         f"{m['planned_weight_bytes'] / mib:.1f} | "
                         f"{m['planned_kv_cache_bytes'] / mib:.1f} | "
                         f"{m['expected_bytes'] / mib:.0f} | {m['loaded_bytes'] / mib:.0f} | "
                         f"{m['resident_bytes'] / mib:.0f} | {m['peak_bytes'] / mib:.0f} | "
                         f"{_pct(m['ratio'] - 1)} |")
    imports = sorted({name for r in a["rows"].values() for m in r["memory"]
                      for name in m.get("imports", [])})
    lines += ["", f"Goal: within {GOAL_MEMORY:.0%} of expected: worst "
              f"{a['memory_within']:.1%} ({'met' if a['met_memory'] else 'MISSED'}). "
              f"Large packages a stage process imported: {', '.join(imports) or 'none'}.", ""]
    return lines


def render_this_machine(t: dict[str, Any]) -> list[str]:
    """This machine's cost model against a real single process, per precision."""
    lines = [
        "## This machine's cost model against one process",
        "",
        f"`this-machine` (one thread) prices each precision from its own measured block "
        "times (`llm.planning.calibration`: one decoder block, the embedding and the head "
        "timed as real stages at a few prompt and cache lengths, each step after a step of "
        "other blocks; measured once, cached), against the whole model run as one stage in one "
        f"process: a prompt of {t['prompt_tokens']} tokens, {t['new_tokens']} new, median "
        "after a warm-up. The roofline's prediction (peaks measured here) beside it.",
        "",
        "| precision | prefill ms: predicted / measured TTFT (error) | decode ms a token: "
        "predicted / measured (error) | roofline prefill, decode ms |",
        "|---|---|---|---|",
    ]
    for r in t["rows"].values():
        lines.append(
            f"| {r['precision']} | {r['predicted_prefill_ms']:.1f} / "
            f"{r['measured_ttft_ms']:.1f} ({_pct(r['error']['prefill'])}) | "
            f"{r['predicted_decode_ms']:.2f} / {r['measured_decode_ms']:.2f} "
            f"({_pct(r['error']['decode'])}) | {r['roofline_prefill_ms']:.1f}, "
            f"{r['roofline_decode_ms']:.2f} |")
    a = next((r for r in t["rows"].values() if "section_a_ttft_ms" in r), {})
    if a:
        lines += ["", f"Section A's one process ({a['precision']}, through the client) for "
                  "comparison: "
                  f"TTFT {a['section_a_ttft_ms']:.1f} ms, decode "
                  f"{a['section_a_decode_ms']:.2f} ms a token."]
    lines += ["", f"Goal: within {GOAL_PREDICTION:.0%}: worst {t['worst_error']:.1%} "
              f"({'met' if t['met'] else 'MISSED'}).", ""]
    return lines


def _b_setting(b: dict[str, Any], w: dict[str, Any]) -> str:
    """What B ran on a topology: the precision, and whether any device holds the model."""
    if "memory_limits" not in b:  # a run before B's topologies had to split
        return (f"Prompt {w['b_prompt_tokens']} tokens, {w['new_tokens']} new. Measured "
                "times divided by the dilation.")
    mib = 2**20
    limits = ", ".join(f"{d} {x / mib:.0f} MiB" for d, x in b["memory_limits"].items())
    return (f"{b['precision']} (the GGUF's own precision), prompt {w['b_prompt_tokens']} "
            f"tokens, {w['new_tokens']} new, KV caches for {b['max_context']} tokens: the "
            f"model needs {b['model_bytes'] / mib:.0f} MiB on one device, and the devices "
            f"have {limits}, so "
            + ("one device holds it (NOT a topology that must split)"
               if b["single_device_fits"] else "none holds it: every placement splits")
            + ". Measured times divided by the dilation.")


def render_b(doc: dict[str, Any]) -> list[str]:
    w = doc["workload"]
    lines: list[str] = []
    for b in doc["b"]:
        lines += [
            f"## B. {b['topology']}: placements with real compute on emulated devices "
            f"(time dilation x{b['dilation']:g})",
            "",
            _b_setting(b, w),
            "",
            "| method | blocks per device | TTFT ms (plan) | tokens/s (plan) | request ms (plan) "
            "| plan's error on tokens/s, TTFT |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in b["methods"].items():
            if not r["feasible"]:
                lines.append(f"| {name} | infeasible: {r['reason']} | | | | |")
                continue
            p = r["predicted"]
            blocks = " / ".join(f"{d} {n}" for d, n in r["assignment"].items())
            lines.append(f"| {name} | {blocks} | {r['ttft_ms']:.1f} ({p['ttft_ms']:.1f}) | "
                         f"{r['tokens_per_s']:.1f} ({p['tokens_per_s']:.1f}) | "
                         f"{r['request_ms']:.0f} ({p['request_ms']:.0f}) | "
                         f"{_pct(r['error']['tokens_per_s'])}, {_pct(r['error']['ttft'])} |")
        lines += [
            "",
            f"Goals: the DP measures the best request time of the placements: best is "
            f"{b['best_measured']}"
            + (f" (placed as the DP: {', '.join(b['same_as_dp'])})" if b.get("same_as_dp") else "")
            + f" ({'met' if b['met_dp_best'] else 'MISSED'}); the DP's predicted tokens/s and "
            f"TTFT within {GOAL_PREDICTION:.0%}: {_pct(b['dp_error']['tokens_per_s'])}, "
            f"{_pct(b['dp_error']['ttft'])}" + _chains_note(b)
            + f" ({'met' if b['met_dp_prediction'] else 'MISSED'})."
            f" Same tokens from every placement: {'yes' if b['same_tokens'] else 'NO'}."
            + (f" The DP's placement runs blocks on {b['dp_stages']} of the "
               f"{len(b['memory_limits'])} devices ("
               + ("met" if b["dp_stages"] > 1 else "MISSED: it does not split") + ")."
               if "dp_stages" in b else ""),
            "",
        ]
    if doc["b"]:
        lines += [
            "What section B's prediction error can show: each stage's compute is emulated by "
            "its plan device's predicted time over this machine's time for the same blocks, "
            "measured as the stage starts, so the compute of every stage equals the plan's by "
            "construction. What the error measures is how the plan composes the parts it "
            "prices: a decode step priced at the mean cache length, the links both ways, "
            "encoding and the serving overhead of every step; and which placement measures "
            "best checks that the DP's ranking survives them. Whether a device preset is "
            "right it cannot show (no such device here); this machine's own cost model is "
            "checked against real compute in the section above.",
            "",
        ]
    return lines


def _chains_note(b: dict[str, Any]) -> str:
    """The DP's errors on each fresh chain, where it ran on several (their median above)."""
    chains = b.get("dp_chains") or []
    if len(chains) < 2:
        return ""
    each = "; ".join(f"{_pct(c['tokens_per_s'])} / {_pct(c['ttft'])}" for c in chains)
    return f" (median of {len(chains)} chains of new stages: {each})"


def this_machine_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The run's check of this machine's cost model (in section A's, or alone in a smoke
    run); None before it was per precision."""
    t = doc.get("this_machine") or doc.get("a", {}).get("this_machine")
    return t if t and "rows" in t else None


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """One run's verdicts and headline numbers, kept in every later run's ``history``."""
    a = doc.get("a")
    t = this_machine_of(doc)
    return {"date": doc.get("date"), "load_before": doc["load_before"],
            # runs before the stages measured their own reference scaled by the cost model's
            "reference": doc.get("reference", "this machine's cost model"),
            "load_after": doc["load_after"], "quick": doc["quick"],
            "two_stages_vs_one": a["two_stages_vs_one"] if a else None,
            "three_stages_vs_one": a["rows"]["3"]["vs_one_process"] if a else None,
            "memory_within": a["memory_within"] if a else None,
            "this_machine_worst": t["worst_error"] if t else None,
            "b": [{"topology": b["topology"], "dilation": b["dilation"],
                   "dp_tokens_per_s": b["methods"]["dp"]["tokens_per_s"],
                   "best_measured": b["best_measured"], "met_dp_best": b["met_dp_best"],
                   "dp_stages": b.get("dp_stages"),
                   "dp_error": b["dp_error"]} for b in doc["b"]]}


def with_history(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    """``doc`` with the runs before it (from the llm.json it replaces) in ``history``."""
    previous = out / "llm.json"
    history: list[dict[str, Any]] = []
    if previous.is_file():
        old = json.loads(previous.read_text())
        if old.get("version") == doc["version"]:
            history = [*old.get("history", []), summary(old)]
    return doc | {"history": history}


def render_history(doc: dict[str, Any]) -> list[str]:
    runs = [*doc.get("history", []), summary(doc)]
    lines = ["## Every run of this benchmark (this code's versions; the last is above)", "",
             "| date | B's reference | load before / after | 2 stages vs 1 | 3 vs 1 | memory "
             "worst | this-machine's worst error | B: topology, dilation, DP tokens/s, best "
             "measured, DP's error (tokens/s, TTFT), devices the DP uses |",
             "|---|---|---|---|---|---|---|---|"]

    def num(x: float | None, form: str) -> str:
        return "-" if x is None else format(x, form)

    for r in runs:
        b = "; ".join(f"{x['topology']} x{x['dilation']:g}, {x['dp_tokens_per_s']:.1f}, "
                      f"{x['best_measured']}, {_pct(x['dp_error']['tokens_per_s'])} / "
                      f"{_pct(x['dp_error']['ttft'])}, {x.get('dp_stages') or '-'}"
                      for x in r["b"])
        lines.append(f"| {r['date'] or '-'}{' (quick)' if r['quick'] else ''} | "
                     f"{r.get('reference', 'this machine' + chr(39) + 's cost model')} | "
                     f"{r['load_before']:.2f} / {r['load_after']:.2f} | "
                     f"x{num(r['two_stages_vs_one'], '.2f')} | "
                     f"x{num(r['three_stages_vs_one'], '.2f')} | "
                     f"{num(r['memory_within'], '.1%')} | "
                     f"{num(r.get('this_machine_worst'), '.1%')} | {b} |")
    return [*lines, *_verdict_over_runs(runs[-VERDICT_RUNS:])]


VERDICT_RUNS = 5  # a goal near its line is judged on the median of this many runs


def _verdict_over_runs(runs: list[dict[str, Any]]) -> list[str]:
    """Section A's goals judged on the median of the last runs, not on one run's."""
    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return _median(values) if values else None

    two, worst, memory = (median("two_stages_vs_one"), median("this_machine_worst"),
                          median("memory_within"))
    if len(runs) < VERDICT_RUNS or None in (two, worst, memory):
        return []
    assert two is not None and worst is not None and memory is not None
    met = {True: "met", False: "MISSED"}
    return ["", f"Medians of the last {len(runs)} runs ({runs[0]['date']} to "
            f"{runs[-1]['date']}): 2 stages x{two:.2f} one process (goal {GOAL_TWO_STAGES}: "
            f"{met[two >= GOAL_TWO_STAGES]}); this-machine's worst error {worst:.1%} (goal "
            f"{GOAL_PREDICTION:.0%}: {met[worst <= GOAL_PREDICTION]}); memory's worst "
            f"{memory:.1%} (goal {GOAL_MEMORY:.0%}: {met[memory <= GOAL_MEMORY]})."]


def render_all(doc: dict[str, Any]) -> list[str]:
    """Section A (or, in a smoke run without it, the title), this machine's cost model
    against one process, section B, and every run."""
    lines = render(doc) if "a" in doc else [
        "# Split generation of a real checkpoint: SmolLM2-135M-Instruct (smoke run: this "
        "machine's cost model and section B only)", ""]
    t = this_machine_of(doc)
    return lines + (render_this_machine(t) if t else []) + render_b(doc) + render_history(doc)


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = render_all(doc)
    (out / "llm.md").write_text("\n".join(lines) + "\n")
    b = doc["b"][0]
    ran = {n: r for n, r in b["methods"].items() if r["feasible"]}
    plot_llm_methods(ran, out / "llm.png",
                     title=f"SmolLM2-135M over {b['topology']}: real compute, emulated devices "
                           "(bars measured, marks planned)")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 8 new tokens, one generation, no warm-up")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=40,
                        help="the prompt of section B (section A's is the chat prompt)")
    parser.add_argument("--repeats", type=int, default=5, help="generations per row")
    parser.add_argument("--dp-chains", type=int, default=5,
                        help="B: chains of new stages the DP's plan runs on (its verdict is the "
                             "median over them)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD,
                        help="highest 1-minute load average to start at (default: quiet)")
    parser.add_argument("--smoke", action="store_true",
                        help="this machine's cost model and section B only, 8 new tokens, one "
                             "generation (writes under the temporary folder unless --out)")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite llm.md from llm.json without measuring")
    args = parser.parse_args()
    if args.render_only:
        write(json.loads((args.out / "llm.json").read_text()), args.out)
        return
    if args.smoke and args.out == RESULTS:  # a smoke run never replaces the results
        args.out = Path(tempfile.gettempdir()) / "bench_llm_smoke"
    before = require_quiet(args.allow_load)
    small = args.quick or args.smoke
    new, repeats, warmup = (8, 1, 0) if small else (args.new_tokens, args.repeats, 1)
    torch.set_num_threads(1)
    start = time.perf_counter()
    doc: dict[str, Any] = {"version": 3, "machine": machine_info(), "model": MODEL,
                           "quick": small, "date": time.strftime("%Y-%m-%d %H:%M"),
                           "reference": "measured (each stage's blocks, timed as it starts, "
                                        "after the run's idle)",
                           "workload": {"new_tokens": new, "repeats": repeats, "warmup": warmup,
                                        "b_prompt_tokens": args.prompt_tokens},
                           "load_before": before, "load_average": list(os.getloadavg())}
    if args.smoke:
        doc["this_machine"] = this_machine_check(args.prompt_tokens, new, repeats=3)
    else:
        doc["a"] = section_a(new, repeats, warmup)
    doc["b"] = [section_b(resolve_topology(path), args.prompt_tokens, new, repeats, warmup,
                          1 if small else args.dp_chains)
                for path in TOPOLOGIES]
    doc["load_after"] = os.getloadavg()[0]
    doc["load_average_end"] = list(os.getloadavg())
    doc["wall_s"] = time.perf_counter() - start
    write(with_history(doc, args.out), args.out)


if __name__ == "__main__":
    main()
