"""Mesh plans served: the root's broadcast to the branch devices.

A mesh plan (:func:`edgesplit.plan.mesh_layout`, JMSNAS Fig. 2b) runs with one
:func:`~edgesplit.runtime.server.partition_server` per device after the first, as a chain
does, except around its parallel part: the root's next hop is a :class:`Fanout`, which sends
each branch device the tensors it receives, all at once and under one fresh join key (call
metadata ``edgesplit-join``); each branch computes and forwards to the aggregator like a star's
source, and the aggregator joins the branches' parts with the star's
:class:`~edgesplit.runtime.star.Join` (a waiting part is parked and holds no worker; the last
part computes, then the aggregator forwards to the chain after it, if any). Every branch relays
the aggregator's answer; the fan-out checks that they agree and answers its caller once.

Failures: the first branch call to fail (an error, or its deadline) cancels the others, whose
cancellation reaches the aggregator (a parked part whose caller left is dropped), and is
reported to the root's caller with its status. A late part of a request given up is refused by
the aggregator (the key is over), so nothing computes for a caller that left.
"""

from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from edgesplit.errors import ConfigError, RemoteError, option
from edgesplit.runtime.dataplane import DataPlane, Hangup, Hop, Message, Metadata, Part
from edgesplit.runtime.planned import JOIN_KEY
from edgesplit.runtime.program import PlanProgram
from edgesplit.transport import LoopbackChannel, LoopbackError, TlsFiles
from edgesplit.transport.shaping import LinkShaper

__all__ = ["BranchFailed", "Fanout", "check_branches"]

Address = str | LoopbackChannel
POLL_S = 0.05  # how often the root checks that its data-plane caller is still there


def check_branches(program: PlanProgram, addresses: Mapping[str, Any]) -> None:
    """Refuse (ConfigError) branch addresses that miss a branch or name another device."""
    flag = option("next_address", flag="--next")
    unknown = sorted(set(addresses) - set(program.sources))
    missing = [b for b in program.sources if b not in addresses]
    if unknown or missing:
        raise ConfigError(f"the root {program.root!r} of this mesh plan sends to its branch "
                          f"devices {', '.join(program.sources)}: give {flag} NAME=HOST:PORT "
                          f"for each of them (unknown: {unknown or 'none'}, missing: "
                          f"{missing or 'none'})")


class BranchFailed(LoopbackError):
    """The first branch call that failed, as its own ``grpc.RpcError`` read (``code()``,
    ``details()``), naming its ``branch``."""

    def __init__(self, branch: str, exc: grpc.RpcError) -> None:
        super().__init__(exc.code(), exc.details() or "")
        self.branch = branch


