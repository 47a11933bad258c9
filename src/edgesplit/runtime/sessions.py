"""What a server keeps per client session: one bounded table, each session its owner's.

A client names its session (call metadata ``edgesplit-session``); a server keeps something
for it between calls: a partition's backend state (:mod:`edgesplit.runtime.compute`), an LLM
stage's KV cache (:mod:`edgesplit.llm.stage.kv_sessions`). A session id is only a name, which
two clients may pick alike, so a session belongs to the owner that opened it: the digest of a
secret its client sends with every call (call metadata :data:`OWNER_KEY`; the table keeps the
digest, never the secret, and compares digests in constant time). A call with another owner
fails with SessionOwnerError, even to open the id afresh: an id that exists is never joined.
A session opened without a secret answers only callers without one (a client that sends no
secret shares its session ids with others that send none, as before secrets existed).

**Bounds and eviction.** At most ``capacity`` sessions are alive. A new one takes the room of
the least recently used session that is not in use; a session in use (held by a call,
:meth:`SessionTable.held`) is never evicted under its call: evicted, ended or opened afresh
while held, it is unlisted at once but its value lives until the call lets it go, and counts
as alive until then. When every session alive is in use, a new one waits up to ``wait_s`` for
one to come free, then fails with SessionsBusyError.

This is the LLM stages' rule, kept because a KV cache is large and a step holds it: evicting
it under a running step would let memory exceed what the plan priced. The partition server's
rule was plain least-recently-used eviction of any session; its calls read a session's state
without holding it (:meth:`SessionTable.get_or_open`), so no session of its is ever in use
and the shared rule evicts exactly as its own did. The training server
(:class:`~edgesplit.train.remote.server.TrainHandler`) keeps its one session at a time in a
table of ``capacity=1`` whose ``evictable`` says never: its session goes only when the
server ends it, taking it over or finding it idle past a timeout (:meth:`SessionTable.idle_s`,
from ``Entry.used_at``), and says why to its device; its requests find it with
:meth:`SessionTable.use`, which opens nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from edgesplit.errors import SessionOwnerError, SessionsBusyError, option

__all__ = ["OWNER_KEY", "Entry", "SessionTable", "owner_digest", "same_owner"]

OWNER_KEY = "edgesplit-session-key"  # call metadata: the client's secret for its sessions

V = TypeVar("V")


def owner_digest(secret: str | None) -> str | None:
    """What a server keeps of a client's secret (None without one)."""
    return None if not secret else hashlib.sha256(secret.encode()).hexdigest()


def same_owner(held: str | None, owner: str | None) -> bool:
    """Whether ``owner`` is the digest ``held`` (None: a session made without a secret, which
    only a caller without one matches), in time independent of where they differ."""
    if held is None or owner is None:
        return held is owner
    return hmac.compare_digest(held.encode(), owner.encode())


@dataclass
class Entry(Generic[V]):
    """One session in the table: its ``value``, the ``owner`` that opened it (a digest; None:
    opened without a secret), the calls holding it now (``users``), whether it is still
    listed (False once evicted, ended or opened afresh) and when a call last used it."""

    value: V
    owner: str | None
    users: int = 0
    listed: bool = True
    used_at: float = field(default_factory=time.monotonic)


