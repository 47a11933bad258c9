"""The CUDA checks of ``--torch-device``, for a machine with a GPU (the "Accelerators"
section of docs/hardware.md records what it printed). Each check runs the real commands in
their own processes:

1. ``tests/runtime/test_accelerator.py``, ``tests/nas/test_nas_accelerator.py`` (the NAS
   trainers) and ``tests/runtime/test_ray_replica_gpus.py`` (a Ray replica on cuda), whose CUDA
   tests skip elsewhere;
2. a ResNet-50 split after its first stage: the edge part in ``edgesplit run`` on the CPU, the
   cloud part in ``edgesplit serve --torch-device cuda``; outputs against the unsplit model on
   the CPU, and the same split with the cloud part on this machine's CPU for comparison;
3. ``edgesplit profile resnet50`` on the GPU and on the CPU;
4. an LLM split (``llama_tiny``, random weights) whose second stage is served on the GPU:
   ``llm generate``'s greedy tokens against single-process ``generate`` on the CPU.

Usage: ``python scripts/gpu_check.py OUT_DIR`` (writes ``gpu_check.json`` and the logs there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EDGESPLIT = [sys.executable, "-m", "edgesplit.cli"]
SPLIT = ["plan", "resnet50", "--edge", "jetson-nano", "--cloud", "v100-server", "--link", "5g",
         "--input-bits", "32", "--method", "manual", "--split-after",
         "resnet.encoder.stages.0.layers.2.add"]


def _cli(args: list[str], log: Path, timeout: float = 300) -> str:
    done = subprocess.run([*EDGESPLIT, *args], capture_output=True, text=True, timeout=timeout)
    log.write_text(f"$ edgesplit {' '.join(args)}\n{done.stdout}\n{done.stderr}")
    if done.returncode != 0:
        raise RuntimeError(f"edgesplit {args[0]} failed: {done.stderr[-1500:]}")
    return done.stdout


class _Server:
    """``edgesplit <args>`` until the block ends; ``address`` from its `listening on` line."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([*EDGESPLIT, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline()
        if not self.line.startswith("listening on"):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {self.proc.stderr.read()[-1500:]}")
        self.address = self.line.split()[2]

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _split_run(plan: Path, where: str, out: Path) -> dict[str, Any]:
    serve = ["serve", str(plan), "--device", "cloud", "--port", "0", "--no-shape",
             "--max-batch", "1"]
    if where != "cpu":
        serve += ["--torch-device", where]
    with _Server(serve) as server:
        report = json.loads(_cli(["run", str(plan), "--server", server.address, "--no-shape",
                                  "--requests", "30", "--warmup", "5", "--json"],
                                 out / f"run_{where.replace(':', '')}.log"))
    return {"server_line": server.line.strip(), "ok": report["ok"],
            "requests": report["requests"], "max_abs_diff": report["max_abs_diff"],
            "latency_ms": report["latency_ms"], "breakdown_ms": report["breakdown_ms"]}


def _profile(where: str, out: Path) -> dict[str, Any]:
    args = ["profile", "resnet50", "--json", "--no-onnx", "--repeats", "20"]
    if where != "cpu":
        args += ["--torch-device", where]
    prof = json.loads(_cli(args, out / f"profile_{where.replace(':', '')}.log"))
    (out / f"profile_{where.replace(':', '')}.json").write_text(json.dumps(prof))
    return {"machine": prof["machine"], "whole_ms": prof["whole_model"]["eager_ms"]["median"],
            "sum_of_layers_ms": prof["sum_of_layers_ms"]["eager"]}


def _llm(tmp: Path, out: Path, where: str = "cuda") -> dict[str, Any]:
    import torch

    from edgesplit.hardware import chain, get_topology
    from edgesplit.llm import LLMWorkload, plan_llm_at
    from edgesplit.models.causal_lm import create_causal_lm

    full = get_topology("home-wifi")
    topology = chain("gpu-check", full.devices[:2], [full.links[0].link])
    plan = plan_llm_at("llama_tiny", topology, (0, 3, 6),
                       LLMWorkload(prompt_tokens=8, new_tokens=16, max_context=64))
    path = tmp / "llm.json"
    path.write_text(plan.model_dump_json())
    model = create_causal_lm("llama_tiny")  # seed 0: the weights every stage builds
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    ids = torch.tensor([prompt])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                         min_new_tokens=16, do_sample=False, pad_token_id=0)[0, 8:].tolist()
    second = plan.devices[1].name
    with _Server(["llm", "serve", str(path), "--device", second, "--port", "0", "--no-shape",
                  "--torch-device", where]) as server:
        got = json.loads(_cli(["llm", "generate", str(path), "--server", server.address,
                               "--prompt-ids", ",".join(map(str, prompt)), "-n", "16",
                               "--no-shape", "--json"], out / "llm_generate.log"))
    tokens = got["tokens"]
    return {"server_line": server.line.strip(), "tokens": tokens, "reference": ref,
            "equal": tokens == ref}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    import torch

    results: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                               "gpu": torch.cuda.get_device_name(0),
                               "cpu_cores": os.cpu_count(), "started": time.ctime()}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                            "no:cacheprovider", "tests/runtime/test_accelerator.py",
                            "tests/nas/test_nas_accelerator.py",
                            "tests/runtime/test_ray_replica_gpus.py"],
                           capture_output=True, text=True, timeout=400)
    (out / "pytest.log").write_text(tests.stdout + tests.stderr)
    results["pytest"] = {"rc": tests.returncode, "tail": tests.stdout.strip().splitlines()[-1]}
    print("pytest:", results["pytest"]["tail"], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "resnet50.json"
        _cli([*SPLIT, "--out", str(plan)], out / "plan.log")
        for name, step in (("split_gpu", lambda: _split_run(plan, "cuda", out)),
                           ("split_cpu", lambda: _split_run(plan, "cpu", out)),
                           ("profile_gpu", lambda: _profile("cuda", out)),
                           ("profile_cpu", lambda: _profile("cpu", out)),
                           ("llm_gpu", lambda: _llm(Path(tmp), out))):
            try:
                results[name] = step()
            except Exception as exc:  # record it and go on: one lease, every check
                results[name] = {"error": repr(exc)[-2000:]}
            print(name, json.dumps(results[name])[:600], flush=True)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
