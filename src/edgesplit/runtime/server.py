"""The server of split inference, one per device after the first: :func:`partition_server`
reads the plan and the device's place in it and assembles a
:class:`~edgesplit.runtime.shell.ServingShell` around a :class:`PartitionHandler` made of
parts, each chosen once. The client that runs device 0 and drives the chain is in
:mod:`edgesplit.runtime.client`.

The parts: the step on the wire (:class:`~edgesplit.runtime.roles.StepWire`), its compute
(:mod:`edgesplit.runtime.compute`: here, batched where the partition allows, or a Ray Serve
deployment), and how a request is answered: a chain device's
:class:`~edgesplit.runtime.roles.Chain` with a :class:`~edgesplit.runtime.roles.Relay` to the
next device (a middle hop, a star's source, a mesh's branch; a mesh's root relays to a
:class:`~edgesplit.runtime.mesh.Fanout` over its branches) or as a
:class:`~edgesplit.runtime.roles.LastHop` with its
:class:`~edgesplit.runtime.fastpath.FastPath`; a star's sink (a mesh's aggregator) through its
:class:`~edgesplit.runtime.star.Join`.

The service (``proto/edgesplit_runtime.proto``) carries wire-format tensor messages. Every
request names its plan (``plan_id`` and schema version) so both ends provably run the same
plan; a bearer token (metadata ``authorization: Bearer ...``) and TLS are optional. A request
that is malformed (unknown or missing tensors, wrong shape or dtype, corrupt bytes) fails alone
with INVALID_ARGUMENT and a message naming the problem; the server keeps serving others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from edgesplit.errors import ConfigError, option
from edgesplit.hardware import Link
from edgesplit.runtime.compute import (
    DEFAULT_MAX_BATCH,
    MAX_SESSIONS,
    Compute,
    EngineCompute,
    LocalCompute,
    batcher_for,
)
from edgesplit.runtime.fastpath import FastPath
from edgesplit.runtime.options import ServeOptions
from edgesplit.runtime.planned import (
    JOIN_KEY,
    SESSION_KEY,
    link_before,
    link_between,
    plan_device,
)
from edgesplit.runtime.program import DeviceStep, PlanProgram
from edgesplit.runtime.roles import Chain, LastHop, Relay, StepWire
from edgesplit.runtime.sessions import OWNER_KEY
from edgesplit.runtime.shell import (
    NextHop,
    ServingShell,
    WorkerSlots,
    check_next,
    check_served,
    open_hop,
)
from edgesplit.runtime.star import Join, check_join_limits
from edgesplit.transport import BadRequest, LinkShaper, LoopbackChannel
from edgesplit.transport.slots import Slots

if TYPE_CHECKING:
    import grpc

    from edgesplit.runtime.batching import Batcher
    from edgesplit.runtime.dataplane import Hop
    from edgesplit.runtime.mesh import Fanout
    from edgesplit.runtime.ray_engine import RayEngine

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_WORKERS", "MAX_SESSIONS", "PartitionHandler",
           "partition_server"]

DEFAULT_WORKERS = 32  # requests a partition server serves at once unless told otherwise

Address = str | LoopbackChannel


def partition_server(program: PlanProgram, device: str, options: ServeOptions | None = None,
                     *, next_address: Address | Mapping[str, Address] | None = None,
                     engine: RayEngine | None = None, max_batch: int | None = None,
                     max_wait_ms: float = 0.0, join_timeout_s: float = 10.0,
                     max_joins: int = 256) -> ServingShell[PartitionHandler]:
    """The server of ``device``'s partition of ``program``, served as ``options`` say; a
    device that sends reaches the next one at ``next_address`` (a mesh's root: one address
    per branch, by name).

    Compute: ``engine`` (a :class:`~edgesplit.runtime.ray_engine.RayEngine`) makes it the
    ingress of a Ray Serve deployment (which computes and batches; the server's health
    follows the deployment's, and stopping the server shuts it down); else it computes here,
    batching up to ``max_batch`` waiting requests (None: up to ``DEFAULT_MAX_BATCH`` where
    the partition allows it; 1: none), waiting ``max_wait_ms`` for a batch to fill.

    A star plan's sink (a mesh's aggregator) joins its sources' calls
    (:class:`~edgesplit.runtime.star.Join`: a request waits at most ``join_timeout_s`` for
    every source, at most ``max_joins`` wait at once) and computes on ``max_workers``
    workers, each taken only by a complete join; a source (a mesh's branch) holds one of its
    ``max_workers`` only while it computes, not while the sink joins. Besides gRPC, the shell
    opens a data plane on ``options.data_port``; calls go there unless the caller says
    ``grpc`` (a star's and a mesh's joins too)."""
    options = options or ServeOptions()
    step = program.step(plan_device(program, device))
    name = step.name
    check_served(name, first=program.kind != "star" and step.index == 0,
                 client="`edgesplit run`")
    _check_next_address(program, step, next_address)
    workers = options.workers(DEFAULT_WORKERS)
    sink = engine is None and name == program.sink  # a star's sink, a mesh's aggregator
    if sink:
        check_join_limits(join_timeout_s, max_joins)
    batcher, batching = _batching(program, step, engine, max_batch, max_wait_ms)
    source = name in program.sources  # a star's source, a mesh's branch
    wire = StepWire(program, step)
    slots = WorkerSlots(_threads(program, workers, max_joins, sink=sink, source=source), name,
                        f"{option('max_workers')} requests", options.next_timeout_s)
    compute: Compute = EngineCompute(engine, name, options.next_timeout_s) \
        if engine is not None else LocalCompute(step, slots, batcher, batching,
                                                Slots(workers) if source else None)
    up, down = _links(program, step)
    upstream = LinkShaper(up, options.shape)  # replies
    forwarding = _forwarding(program, step, next_address, wire.limit, options,
                             LinkShaper(down, options.shape))
    relay = Relay(wire, forwarding) if forwarding is not None else None
    if sink:
        answers: Chain | Join = Join(wire, compute, relay, timeout_s=join_timeout_s,
                                     max_joins=max_joins, shape=options.shape,
                                     workers=workers)
    else:
        answers = _chain(wire, compute, relay, slots, upstream)
    handler = PartitionHandler(wire, compute, answers, forwarding)
    return ServingShell(handler, options, limit=wire.limit, slots=slots)


class PartitionHandler:
    """What a partition server's shell serves: one device's step (``wire``), its ``compute``
    part, and the part that answers its requests, ``answers`` (a chain's
    :class:`~edgesplit.runtime.roles.Chain`, a sink's :class:`~edgesplit.runtime.star.Join`),
    whose answering calls are bound here once; ``forwarding``: how it reaches the next device
    (None: it sends nothing). Its parts start and stop with the shell."""

    def __init__(self, wire: StepWire, compute: Compute, answers: Chain | Join,
                 forwarding: NextHop | None) -> None:
        self.wire, self.compute, self.answers, self.forwarding = wire, compute, answers, forwarding
        self.program, self.step = wire.program, wire.step
        self.plan_id, self.device = wire.plan_id, wire.name
        self.inputs: Sequence[str] = list(wire.step.receives)
        self.outputs: Sequence[str] = list(wire.step.returns)
        self.batcher: Batcher | None = compute.batcher
        self.batching = compute.batching
        self.join = answers if isinstance(answers, Join) else None
        chain = answers if isinstance(answers, Chain) else None
        self.fast: FastPath | None = chain.fast if chain is not None else None
        # the links a reply and a send take (a sink shapes each reply on its source's link)
        self.upstream = chain.upstream if chain is not None else LinkShaper(None, False)
        self.downstream = forwarding.shaper if forwarding is not None \
            else LinkShaper(None, False)
        # the next device: a Hop, or a mesh root's Fanout (None: none)
        self.next_hop: Any = forwarding.hop if forwarding is not None else None
        self.reply_pb = answers.reply_pb
        self.answer_frame = answers.answer_frame
        self.failure: Callable[[BaseException], str] = wire.failure

    def started(self, serving: Callable[[bool], None]) -> None:
        self.compute.started(serving)

    def refuse(self) -> None:
        """The compute workers, then a star sink's parked joins: every call still waiting
        for one is answered UNAVAILABLE."""
        self.compute.refuse()
        if self.join is not None:
            self.join.close()

    def drain(self, timeout: float) -> None:
        self.compute.drain(timeout)

    def close(self) -> None:
        """The batcher, the next hop, the deployment."""
        if self.forwarding is not None:
            self.forwarding.close()
        self.compute.close()


# ---- the assembly's choices -----------------------------------------------------------------
def _check_next_address(program: PlanProgram, step: DeviceStep,
                        next_address: Address | Mapping[str, Address] | None) -> None:
    """A mesh's root takes one address per branch; any other device that sends, one."""
    nxt = program.next_device(step)
    if step.name == program.root:  # a mesh's root: one address per branch
        nxt = ", ".join(program.sources)
        if not isinstance(next_address, Mapping):
            from edgesplit.runtime.mesh import check_branches

            check_branches(program, {})
    elif isinstance(next_address, Mapping):
        flag = option("next_address", "HOST:PORT", flag="--next")
        raise ConfigError(f"device {step.name!r} sends to one device, {nxt!r}: give its "
                          f"address alone ({flag})")
    check_next(step.name, nxt, next_address)


def _batching(program: PlanProgram, step: DeviceStep, engine: RayEngine | None,
              max_batch: int | None, max_wait_ms: float) -> tuple[Batcher | None, str]:
    """The batcher of a step computed here (emulation paces each request: none), and what
    was decided, in a few words."""
    if engine is not None:
        return None, "in the engine"
    if step.partition is None or step.emulate_ms is not None:
        return None, "off"
    return batcher_for(program, step.name, max_batch, max_wait_ms)


def _threads(program: PlanProgram, workers: int, max_joins: int, *, sink: bool,
             source: bool) -> int:
    """The calls the server holds at once: ``workers``, and for a star's sink the parts its
    join table parks (they compute nothing) and the callers of the joins being computed (a
    parked part never queues another), for a source the calls waiting for the sink's join
    (they hold none of its compute workers)."""
    if sink:
        sources = len(program.sources)
        return workers * sources + max_joins * (sources - 1)
    return workers + max_joins if source else workers


def _links(program: PlanProgram, step: DeviceStep) -> tuple[Link | None, Link | None]:
    """The plan links ``step`` replies over and sends over (None: none). A star's source has
    no link before it (its inputs are its own); the sink shapes each reply on its source's
    link itself."""
    if program.kind == "star":
        from edgesplit.runtime.star import star_link

        return None, (star_link(program, step.name) if step.sends else None)
    if program.kind == "mesh":  # the root's fan-out and the aggregator's join shape their own
        before = {b: a for a, b in program.hops.items() if b != program.sink}
        before |= dict.fromkeys(program.sources, str(program.root))
        up, down = before.get(step.name), program.next_device(step)
        return (link_between(program, up, step.name) if up and step.name != program.sink
                else None, link_between(program, step.name, down) if down else None)
    return (link_before(program, step.index),
            link_before(program, step.index + 1) if step.sends else None)


def _forwarding(program: PlanProgram, step: DeviceStep,
                next_address: Address | Mapping[str, Address] | None, limit: int,
                options: ServeOptions, shaper: LinkShaper) -> NextHop | None:
    """How a device that sends calls the next one (a mesh's root: its branches, each over
    its own link); the token, the session (and its secret) and a star's join key, which the
    sink joins its sources' requests by, travel on: every hop keeps the session's backend
    state."""
    if not step.sends or next_address is None:
        return None
    if isinstance(next_address, Mapping):
        from edgesplit.runtime.mesh import Fanout

        hop: Hop | Fanout = Fanout(program, next_address, limit, options.tls,
                                   options.data_plane, options.shape)
    else:
        hop = open_hop(next_address, limit, options)
    return NextHop(hop, step.name, timeout_s=options.next_timeout_s, shaper=shaper,
                   passes=("authorization", SESSION_KEY, OWNER_KEY, JOIN_KEY),
                   own=_next_failed(step.name))


def _chain(wire: StepWire, compute: Compute, relay: Relay | None, slots: WorkerSlots,
           upstream: LinkShaper) -> Chain:
    """A chain device's answers: a relay's, or a last hop's, which answers a plain data-plane
    call the short way when it computes here and emulates nothing."""
    if relay is not None:
        return Chain(wire, compute, relay.downstream, slots, upstream)
    chain = Chain(wire, compute, LastHop.downstream, slots, upstream)
    if isinstance(compute, LocalCompute) and wire.step.emulate_ms is None:
        fast = FastPath(wire, compute, slots, upstream, chain.handle)
        chain.short_way(LastHop(fast, chain.slotted))
    return chain


def _next_failed(device: str) -> Callable[[grpc.RpcError], BadRequest | None]:
    """The next hop's failure a request fails with as it is: the caller's deadline passed,
    or it cancelled (anything else: the next hop failed)."""
    import grpc

    def own(exc: grpc.RpcError) -> BadRequest | None:
        if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            return BadRequest(exc.code(), f"next hop after {device!r}: "
                              f"{exc.code().name}: {exc.details()}")
        return None

    return own
