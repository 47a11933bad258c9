"""Split LLM generation on emulated heterogeneous devices: time to first token, tokens/s and
request time of the exact stage placement (``dp``) against exo's memory-proportional split,
the best single device and an equal split, each served as a real chain of stages.

Setup. ``llama_1b`` (TinyLlama-1.1B's shape: embed, 22 decoder blocks, head; float32) is
planned by every method over ``home-wifi`` (phone -> laptop GPU -> Jetson TX2, 50 Mbps / Wi-Fi
RTT links): devices that differ by an order of magnitude in speed and by 2x in memory, so
memory-proportional puts most blocks on the slow phone and Jetson while the DP puts them on
the laptop. The weights of a 1.1B model do not run at a phone's speed on this CPU (nor fit
three copies beside another engineer's work), so each plan runs a *stand-in*: the same
architecture with the same module paths and 22 blocks, but hidden size 256 (28 M parameters).
Each stage's compute is emulated (``--emulate-device``): it sleeps until its step took what
the plan predicts for its device and phase, so the stand-in's blocks cost what llama_1b's do
on that device (the stand-in's own compute is well below every target here; a stage that is
not is reported). Links are shaped to the plan's bandwidth and RTT; the stand-in's hidden
states are 1/8 of the real model's bytes per token, so the links run forward at 1/8 of their
rate and each hop takes what the real tensors would (a forward message's header, ~0.2 KB, is
charged 8x too: ~0.3 ms a hop per step). The token coming back is the same size for both
models: that direction keeps the link's rate.

Each plan's stages after the first are in-process ``LLMStageServer``s on 127.0.0.1 (gRPC and
the data plane over real sockets), the first is the ``LLMClient``; one warm-up generation,
then ``--repeats`` generations of ``--new-tokens`` tokens after a ``--prompt-tokens`` prompt
(the workload every plan is made for). Per method: the median TTFT, decode tokens/s (tokens
after the first over the time after the first) and request time, next to the plan's
predictions, each stage's measured compute against its plan, and the ratios against
memory-proportional and the best single device. Goals (issue 20): the DP's tokens/s >= 1.3x
memory-proportional's, and never below the best single device's.

Quiet machine: refuses to start above a 1-minute load of 1.0 (``--allow-load`` for a trial
run, with ``--out`` elsewhere); the load is recorded before and after. Writes llm.md,
llm.json and llm.png (measured against planned, by method; to benchmarks/results/ by
default). ``--quick``: a smoke run (short workload, one
generation, no warm-up) in a few seconds.

    python benchmarks/bench_llm.py [--quick] [--repeats 3] [--out DIR] [--allow-load X]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from edgesplit.hardware import get_topology
from edgesplit.hardware.profile import machine_info
from edgesplit.models.causal_lm import create_causal_lm
from edgesplit.plan import LLMWorkload, plan_llm
from edgesplit.plan.model import Plan
from edgesplit.report.plots import plot_llm_methods
from edgesplit.runtime.llm_client import LLMClient
from edgesplit.runtime.llm_report import generation_report
from edgesplit.runtime.llm_server import LLMStageServer, head_stage

RESULTS = Path(__file__).parent / "results"
QUIET_LOAD = 1.0
MODEL = "llama_1b"
TOPOLOGY = "home-wifi"
# the stand-in: llama_1b's architecture and depth at hidden 256 (GQA 4/2 heads of 64). Wide
# enough that a forward message's header stays small beside its hidden state on the slowed
# link, narrow enough that every stage computes well within its emulated time here.
STANDIN = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 64}
METHODS = ("dp", "memory_proportional", "single_device", "equal_split")
GOAL_VS_MEMORY_PROPORTIONAL = 1.3
# a stage whose measured compute exceeds its plan by more than this ran slower than emulated
EMULATION_SLACK = 1.10


# ---- the stand-in -------------------------------------------------------------------------------
def standin_model() -> torch.nn.Module:
    """llama_1b's blocks at the stand-in's width: every module path as in the plan."""
    return create_causal_lm(MODEL, **STANDIN)


def standin_plan(plan: Plan) -> tuple[Plan, float]:
    """``plan`` run by the stand-in: its hidden size in the LLM section (what a stage checks a
    hidden state against) and every link's forward rate ("up": hidden states) slowed by the
    ratio of the stand-in's bytes per token to the planned model's, so each hop takes the
    planned time; the way back ("down": a token, the same for both) keeps its rate. Stages (the
    emulation's targets), hops and predictions stay the planned model's. Returns the plan and
    the ratio."""
    llm = plan.llm
    assert llm is not None
    scale = STANDIN["hidden_size"] / llm.hidden_size  # same dtype: bytes scale as the width
    links = []
    for pl in plan.links:
        link = pl.link
        down = link.down_bandwidth_mbps or link.bandwidth_mbps
        links.append(pl.model_copy(update={"link": link.model_copy(update={
            "bandwidth_mbps": link.bandwidth_mbps * scale, "down_bandwidth_mbps": down})}))
    section = llm.model_copy(update={"hidden_size": STANDIN["hidden_size"],
                                     "num_heads": STANDIN["num_attention_heads"],
                                     "num_kv_heads": STANDIN["num_key_value_heads"],
                                     "head_dim": STANDIN["head_dim"]})
    return plan.model_copy(update={"llm": section, "links": links}), scale


# ---- serving and generating ---------------------------------------------------------------------
@contextlib.contextmanager
def serve_chain(plan: Plan, model: torch.nn.Module) -> Iterator[str | None]:
    """Every stage after the first up to the head, emulated and shaped, on 127.0.0.1 (the last
    started first: each calls the next); yields the second's address (None: one device)."""
    assert plan.llm is not None
    servers: list[LLMStageServer] = []
    nxt: str | None = None
    try:
        for i in range(head_stage(plan.llm), 0, -1):
            server = LLMStageServer(plan, plan.devices[i].name, next_address=nxt, model=model,
                                    emulate=True, shape=True)
            nxt = f"127.0.0.1:{server.start('127.0.0.1', 0)}"
            servers.append(server)
        yield nxt
    finally:
        for server in servers:
            server.stop(grace_s=1.0)


def generate_runs(plan: Plan, model: torch.nn.Module, prompt: list[int], new_tokens: int,
                  repeats: int, warmup: int, log=print) -> list[dict[str, Any]]:
    """``warmup`` then ``repeats`` generations on ``plan``'s emulated chain; their reports."""
    runs = []
    with serve_chain(plan, model) as address, \
            LLMClient(plan, address, model=model, emulate=True, shape=True) as client:
        for i in range(warmup + repeats):
            tokens = list(client.generate(prompt, new_tokens))
            client.end_session()
            doc = generation_report(plan, prompt, tokens, session=client.session,
                                    data_plane=client.data_plane)
            if i >= warmup:
                runs.append(doc)
                log(f"  {plan.method}: run {i - warmup + 1}/{repeats}: TTFT "
                    f"{doc['ttft_ms']:.1f} ms, {doc['tokens_per_s'] or 0:.2f} tokens/s, "
                    f"request {doc['total_ms']:.0f} ms")
    return runs


# ---- one method's row ---------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def method_row(name: str, plan: Plan, runs: list[dict[str, Any]]) -> dict[str, Any]:
    llm = plan.llm
    assert llm is not None
    stages = []
    for i, stage in enumerate(runs[0]["stages"]):
        prefill = _median([r["stages"][i]["prefill_ms"] for r in runs])
        decode = _median([r["stages"][i]["decode_ms"] or 0.0 for r in runs])
        slow = [phase for phase, got, want in
                (("prefill", prefill, stage["predicted_prefill_ms"]),
                 ("decode", decode, stage["predicted_decode_ms"]))
                if want > 0.5 and got > EMULATION_SLACK * want]  # sub-ms targets: timer noise
        stages.append({"device": stage["device"], "blocks": len(stage["blocks"]),
                       "prefill_ms": prefill, "predicted_prefill_ms": stage["predicted_prefill_ms"],
                       "decode_ms": decode, "predicted_decode_ms": stage["predicted_decode_ms"],
                       "slower_than_emulated": slow})
    return {
        "method": name,
        "reason": plan.reason,
        "assignment": {s.device: s.end - s.start for s in llm.stages},
        "ttft_ms": _median([r["ttft_ms"] for r in runs]),
        "tokens_per_s": _median([r["tokens_per_s"] or 0.0 for r in runs]),
        "tpot_ms": _median([r["tpot_ms"] or 0.0 for r in runs]),
        "request_ms": _median([r["total_ms"] for r in runs]),
        "predicted": {"ttft_ms": llm.ttft_ms, "tpot_ms": llm.tpot_ms,
                      "tokens_per_s": llm.tokens_per_s,
                      "request_ms": plan.predicted.total_ms},
        "runs": [{"ttft_ms": r["ttft_ms"], "tokens_per_s": r["tokens_per_s"],
                  "request_ms": r["total_ms"]} for r in runs],
        "tokens": runs[0]["tokens"],
        "stages": stages,
    }


def add_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each row's tokens/s, TTFT and request time against memory-proportional's and the best
    single device's; the goals' verdicts."""
    for row in rows.values():
        for base in ("memory_proportional", "single_device"):
            ref = rows[base]
            row[f"vs_{base}"] = {
                "tokens_per_s": row["tokens_per_s"] / ref["tokens_per_s"],
                "ttft": ref["ttft_ms"] / row["ttft_ms"],  # > 1: faster
                "request": ref["request_ms"] / row["request_ms"],
            }
    dp = rows["dp"]
    return {
        "dp_vs_memory_proportional_tokens_per_s": dp["vs_memory_proportional"]["tokens_per_s"],
        "dp_vs_single_device_tokens_per_s": dp["vs_single_device"]["tokens_per_s"],
        "goal_vs_memory_proportional": GOAL_VS_MEMORY_PROPORTIONAL,
        "met_vs_memory_proportional": dp["vs_memory_proportional"]["tokens_per_s"]
        >= GOAL_VS_MEMORY_PROPORTIONAL,
        "met_never_below_single_device": dp["vs_single_device"]["tokens_per_s"] >= 1.0,
    }


# ---- the benchmark ------------------------------------------------------------------------------
def bench_llm(prompt_tokens: int, new_tokens: int, repeats: int, warmup: int, log=print
              ) -> dict[str, Any]:
    torch.manual_seed(0)
    planning = plan_llm(MODEL, get_topology(TOPOLOGY),
                        LLMWorkload(prompt_tokens=prompt_tokens, new_tokens=new_tokens))
    model = standin_model()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_tokens,), generator=g).tolist()
    rows: dict[str, dict[str, Any]] = {}
    scale = 1.0
    for name in METHODS:
        plan = planning.plans[name]
        if not planning.placements[name].feasible:
            raise SystemExit(f"{name} does not fit {TOPOLOGY}'s memory: {plan.reason}")
        runnable, scale = standin_plan(plan)
        predicted = runnable.llm
        assert predicted is not None
        log(f"{name}: {dict((s.device, s.end - s.start) for s in predicted.stages)} blocks; "
            f"plan: TTFT {predicted.ttft_ms:.1f} ms, {predicted.tokens_per_s:.2f} tokens/s")
        rows[name] = method_row(name, runnable,
                                generate_runs(runnable, model, prompt, new_tokens, repeats,
                                              warmup, log))
    tokens = {name: row["tokens"] for name, row in rows.items()}
    same = len({tuple(t) for t in tokens.values()}) == 1
    return {"methods": rows, "summary": add_ratios(rows), "same_tokens": same,
            "link_scale": scale}


def _quiet(threshold: float) -> float:
    """Refuse to measure on a busy machine (others' work would slow the emulated stages'
    own compute and threads, not the plan); returns the load it started at."""
    load = os.getloadavg()[0]
    if load > threshold:
        raise SystemExit(f"load average {load:.2f} > {threshold:g}: the machine is not quiet "
                         "(tests, helpers or other jobs running?); wait, or pass --allow-load "
                         "for a trial run (with --out elsewhere)")
    return load


# ---- report -------------------------------------------------------------------------------------
def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def render(doc: dict[str, Any]) -> list[str]:
    w = doc["workload"]
    s = doc["summary"]
    lines = [
        "# Split LLM generation on emulated devices",
        "",
        f"{doc['model']} (stand-in: hidden {doc['standin']['hidden_size']}, same 22 blocks, "
        f"compute emulated to the plan) over {doc['topology']}; prompt "
        f"{w['prompt_tokens']} tokens, {w['new_tokens']} new; median of {w['repeats']} "
        f"generation(s) after {w['warmup']} warm-up. Links shaped, forward at "
        f"x{doc['link_scale']:g} of their rate (the stand-in's bytes per token). Load average "
        f"{doc['load_before']:.2f} before, {doc['load_after']:.2f} after; "
        f"{doc['wall_s']:.0f} s{' (quick)' if doc['quick'] else ''}.",
        "",
        "| method | blocks per device | TTFT ms (plan) | tokens/s (plan) | request ms (plan) "
        "| tokens/s vs mem-prop | tokens/s vs single | TTFT vs mem-prop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["methods"].items():
        p = r["predicted"]
        blocks = " / ".join(f"{d} {n}" for d, n in r["assignment"].items())
        lines.append(
            f"| {name} | {blocks} | {_ms(r['ttft_ms'])} ({_ms(p['ttft_ms'])}) | "
            f"{r['tokens_per_s']:.2f} ({p['tokens_per_s']:.2f}) | {r['request_ms']:.0f} "
            f"({p['request_ms']:.0f}) | x{r['vs_memory_proportional']['tokens_per_s']:.2f} | "
            f"x{r['vs_single_device']['tokens_per_s']:.2f} | "
            f"x{r['vs_memory_proportional']['ttft']:.2f} |")
    lines += [
        "",
        f"Goal: dp >= {s['goal_vs_memory_proportional']:g}x memory-proportional's tokens/s: "
        f"x{s['dp_vs_memory_proportional_tokens_per_s']:.2f} "
        f"({'met' if s['met_vs_memory_proportional'] else 'MISSED'}); never below the best "
        f"single device: x{s['dp_vs_single_device_tokens_per_s']:.2f} "
        f"({'met' if s['met_never_below_single_device'] else 'MISSED'}). Same tokens from "
        f"every placement: {'yes' if doc['same_tokens'] else 'NO'}.",
        "",
        "## Stages: measured compute (plan)",
        "",
        "| method | device | blocks | prefill ms | decode ms / step |",
        "|---|---|---|---|---|",
    ]
    for name, r in doc["methods"].items():
        for st in r["stages"]:
            flag = f" (slower than emulated: {', '.join(st['slower_than_emulated'])})" \
                if st["slower_than_emulated"] else ""
            lines.append(f"| {name} | {st['device']} | {st['blocks']} | "
                         f"{st['prefill_ms']:.2f} ({st['predicted_prefill_ms']:.2f}) | "
                         f"{st['decode_ms']:.2f} ({st['predicted_decode_ms']:.2f}){flag} |")
    lines += [
        "",
        "TTFT: the prefill step as the client saw it; tokens/s: decode tokens over the time "
        "after the first (the plan's 1/TPOT); request: the whole generation. The plan's "
        "predictions are llama_1b's on the presets; measured values add this machine's "
        "serving overhead and the forward headers' slowed link (~0.3 ms a hop per step).",
    ]
    return lines


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = render(doc)
    (out / "llm.md").write_text("\n".join(lines) + "\n")
    w = doc["workload"]
    plot_llm_methods(doc["methods"], out / "llm.png",
                     title=f"{doc['model']} over {doc['topology']}: prompt {w['prompt_tokens']}, "
                           f"{w['new_tokens']} new tokens (bars measured, lines planned)")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 16-token prompt, 8 new tokens, one generation")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="generations per method")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD,
                        help="highest 1-minute load average to start at (default: quiet)")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite llm.md from llm.json without measuring")
    args = parser.parse_args()
    if args.render_only:
        write(json.loads((args.out / "llm.json").read_text()), args.out)
        return
    before = _quiet(args.allow_load)
    prompt, new, repeats, warmup = ((16, 8, 1, 0) if args.quick else
                                    (args.prompt_tokens, args.new_tokens, args.repeats, 1))
    torch.set_num_threads(1)  # one core per stage at most: the sleeps, not threads, set time
    start = time.perf_counter()
    doc: dict[str, Any] = {"version": 1, "machine": machine_info(), "model": MODEL,
                           "standin": STANDIN, "topology": TOPOLOGY, "quick": args.quick,
                           "workload": {"prompt_tokens": prompt, "new_tokens": new,
                                        "repeats": repeats, "warmup": warmup},
                           "load_before": before, "load_average": list(os.getloadavg())}
    doc.update(bench_llm(prompt, new, repeats, warmup))
    doc["load_after"] = os.getloadavg()[0]
    doc["load_average_end"] = list(os.getloadavg())
    doc["wall_s"] = time.perf_counter() - start
    write(doc, args.out)


if __name__ == "__main__":
    main()
