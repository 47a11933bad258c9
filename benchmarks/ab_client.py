"""One version's client of bench_runtime.py's interleaved old-vs-new comparison of section 1,
as a process of its own.

It imports edgesplit from whatever ``PYTHONPATH`` it was started with (this checkout's ``src``,
or an older commit's), so each version's server is driven by that version's own client (the
client's framing and socket calls are part of what section 1 measures). It uses only what
both versions export (``ChainClient``, ``PlanProgram.load`` and ``run_local``, ``load_plan``):

    python benchmarks/ab_client.py PLAN ADDRESS THREADS

It connects one data-plane and one gRPC client to ``ADDRESS``, warms both up, prints
``ready`` and the edgesplit it imported, then answers each line on stdin, ``block N R``, with
one JSON line: N requests over the data plane, N over gRPC and N ``run_local()`` passes, in an
order that rotates with the round R (each variant's requests back to back, as a client streams
them), each request's breakdown (ChainClient's own) and wall time. The caller runs one
version's block at a time, so the other version's client and server sleep meanwhile. It ends
at end of input.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

import edgesplit
from edgesplit.plan import load_plan
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.client import ChainClient


def main(plan_path: str, address: str, threads: int) -> None:
    torch.set_num_threads(threads)  # a device: as many cores as section 1's edge has
    program = PlanProgram.load(load_plan(plan_path))
    with ChainClient(program, address, shape=False, data_plane="tcp") as tcp, \
            ChainClient(program, address, shape=False, data_plane="grpc") as grpc_client:
        variants = {"tcp": tcp.request, "grpc": grpc_client.request,
                    "local": program.run_local}
        for _ in range(3):  # connections, first-call work
            for run in variants.values():
                run()
        print("ready", edgesplit.__file__, flush=True)  # the caller checks which version runs
        for line in sys.stdin:
            _, n, r = line.split()
            print(json.dumps(block(variants, int(n), int(r))), flush=True)


def block(variants: dict[str, Any], n: int, r: int) -> dict[str, Any]:
    """``n`` runs of each variant, variant after variant from the ``r``-th: per variant the
    breakdowns (``run_local``'s timings for ``local``) and wall times (ms)."""
    names = list(variants)
    out: dict[str, Any] = {}
    for name in names[r % len(names):] + names[:r % len(names)]:
        breakdowns, wall = [], []
        for _ in range(n):
            t = time.perf_counter()
            result = variants[name]()
            wall.append((time.perf_counter() - t) * 1e3)
            breakdowns.append(result[1] if name == "local" else result.breakdown_ms)
        out[name] = {"breakdown_ms": breakdowns, "wall_ms": wall}
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
