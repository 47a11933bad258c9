"""One device's partition as a Ray Serve deployment: what each replica runs.

Imported only where Ray is installed (:mod:`edgesplit.runtime.ray_engine` checks first). A
replica loads the plan itself (the same capture as the ingress, so the same weights: built-in
models are seeded), computes the partition on the tensors the ingress decoded and checked,
and answers with the tensors later devices and the caller need. Tensors cross Ray as numpy
arrays, which Ray's object store hands over without pickling their bytes.

Batching is Ray's ``@serve.batch``, on the partition with its batch dimension freed and
checked against each sample alone (:func:`edgesplit.runtime.batching.flexible_step`, as the
local server does): a request's answer does not depend on its batch, and a batch that fails is
run again one request at a time so a bad request fails alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

import numpy as np
import torch
from ray import serve

from edgesplit.plan.model import Plan
from edgesplit.runtime.batching import flexible_step, run_together
from edgesplit.runtime.program import DeviceStep, PlanProgram

__all__ = ["Arrays", "PartitionReplica", "ReplicaReply", "from_arrays", "to_arrays"]

Arrays = dict[str, np.ndarray]
DEFAULT_BATCH = 32  # @serve.batch's bound until __init__ sets the configured one
INLINE_MS = 0.5  # partitions faster than this compute on the replica's event loop


class ReplicaReply(NamedTuple):
    """What a replica answers one request with (a tuple: cheap to pickle)."""

    outputs: Arrays | None  # None: the compute failed (``error`` says how)
    error: str | None
    compute_ms: float  # this request's compute (its batch's, when batched)
    emulated_ms: float | None  # the time compute emulation slept; None: not emulating
    replica: str  # the replica's id (requests spread over replicas)
    batch: int  # requests computed together with this one (itself included)


def _compute_ms(step: DeviceStep, program: PlanProgram) -> float:
    """The partition's compute on the plan's example (median of 3, after a warm-up), ms."""
    assert step.partition is not None
    example = program.example_values()
    values = {t: example[t] for t in step.partition.inputs}
    step.compute(values)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        step.compute(values)
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def to_arrays(values: dict[str, torch.Tensor], names: tuple[str, ...] | list[str]) -> Arrays:
    return {n: values[n].detach().numpy() for n in names}


def from_arrays(arrays: Arrays) -> dict[str, torch.Tensor]:
    """Tensors over the arrays; ones Ray handed over read-only (zero-copy from its object
    store) are copied, so a partition may never write into shared memory."""
    return {n: torch.from_numpy(a if a.flags.writeable else a.copy()) for n, a in arrays.items()}


class PartitionReplica:
    """A Ray Serve replica computing ``device``'s partition of the plan ``plan_json``, on
    ``torch_device`` (``cuda``: the GPU Ray gave this replica; None: the CPU). Its backend
    returns host tensors whatever computed them, so the arrays it answers with are the
    CPU's."""

    def __init__(self, plan_json: str, device: str, *, backend: str = "torch",
                 trust_model_file: bool = False, threads: int = 1, max_batch: int = 1,
                 max_wait_ms: float = 0.0, emulate: bool = False,
                 torch_device: str | None = None) -> None:
        torch.set_num_threads(threads)
        program = PlanProgram.load(Plan.model_validate_json(plan_json), backend=backend,
                                   trust_model_file=trust_model_file, torch_device=torch_device)
        self.step = program.step(device)
        if emulate:  # each compute paced to the plan's prediction: no batching
            program.emulate([device])
        partition = self.step.partition
        assert partition is not None  # the engine refuses relay-only devices
        wanted = {*self.step.sends, *self.step.returns}
        self.produced = tuple(t for t in partition.outputs if t in wanted)
        self.batched: DeviceStep | None = None
        self.batching = "off"
        self._busy = 0  # requests computing alone (the event loop's own: no lock needed)
        self._wait = max_wait_ms > 0
        # a partition that computes in well under a millisecond runs on the event loop: the
        # hand-off to a thread and back would cost about as much as the compute. Requests
        # then run one by one as they arrive (none is ever seen waiting), so such a partition
        # batches only with a batch wait (max_wait_ms)
        self._inline = not emulate and _compute_ms(self.step, program) < INLINE_MS
        if max_batch > 1 and not emulate:
            flexible = flexible_step(program, self.step.name)
            self.batched = None if isinstance(flexible, str) else flexible
            self.batching = f"up to {max_batch}" if self.batched else f"off ({flexible})"
        self.run_batch.set_max_batch_size(max(1, max_batch))  # type: ignore[attr-defined]
        self.run_batch.set_batch_wait_timeout_s(max_wait_ms / 1e3)  # type: ignore[attr-defined]
        try:
            self.replica = str(serve.get_replica_context().replica_id.unique_id)
        except Exception:  # constructed outside Serve (tests of the class itself)
            self.replica = "local"

    async def __call__(self, arrays: Arrays) -> ReplicaReply:
        # without a batch wait, a request alone on the replica runs at once: a lone client pays
        # no batch queue (as the local server's Batcher); others arriving meanwhile batch
        if self.batched is None or (self._busy == 0 and not self._wait):
            if self._inline:
                return self._alone(arrays)
            self._busy += 1
            try:
                return await asyncio.to_thread(self._alone, arrays)
            finally:
                self._busy -= 1
        return await self.run_batch(arrays)

    def describe(self) -> dict[str, Any]:
        """What this replica runs (the ingress prints it once)."""
        return {"replica": self.replica, "device": self.step.name, "batching": self.batching,
                "threads": torch.get_num_threads(), "inline": self._inline,
                "torch_device": str(self.step.backend.device)}

    @serve.batch(max_batch_size=DEFAULT_BATCH, batch_wait_timeout_s=0.0)
    async def run_batch(self, requests: list[Arrays]) -> list[ReplicaReply]:
        # off the event loop: requests arriving meanwhile queue for the next batch
        return await asyncio.to_thread(self._together, requests)

    def _alone(self, arrays: Arrays) -> ReplicaReply:
        start = time.perf_counter()
        try:
            out = self.step.compute(from_arrays(arrays))
        except Exception as exc:
            return ReplicaReply(None, f"{type(exc).__name__}: {exc}", 0.0, None, self.replica, 1)
        ms = (time.perf_counter() - start) * 1e3
        emulated = self.step.take_emulated_ms() if self.step.emulate_ms is not None else None
        return ReplicaReply(to_arrays(out, self.produced), None, ms, emulated, self.replica, 1)

    def _together(self, requests: list[Arrays]) -> list[ReplicaReply]:
        if len(requests) == 1:
            return [self._alone(requests[0])]
        assert self.batched is not None
        start = time.perf_counter()
        try:
            outs = run_together(self.step, self.batched, [from_arrays(r) for r in requests])
        except Exception:  # a request the batch cannot take fails alone, not its batch
            return [self._alone(r) for r in requests]
        ms = (time.perf_counter() - start) * 1e3
        return [ReplicaReply(to_arrays(o, self.produced), None, ms, None, self.replica,
                             len(requests)) for o in outs]