class _Group:
    """Stands for the root's caller towards its branch calls (``Hop.run``'s ``context``):
    collects their gRPC cancellations, and its :class:`Hangup` (``connection``, which their
    data-plane calls watch) hangs up, when one of them fails or the caller's call ends.
    ``users``: the calls and the root that use it; the last to :meth:`leave` closes it."""

    def __init__(self, context: Any, users: int) -> None:
        self._hangup = Hangup()
        self.connection = self._hangup.watched
        self._callbacks: list[Callable[[], Any]] = [self._hangup.cancel]
        self._cancelled = False
        self._users = users
        self._lock = threading.Lock()
        if context is not None and not context.add_callback(self.cancel):
            self.cancel()  # the caller's call ended already

    def add_callback(self, callback: Callable[[], Any]) -> bool:
        with self._lock:
            now = self._cancelled
            if not now:
                self._callbacks.append(callback)
        if now:
            callback()
        return True

    def cancel(self) -> None:
        with self._lock:
            self._cancelled, callbacks, self._callbacks = True, self._callbacks, []
        for callback in callbacks:
            callback()

    def leave(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self._hangup.close()


class Fanout:
    """The root's next hop: ``run`` sends every branch its share of ``message`` concurrently
    (each over its :class:`Hop`: the data plane where the branch offers one, else gRPC), under
    one fresh join key, and answers with the one reply they all relay (timings: each key at its
    largest). Raises the first failed call's ``grpc.RpcError`` (as :class:`BranchFailed`)
    after cancelling the others. A star's client sends to its sources through one.
    Has :class:`Hop`'s interface (``run``, ``describe``, ``wire_size``, ``close``). ``shape``:
    each branch's share is delayed as the plan's link from the root to it would (each link
    its own, side by side)."""

    def __init__(self, program: PlanProgram, addresses: Mapping[str, Address], limit: int,
                 tls: TlsFiles | None, mode: DataPlane = "auto", shape: bool = False) -> None:
        check_branches(program, addresses)
        self.program = program
        self.hops = {b: Hop(addresses[b], limit, tls, mode) for b in program.sources}
        links = {frozenset((pl.src, pl.dst)): pl.link for pl in program.plan.links}
        self.shapers = {b: LinkShaper(links.get(frozenset((str(program.root), b))), shape)
                        for b in program.sources}
        self.shares = {b: program.step(b).receives for b in program.sources}
        self.address = ", ".join(f"{b}={hop.address}" for b, hop in self.hops.items())
        self.frames = None  # messages are cut per branch: no one frame to send from memory
        self._root_key = secrets.token_hex(8)  # join keys: this root's id + a counter
        self._count = iter(range(1, 1 << 62))
        self._lock = threading.Lock()

    @property
    def data_plane(self) -> str:
        return ", ".join(f"{b}: {hop.data_plane}" for b, hop in self.hops.items())

    def close(self) -> None:
        for hop in self.hops.values():
            hop.close()

    def describe(self, timeout: float | None, metadata: Metadata) -> Any:
        """Every branch's Description (the first one's is returned; a branch serving another
        plan is reported by the plan check of the calls)."""
        described = [hop.describe(timeout, metadata) for hop in self.hops.values()]
        return described[0]

    def wire_size(self, message: Message) -> int:
        return sum(self.hops[b].wire_size(self._share(message, b)) for b in self.hops)

    def _share(self, message: Message, branch: str) -> Message:
        parts = {p.name: p for p in message.tensors}
        return Message(message.plan_id, message.plan_version, message.request_id,
                       [parts[name] for name in self.shares[branch] if name in parts])

    def run(self, message: Message, timeout: float | None, metadata: Metadata,
            context: Any = None, read: Callable[[Message], Any] = lambda m: m,
            read_frame: Callable[[Any], Any] | None = None) -> Any:
        """``read`` of the branches' common reply to ``message`` (see the class)."""
        with self._lock:
            key = f"{self._root_key}-{next(self._count)}"
        metadata = [*((k, v) for k, v in metadata if k != JOIN_KEY), (JOIN_KEY, key)]
        group = _Group(context, len(self.hops) + 1)
        finished: queue.SimpleQueue[tuple[str, Message | BaseException]] = queue.SimpleQueue()
        for branch, hop in self.hops.items():
            share = self._share(message, branch)
            threading.Thread(target=self._call, daemon=True, name=f"edgesplit-mesh-{branch}",
                             args=(branch, hop, share, timeout, metadata, group, finished,
                                   self.shapers[branch])).start()
        try:
            replies = self._replies(finished, group, context)
        finally:
            group.leave()
        return read(self._agree(replies, message.request_id))

    def _replies(self, finished: queue.SimpleQueue, group: _Group, context: Any
                 ) -> dict[str, Message]:
        """Every branch's reply; the first failure, or the root's data-plane caller hanging
        up (its connection is watched here), cancels the other calls and is raised."""
        replies: dict[str, Message] = {}
        while len(replies) < len(self.hops):
            try:
                branch, got = finished.get(timeout=POLL_S)
            except queue.Empty:
                if getattr(context, "connection", None) is None or context.is_active():
                    continue
                group.cancel()
                raise LoopbackError(grpc.StatusCode.CANCELLED, "the caller hung up") from None
            if isinstance(got, BaseException):
                # the other branches' calls end, and their parts at the join (a root server's
                # caller ending cancels them too; a client root has no caller but this)
                group.cancel()
                if isinstance(got, grpc.RpcError):
                    raise BranchFailed(branch, got) from None
                raise got
            replies[branch] = got
        return replies

    @staticmethod
    def _call(branch: str, hop: Hop, share: Message, timeout: float | None,
              metadata: Metadata, group: _Group, finished: queue.SimpleQueue,
              shaper: LinkShaper) -> None:
        try:
            if shaper.enabled:
                shaper.send(hop.wire_size(share), "up")
            finished.put((branch, hop.run(share, timeout, metadata, group)))
        except BaseException as exc:  # the caller raises the first (a sibling's: cancelled)
            finished.put((branch, exc))
        finally:
            group.leave()

    def _agree(self, replies: Mapping[str, Message], request_id: int) -> Message:
        """The one reply every branch relayed (they all relay the aggregator's answer)."""
        first: tuple[str, Message] | None = None
        for branch, reply in replies.items():
            where = f"branch {branch} ({self.hops[branch].address})"
            if reply.request_id != request_id:
                raise RemoteError(f"{where} answered request {reply.request_id} for request "
                                  f"{request_id}")
            if first is None:
                first = (branch, reply)
            elif [(p.name, bytes(p.data)) for p in reply.tensors] != \
                    [(p.name, bytes(p.data)) for p in first[1].tensors]:
                raise RemoteError(f"branches {first[0]} and {branch} relayed different outputs "
                                  f"for request {request_id}: the aggregator mixed two requests")
        assert first is not None  # a mesh has branches
        timings: dict[str, float] = {}
        for reply in replies.values():
            for k, v in reply.timings_ms.items():
                timings[k] = max(v, timings.get(k, v))
        out = first[1]
        return Message(out.plan_id, out.plan_version, out.request_id,
                       [Part(p.name, p.data) for p in out.tensors], timings)