class SessionTable(Generic[V]):
    """At most ``capacity`` sessions of ``device`` by id, each its owner's (see the module
    docstring). ``holds`` names what a session holds in the busy error (``KV caches``);
    ``evictable``: which idle sessions may make room (default: any). ``let_go``: called with a
    session's value once the table lets it go (unlisted, no call holding it), under the lock
    and before another session takes its room: where a value holds a resource the next one
    needs (a KV cache row), it goes back here, not when the value happens to be collected."""

    def __init__(self, capacity: int, *, device: str, holds: str = "sessions",
                 evictable: Callable[[Entry[V]], bool] | None = None,
                 let_go: Callable[[V], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"a session table holds at least one session, got {capacity}")
        self.capacity, self.device, self.holds = capacity, device, holds
        self.evictable, self.let_go = evictable, let_go
        self.evicted = 0  # sessions dropped to make room, since start
        self._entries: OrderedDict[str, Entry[V]] = OrderedDict()
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a session came free or was dropped
        self._unlisted = 0  # dropped sessions a call still holds

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session: object) -> bool:
        return session in self._entries

    @property
    def alive(self) -> int:
        """Sessions alive: those listed, and dropped ones a call still holds."""
        return len(self._entries) + self._unlisted

    def get(self, session: str) -> V | None:
        """``session``'s value as it is now (None: not here), for a check: no owner asked, no
        use recorded."""
        entry = self._entries.get(session)
        return None if entry is None else entry.value

    def use(self, session: str, owner: str | None = None) -> V | None:
        """``session``'s value, its use recorded (None: not here; nothing is opened, nothing
        evicted)."""
        with self._lock:
            entry = self._entries.get(session)
            if entry is None:
                return None
            if entry.owner is not owner:
                self.check_owner(session, owner)
            self._touch(session, entry)
            return entry.value

    def idle_s(self, session: str) -> float:
        """Seconds since a call last used ``session`` (KeyError: not here)."""
        return time.monotonic() - self._entries[session].used_at

    def values(self) -> list[V]:
        """Every listed session's value, least recently used first."""
        return [entry.value for entry in list(self._entries.values())]

    def check_owner(self, session: str, owner: str | None) -> None:
        """SessionOwnerError unless ``owner`` may use ``session`` (a session answers only the
        owner it was opened with; one that is not here, anyone)."""
        entry = self._entries.get(session)
        if entry is not None and not same_owner(entry.owner, owner):
            raise SessionOwnerError(f"session {session!r} on device {self.device!r} belongs "
                                    "to another client (another session secret): use a "
                                    "session id of your own")

    def get_or_open(self, session: str, owner: str | None, make: Callable[..., V | None],
                    *args: Any) -> V | None:
        """``session``'s value, opened with ``make(*args)`` on its first call (a None value
        is not kept: nothing to keep); not held, so evictable once this returns."""
        with self._lock:
            entry = self._entries.get(session)
            if entry is not None:  # the call every request of a session makes: kept short
                if entry.owner is not owner:
                    self.check_owner(session, owner)
                self._entries.move_to_end(session)
                entry.used_at = time.monotonic()
                return entry.value
            if not self._make_room():  # only where no session may be evicted (training)
                raise self._busy()
            value = make(*args)
            if value is not None:
                self._entries[session] = Entry(value, owner)
            return value

    @contextmanager
    def held(self, session: str, owner: str | None, make: Callable[[], V], *,
             fresh: bool = False, wait_s: float | None = 60.0) -> Iterator[V]:
        """``session``'s value, held (never evicted) while the block runs; opened with
        ``make()`` when it is not here or ``fresh`` (an existing one is dropped first). A new
        session waits up to ``wait_s`` (None: as long as it takes) for room while every
        session alive is held, then SessionsBusyError."""
        entry = self._take(session, owner, make, fresh=fresh, wait_s=wait_s)
        try:
            yield entry.value
        finally:
            self._release(entry)

    def end(self, session: str, owner: str | None = None) -> bool:
        """Forget ``session`` (its value is let go once no call holds it); whether it was
        here. Only its owner may (:meth:`check_owner`)."""
        with self._lock:
            self.check_owner(session, owner)
            if session not in self._entries:
                return False
            self._drop(session)
            return True

    # ---- under the lock ------------------------------------------------------------------
    def _take(self, session: str, owner: str | None, make: Callable[[], V], *, fresh: bool,
              wait_s: float | None) -> Entry[V]:
        with self._lock:
            self.check_owner(session, owner)  # again, under the lock: it may have changed
            entry = self._entries.get(session)
            if entry is not None and not fresh:
                self._touch(session, entry)
                entry.users += 1
                return entry
            if entry is not None:  # opened afresh: the old value goes (once let go)
                self._drop(session)
            if not self._freed.wait_for(self._make_room, wait_s):
                raise self._busy()
            entry = Entry(make(), owner, users=1)
            self._entries[session] = entry
            return entry

    def _touch(self, session: str, entry: Entry[V]) -> None:
        self._entries.move_to_end(session)
        entry.used_at = time.monotonic()

    def _busy(self) -> SessionsBusyError:
        return SessionsBusyError(
            f"all {self.capacity} {self.holds} of device {self.device!r} are in steps of other "
            f"sessions: try again, or serve with more {option('max_sessions')}")

    def _make_room(self) -> bool:
        """Evict idle sessions, least recently used first, until one more fits; False when
        every session alive is held (or none may go)."""
        while self.alive >= self.capacity:
            idle = next((s for s, e in self._entries.items() if e.users == 0 and (
                self.evictable is None or self.evictable(e))), None)
            if idle is None:
                return False
            self._drop(idle)
            self.evicted += 1
        return True

    def _drop(self, session: str) -> None:
        """Unlist ``session``; a call still holding it keeps its value."""
        entry = self._entries.pop(session)
        entry.listed = False
        if entry.users:
            self._unlisted += 1
        else:
            self._gone(entry)

    def _release(self, entry: Entry[V]) -> None:
        with self._lock:
            entry.users -= 1
            if entry.users == 0:
                if not entry.listed:
                    self._unlisted -= 1
                    self._gone(entry)
                    return
                self._freed.notify_all()

    def _gone(self, entry: Entry[V]) -> None:
        """``entry`` is let go: its value's resource back (``let_go``), its room free."""
        if self.let_go is not None:
            self.let_go(entry.value)
        self._freed.notify_all()
