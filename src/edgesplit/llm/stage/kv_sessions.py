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
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from edgesplit.errors import (
    ContextLimitError,
    SessionError,
    SessionOwnerError,
    SessionsBusyError,
    option,
)

__all__ = ["OWNER_KEY", "KVSession", "LLMSessions", "owner_digest"]

OWNER_KEY = "edgesplit-session-key"  # call metadata: the client's secret for its sessions


def owner_digest(secret: str | None) -> str | None:
    """What a stage keeps of a client's secret (None without one)."""
    return None if not secret else hashlib.sha256(secret.encode()).hexdigest()


def _same_owner(held: str | None, owner: str | None) -> bool:
    """Whether ``owner`` is the digest ``held`` (None: a session made without a secret, which
    only a caller without one matches), in time independent of where they differ."""
    if held is None or owner is None:
        return held is owner
    return hmac.compare_digest(held.encode(), owner.encode())


@dataclass
class KVSession:
    """One session's KV cache on one stage and the tokens it holds. ``users``: the steps holding
    it now; ``listed``: False once evicted, ended or replaced (its cache lives while used)."""

    cache: Any
    length: int = 0
    lock: threading.Lock | None = None
    owner: str | None = None  # a digest of its creator's secret (None: made without one)
    users: int = 0
    listed: bool = True

    def __post_init__(self) -> None:
        self.lock = threading.Lock()


class LLMSessions:
    """A stage's KV sessions: at most ``max_sessions`` (KV caches alive) of at most
    ``max_context`` tokens each on ``device``; ``new_cache`` makes an empty KV cache."""

    def __init__(self, device: str, new_cache: Callable[[], Any], *, max_sessions: int,
                 max_context: int) -> None:
        if max_sessions < 1 or max_context < 1:
            raise SessionError(f"{option('max_sessions')} and the plan's max context must be "
                               f"at least 1, got {max_sessions} and {max_context}")
        self.device, self.new_cache = device, new_cache
        self.max_sessions, self.max_context = max_sessions, max_context
        self._sessions: OrderedDict[str, KVSession] = OrderedDict()
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a cache became idle or was dropped
        self._unlisted = 0  # caches of dropped sessions that a step still uses
        self.evicted = 0  # sessions dropped to make room, since start

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session: str) -> bool:
        return session in self._sessions

    @property
    def alive(self) -> int:
        """KV caches alive: the sessions listed, and dropped ones a step still uses."""
        return len(self._sessions) + self._unlisted

    def length(self, session: str) -> int:
        """Tokens ``session``'s cache holds (0: unknown)."""
        state = self._sessions.get(session)
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
        held = self._sessions.get(session)
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
        held = self._sessions.get(session)
        if held is not None and not _same_owner(held.owner, owner):
            raise SessionOwnerError(f"session {session!r} on device {self.device!r} belongs "
                                    "to another client (another session secret): use a "
                                    "session id of your own")

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
        state = self._take(session, fresh=position == 0, owner=owner, wait_s=wait_s)
        try:
            assert state.lock is not None
            with state.lock:
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
        finally:
            self._release(state)

    def _take(self, session: str, *, fresh: bool, owner: str | None,
              wait_s: float | None) -> KVSession:
        """The session's state, held by one more step; a fresh one takes an idle session's
        room, waiting while every cache alive is in a step."""
        with self._lock:
            self.check_owner(session, owner)  # again, under the lock: it may have changed
            state = self._sessions.get(session)
            if state is not None and not fresh:
                self._sessions.move_to_end(session)
                state.users += 1
                return state
            if state is not None:  # started afresh: the old cache goes (once idle)
                self._drop(session)
            if not self._freed.wait_for(self._make_room, wait_s):
                raise SessionsBusyError(
                    f"all {self.max_sessions} KV caches of device {self.device!r} are in "
                    f"steps of other sessions: try again, or serve with more "
                    f"{option('max_sessions')}")
            state = KVSession(self.new_cache(), owner=owner, users=1)
            self._sessions[session] = state
            return state

    def _make_room(self) -> bool:
        """Evict idle sessions, least recently used first, until one more cache fits; False
        when every cache alive is in a step (under the lock)."""
        while self.alive >= self.max_sessions:
            idle = next((s for s, st in self._sessions.items() if st.users == 0), None)
            if idle is None:
                return False
            self._drop(idle)
            self.evicted += 1
        return True

    def _drop(self, session: str) -> None:
        """Unlist ``session`` (under the lock); a step still using its cache keeps it."""
        state = self._sessions.pop(session)
        state.listed = False
        if state.users:
            self._unlisted += 1
        else:
            self._freed.notify_all()

    def _release(self, state: KVSession) -> None:
        with self._lock:
            state.users -= 1
            if state.users == 0:
                if not state.listed:
                    self._unlisted -= 1
                self._freed.notify_all()

    def end(self, session: str, owner: str | None = None) -> bool:
        """Forget ``session`` (its cache's memory is freed, once no step uses it); whether it
        was here. Only its owner may (:meth:`check_owner`)."""
        with self._lock:
            self.check_owner(session, owner)
            if session not in self._sessions:
                return False
            self._drop(session)
            return True


def _crop(cache: Any, length: int) -> None:
    """Drop what a failed step appended: the cache holds ``length`` tokens again."""
    if cache is None:
        return
    # layer by layer: a stage's cache spans the model's depth, other stages' layers stay empty
    # (and transformers' crop takes the number of tokens to remove)
    for layer in cache.layers:
        extra = layer.get_seq_length() - length if layer.is_initialized else 0
        if extra > 0:
            layer.crop(-extra)
