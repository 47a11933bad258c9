"""The KV caches of one quantized stage's sessions as one pool: per layer one key and one value
array ``[sessions, kv_heads, positions, head_dim]``, a session one row (:class:`KVSlot`).

Why one array, not a buffer per session: ONNX Runtime's GroupQueryAttention attends over the
rows of *one* past-key buffer, so the decode steps of several sessions run as one batch only
where their caches are rows of the same array. Rows are the outermost dimension, so rows
``lo .. hi - 1`` are one contiguous view: a batch binds views, never copies. A free row goes
to the next session lowest first, so the sessions alive sit together and a batch spans few
rows that take no part.

The arrays are allocated once, at the pool's full size, as zeroed pages the kernel maps on
first write: a row costs resident memory only for the positions its sessions have written.

Shutdown: a slot's row comes back with :meth:`KVSlot.close` (the session table calls it as it
lets a session go, before it admits another), or when the slot is garbage (a cache a caller
made and dropped), whichever comes first; closing twice is harmless.
"""

from __future__ import annotations

import heapq
import threading
import weakref
from typing import Any

import numpy as np

from edgesplit.errors import SessionsBusyError

__all__ = ["KVPool", "KVSlot"]


class KVPool:
    """Rows for ``capacity`` sessions of ``layers`` layers, each ``positions`` long, of
    ``kv_heads`` heads of ``head_dim``; ``lengths[row]``: the tokens a row holds."""

    def __init__(self, layers: int, kv_heads: int, positions: int, head_dim: int, *,
                 capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a KV pool holds at least one session, got {capacity}")
        self.capacity, self.positions = capacity, positions
        shape = (capacity, kv_heads, positions, head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(layers)]
        self.values = [np.zeros(shape, np.float32) for _ in range(layers)]
        self.lengths = np.zeros(capacity, np.int64)
        self._free = list(range(capacity))  # a heap: the lowest row first
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays at their full size (what is resident is what was written)."""
        return sum(a.nbytes for a in (*self.keys, *self.values))

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self) -> KVSlot:
        """An empty row for a new session; SessionsBusyError when every row is in use."""
        with self._lock:
            if not self._free:
                raise SessionsBusyError(
                    f"all {self.capacity} KV cache rows of the stage are in use: end a "
                    "session, or serve with more --max-sessions")
            row = heapq.heappop(self._free)
        self.lengths[row] = 0
        return KVSlot(self, row)

    def rows(self, lo: int, hi: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per layer, the keys' and the values' rows ``lo .. hi - 1`` (views)."""
        return [k[lo:hi] for k in self.keys], [v[lo:hi] for v in self.values]

    def _give(self, row: int) -> None:
        with self._lock:
            self.lengths[row] = 0
            heapq.heappush(self._free, row)


class KVSlot:
    """One session's row of a :class:`KVPool`: ``length`` tokens held, :meth:`crop` to hold
    fewer (what lies past is never read), :meth:`close` to give the row back."""

    __slots__ = ("__weakref__", "_back", "pool", "row")

    def __init__(self, pool: KVPool, row: int) -> None:
        self.pool, self.row = pool, row
        self._back: Any = weakref.finalize(self, pool._give, row)

    @property
    def length(self) -> int:
        return int(self.pool.lengths[self.row])

    @length.setter
    def length(self, tokens: int) -> None:
        self.pool.lengths[self.row] = tokens

    def crop(self, length: int) -> None:
        """Hold ``length`` tokens again (what lies past it is never read)."""
        self.length = min(self.length, length)

    @property
    def closed(self) -> bool:
        return not self._back.alive

    def close(self) -> None:
        """Give the row back to the pool (once; a closed slot must not step again)."""
        self._back()
