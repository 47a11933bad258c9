"""Star plans served: the sink's join, and the client that drives a star.

A star plan (:func:`edgesplit.plan.star_layout`: SplitNets' V sensors and one aggregator) runs
with one partition server (:func:`~edgesplit.runtime.server.partition_server`) per device. A
source gets its own model inputs from the client, runs its layers and forwards what it sends to
the sink, like a middle hop of a chain. The sink *joins*: the calls of one client request carry
one join key (call metadata ``edgesplit-join``) and one request id; the sink waits until every
tensor it receives has arrived for that pair, computes once, and answers every waiting call
with the model outputs, which each source relays to the client. :class:`StarClient` sends every
source its inputs concurrently under a fresh key and checks that their replies agree.

Bounds against broken or hostile callers: a join takes each of the sink's tensors once (an
unknown or repeated tensor fails its call with INVALID_ARGUMENT); it waits at most
``join_timeout_s`` or its caller's deadline, after which its calls fail with DEADLINE_EXCEEDED
naming the missing tensors and sources and it is dropped; at most ``max_joins`` wait at once,
holding at most as many joins' worth of parked bytes, and the table is shared fairly among the
hosts that open joins (:meth:`Join.share`; a part past a bound is refused RESOURCE_EXHAUSTED
before anything is parked: a flood cannot evict the joins that are waiting); a finished or
dropped key is remembered (a bounded number of them) so that it is never computed again. A
call that carries every source's tensors is a complete join: computed at once, never parked.

A mesh plan's aggregator (:mod:`edgesplit.runtime.mesh`) is such a sink, its branches the
sources; when devices follow it, the completing part's call forwards the result to them before
the join answers.

Workers: a waiting part is parked and holds none of the sink's ``max_workers``; the part that
completes a join takes one and computes, through the sink's compute part (its batcher):
complete joins waiting together run as one batch (a parked call still blocks a gRPC thread, or
its data-plane connection's, as the synchronous server has no other way to answer later, but
the sink has a thread for every part its table can park beyond its workers, so a parked part
never queues another). Parts arrive over gRPC (:meth:`Join.reply_pb`) or the data plane
(:meth:`Join.answer_frame`), checked and joined alike. A source holds its worker only while it
computes, not while the sink joins: held across the join, the sources' workers waited on each
other (a circular wait until the join timed out).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import torch

from edgesplit.errors import ConfigError, RemoteError, option
from edgesplit.hardware import Link
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime.calls import RETRYABLE
from edgesplit.runtime.client import (
    RequestResult,
    RuntimeClient,
    address_name,
    explain_failure,
)
from edgesplit.runtime.dataplane import DataPlane, Message, Part
from edgesplit.runtime.mesh import BranchFailed, Fanout
from edgesplit.runtime.outputs import infer_rows
from edgesplit.runtime.planned import JOIN_KEY, decode_planned, max_message_bytes
from edgesplit.runtime.program import PlanProgram
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.transport import (
    BadRequest,
    LoopbackChannel,
    TlsFiles,
    invalid,
)
from edgesplit.transport.auth import peer_host
from edgesplit.transport.frames import Frame
from edgesplit.transport.shaping import LinkShaper
from edgesplit.transport.slots import Slots

if TYPE_CHECKING:
    from edgesplit.runtime.compute import Compute
    from edgesplit.runtime.roles import Relay, StepWire

__all__ = ["JOIN_KEY", "Join", "StarClient", "check_addresses", "check_join_limits",
           "star_link"]

MAX_KEY_CHARS = 128  # a join key longer than this is refused (keys are held in memory)
POLL_S = 0.05  # how often a waiting call checks that its caller is still there


def star_link(program: PlanProgram, source: str) -> Link:
    """The link ``source`` sends to the sink over, as the plan prices it: on a shared medium
    (a bus) each source that sends gets its share of the bandwidth."""
    sink = str(program.sink)
    links = {frozenset((pl.src, pl.dst)): pl.link for pl in program.plan.links}
    link = links.get(frozenset((source, sink)))
    if link is None:
        raise ConfigError(f"the plan has no link between {source!r} and {sink!r}")
    if not link.shared:
        return link
    share = sum(1 for t in program.plan.transfers if t.tensors
                and (other := links.get(frozenset((t.src, t.dst)))) is not None
                and other.shared and other.name == link.name)
    down = link.down_bandwidth_mbps
    return link.model_copy(update={"bandwidth_mbps": link.bandwidth_mbps / max(share, 1),
                                   "down_bandwidth_mbps": down / max(share, 1) if down else None,
                                   "shared": False})


def check_addresses(program: PlanProgram, addresses: Mapping[str, Any]) -> None:
    """Refuse (ConfigError) a star's source addresses that miss a source or name another
    device."""
    if program.kind != "star":
        raise ConfigError(f"this plan is a chain: give the second device's address "
                          f"({option('address', flag='--server')} HOST:PORT), not sources")
    flag = option("addresses", flag="--source")
    unknown = sorted(set(addresses) - set(program.sources))
    if unknown:
        raise ConfigError(f"{unknown} are not sources of this star plan (its sink "
                          f"{program.sink!r} is reached through them); its sources are "
                          f"{', '.join(program.sources)}: give {flag} NAME=HOST:PORT for each")
    missing = [s for s in program.sources if s not in addresses]
    if missing:
        raise ConfigError(f"no address for source(s) {', '.join(missing)} of this star plan: "
                          f"give {flag} NAME=HOST:PORT for each of "
                          f"{', '.join(program.sources)}")


# ---- the sink's join ------------------------------------------------------------------------
def check_join_limits(timeout_s: float, max_joins: int) -> None:
    """Refuse (ConfigError) a join timeout or table size that joins nothing."""
    if timeout_s <= 0:
        raise ConfigError(f"{option('join_timeout_s')} must be positive, got {timeout_s}")
    if max_joins < 1:
        raise ConfigError(f"{option('max_joins')} must be at least 1, got {max_joins}")


@dataclass
class _Entry:
    """One client request being joined at the sink."""

    ident: tuple[str, int]  # (join key, request id)
    created: float  # time.monotonic()
    opener: str  # the host whose part opened it: charged for it
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    nbytes: int = 0  # bytes of the parked tensors
    done: threading.Event = field(default_factory=threading.Event)
    completed_at: float = 0.0  # time.perf_counter() when the last tensor arrived
    outputs: dict[str, bytes] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    error: tuple[grpc.StatusCode, str] | None = None


def _host(context: grpc.ServicerContext | None) -> str:
    """Who the caller is, for its share of the table: its host (``10.0.0.2``), alike over
    gRPC and the data plane. Not its connection: a caller opens as many of those as it likes
    (a quota per connection let a few channels fill the table); and nothing finer is
    authenticated (the sources share one token, and TLS does not identify clients)."""
    return "local" if context is None else peer_host(context.peer())


class Join:
    """A star sink's join table and its answers (the sink's handler part): see the module
    docstring. ``wire`` is the sink's step on the wire, ``compute`` computes a complete join,
    and ``relay`` (a mesh's aggregator followed by a chain) forwards its result.

    Invariant: a part waiting for the others is *parked* (its call blocks on the join's event)
    and holds none of the ``workers`` compute workers; the call bringing a join's last part
    takes one worker, computes once and wakes the others (a call carrying every tensor
    computes at once). The table holds at most ``max_joins`` joins and ``max_bytes`` parked
    bytes, and the joins a host opens at most its :meth:`share`; a part that would go past a
    bound is refused (RESOURCE_EXHAUSTED) before anything is parked. Only opening a join is
    charged: a part that adds to a join, or completes it, is never refused for a share.
    ``computed`` counts the joins computed, ``parked`` the calls waiting for other parts,
    ``busy`` the workers computing.

    What the shares guarantee: a host never opens more than half the table, however many
    connections it uses, and a host that starts to send always has room made for it (see
    :meth:`share`), so callers on other hosts, flooding or not, cannot take the sources'
    share; H hosts flooding at once leave each source's host ``max_joins // (H + S + 1)``, S
    the sources' hosts. A caller on the same host as a source shares that host's share: a
    flood from there can fill it, and then the requests whose *first* part comes from that
    source are refused (RESOURCE_EXHAUSTED) while the requests another source opens still
    complete. Keep a source's host (and the token) to the source alone where that matters."""

    def __init__(self, wire: StepWire, compute: Compute, relay: Relay | None, *,
                 timeout_s: float, max_joins: int, shape: bool = False, workers: int = 1
                 ) -> None:
        check_join_limits(timeout_s, max_joins)
        program = wire.program
        self.wire, self.compute, self.relay = wire, compute, relay
        self.timeout_s, self.max_joins = timeout_s, max_joins
        self.sink = wire.name
        self.source_of = {t: s for s in program.sources for t in program.step(s).sends}
        self.shapers = {s: LinkShaper(star_link(program, s), shape) for s in program.sources}
        full = sum(program.graph.tensors[t].elements * 4 for t in self.source_of)
        self.max_bytes = max_joins * full  # every join parked with all but nothing missing
        self.computed = self.parked = self.busy = 0
        self.parked_bytes = 0
        self._workers = Slots(workers)
        self._opened: dict[str, int] = {}  # joins pending per opening host
        self._pending: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        # what became of finished or dropped keys: a late or repeated call is told at once
        self._finished: OrderedDict[tuple[str, int], tuple[grpc.StatusCode, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pending(self) -> int:
        """Joins waiting for some of their sources."""
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """The server is stopping: every pending join's callers, and every later part, are
        answered UNAVAILABLE (their clients may retry on another sink)."""
        with self._lock:
            self._closed = True
            for entry in list(self._pending.values()):
                self._drop(entry)
                self._fail(entry, grpc.StatusCode.UNAVAILABLE, self._stopping())
        self._workers.close()

    def reply_pb(self, request: pb.Bundle, context: grpc.ServicerContext | None) -> pb.Bundle:
        """A part that came over gRPC: its join's answer, once the join is complete."""
        reply, source = self.handle(request, context)
        bundle = reply.to_pb()
        self.shapers[source].send(bundle.ByteSize(), "down")
        return bundle

    def answer_frame(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """A part that came over the data plane: the same checks, join and answer."""
        reply, source = self.handle(Message.from_frame(frame), context)
        answer = self.wire.reply_frame(reply)
        self.shapers[source].send(answer.nbytes(), "down")
        return answer

    def handle(self, request: pb.Bundle | Message, context: grpc.ServicerContext | None
               ) -> tuple[Message, str]:
        """Add this call's tensors to its join; once the join is complete, its answer and
        the source whose link it goes back over."""
        t0 = time.perf_counter()
        self.wire.check_plan(request)  # a foreign plan is named as such, as for chains
        key = self._key(context)
        names = self._names(request)
        values = self.wire.decode_tensors(request)
        decode_ms = (time.perf_counter() - t0) * 1e3
        arrived = time.perf_counter()
        source = self.source_of[names[0]]
        entry, complete = self._add((key, request.request_id), (source, _host(context)),
                                    names, values)
        if complete:
            self._compute(entry, request, context)
        else:
            self._park(entry, context)
        if entry.error is not None:
            raise BadRequest(*entry.error)
        serialize = f"{self.sink}.serialize_ms"
        timings = {**entry.timings, serialize: entry.timings.get(serialize, 0.0) + decode_ms,
                   f"{self.sink}.join_wait_ms": max(0.0, entry.completed_at - arrived) * 1e3}
        parts = [Part(name, entry.outputs[name]) for name in self.wire.step.returns]
        return Message(self.wire.plan_id, PLAN_VERSION, request.request_id, parts,
                       timings), source

    # ---- checks --------------------------------------------------------------------------
    def _key(self, context: grpc.ServicerContext | None) -> str:
        metadata = dict(context.invocation_metadata()) if context is not None else {}
        key = metadata.get(JOIN_KEY)
        if not isinstance(key, str) or not key:
            raise invalid(f"device {self.sink!r} is the sink of a star plan: it joins its "
                          f"sources' calls by the call metadata {JOIN_KEY!r}, which this "
                          "request lacks; send requests through the sources with StarClient "
                          "(`edgesplit run --source NAME=HOST:PORT ...`), or give every "
                          "source's call of one request the same key")
        if len(key) > MAX_KEY_CHARS:
            raise invalid(f"join key of {len(key)} characters; at most {MAX_KEY_CHARS}")
        return key

    def _names(self, request: pb.Bundle) -> list[str]:
        names = [t.name for t in request.tensors]
        expected = sorted(self.source_of)
        unknown = [n for n in names if n not in self.source_of]
        if not names or unknown:
            got = f"unknown tensor(s) {unknown}" if unknown else "no tensor"
            raise invalid(f"device {self.sink!r} joins tensors {expected} from its sources; "
                          f"got {got}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise invalid(f"tensor(s) {twice} appear twice in one request")
        return names

    def _stopping(self) -> str:
        return f"device {self.sink!r} is shutting down: send the request to another sink"

    # ---- the table -----------------------------------------------------------------------
    def _add(self, ident: tuple[str, int], opener: tuple[str, str], names: Sequence[str],
             values: dict[str, torch.Tensor]) -> tuple[_Entry, bool]:
        """Put ``values`` into the join ``ident``, opened (if it is new) by ``opener``, a
        (source, host); True when that completes it (the caller then computes it, outside the
        lock). Every refusal comes before anything changes."""
        nbytes = sum(v.element_size() * v.nelement() for v in values.values())
        with self._lock:
            entry = self._joinable(ident, names)
            held = entry.values if entry is not None else {}
            if len(held) + len(values) == len(self.source_of):  # no tensor twice: all there
                return self._completed(entry, ident, opener[1], values), True
            self._admit(entry, opener, nbytes)
            if entry is None:
                entry = self._pending[ident] = _Entry(ident, time.monotonic(), opener[1])
                self._opened[opener[1]] = self._opened.get(opener[1], 0) + 1
            entry.values.update(values)
            entry.nbytes += nbytes
            self.parked_bytes += nbytes
            return entry, False

    def _joinable(self, ident: tuple[str, int], names: Sequence[str]) -> _Entry | None:
        """The pending join ``ident`` (None: a new one), or BadRequest when this part cannot
        join it: the sink stops, the key is over, or a tensor came twice (the lock held)."""
        if self._closed:
            raise BadRequest(grpc.StatusCode.UNAVAILABLE, self._stopping())
        if ident in self._finished:
            code, why = self._finished[ident]
            raise BadRequest(code, f"tensor(s) {list(names)} arrived for join key "
                                   f"{ident[0]!r} (request {ident[1]}), which is over: {why}")
        entry = self._pending.get(ident)
        again = [n for n in names if entry is not None and n in entry.values]
        if again:
            raise invalid(f"tensor(s) {again} arrived twice for join key {ident[0]!r} "
                          f"(request {ident[1]}); each source sends its tensors once per "
                          "request")
        return entry

    def _completed(self, entry: _Entry | None, ident: tuple[str, int], host: str,
                   values: dict[str, torch.Tensor]) -> _Entry:
        """The join ``ident`` completed by ``values``, out of the table (the lock held). A
        call that brings every tensor itself never enters it: nothing to wait for."""
        if entry is None:
            entry = _Entry(ident, time.monotonic(), host)
        else:
            self._drop(entry)
        entry.values.update(values)
        entry.completed_at = time.perf_counter()
        self._remember(ident, (grpc.StatusCode.INVALID_ARGUMENT,
                               "it was complete and has been answered"))
        return entry

    def share(self, host: str) -> int:
        """How many joins ``host`` may hold open: ``max_joins // (H + 1)``, H the hosts that
        hold joins, ``host`` counted. Alone, a host may fill half the table; each host that
        joins in lowers the others' share, so the room it needs is left free or, at the
        latest, freed as the others' joins beyond their new share end (``join_timeout_s``)
        (the lock held)."""
        hosts = len(self._opened) + (host not in self._opened)
        return max(1, self.max_joins // (hosts + 1))

    def _admit(self, entry: _Entry | None, opener: tuple[str, str], nbytes: int) -> None:
        """Refuse (RESOURCE_EXHAUSTED) a part the table has no room to park (the lock held)."""
        source, host = opener
        held, share = self._opened.get(host, 0), self.share(host)
        if entry is None and len(self._pending) >= self.max_joins:
            why = f"{self.max_joins} requests are waiting for their sources already"
        elif entry is None and held >= share:
            why = (f"source {source} from {host} has {held} requests waiting for the other "
                   f"sources already, counted with every caller on {host} (a host may hold "
                   f"{share} of the {self.max_joins} while {len(self._opened)} host(s) hold "
                   "some)")
        elif self.parked_bytes + nbytes > self.max_bytes:
            why = f"{self.max_bytes} bytes are parked waiting for their sources already"
        else:
            return
        raise BadRequest(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"device {self.sink!r} refused this part: {why} (raise "
                         f"{option('max_joins')}, or check that every source reaches this "
                         "sink)")

    def _drop(self, entry: _Entry) -> None:
        """Take ``entry`` out of the table and its bounds (the lock held)."""
        del self._pending[entry.ident]
        self.parked_bytes -= entry.nbytes
        left = self._opened[entry.opener] - 1
        if left:
            self._opened[entry.opener] = left
        else:
            del self._opened[entry.opener]

    def _remember(self, ident: tuple[str, int], outcome: tuple[grpc.StatusCode, str]) -> None:
        self._finished[ident] = outcome
        while len(self._finished) > 4 * self.max_joins:
            self._finished.popitem(last=False)

    def _fail(self, entry: _Entry, code: grpc.StatusCode, message: str) -> None:
        """End a join taken out of the table (the lock held): its callers fail with ``code``."""
        entry.error = (code, message)
        entry.values = {}
        self._remember(entry.ident, entry.error)
        entry.done.set()

    def _expire(self, entry: _Entry, code: grpc.StatusCode) -> bool:
        """Drop ``entry`` if it still waits for sources (False: it completed meanwhile)."""
        with self._lock:
            if self._pending.get(entry.ident) is not entry:
                return False
            self._drop(entry)
            missing = [t for t in self.source_of if t not in entry.values]
            sources = sorted({self.source_of[t] for t in missing})
            if code == grpc.StatusCode.CANCELLED:
                why = "a caller gave up"
            else:
                why = (f"it waited {time.monotonic() - entry.created:.1f} s (the join timeout "
                       f"of {self.timeout_s:g} s, or less if the caller's deadline came first)")
            self._fail(entry, code,
                       f"device {self.sink!r} dropped join key {entry.ident[0]!r} (request "
                       f"{entry.ident[1]}): {why}; tensor(s) {missing} from "
                       f"{', '.join(sources)} never arrived (is every source's server up and "
                       "pointed at this sink?)")
            return True

    # ---- computing and waiting -----------------------------------------------------------
    def _compute(self, entry: _Entry, request: pb.Bundle | Message,
                 context: grpc.ServicerContext | None) -> None:
        """Compute a complete join on one of the workers (and, when the sink sends on, as a
        mesh's aggregator followed by a chain does, forward the result within the completing
        call's deadline), then wake its parked callers."""
        step = self.wire.step
        try:
            self._take_worker(context)
        except BadRequest as exc:
            entry.error = (exc.code, str(exc))
            entry.values = {}
            entry.done.set()
            return
        try:
            timings: dict[str, float] = {}  # the server's batcher batches complete joins
            values = self.compute.now(dict(entry.values), context, timings)
            t1 = time.perf_counter()
            later: dict[str, Any] = {}
            if self.relay is not None:
                later = self.relay.downstream(request, values, context, timings)
                t1 = time.perf_counter()
            entry.outputs = {name: bytes(later[name]) if name in later else
                             encode_tensor(values[name], 32) for name in step.returns}
            serialize = f"{self.sink}.serialize_ms"
            timings[serialize] = timings.get(serialize, 0.0) + \
                (time.perf_counter() - t1) * 1e3
            entry.timings = timings
            with self._lock:
                self.computed += 1
        except BadRequest as exc:  # the chain after it gave up (a deadline, a cancellation)
            entry.error = (exc.code, str(exc))
        except Exception as exc:  # every caller of the join gets the failure
            entry.error = (grpc.StatusCode.INTERNAL, self.wire.failure(exc))
        finally:
            with self._lock:
                self.busy -= 1
            self._workers.give()
            entry.values = {}
            entry.done.set()

    def _take_worker(self, context: grpc.ServicerContext | None) -> None:
        """One of the ``workers`` (counted in ``busy``), or BadRequest: UNAVAILABLE when the
        server stops, DEADLINE_EXCEEDED when the caller's deadline passes first."""
        remaining = context.time_remaining() if context is not None else None
        if not self._workers.take(None if remaining is None else max(0.0, remaining)):
            if self._closed:
                raise BadRequest(grpc.StatusCode.UNAVAILABLE, self._stopping())
            raise BadRequest(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"device {self.sink!r} completed this join, but the caller's "
                             f"deadline passed while its {option('max_workers')} workers were "
                             "busy")
        with self._lock:
            self.busy += 1

    def _park(self, entry: _Entry, context: grpc.ServicerContext | None) -> None:
        """Wait, holding no worker, until the join is answered or dropped, or this call's
        time is up."""
        with self._lock:
            self.parked += 1
        try:
            self._wait(entry, context)
        finally:
            with self._lock:
                self.parked -= 1

    def _wait(self, entry: _Entry, context: grpc.ServicerContext | None) -> None:
        while not entry.done.wait(max(0.0, min(self._left(entry, context), POLL_S))):
            if self._left(entry, context) <= 0:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
            elif context is not None and not context.is_active():
                code = grpc.StatusCode.CANCELLED
            else:
                continue
            if not self._expire(entry, code):
                self._wait_computed(entry, context)
            return

    def _left(self, entry: _Entry, context: grpc.ServicerContext | None) -> float:
        """Seconds this call may still wait: the join timeout or the caller's deadline."""
        left = entry.created + self.timeout_s - time.monotonic()
        remaining = context.time_remaining() if context is not None else None
        return left if remaining is None else min(left, remaining)

    def _wait_computed(self, entry: _Entry, context: grpc.ServicerContext | None) -> None:
        """The join completed while this call gave up waiting: wait for its result within
        this call's own deadline only."""
        remaining = context.time_remaining() if context is not None else None
        if not entry.done.wait(None if remaining is None else max(0.0, remaining)):
            raise BadRequest(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"device {self.sink!r} completed join key {entry.ident[0]!r}, but "
                             "this call's deadline passed before its result")


# ---- client ---------------------------------------------------------------------------------
class StarClient(RuntimeClient):
    """Drives a star plan: every source gets its own model inputs, concurrently, under one
    join key per request (a :class:`~edgesplit.runtime.mesh.Fanout` over the sources: each
    over its data plane where it offers one, as ``data_plane`` says, else gRPC); the sink
    computes once and every source relays its answer, which must agree. ``addresses``: source
    device -> ``HOST:PORT`` or a server's ``loopback_channel()``. ``shape`` is accepted as for
    :class:`ChainClient`; a source's own inputs cross no planned link (the sources shape
    theirs to the sink). ``retries``: a request that fails UNAVAILABLE or DEADLINE_EXCEEDED is
    sent again, under a new key."""

    def __init__(self, program: PlanProgram, addresses: Mapping[str, str | LoopbackChannel], *,
                 token: str | None = None, tls: TlsFiles | None = None, shape: bool = False,
                 timeout_s: float = 60.0, retries: int = 0, retry_backoff_s: float = 0.2,
                 session: str | None = None, data_plane: DataPlane = "auto") -> None:
        check_addresses(program, addresses)
        super().__init__(program.plan_id, token, timeout_s=timeout_s, retries=retries,
                         retry_backoff_s=retry_backoff_s, session=session)
        self.program = program
        limit = max_message_bytes(program)
        self._sources = Fanout(program, {s: addresses[s] for s in program.sources}, limit, tls,
                               data_plane)
        self.addresses = {s: address_name(addresses[s]) for s in program.sources}

    def close(self) -> None:
        self._sources.close()

    @property
    def data_plane(self) -> str:
        """How each source is called now ("sensor0: tcp HOST:PORT, ..." or "...: grpc")."""
        return self._sources.data_plane

    def describe(self, source: str) -> pb.Description:
        """What ``source`` serves (retried as requests are, while it is not up yet)."""
        try:
            return self._attempts(self._sources.hops[source].describe)
        except grpc.RpcError as exc:
            raise RemoteError(self._explain(source, exc)) from None

    def _described(self) -> Iterator[tuple[str, pb.Description]]:
        """Every source, asked in turn."""
        for source in self.program.sources:
            yield source, self.describe(source)

    def _plan_mismatch(self, where: str, described: pb.Description) -> str:
        return (f"source {where} ({self.addresses[where]}) refused the request: "
                f"FAILED_PRECONDITION: plan mismatch: it runs plan {described.plan_id} "
                f"(version {described.plan_version}), this client {self.program.plan_id} "
                f"(version {PLAN_VERSION}); start every side from the same plan file")

    def request(self, inputs: Sequence[torch.Tensor] | None = None) -> RequestResult:
        self._ensure_plan()
        values = self.program.input_values(inputs)
        request_id = self.next_request_id()
        try:  # each attempt under a new join key: the sink may still hold the last one's
            return self._retried(lambda attempt: self._request(values, request_id),
                                 lambda exc: isinstance(exc, _Failed) and exc.code in RETRYABLE)
        except _Failed as failed:
            raise RemoteError(failed.message) from None

    def infer(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Every row of ``inputs`` through the star, one request per batch in order; the
        model's outputs, rows in order (as :meth:`ChainClient.infer`)."""
        return infer_rows(self.request, self.program, inputs)

    def _request(self, values: Mapping[str, torch.Tensor], request_id: int) -> RequestResult:
        start = time.perf_counter()
        names = dict.fromkeys(n for s in self.program.sources
                              for n in self.program.step(s).receives)
        message = Message(self.program.plan_id, PLAN_VERSION, request_id,  # inputs as they are
                          [Part(name, encode_tensor(values[name], 32)) for name in names])
        serialize_ms = (time.perf_counter() - start) * 1e3
        try:
            reply = self._sources.run(message, self.timeout_s, self.metadata)
        except BranchFailed as exc:
            raise _Failed(exc.code(), self._explain(exc.branch, exc)) from None
        t1 = time.perf_counter()
        outputs = self._outputs(reply)
        serialize_ms += (time.perf_counter() - t1) * 1e3
        total = (time.perf_counter() - start) * 1e3
        return RequestResult(request_id, outputs,
                             *self._breakdown(reply.timings_ms, serialize_ms, total))

    def _outputs(self, reply: Message) -> tuple[torch.Tensor, ...]:
        """The outputs of the reply every source relayed (the fan-out checked that they
        agree), once it holds the plan's outputs."""
        expected = sorted(self.program.outputs)
        data = {t.name: t.data for t in reply.tensors}
        if sorted(data) != expected or len(data) != len(reply.tensors):
            raise RemoteError(f"the sources answered with tensors "
                              f"{[t.name for t in reply.tensors]}, the plan expects {expected}")
        try:
            return tuple(decode_planned(self.program, t, data[t]) for t in self.program.outputs)
        except Exception as exc:
            raise RemoteError(f"the sources answered with a bad tensor: {exc}") from None

    def _breakdown(self, hops: Mapping[str, float], serialize_ms: float, total: float
                   ) -> tuple[dict[str, float], dict[str, float]]:
        """``edge``: the slowest source's compute; ``remote``: the sink's; ``serialize``: here,
        the slowest source's and the sink's; ``transfer``: the rest. Hops: what the servers
        reported, a key several replies carry (the sink's) at its largest."""
        sources, sink = self.program.sources, self.program.sink
        edge = max(hops.get(f"{s}.compute_ms", 0.0) for s in sources)
        remote = hops.get(f"{sink}.compute_ms", 0.0)
        serialize_ms += max(hops.get(f"{s}.serialize_ms", 0.0) for s in sources) + \
            hops.get(f"{sink}.serialize_ms", 0.0)
        return {"edge": edge, "serialize": serialize_ms, "remote": remote,
                "transfer": max(0.0, total - edge - serialize_ms - remote), "total": total}, \
            dict(hops)

    def _explain(self, source: str, exc: grpc.RpcError) -> str:
        code, details, address = exc.code(), exc.details() or "", self.addresses[source]
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and details.startswith("next hop after"):
            # the sink timed the join out: its message names the missing sources
            return f"source {source} ({address}) is up, but the sink did not answer: {details}"
        return f"source {source}: {explain_failure(code, details, address)}"


class _Failed(Exception):
    """A request's first failed call: its status and the sentence explaining it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message
