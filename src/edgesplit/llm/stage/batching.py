"""Decode steps of concurrent sessions at one stage, run as one batch: :class:`StepBatcher`.

Who calls: every thread that steps a stage (a server's workers, one per request in flight; a
client's generations sharing its first stage). Each calls :meth:`StepBatcher.run` with its
own step and gets its own result back, as if it had run alone.

The algorithm (leader/follower, no worker thread): a step joins a queue; the first caller to
find the stage idle becomes the leader, takes what is queued as one batch, computes it on its
own thread and hands each follower its result; a follower waits, and leads the next batch if
its step is still queued when the stage comes free. So a lone caller computes at once with no
hand-off (batching costs it nothing), and under load a batch takes every decode step that
queued while the previous one computed. One computation at a time either way.

What batches: decode steps (``together(step)``), up to ``max_batch`` a batch, in arrival order;
a step that does not (a prompt's prefill) runs alone. A batch that fails is run again one step
at a time, so one session's failure is its own.

Why not :class:`edgesplit.runtime.batching.Batcher`: it stacks a captured graph's inputs by
name and keeps a worker thread; a stage's steps carry each its own session's cache row and
position, and only some of them may batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["StepBatcher"]

S = TypeVar("S")


class StepBatcher(Generic[S]):
    """Runs steps ``S`` through ``compute(batch) -> results`` (a result per step, in order),
    batching those ``together(step)`` admits, at most ``max_batch`` at once."""

    def __init__(self, compute: Callable[[list[S]], list[Any]],
                 together: Callable[[S], bool], *, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"a batch holds at least one step, got {max_batch}")
        self.compute, self.together, self.max_batch = compute, together, max_batch
        self._queue: list[_Queued[S]] = []
        self._busy = False
        self._changed = threading.Condition()
        self.batches = 0  # runs of more than one step, since start
        self.batched = 0  # steps that ran in them

    def run(self, step: S) -> Any:
        """``step``'s result, computed alone or in a batch; its own error if it fails."""
        mine = _Queued(step)
        with self._changed:
            self._queue.append(mine)
            while not mine.done:
                if self._busy:
                    self._changed.wait()
                    continue
                batch = self._take()
                self._busy = True
                self._changed.release()
                try:
                    self._compute(batch)
                finally:
                    self._changed.acquire()
                    self._busy = False
                    self._changed.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _take(self) -> list[_Queued[S]]:
        """The next batch, under the lock: the first step queued, and where it batches, every
        later step that batches too (up to ``max_batch``)."""
        first = self._queue[0]
        if not self.together(first.step):
            return [self._queue.pop(0)]
        batch: list[_Queued[S]] = []
        rest: list[_Queued[S]] = []
        for queued in self._queue:
            if len(batch) < self.max_batch and self.together(queued.step):
                batch.append(queued)
            else:
                rest.append(queued)
        self._queue = rest
        return batch

    def _compute(self, batch: list[_Queued[S]]) -> None:
        try:
            results = self.compute([q.step for q in batch])
        except BaseException as exc:
            if len(batch) == 1 or not isinstance(exc, Exception):  # an interrupt: all fail
                for queued in batch:
                    queued.fail(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            for queued in batch:  # again alone: a failure is its own step's
                self._compute([queued])
            return
        if len(batch) > 1:
            self.batches += 1
            self.batched += len(batch)
        for queued, result in zip(batch, results, strict=True):
            queued.result, queued.done = result, True


class _Queued(Generic[S]):
    """A step waiting in the queue, then its outcome."""

    __slots__ = ("done", "error", "result", "step")

    def __init__(self, step: S) -> None:
        self.step = step
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False

    def fail(self, exc: BaseException) -> None:
        self.error, self.done = exc, True
