"""The training server's sessions: which device trains, and what tells a request sent again
from a new one.

**One session at a time.** The server trains one model for one device at a time. ``Hello``
starts a session from the initial model and returns its id, which every later request
carries; a request with another id fails with FAILED_PRECONDITION (the message says why:
closed, taken over, or unknown). While a session is open, another ``Hello`` is refused, unless
it sets ``take_over`` (the same device restarting after a crash: its half of the model is lost,
so it starts over) or the open session has been idle for ``session_timeout_s``. A device that
only lost the connection keeps its session and goes on. Closing ends the session.

**Nothing is applied twice, nothing half.** Step, Sync and Undo carry the session's next
sequence number. The server keeps its last reply (:class:`TrainSession`): the device re-sends
a request whose reply was lost with the same number and gets that reply, with nothing trained
or merged again; a number out of step is refused with FAILED_PRECONDITION (after the request's
content is checked). A round the device cannot finish after the server stepped is taken back
with Undo, from the :class:`~edgesplit.train.remote.replica.Snapshot` the session keeps.

:class:`TrainSessions` is the server's whole view of its sessions (start, require, close), so
that another session store can take its place.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import grpc

from edgesplit.errors import option
from edgesplit.train.remote.replica import Snapshot
from edgesplit.transport import BadRequest

__all__ = ["SESSION_TIMEOUT_S", "TrainSession", "TrainSessions", "request_digest"]

log = logging.getLogger(__name__)

SESSION_TIMEOUT_S = 600.0
_ENDED_KEPT = 32  # ended sessions remembered, to tell their devices why


def request_digest(method: str, request: Any) -> bytes:
    """What tells a re-sent request from another one with the same sequence number."""
    return hashlib.sha256(method.encode() + b"\0" +
                          request.SerializeToString(deterministic=True)).digest()


@dataclass
class TrainSession:
    """An open session and its last accepted state-changing request: its number, its
    digest and the reply (sent again to a repeat), and, after a Step, what takes it back."""

    id: str
    peer: str
    last_seen: float  # time.monotonic() of its last request
    seq: int = 0
    digest: bytes = b""
    reply: Any = None
    undo: Snapshot | None = None

    def repeat(self, method: str, seq: int, digest: bytes) -> Any:
        """The first reply if this is the last accepted request sent again, else None; a
        reused number with other content is refused (the device lost track)."""
        if seq == 0 or seq != self.seq:
            return None
        if digest != self.digest:
            raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{method} numbered {seq} reuses the number of an earlier, "
                             "different request that the server already applied (its reply "
                             "was lost and the device went on without it): device and server "
                             "are out of step; start a new session "
                             f"({option('take_over', True)}; the session's training is lost)")
        log.info("training session %s: %s %d sent again, answered from the first reply",
                 self.id[:8], method, seq)
        return self.reply

    def check_next(self, method: str, seq: int) -> None:
        """Refuse a number other than the next one: requests were lost or reordered."""
        if seq != self.seq + 1:
            raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{method} numbered {seq}, but the server's last accepted request "
                             f"was {self.seq}, so it expects {self.seq + 1} (or {self.seq} sent "
                             "again): device and server are out of step; start a new session "
                             f"({option('take_over', True)}; the session's training is lost)")

    def accept(self, seq: int, digest: bytes, reply: Any, undo: Snapshot | None = None
               ) -> None:
        self.seq, self.digest, self.reply, self.undo = seq, digest, reply, undo


class TrainSessions:
    """The open training session (at most one) and why the last ones ended. It takes no lock:
    the server calls it under the lock that also guards the model, since a request changes
    both together."""

    def __init__(self, timeout_s: float = SESSION_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.current: TrainSession | None = None
        self._ended: OrderedDict[str, str] = OrderedDict()  # session id -> why it ended

    def start(self, peer: str, take_over: bool) -> TrainSession:
        """A new session for ``peer``, ending the open one if ``take_over`` or if it has been
        idle for ``timeout_s``; refused (FAILED_PRECONDITION) otherwise."""
        now, current = time.monotonic(), self.current
        if current is not None:
            idle = now - current.last_seen
            if not take_over and idle < self.timeout_s:
                raise BadRequest(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"the server is training another session (device {current.peer}, last "
                    f"request {idle:.0f} s ago; sessions expire after "
                    f"{self.timeout_s:g} s idle): wait for it to finish, or, if it "
                    "is yours and that device restarted, take it over "
                    f"({option('take_over', True)}; the session's training is lost)")
            self._end(current, f"taken over by device {peer}" if take_over else
                      f"expired after {idle:.0f} s idle and was taken by device {peer}")
        self.current = TrainSession(secrets.token_hex(16), peer, now)
        return self.current

    def require(self, session_id: str) -> TrainSession:
        """The open session, if the request names it (and now its last request), else refused
        with why."""
        current = self.current
        if current is not None and session_id == current.id:
            current.last_seen = time.monotonic()
            return current
        if not session_id:
            why = "the request names no training session: the device must call Hello first"
        elif session_id in self._ended:
            why = (f"training session {session_id[:8]} has ended ({self._ended[session_id]}); "
                   "start a new session (its training is lost)")
        else:
            why = (f"unknown training session {session_id[:8]} (did the server restart?); "
                   "start a new session")
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION, why)

    def close(self, session_id: str) -> bool:
        """End the session ``session_id`` names, if it is the open one (closing twice is
        fine); whether it was."""
        current = self.current
        if current is None or session_id != current.id:
            return False
        self._end(current, "closed by its device")
        return True

    def _end(self, session: TrainSession, why: str) -> None:
        self._ended[session.id] = why
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        if self.current is session:
            self.current = None
        log.info("training session %s ended: %s", session.id[:8], why)
