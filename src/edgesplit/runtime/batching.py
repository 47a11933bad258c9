"""Dynamic batching for a served device: requests waiting together (up to ``max_batch``) run as
one batch, then each gets its own rows back.

Which batches: whatever is queued when the worker is free (a lone client never waits for
company, so batching costs it nothing), optionally waiting up to ``max_wait_ms`` for more.
Under load the queue fills while a batch computes, and the next batch takes it all. A request
whose caller's deadline passes while it waits in the queue is answered DEADLINE_EXCEEDED
without being computed: under overload, work nobody waits for would delay the live requests.

How: captured programs bake the example's batch size into their reshapes. :func:`flexible_step`
frees it (:func:`edgesplit.graph.passes.free_batch`) and checks the result on distinct
samples against each sample alone, so any batch size runs without padding; a model that
mixes samples (or moves the batch out of dimension 0) fails the check and is served unbatched.
:func:`batched_step` is the older way for built-in models: capture again at ``max_batch`` and
pad short batches by repeating the last request. Inference-mode layers treat samples
independently (and edgesplit rounds activations per sample), so a request's answer does not
depend on the others in its batch; a request the batch cannot take (a failing one) is retried
alone so it cannot fail the others.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import torch
from torch.fx import GraphModule

from edgesplit.errors import ConfigError, option
from edgesplit.graph import capture
from edgesplit.graph.partition import Partition
from edgesplit.graph.passes import free_batch
from edgesplit.runtime.backends import TorchBackend
from edgesplit.runtime.program import DeviceStep, PlanProgram
from edgesplit.transport.errors import BadRequest

__all__ = ["Batcher", "batched_step", "flexible_step", "run_together"]

log = logging.getLogger(__name__)
CHECK_SAMPLES = 3  # distinct samples a freed batch is checked with, against each alone
CHECK_TOL = 1e-4  # relative to the output's scale: batched kernels may round differently


def batched_step(program: PlanProgram, device: str, max_batch: int) -> DeviceStep:
    """``device``'s step built from the model captured at batch ``max_batch``."""
    plan = program.plan
    shapes = plan.model.input_shapes
    if not shapes or any(s[0] != 1 for s in shapes):
        raise ConfigError("dynamic batching needs a plan made at batch size 1")
    if str(plan.model.source).endswith(".pt2"):
        raise ConfigError("dynamic batching re-captures the model at the batch size; a saved "
                          ".pt2 program has a fixed batch size")
    graph = capture(plan.model.local_source, input_shape=(max_batch, *shapes[0][1:]),
                    optimize=plan.model.graph == "optimized")
    return PlanProgram.load(plan, graph).step(device)


def flexible_step(program: PlanProgram, device: str) -> DeviceStep | str:
    """``device``'s step running at any batch size, or why it cannot (a sentence).

    The partition's graph is copied with its batch freed, then ``CHECK_SAMPLES`` distinct
    samples run as one batch must give each sample's own answer."""
    step = program.step(device)
    shapes = program.plan.model.input_shapes
    if step.partition is None:
        return "the device only relays"
    if not shapes or any(s[0] != 1 for s in shapes):
        return "the plan was made at a batch size above 1"
    if not isinstance(step.backend, TorchBackend):  # torchscript traces each batch size
        return f"the {step.backend.name} backend runs a fixed batch size"
    # a new graph over the same module: the weights are shared, not copied (a deep copy would
    # double the server's memory for its partition)
    source = step.partition.module
    gm = GraphModule(source, copy.deepcopy(source.graph))
    free_batch(gm, 1)
    flexible = dataclasses.replace(step, partition=dataclasses.replace(step.partition, module=gm))
    try:
        ok = _same_as_alone(step, flexible, program)
    except Exception as exc:  # a shape the freed graph cannot take: not batch-first
        ok = False
        log.debug("freed batch of %s fails: %s", device, exc)
    return flexible if ok else "its layers mix the samples of a batch (not batch-first)"


