"""A partition server's compute, as a part: :class:`LocalCompute` (this process: batching,
compute emulation, a session's backend state, a star source's compute workers) or
:class:`EngineCompute` (a Ray Serve deployment this server is the ingress of).

Both answer ``compute(values, context, timings)``: the step's outputs of a request's decoded
inputs, what it took added to ``timings``. A part also takes its share of the server's start
and stop (:class:`~edgesplit.runtime.shell.Handler`): the deployment's health becomes the
server's, compute workers are refused and drained with the server's slots, a batcher or a
deployment closes last.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import torch

from edgesplit.errors import ConfigError, SessionOwnerError, option
from edgesplit.runtime.planned import SESSION_KEY
from edgesplit.runtime.program import DeviceStep, PlanProgram
from edgesplit.runtime.sessions import OWNER_KEY, SessionTable, owner_digest
from edgesplit.runtime.shell import WorkerSlots
from edgesplit.transport import BadRequest, deadline_of, remaining_timeout
from edgesplit.transport.slots import Slots

if TYPE_CHECKING:
    from edgesplit.runtime.batching import Batcher
    from edgesplit.runtime.ray_engine import RayEngine

__all__ = ["DEFAULT_MAX_BATCH", "MAX_SESSIONS", "EngineCompute", "LocalCompute", "batcher_for"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 32  # batches up to this many requests where the partition allows it
MAX_SESSIONS = 1024  # sessions whose backend state a server keeps (the oldest go first)

Values = dict[str, torch.Tensor]


def batcher_for(program: PlanProgram, device: str, max_batch: int | None, max_wait_ms: float
                ) -> tuple[Batcher | None, str]:
    """Dynamic batching for ``device`` (``max_batch`` None: up to DEFAULT_MAX_BATCH where
    the partition allows it; 1: none), and a few words saying what was decided."""
    from edgesplit.runtime.batching import Batcher, flexible_step

    limit = DEFAULT_MAX_BATCH if max_batch is None else max_batch
    if limit <= 1:
        return None, "off"
    flexible = flexible_step(program, device)
    if isinstance(flexible, str):
        log.warning("device %s serves requests one by one: %s", device, flexible)
        return None, f"off ({flexible})"
    return (Batcher(program.step(device), flexible, limit, max_wait_ms, flexible=True),
            f"up to {limit}")


class LocalCompute:
    """``step`` computed in this process: in ``batcher``'s batches where there is one
    (``batching`` says what was decided), a session's requests alone on that session's
    backend state (:meth:`now`). With ``computing`` (a star source, a mesh's branch) at most
    that many compute at once, and a call holds a worker only while it computes, not while the
    sink joins (held across that wait, the sources' workers waited on each other); a call
    waiting for one past its deadline is refused, and once the server stops, UNAVAILABLE
    (``slots`` say whether it does)."""

    def __init__(self, step: DeviceStep, slots: WorkerSlots, batcher: Batcher | None = None,
                 batching: str = "off", computing: Slots | None = None) -> None:
        self.step, self.slots, self.batcher, self.batching = step, slots, batcher, batching
        self.computing = computing
        self._compute_key = f"{step.name}.compute_ms"
        # the backend state of each client session (a stateless backend keeps none)
        self.states: SessionTable[Any] = SessionTable(MAX_SESSIONS, device=step.name)
        # how a request computes, chosen once: in a compute worker, or at once
        self.compute: Callable[[Values, grpc.ServicerContext | None, dict[str, float]],
                               Values] = self.now if computing is None else self._in_worker

    def _in_worker(self, values: Values, context: grpc.ServicerContext | None,
                   timings: dict[str, float]) -> Values:
        computing = self.computing
        assert computing is not None
        if not computing.take(remaining_timeout(context, self.slots.timeout_s)):
            self.slots.check_running()
            raise BadRequest(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"device {self.step.name!r}: the caller's deadline passed while "
                             f"its {option('max_workers')} workers were busy")
        try:
            return self.now(values, context, timings)
        finally:
            computing.give()

    def now(self, values: Values, context: grpc.ServicerContext | None,
            timings: dict[str, float]) -> Values:
        """This step's outputs of ``values``, in the batcher's next batch where there is one
        (a session's requests alone, on its state); the compute time added to ``timings``."""
        t0 = time.perf_counter()
        state = self.session_state(context)
        if state is None:
            batcher = self.batcher
            values = batcher.compute(values, deadline_of(context)) if batcher is not None \
                else self.step.compute(values)
        else:  # a session's state is its own: no batching across sessions
            values = self.step.compute(values, state)
        timings[self._compute_key] = (time.perf_counter() - t0) * 1e3
        if self.step.emulate_ms is not None:  # compute emulation: the time slept
            timings.update(self.step.emulation_timings())
        return values

    def session_state(self, context: grpc.ServicerContext | None) -> Any:
        """The backend state of the caller's session (metadata ``edgesplit-session``), made
        on its first request; None without a session or with a stateless backend. The least
        recently used sessions are forgotten beyond ``MAX_SESSIONS`` (a client cannot grow
        memory without bound); a session answers only the secret it was opened with
        (metadata ``edgesplit-session-key``; none: callers without one), another caller is
        refused PERMISSION_DENIED."""
        metadata = dict(context.invocation_metadata()) if context else {}
        session = metadata.get(SESSION_KEY)
        if not isinstance(session, str) or self.step.partition is None:
            return None
        secret = metadata.get(OWNER_KEY)
        owner = owner_digest(secret) if isinstance(secret, str) else None
        step = self.step
        try:
            return self.states.get_or_open(session, owner, step.backend.new_state, step)
        except SessionOwnerError as exc:
            raise BadRequest(grpc.StatusCode.PERMISSION_DENIED, str(exc)) from None

    # ---- the server's start and stop -----------------------------------------------------
    def started(self, serving: Callable[[bool], None]) -> None:
        """Nothing to start: the server's health is its own."""

    def refuse(self) -> None:
        """Every call waiting for a compute worker is answered at once."""
        if self.computing is not None:
            self.computing.close()

    def drain(self, timeout: float) -> None:
        """Wait at most ``timeout`` for the calls waiting for a compute worker."""
        if self.computing is not None:
            self.computing.drain(timeout)

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()


class EngineCompute:
    """The step computed by ``engine``'s deployment (which batches): the hop to it and its
    compute added to a request's timings, within what is left of the caller's deadline
    (``timeout_s`` without one). Once the server listens, its health follows the
    deployment's; when it stops, the deployment is shut down."""

    batcher: Batcher | None = None
    batching = "in the engine"

    def __init__(self, engine: RayEngine, device: str, timeout_s: float) -> None:
        if engine.device != device:
            raise ConfigError(f"the engine runs device {engine.device!r}, not {device!r}")
        self.engine, self.timeout_s = engine, timeout_s

    def compute(self, values: Values, context: grpc.ServicerContext | None,
                timings: dict[str, float]) -> Values:
        """The deployment's compute, and the hop to it (their timings added)."""
        values, more = self.engine.compute(values, remaining_timeout(context, self.timeout_s))
        timings.update(more)
        return values

    now = compute

    def started(self, serving: Callable[[bool], None]) -> None:
        self.engine.watch(serving)

    def refuse(self) -> None:
        """Nothing waits here: the deployment queues its own requests."""

    def drain(self, timeout: float) -> None:
        """Nothing waits here."""

    def close(self) -> None:
        self.engine.close()


Compute = LocalCompute | EngineCompute
