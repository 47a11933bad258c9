"""One client device of bench_runtime.py's old-vs-new load comparison, as a process of its own.

It imports edgesplit from whatever ``PYTHONPATH`` it was started with (this checkout's ``src``,
or an older commit's), so the same client code measures either version. It uses only what
both versions export (``ChainClient``, ``PlanProgram.load``, ``load_plan``):

    python benchmarks/load_client.py PLAN ADDRESS PLANE THREADS

It connects ``THREADS`` clients and warms each up with one request, prints ``ready`` and the
edgesplit it imported, then answers each line on stdin (so that every device of a run starts
together): ``single N`` runs N requests on its first client alone, ``concurrent N`` N requests
on each client at once, each with one of 16 inputs, and prints one JSON line: start and end
(monotonic, the same clock in every process), latencies, errors, the largest difference from
the unsplit model's outputs and its own CPU seconds. It ends at end of input.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

import edgesplit
from edgesplit.plan import load_plan
from edgesplit.runtime import PlanProgram

try:
    from edgesplit.runtime.client import ChainClient
except ImportError:  # bench_runtime's section 6 drives older commits' code with this script too
    from edgesplit.runtime.transport import ChainClient


def main(plan_path: str, address: str, plane: str, threads: int) -> None:
    torch.set_num_threads(1)  # a client device computes on one core, as in bench_runtime
    torch.manual_seed(0)
    program = PlanProgram.load(load_plan(plan_path))
    inputs = [(x,) for x in torch.randn(16, *program.graph.example_inputs[0].shape)]
    references = [program.unsplit(x) for x in inputs]
    clients = [ChainClient(program, address, shape=False, data_plane=plane)
               for _ in range(threads)]
    for c in clients:  # connect and warm up before the clock starts
        c.request(inputs[0])
    print("ready", edgesplit.__file__, flush=True)  # the caller checks which version runs
    for line in sys.stdin:
        kind, requests = line.split()
        used = clients[:1] if kind == "single" else clients
        print(json.dumps(run(used, inputs, references, int(requests))), flush=True)
    for c in clients:
        c.close()


def run(clients: list[ChainClient], inputs: list, references: list, requests: int
        ) -> dict[str, Any]:
    """``requests`` on each of ``clients`` at once; what they measured."""
    latencies: list[float] = []
    answers: list[tuple[int, list[torch.Tensor]]] = []
    errors: list[str] = []

    def loop(k: int) -> None:
        for i in range(requests):
            x = (k * requests + i) % len(inputs)
            t = time.monotonic()
            try:
                r = clients[k].request(inputs[x])
            except Exception as exc:  # counted and reported, as bench_runtime's load does
                errors.append(str(exc))
                continue
            latencies.append((time.monotonic() - t) * 1e3)
            answers.append((x, r.outputs))

    cpu = time.process_time()
    start = time.monotonic()
    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(loop, range(len(clients))))
    end = time.monotonic()
    cpu = time.process_time() - cpu
    diffs = [max(float((o - ref).abs().max()) for o, ref in zip(out, references[x], strict=True))
             for x, out in answers]
    return {"start": start, "end": end, "latencies_ms": latencies, "errors": errors,
            "max_abs_diff": max(diffs, default=float("nan")), "cpu_s": cpu}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