def _samples(program: PlanProgram, step: DeviceStep) -> list[dict[str, torch.Tensor]]:
    """Distinct inputs for ``step`` shaped like the plan's: the example perturbed."""
    assert step.partition is not None
    example = program.example_values()
    out = []
    for k in range(CHECK_SAMPLES):
        g = torch.Generator().manual_seed(1234 + k)
        sample = {}
        for name in step.partition.inputs:
            x = example[name]
            if x.is_floating_point():
                sample[name] = x + torch.randn(x.shape, generator=g, dtype=x.dtype) * (
                    x.abs().mean() + 1e-3)
            else:  # ids and masks: other values from the same range
                sample[name] = torch.randint(int(x.min()), int(x.max()) + 1, x.shape,
                                             generator=g, dtype=x.dtype)
        out.append(sample)
    return out


def _same_as_alone(step: DeviceStep, flexible: DeviceStep, program: PlanProgram) -> bool:
    assert step.partition is not None
    samples = _samples(program, step)
    alone = [step.compute(s) for s in samples]
    together = flexible.compute({n: torch.cat([s[n] for s in samples])
                                 for n in step.partition.inputs})
    for name in step.partition.outputs:
        rows = torch.cat([a[name] for a in alone])
        got = together[name]
        if got.shape != rows.shape:
            return False
        scale = float(rows.abs().max()) if rows.numel() and rows.is_floating_point() else 1.0
        if not torch.allclose(got.double(), rows.double(), rtol=0, atol=CHECK_TOL * (scale + 1)):
            return False
    return True


