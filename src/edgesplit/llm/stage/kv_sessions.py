"""A stage's *KV sessions*: one per client session, the session's KV cache on this stage and
the tokens it holds (:class:`KVSession`); bounded (the least recently used session goes
first), each limited to the plan's max context, checked before anything is computed.

A step names its session, the position it continues from (the tokens the session's cache
already holds) and how many tokens it adds. Position 0 starts the session afresh (a new
prompt; an existing cache is dropped). A position below what the cache holds rewinds the
cache there first (the next turn of a conversation that shares only part of what was cached:
the client keeps the common prefix). A position past what the cache holds, or a session that
was evicted or never started, fails with a message that says to send the prompt again. A step
that would take the session past ``max_context`` fails before the cache is touched. A step
whose compute (or the rest of the chain) fails is rolled back to its position, so the session
holds what it held, or, for a rewinding step, what it held up to the position.

A session id is only a name, which two clients may pick alike; so a client also sends a secret
of its own (call metadata :data:`OWNER_KEY`), and a session made with one answers only steps
and ends that carry it (the stage keeps its digest, never the secret, and compares digests in
constant time); another client's step or end fails with SessionOwnerError, and so does its
attempt to open the id afresh: an id that exists is never joined.

``max_sessions`` bounds the KV caches alive, not only those listed: a session evicted (or ended,
or started afresh) while a step still runs on its cache keeps that cache until the step ends,
so a new session takes the room of an idle one only, and waits (up to ``wait_s``) while every
cache is in a step; past that it fails with SessionsBusyError.

The bound, the owners and the eviction are a :class:`~edgesplit.runtime.sessions.SessionTable`'s
(the table every server keeps its sessions in); what is a KV cache's own is here: positions,
the context limit, rewinding and rolling back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from edgesplit.errors import ContextLimitError, SessionError, option
from edgesplit.runtime.sessions import OWNER_KEY, SessionTable, owner_digest

__all__ = ["OWNER_KEY", "KVSession", "LLMSessions", "owner_digest"]


@dataclass
class KVSession:
    """One session's cache on one stage and the tokens it holds (``lock``: one step of the
    session at a time)."""

    cache: Any
    length: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class LLMSessions:
    """At most ``max_sessions`` sessions (KV caches alive) of at most ``max_context`` tokens
    each on ``device``, in a :class:`~edgesplit.runtime.sessions.SessionTable` (its owners,
    its bound and eviction); ``new_cache`` makes an empty KV cache."""

    def __init__(self, device: str, new_cache: Callable[[], Any], *, max_sessions: int,
                 max_context: int) -> None:
        if max_sessions < 1 or max_context < 1:
            raise SessionError(f"{option('max_sessions')} and the plan's max context must be "
                               f"at least 1, got {max_sessions} and {max_context}")
        self.device, self.new_cache = device, new_cache
        self.max_sessions, self.max_context = max_sessions, max_context
        self.table: SessionTable[KVSession] = SessionTable(max_sessions, device=device,
                                                              holds="KV caches",
                                                              let_go=_close)

    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, session: str) -> bool:
        return session in self.table

    @property
    def alive(self) -> int:
        """KV caches alive: the sessions listed, and dropped ones a step still uses."""
        return self.table.alive

    @property
    def evicted(self) -> int:
        """Sessions dropped to make room, since start."""
        return self.table.evicted

    def state(self, session: str) -> KVSession | None:
        """``session``'s state (None: not here), for a look: no owner asked."""
        return self.table.get(session)

    def length(self, session: str) -> int:
        """Tokens ``session``'s cache holds (0: unknown)."""
        state = self.table.get(session)
        return 0 if state is None else state.length

    def check(self, session: str, position: int, tokens: int) -> None:
        """SessionError / ContextLimitError unless a step of ``tokens`` at ``position`` fits."""
        if tokens < 1 or position < 0:
            raise SessionError(f"a step adds at least one token at a position >= 0, got "
                               f"{tokens} token(s) at {position}")
        if position + tokens > self.max_context:
            raise ContextLimitError(
                f"session {session!r} would hold {position + tokens} tokens, more than the "
                f"plan's max context of {self.max_context}: start a new session (a shorter "
                f"prompt or fewer new tokens), or plan with a larger "
                f"{option('max_context', flag='--max-context')}")
        if position == 0:
            return
        held = self.table.get(session)
        if held is None:
            raise SessionError(
                f"session {session!r} is not on device {self.device!r} (evicted to make room "
                f"for newer sessions, the server restarted, or it never started): send its "
                f"prompt again from position 0")
        if held.length < position:
            raise SessionError(
                f"session {session!r} holds {held.length} tokens on device {self.device!r}, "
                f"the step continues from {position}: send its prompt again from position 0")

    def check_owner(self, session: str, owner: str | None) -> None:
        """SessionOwnerError unless ``owner`` may use ``session``: a session answers only the
        owner it was made with (a digest of its client's secret), so two clients that pick
        one id never decode on each other's cache, and nobody else continues, restarts or
        ends it."""
        self.table.check_owner(session, owner)

    @contextmanager
    def step(self, session: str, position: int, tokens: int, owner: str | None = None, *,
             wait_s: float | None = 60.0) -> Iterator[KVSession]:
        """The session's state for one step of ``tokens`` at ``position`` (checked first);
        the tokens count once the block exits normally, an exception rolls the cache back.
        ``owner``: the caller's digest (:meth:`check_owner`); a new session takes it.
        ``wait_s``: how long a new session waits for a cache to come free (None: as long as
        it takes)."""
        self.check_owner(session, owner)
        self.check(session, position, tokens)
        with self.table.held(session, owner, lambda: KVSession(self.new_cache()),
                             fresh=position == 0, wait_s=wait_s) as state, state.lock:
            self.check(session, position, tokens)  # another step of the session came first
            if state.length > position:  # a rewind: keep the first ``position`` tokens
                _crop(state.cache, position)
                state.length = position
            try:
                yield state
            except BaseException:
                _crop(state.cache, position)
                raise
            state.length = position + tokens

    def end(self, session: str, owner: str | None = None) -> bool:
        """Forget ``session`` (its cache's memory is freed, once no step uses it); whether it
        was here. Only its owner may (:meth:`check_owner`)."""
        return self.table.end(session, owner)


def _close(state: KVSession) -> None:
    """A session let go: a cache that holds a row of a stage's pool gives it back now, before
    the table admits a session that will need it."""
    close = getattr(state.cache, "close", None)
    if close is not None:
        close()


def _crop(cache: Any, length: int) -> None:
    """Drop what a failed step appended: the cache holds ``length`` tokens again."""
    if cache is None:
        return
    if not hasattr(cache, "layers"):  # a preallocated cache (a row of the quantized stage's pool):
        cache.crop(length)  # what lies past its length is never read
        return
    # layer by layer: a stage's cache spans the model's depth, other stages' layers stay empty
    # (and transformers' crop takes the number of tokens to remove)
    for layer in cache.layers:
        extra = layer.get_seq_length() - length if layer.is_initialized else 0
        if extra > 0:
            layer.crop(-extra)
