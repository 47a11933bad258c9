"""Concurrent chats over a split LLM: SmolLM2-135M-Instruct Q4_1 (the built-in GGUF, run as
stored) over two stage processes, one chat against four at once.

The split: blocks [0, 16) in this process (``LLMClient``'s first stage, which the chats'
threads share) and [16, 32) in an ``edgesplit llm serve`` process, one ONNX Runtime thread
each, over the data plane on 127.0.0.1, links unshaped. The plan keeps 4 sessions, so each
stage has a KV cache row for each chat, and decode steps that meet at a stage run as one batch
(``llm/stage/batching.py``). Each activation setting of the quantized stages is measured
(``float``: float32 inputs to the 4-bit kernels, the default; ``int8``: inputs quantized per
block, as llama.cpp does; ``mixed``: int8 but the q/k/v product).

Each round, for each setting: one chat alone (the first question), then the four questions at
once, each on a thread of its own; greedy, ``--new-tokens`` tokens each (no stop at an end of
text: every chat does the same work). A chat's decode rate is its tokens after the first over
the time after its first token; four chats' aggregate decode rate is their tokens after the
first over the time from the earliest first token to the last token. Goal (issue 53): the
aggregate of 4 chats >= 2x one chat's decode tokens/s, median over ``--repeats`` rounds after
one warm-up round. Also recorded: whether every chat's tokens equal what it generates alone
(with float activations a batch's rows may round apart from one row's, so a token may differ),
and how many of the first stage's decode steps ran in batches.

Quiet machine: refuses to start above a 1-minute load of 1.0 (``--allow-load`` for a trial);
the load is recorded before and after. Writes llm_concurrent.md and llm_concurrent.json.

    python benchmarks/bench_llm_concurrent.py [--quick] [--repeats 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quiet import require_quiet

from edgesplit.hardware import get_topology
from edgesplit.hardware.profile import machine_info
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.generate.engine import plan_tokenizer
from edgesplit.plan.model import Plan

RESULTS = Path(__file__).parent / "results"
QUIET_LOAD = 1.0
MODEL = "smollm2-135m-instruct"
SPLIT = (0, 16, 32, 32)  # blocks per home-wifi device: two stages
CHATS = 4
GOAL = 2.0
QUESTIONS = ["Which city is the capital of France?", "Write a short poem about the sea.",
             "Explain what a hash table is.", "Give three tips for learning to cook."]
ACTIVATIONS = ("float", "int8", "mixed")


def split_plan(activations: str, prompt_tokens: int, new_tokens: int) -> Plan:
    return plan_llm_at(MODEL, get_topology("home-wifi"), SPLIT,
                       LLMWorkload(prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                                   max_context=prompt_tokens + new_tokens, sessions=CHATS,
                                   activations=activations),  # type: ignore[arg-type]
                       dtype="gguf", method="2-stage")


@contextlib.contextmanager
def second_stage(plan: Plan, path: Path) -> Iterator[str]:
    """`edgesplit llm serve` for the plan's second device; yields its address."""
    exe = Path(sys.executable).with_name("edgesplit")
    proc = subprocess.Popen([str(exe), "llm", "serve", str(path), "--device",
                             plan.devices[1].name, "--port", "0", "--threads", "1",
                             "--no-shape"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"the second stage did not start: {line!r}")
        yield line.split()[2]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def chat(client: LLMClient, prompt: list[int], new_tokens: int, session: str
         ) -> dict[str, Any]:
    """One greedy generation: its tokens and when its first and last token came."""
    tokens, first = [], 0.0
    for token in client.generate(prompt, new_tokens, session=session):
        tokens.append(token.token)
        if token.index == 0:
            first = time.perf_counter()
    last = time.perf_counter()
    client.end_session(session)
    return {"tokens": tokens, "first": first, "last": last,
            "decode_tokens_per_s": (len(tokens) - 1) / (last - first)}


def together(client: LLMClient, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
    """The prompts' chats at once, a thread each: the aggregate decode rate."""
    out: dict[int, dict[str, Any]] = {}

    def run(i: int) -> None:
        out[i] = chat(client, prompts[i], new_tokens, f"chat{i}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    chats = [out[i] for i in range(len(prompts))]
    span = max(c["last"] for c in chats) - min(c["first"] for c in chats)
    decoded = sum(len(c["tokens"]) - 1 for c in chats)
    return {"chats": chats, "aggregate_decode_tokens_per_s": decoded / span}


def setting(activations: str, prompts: list[list[int]], new_tokens: int, repeats: int,
            warmup: int, log=print) -> dict[str, Any]:
    plan = split_plan(activations, max(len(p) for p in prompts), new_tokens)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        plan.save(path)
        with second_stage(plan, path) as address, \
                LLMClient(plan, address, threads=1) as client:
            steps = client.stage.steps  # type: ignore[attr-defined]
            alone = [chat(client, p, new_tokens, f"alone{i}")["tokens"]
                     for i, p in enumerate(prompts)]
            for r in range(warmup + repeats):
                one = chat(client, prompts[0], new_tokens, "one")
                batched_before = steps.batched
                four = together(client, prompts, new_tokens)
                row = {"one_decode_tokens_per_s": one["decode_tokens_per_s"],
                       "four_aggregate_decode_tokens_per_s":
                           four["aggregate_decode_tokens_per_s"],
                       "first_stage_batched_steps": steps.batched - batched_before,
                       "same_tokens_as_alone": [c["tokens"] == a for c, a in
                                                zip(four["chats"], alone, strict=True)]}
                row["ratio"] = row["four_aggregate_decode_tokens_per_s"] / \
                    row["one_decode_tokens_per_s"]
                log(f"  {activations}: round {r + 1}/{warmup + repeats}: one "
                    f"{row['one_decode_tokens_per_s']:.1f} tokens/s, four "
                    f"{row['four_aggregate_decode_tokens_per_s']:.1f} (x{row['ratio']:.2f}), "
                    f"{row['first_stage_batched_steps']} steps batched at stage 1")
                if r >= warmup:
                    rounds.append(row)
    med = {k: statistics.median(r[k] for r in rounds)
           for k in ("one_decode_tokens_per_s", "four_aggregate_decode_tokens_per_s")}
    ratio = statistics.median(r["ratio"] for r in rounds)
    return {"activations": activations, "rounds": rounds, **med, "ratio": ratio,
            "met": ratio >= GOAL,
            "same_tokens": all(all(r["same_tokens_as_alone"]) for r in rounds)}


def render(doc: dict[str, Any]) -> list[str]:
    w = doc["workload"]
    lines = [
        "# Concurrent chats over a split LLM: SmolLM2-135M-Instruct Q4_1, two stage processes",
        "",
        f"{CHATS} chats at once against one, each {w['new_tokens']} greedy tokens after its "
        f"chat prompt ({w['prompt_tokens']} tokens at most); median of {w['repeats']} rounds "
        f"after {w['warmup']} warm-up. Blocks {SPLIT[:2]} in the client's process, the rest in "
        "an `edgesplit llm serve` process, one ONNX Runtime thread each. Load average "
        f"{doc['load_before']:.2f} before, {doc['load_after']:.2f} after; {doc['wall_s']:.0f} s"
        f"{' (quick)' if doc['quick'] else ''}. Method: benchmarks/bench_llm_concurrent.py.",
        "",
        "| activations | one chat decode tokens/s | 4 chats aggregate decode tokens/s | ratio | "
        "goal >= 2x | every chat's tokens as alone | rounds (one / four / ratio / steps "
        "batched at stage 1) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in doc["settings"]:
        runs = "; ".join(f"{r['one_decode_tokens_per_s']:.1f} / "
                         f"{r['four_aggregate_decode_tokens_per_s']:.1f} / x{r['ratio']:.2f} / "
                         f"{r['first_stage_batched_steps']}" for r in s["rounds"])
        lines.append(f"| {s['activations']} | {s['one_decode_tokens_per_s']:.1f} | "
                     f"{s['four_aggregate_decode_tokens_per_s']:.1f} | x{s['ratio']:.2f} | "
                     f"{'met' if s['met'] else 'MISSED'} | "
                     f"{'yes' if s['same_tokens'] else 'no'} | {runs} |")
    decode_steps = CHATS * (w["new_tokens"] - 1)
    met = [s for s in doc["settings"] if s["met"]]
    shares = ", ".join(f"{s['activations']} {_batched_share(s) / decode_steps:.0%}"
                       for s in doc["settings"])
    lines += ["", f"Share of the first stage's {decode_steps} decode steps a round that ran in a "
              f"batch (median): {shares}."]
    if len(met) < len(doc["settings"]):
        lines += ["", "Where the goal is missed, the bound is not compute: making the steps "
                  "meet does not lift it (a 2 ms wait at each stage for every session that "
                  "stepped in the last 100 ms, tried on 2026-12-07, batched ~90 % of int8's "
                  "decode steps instead of ~20 % and left the aggregate at x1.90 against "
                  "x1.89); what remains is each chat's per-step Python (the client's loop, "
                  "the messages, the hop, the server's handling) under each process's GIL, "
                  "not yet profiled per step."]
    return lines


def _batched_share(setting: dict[str, Any]) -> float:
    return statistics.median(r["first_stage_batched_steps"] for r in setting["rounds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 tokens, 1 round")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD)
    parser.add_argument("--activations", default=",".join(ACTIVATIONS),
                        help="the settings to measure, comma-separated")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite llm_concurrent.md from llm_concurrent.json")
    args = parser.parse_args()
    if args.render_only:
        doc = json.loads((args.out / "llm_concurrent.json").read_text())
        (args.out / "llm_concurrent.md").write_text("\n".join(render(doc)) + "\n")
        return
    before = require_quiet(args.allow_load)
    new, repeats, warmup = (8, 1, 0) if args.quick else (args.new_tokens, args.repeats, 1)
    start = time.perf_counter()
    tokenizer = plan_tokenizer(split_plan("float", 64, new))
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                             add_generation_prompt=True, tokenize=True,
                                             return_dict=False) for q in QUESTIONS]
    doc: dict[str, Any] = {
        "version": 1, "machine": machine_info(), "model": MODEL, "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M"), "load_before": before,
        "workload": {"new_tokens": new, "repeats": repeats, "warmup": warmup,
                     "prompt_tokens": max(len(p) for p in prompts)}}
    doc["settings"] = [setting(a, prompts, new, repeats, warmup)
                       for a in args.activations.split(",")]
    doc["load_after"] = os.getloadavg()[0]
    doc["wall_s"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llm_concurrent.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = render(doc)
    (args.out / "llm_concurrent.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