class Batcher:
    """Collects single requests for ``step`` and runs them in batches on one worker thread.
    ``batched`` runs any batch size (``flexible``, from :func:`flexible_step`) or exactly
    ``max_batch`` rows (from :func:`batched_step`; short batches are padded).

    A request that finds nothing computing and nothing queued runs at once on its caller's
    thread (a lone client pays no hand-off to the worker); while it runs, others queue for
    the worker's next batch. One computation at a time either way (``_computing``)."""

    def __init__(self, single: DeviceStep, batched: DeviceStep, max_batch: int,
                 max_wait_ms: float = 0.0, *, flexible: bool = False) -> None:
        if max_batch < 2:
            raise ConfigError(f"{option('max_batch')} must be at least 2 to batch anything")
        if max_wait_ms < 0:
            raise ConfigError(f"{option('max_wait_ms')} must be 0 or more")
        self.single, self.batched, self.flexible = single, batched, flexible
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1e3
        # C-level queue; each request waits on a bare lock the worker releases (a Future's
        # Condition costs a dozen Python calls a side, per request, on the loaded path)
        self._queue: queue.SimpleQueue[_Waiting] = queue.SimpleQueue()
        self._computing = threading.Lock()
        self._stop = threading.Event()
        self.batches_run = 0
        self.requests_batched = 0
        self.requests_expired = 0  # dropped in the queue: their callers' deadlines passed
        self._worker = threading.Thread(target=self._loop, name="edgesplit-batcher", daemon=True)
        self._worker.start()

    def compute(self, values: dict[str, torch.Tensor], deadline: float | None = None
                ) -> dict[str, torch.Tensor]:
        """``values``' outputs, computed at once or in the worker's next batch. ``deadline``
        (a ``time.monotonic()`` instant, its caller's): a request still queued when it
        passes is dropped uncomputed (BadRequest DEADLINE_EXCEEDED)."""
        # a request queued meanwhile waits for the worker, which runs once this one releases
        # _computing
        if self.max_wait_s == 0 and self._queue.empty() and \
                self._computing.acquire(blocking=False):
            try:
                return self.single.compute(values)
            finally:
                self._computing.release()
        waiting = _Waiting(values, None, deadline)
        self._queue.put(waiting)
        waiting.done.acquire()  # released by the worker once the outcome is set
        if waiting.error is not None:
            raise waiting.error
        return waiting.result

    def idle(self) -> bool:
        """Whether a request now would run at once on its caller's thread (:meth:`compute`'s
        short way: nothing computing, nothing queued)."""
        return self.max_wait_s == 0 and self._queue.empty() and not self._computing.locked()

    def submit(self, values: dict[str, torch.Tensor],
               callback: Callable[[_Waiting], None], deadline: float | None = None) -> None:
        """Queue one request for the worker's next batch without waiting for it:
        ``callback(waiting)`` runs on the worker once its ``result`` or ``error`` is set (it
        must raise nothing; it must not block: the batch's other requests wait on it).
        ``deadline``: as :meth:`compute`'s."""
        self._queue.put(_Waiting(values, callback, deadline))

    def close(self) -> None:
        self._stop.set()
        self._worker.join(timeout=5)

    def _collect(self, first: _Waiting) -> list[_Waiting]:
        items, deadline = [first], time.perf_counter() + self.max_wait_s
        while len(items) < self.max_batch:
            try:  # what is queued already, then (max_wait_ms) what arrives in time
                items.append(self._queue.get_nowait())
                continue
            except queue.Empty:
                pass
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
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            with self._computing:  # then gather: what queued while a caller computed joins
                self._run(self._collect(first))

    def _run(self, items: list[_Waiting]) -> None:
        items = self._unexpired(items)
        if not items:
            return
        if len(items) == 1:
            self._run_alone(items[0])
            return
        try:
            results = self._run_batch([w.values for w in items])
        except Exception:
            for waiting in items:
                self._run_alone(waiting)
            return
        self.batches_run += 1
        self.requests_batched += len(items)
        for waiting, result in zip(items, results, strict=True):
            waiting.result = result
            waiting.finish()

    def _unexpired(self, items: list[_Waiting]) -> list[_Waiting]:
        """The requests whose callers still wait; the others are answered DEADLINE_EXCEEDED
        without computing (under overload a queue of them would eat the time of live ones)."""
        now = time.monotonic()
        live = []
        for waiting in items:
            if waiting.deadline is None or waiting.deadline > now:
                live.append(waiting)
                continue
            self.requests_expired += 1
            waiting.error = BadRequest(grpc.StatusCode.DEADLINE_EXCEEDED,
                                       "the request waited for a batch past its caller's "
                                       "deadline: dropped uncomputed")
            waiting.finish()
        return live

    def _run_alone(self, waiting: _Waiting) -> None:
        try:
            waiting.result = self.single.compute(waiting.values)
        except Exception as exc:
            waiting.error = exc
        waiting.finish()

    def _run_batch(self, requests: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        return run_together(self.single, self.batched, requests,
                            None if self.flexible else self.max_batch)


class _Waiting:
    """One queued request: its inputs and its caller's deadline, then its outcome; its caller
    waits on ``done`` (held until the outcome is set), or ``callback`` gets it (a request
    submitted to answer later)."""

    __slots__ = ("callback", "deadline", "done", "error", "result", "values")

    def __init__(self, values: dict[str, torch.Tensor],
                 callback: Callable[[_Waiting], None] | None = None,
                 deadline: float | None = None) -> None:
        self.values, self.callback, self.deadline = values, callback, deadline
        self.result: Any = None
        self.error: Exception | None = None
        self.done = threading.Lock()
        if callback is None:
            self.done.acquire()

    def finish(self) -> None:
        if self.callback is None:
            self.done.release()
            return
        try:
            self.callback(self)
        except Exception:  # the worker must go on for the other requests
            log.exception("answering a batched request failed")


def run_together(single: DeviceStep, batched: DeviceStep, requests: list[dict[str, torch.Tensor]],
                 pad_to: int | None = None) -> list[dict[str, torch.Tensor]]:
    """``requests`` (each one sample's inputs by name) computed as one batch by ``batched``;
    each gets its own values back with its rows of the outputs. ``pad_to``: a fixed-batch
    step's size (short batches repeat the last request; the padding is dropped)."""
    n = len(requests)
    partition: Partition | None = single.partition
    names = list(partition.inputs) if partition else []
    stacked = {}
    for name in names:
        rows = [r[name] for r in requests]
        if pad_to is not None:
            rows += [rows[-1]] * (pad_to - n)  # padding, dropped below
        stacked[name] = torch.cat(rows)
    out = batched.compute(stacked)
    produced = partition.outputs if partition else ()
    return [{**requests[i], **{t: out[t][i:i + 1] for t in produced}} for i in range(n)]
