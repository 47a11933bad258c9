"""Dynamic batching for a served device: requests that arrive within ``max_wait_ms`` of each
other (up to ``max_batch``) run as one batch, then each gets its own rows back.

Captured programs are shape-specialised, so the device's partition is built a second time
from the model captured at batch ``max_batch``; a short batch is padded by repeating its last
request and the padding is dropped. Inference-mode layers treat samples independently (and
edgesplit rounds activations per sample), so a request's answer does not depend on the others
in its batch; a request the batch cannot take (a failing one) is retried alone so it cannot
fail the others.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import torch

from edgesplit.errors import ConfigError, option
from edgesplit.graph import capture
from edgesplit.runtime.program import DeviceStep, PlanProgram

__all__ = ["Batcher", "batched_step"]


def batched_step(program: PlanProgram, device: str, max_batch: int) -> DeviceStep:
    """``device``'s step built from the model captured at batch ``max_batch``."""
    plan = program.plan
    shapes = plan.model.input_shapes
    if not shapes or any(s[0] != 1 for s in shapes):
        raise ConfigError("dynamic batching needs a plan made at batch size 1")
    if str(plan.model.source).endswith(".pt2"):
        raise ConfigError("dynamic batching re-captures the model at the batch size; a saved "
                          ".pt2 program has a fixed batch size")
    graph = capture(plan.model.source, input_shape=(max_batch, *shapes[0][1:]),
                    optimize=plan.model.graph == "optimized")
    return PlanProgram.load(plan, graph).step(device)


class Batcher:
    """Collects single requests for ``step`` and runs them in batches on one worker thread."""

    def __init__(self, single: DeviceStep, batched: DeviceStep, max_batch: int,
                 max_wait_ms: float) -> None:
        if max_batch < 2:
            raise ConfigError(f"{option('max_batch')} must be at least 2 to batch anything")
        self.single, self.batched = single, batched
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1e3
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.batches_run = 0
        self._worker = threading.Thread(target=self._loop, name="edgesplit-batcher", daemon=True)
        self._worker.start()

    def compute(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        done: Future = Future()
        self._queue.put((values, done))
        return done.result()

    def close(self) -> None:
        self._stop.set()
        self._worker.join(timeout=5)

    def _collect(self) -> list:
        try:
            first = self._queue.get(timeout=0.1)
        except queue.Empty:
            return []
        items, deadline = [first], time.perf_counter() + self.max_wait_s
        while len(items) < self.max_batch:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            try:
                items.append(self._queue.get(timeout=left))
            except queue.Empty:
                break
        return items

    def _loop(self) -> None:
        while not self._stop.is_set():
            items = self._collect()
            if not items:
                continue
            if len(items) == 1:
                self._run_alone(*items[0])
                continue
            try:
                results = self._run_batch([v for v, _ in items])
            except Exception:
                for values, done in items:
                    self._run_alone(values, done)
                continue
            self.batches_run += 1
            for (_, done), result in zip(items, results, strict=True):
                done.set_result(result)

    def _run_alone(self, values: dict[str, torch.Tensor], done: Future) -> None:
        try:
            done.set_result(self.single.compute(values))
        except Exception as exc:
            done.set_exception(exc)

    def _run_batch(self, requests: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        n = len(requests)
        names = list(self.single.partition.inputs) if self.single.partition else []
        stacked = {}
        for name in names:
            rows = [r[name] for r in requests]
            rows += [rows[-1]] * (self.max_batch - n)  # padding, dropped below
            stacked[name] = torch.cat(rows)
        out = self.batched.compute(stacked)
        produced = self.single.partition.outputs if self.single.partition else ()
        return [{**requests[i], **{t: out[t][i:i + 1] for t in produced}} for i in range(n)]
