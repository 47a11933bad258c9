"""What a training session keeps so that nothing is applied twice, nothing half
(:class:`TrainSession`), and what tells a request sent again from a new one.

Step, Sync and Undo carry the session's next sequence number. The server keeps its last reply:
the device re-sends a request whose reply was lost with the same number and gets that reply,
with nothing trained or merged again; a number out of step is refused with
FAILED_PRECONDITION (after the request's content is checked). A round the device cannot
finish after the server stepped is taken back with Undo, from the
:class:`~edgesplit.train.remote.replica.Snapshot` the session keeps.

Which session is open, and when another device may take the server, is the server's
(:class:`~edgesplit.train.remote.server.TrainHandler`, over a
:class:`~edgesplit.runtime.sessions.SessionTable` of one).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import grpc

from edgesplit.errors import option
from edgesplit.train.remote.replica import Snapshot
from edgesplit.transport import BadRequest

__all__ = ["SESSION_TIMEOUT_S", "TrainSession", "request_digest"]

log = logging.getLogger(__name__)

SESSION_TIMEOUT_S = 600.0  # idle time after which another device may take the server


def request_digest(method: str, request: Any) -> bytes:
    """What tells a re-sent request from another one with the same sequence number."""
    return hashlib.sha256(method.encode() + b"\0" +
                          request.SerializeToString(deterministic=True)).digest()


@dataclass
class TrainSession:
    """An open session of device ``peer`` and its last accepted state-changing request: its
    number, its digest and the reply (sent again to a repeat), and, after a Step, what takes
    it back."""

    id: str
    peer: str
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
